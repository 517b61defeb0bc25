"""Tiny randomly initialised CLIP models built offline, for the demo profile and the tests.

The production recipes start from gigabytes of published weights (CommonPool ViT-L-14, DFN-2B,
BioClinical ModernBERT). The training and evaluation code is the same for a model of 0.1M
parameters, so the synthetic profile trains and evaluates these instead: an OpenCLIP model
(OpenCLIP's own tokenizer, whose vocabulary ships in its wheel) and a 2-layer ModernBERT with a
WordPiece tokenizer made in code, each as a folder with seeded weights, marked synthetic by a
marker file so its numbers can never pass for a real model's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from pipelines.core.atomic_dir import build_dir_once

MARKER = "panelforge_synthetic.json"
OPEN_CLIP_CONFIG = "open_clip_config.json"
OPEN_CLIP_WEIGHTS = "open_clip_model.safetensors"
TINY_CLIP = {
    "model_cfg": {
        "embed_dim": 32,
        "vision_cfg": {"image_size": 64, "layers": 1, "width": 64, "head_width": 32, "patch_size": 16},
        "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 1},
    },
    "preprocess_cfg": {},
}
# Smaller still (32 px images, width 32, 2 vision layers): the multi-level trainer's tests, which
# run many steps at several levels.
TINY_CLIP_32PX = {
    "model_cfg": {
        "embed_dim": 32,
        "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "head_width": 16, "patch_size": 16},
        "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
    },
    "preprocess_cfg": {},
}
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # ids 0..4
BERT_WORDS = (
    "the panel shows fluorescence microscopy of stained cells with nuclei in blue and actin in green "
    "bar chart western blot line plot survival expression levels protein lysates over time group scale"
).split()


def write_tiny_clip(folder: Path, seed: int = 0, model_cfg: dict | None = None) -> Path:
    """An OpenCLIP ``local-dir:`` model (config + seeded random weights) in ``folder``."""
    import open_clip
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = {"model_cfg": model_cfg, "preprocess_cfg": {}} if model_cfg is not None else TINY_CLIP
    (folder / OPEN_CLIP_CONFIG).write_text(json.dumps(config))
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # OpenCLIP warns that the folder has no weights yet: they are written next
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = open_clip.create_model(f"local-dir:{folder}")
    finally:
        root.setLevel(level)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / OPEN_CLIP_WEIGHTS))
    return folder


def write_tiny_modernbert(folder: Path, seed: int = 0) -> Path:
    """A 2-layer ModernBERT with a WordPiece tokenizer over :data:`BERT_WORDS`, saved as a Hub
    folder (``config.json``, weights, tokenizer): the stand-in for BioClinical ModernBERT."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import ModernBertConfig, ModernBertModel, PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(BERT_SPECIALS + sorted(set(BERT_WORDS)))}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
    )
    config = ModernBertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=512,
        local_attention=16,
        global_attn_every_n_layers=2,
        pad_token_id=0,
        cls_token_id=2,
        sep_token_id=3,
        bos_token_id=2,
        eos_token_id=3,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        fast.save_pretrained(str(folder))
        ModernBertModel(config).save_pretrained(str(folder))
    return folder


def is_synthetic(folder: str | Path) -> bool:
    return (Path(folder) / MARKER).is_file()


def _cached(root: str | Path, name: str, build: Callable[[Path], Path]) -> Path:
    """``root/name`` built on first use and marked synthetic (``core.atomic_dir``: a concurrent
    caller sees no folder or a whole one; the build is deterministic)."""

    def marked(staging: Path) -> None:
        build(staging)
        (staging / MARKER).write_text(json.dumps({"synthetic": True, "model": name}))

    return build_dir_once(Path(root) / name, marked, is_synthetic)


def tiny_clip_dir(cache_root: str | Path, seed: int = 0) -> Path:
    """The tiny OpenCLIP model under ``cache_root`` (built once): use it as ``local-dir:<path>``."""
    return _cached(cache_root, f"tiny-openclip-seed{seed}", lambda folder: write_tiny_clip(folder, seed))


def tiny_text_tower_dir(cache_root: str | Path, seed: int = 0) -> Path:
    """The tiny ModernBERT under ``cache_root`` (built once): a ``text_model`` for BMC-LongCLIP's recipe."""
    return _cached(cache_root, f"tiny-modernbert-seed{seed}", lambda folder: write_tiny_modernbert(folder, seed))
