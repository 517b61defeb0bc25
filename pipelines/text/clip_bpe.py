"""OpenCLIP's CLIP BPE tokenizer (``open_clip.tokenizer.SimpleTokenizer``) without the rest of OpenCLIP.

The long captions' token budget and the release's caption statistics count tokens as the CLIP text
encoder will, with the tokenizer and vocabulary the open-clip-torch wheel ships (so it works
offline). ``from open_clip.tokenizer import SimpleTokenizer`` runs OpenCLIP's package first, which
imports every model family it has and torchvision: 5.1 s of CPU and 880 MB in a fresh process, for
a step that only counts tokens. The tokenizer module needs none of that (its imports are the
standard library, ftfy, regex, numpy and torch; its vocabulary is found next to its own file), so
it is loaded from its file in the installed wheel: 2.0 s and 655 MB, nearly all of it torch's
import. A process that has imported OpenCLIP already (training, evaluation) uses OpenCLIP's own.
"""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

PACKAGE, MODULE = "open_clip", "open_clip.tokenizer"
STANDALONE = "panelforge_open_clip_tokenizer"  # the name the module runs under when loaded alone


def simple_tokenizer(context_length: int = 77):
    """A new ``SimpleTokenizer`` (CLIP BPE, 49,408 tokens) of the installed open-clip-torch."""
    return tokenizer_module().SimpleTokenizer(context_length=context_length)


def tokenizer_module() -> ModuleType:
    """``open_clip.tokenizer``: OpenCLIP's, where OpenCLIP is imported, else the same file loaded alone."""
    return sys.modules.get(MODULE) or load_alone()


@cache
def load_alone() -> ModuleType:
    """The wheel's ``open_clip/tokenizer.py`` run as a module of its own, OpenCLIP's package not run
    (``find_spec`` of a top-level package locates it without importing it)."""
    package = importlib.util.find_spec(PACKAGE)
    if package is None or not package.submodule_search_locations:
        raise ModuleNotFoundError(f"{PACKAGE} is not installed (the open-clip-torch package)", name=PACKAGE)
    path = Path(next(iter(package.submodule_search_locations))) / "tokenizer.py"
    spec = importlib.util.spec_from_file_location(STANDALONE, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
