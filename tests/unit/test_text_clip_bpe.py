"""OpenCLIP's CLIP BPE tokenizer loaded without OpenCLIP's package (``pipelines.text.clip_bpe``).

Token counts are read by hand: CLIP's BPE lowercases, and each of these common English words and
"." is one token of its 49,408 (``a</w>``, ``photo</w>``, ...).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from pipelines.text import clip_bpe


def test_the_module_loaded_alone_is_the_wheels_tokenizer_file_and_counts_like_openclip():
    import open_clip.tokenizer as theirs

    alone = clip_bpe.load_alone()
    assert alone.__name__ == clip_bpe.STANDALONE and alone is not theirs
    assert Path(alone.__file__) == Path(theirs.__file__)
    ours, reference = alone.SimpleTokenizer(), theirs.SimpleTokenizer()
    assert len(ours.encode("a photo of a cat")) == 5
    assert len(ours.encode("A PHOTO of a cat.")) == 6
    assert ours.vocab_size == 49408
    for text in ("a photo of a cat", "Scale bar, 50 µm. (B) H&E staining of the lung, ×20."):
        assert ours.encode(text) == reference.encode(text)


def test_openclips_own_module_is_used_where_openclip_is_imported(monkeypatch):
    import open_clip.tokenizer as theirs

    monkeypatch.setitem(sys.modules, clip_bpe.MODULE, theirs)
    assert clip_bpe.tokenizer_module() is theirs
    monkeypatch.delitem(sys.modules, clip_bpe.MODULE)
    assert clip_bpe.tokenizer_module() is clip_bpe.load_alone()
    assert clip_bpe.simple_tokenizer(32).context_length == 32


def test_a_missing_open_clip_torch_is_one_clear_error(monkeypatch):
    clip_bpe.load_alone.cache_clear()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    try:
        with pytest.raises(ModuleNotFoundError, match="open-clip-torch"):
            clip_bpe.load_alone()
    finally:
        monkeypatch.undo()
        clip_bpe.load_alone.cache_clear()
