"""How a model is named in what PanelForge writes: by its id, never by where it lies on a machine.

A model is given as a Hugging Face id (``Qwen/Qwen2.5-VL-7B-Instruct``) or as a local directory
(``/scratch/me/models/qwen``, the demo's ``<lake>/models/vlm/tiny-qwen2_5_vl-seed0``). The
directory is how this machine finds the weights; written into a table, a card or a sample's JSON
it tells a reader nothing they can use and tells everyone the layout of the machine (user names,
mount points). Provenance therefore names a local directory by what identifies it: the id of the
Hugging Face cache snapshot it is (``models--Qwen--Qwen2.5-VL-7B-Instruct/snapshots/<sha>`` is
``Qwen/Qwen2.5-VL-7B-Instruct``), else ``local:<its folder name>``. Its revision is then what
identifies the weights wherever they lie: the snapshot's commit, else the content hash of the
folder (``model_identity``, the hash fingerprints use).
"""

from __future__ import annotations

import os
import re

from pipelines.core.fingerprints import model_identity

# A Hugging Face cache snapshot: .../models--<org>--<name>/snapshots/<revision>[/...]
_HF_SNAPSHOT = re.compile(r"(?:^|[/\\])models--([^/\\]+?)--([^/\\]+)[/\\]snapshots[/\\]([^/\\]+)")


def public_model_name(model: str | None) -> str | None:
    """``model`` as provenance may show it: a hub id unchanged; a path (absolute, relative or
    ``~``) as its hub id when it is a cache snapshot, else ``local:<folder name>``."""
    if not model:
        return model
    if not _is_path(model):
        return model
    snapshot = _HF_SNAPSHOT.search(model)
    if snapshot:
        org, name, _ = snapshot.groups()
        return f"{org}/{name}"
    return "local:" + re.split(r"[/\\]", model.rstrip("/\\"))[-1]


def public_model(model: str | None, revision: str | None) -> tuple[str | None, str | None]:
    """The ``(model, model_revision)`` pair provenance writes: the name of :func:`public_model_name`;
    the revision as given, else for a local directory the cache snapshot's commit or the content
    hash of its files (``local:<hash>``), so two folders of the same name stay told apart."""
    name = public_model_name(model)
    if revision or not model or name == model:
        return name, revision
    snapshot = _HF_SNAPSHOT.search(model)
    if snapshot:
        return name, snapshot.group(3)
    return name, model_identity(model) if os.path.isdir(model) else None


def _is_path(model: str) -> bool:
    """A local directory rather than a hub id: absolute, home-relative, explicitly relative, a
    Windows drive, or more than one ``/`` (hub ids are ``name`` or ``org/name``)."""
    return (
        model.startswith(("/", "~", "./", "../", "\\"))
        or re.match(r"^[A-Za-z]:[\\/]", model) is not None
        or model.count("/") > 1
        or os.path.isdir(model)
    )
