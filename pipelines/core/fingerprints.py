"""One way to hash what a result was made from: settings, prompts, inputs, a model's identity.

A stage reuses a result when the fingerprint of its inputs and settings is unchanged (see
``reusable_results`` in ``pipelines/core/stage.py``), and reports a hash of those fingerprints as its
data version. Every such hash is :func:`fingerprint` of a JSON-able value, so the same settings
always give the same key whoever computes it.

A fingerprint must survive moving the lake or the models: it never holds a machine's path. A
model given as a local directory is identified by what is in it (:func:`model_identity`), so a
lake copied to another machine, with the same weights elsewhere on disk, reuses every result.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, is_dataclass

# Files that say which model a directory holds, hashed whole (small). The weights themselves are
# identified by their names and sizes: hashing gigabytes per run would cost more than it saves.
IDENTITY_FILES = (
    "config.json",
    "generation_config.json",
    "preprocessor_config.json",
    "tokenizer_config.json",
    "tokenizer.json",
    "vocab.json",
    "merges.txt",
    "model.safetensors.index.json",
    "panelforge_detector.json",
)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def fingerprint(value: object) -> str:
    """A short stable hash of a JSON-able value (settings, prompts, inputs); dataclasses as their fields."""
    if is_dataclass(value) and not isinstance(value, type):
        value = asdict(value)
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def model_identity(model: str | None, revision: str | None = None) -> str | None:
    """What names a model in a fingerprint: a hub id with its revision as given, or, for a local
    directory, ``local:<hash>`` of its configuration files and the names and sizes of its weights,
    so the same weights in another directory (a copied lake, another machine) are the same model."""
    if not model or not os.path.isdir(model):
        return f"{model}@{revision}" if model and revision else model
    found: dict[str, object] = {}
    for root, _, files in sorted(os.walk(model)):
        for name in sorted(files):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, model)
            if name in IDENTITY_FILES:
                with open(path, "rb") as fh:
                    found[rel] = hashlib.sha256(fh.read()).hexdigest()
            elif name.endswith(WEIGHT_SUFFIXES):
                found[rel] = os.path.getsize(path)
    return f"local:{fingerprint(found)}"
