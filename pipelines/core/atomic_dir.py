"""A local folder built once and published whole: the build runs in a hidden temporary sibling
that is renamed into place. A rename is atomic, so a concurrent caller sees no folder or a whole
one; when two build at once, the loser's rename fails and it uses the winner's copy (the callers'
builds are deterministic, so both copies are the same). The tiny models of the tests and the demo
are cached this way (``pipelines/training/tiny.py``, ``pipelines/vlm/tiny.py``)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def build_dir_once(final: str | Path, build: Callable[[Path], object], is_whole: Callable[[Path], bool]) -> Path:
    """``final``, built by ``build(staging folder)`` unless ``is_whole(final)`` already; returns ``final``.

    ``is_whole`` is what tells a published folder from none (a marker file the build writes
    last): it is asked before building, and again when the rename fails (another caller won)."""
    final = Path(final)
    if is_whole(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        build(staging)
        try:
            os.rename(staging, final)
        except OSError:
            if not is_whole(final):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final
