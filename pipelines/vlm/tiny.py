"""A tiny, randomly initialised Qwen-VL built offline, for tests, the demo and CI.

The real models are gigabytes and cannot be downloaded here, but the engine code (chat template,
processor resize, batched generate, constrained decoding, token counting) is the same for a model
of 0.4M parameters as for one of 7B. So the tiny model has the real architecture, Qwen's special
tokens and chat template, and a byte-level BPE tokenizer trained in code on the words our prompts
use; only the weights are random. Everything it produces is marked synthetic
(:func:`is_synthetic` reads the marker file the builder writes), so its output can never be
mistaken for mined data.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipelines.core.atomic_dir import build_dir_once

MARKER = "panelforge_synthetic.json"
FAMILIES = ("qwen2_5_vl", "qwen3_vl")

SPECIALS = [
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]  # <|endoftext|> is Qwen2Tokenizer's own unk/pad token

# A simplified Qwen2-VL chat template: system turn (a default one when absent), images before text.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# What the BPE is trained on: JSON punctuation, digits and the words of our prompts, so that
# answers (and the canary token) take few tokens and generation stays fast.
_CORPUS = [
    '{"panels": [{"label": "A", "bbox_2d": [10, 20, 200, 300]}, {"label": null, "bbox_2d": [0, 0, 5, 9]}]}',
    '{"panels": [{"label": "b", "text": "Western blot of lysates."}]}',
    '{"regions": [{"bbox_2d": [1, 23, 456, 789]}]}',
    '{"description": "A bar chart of cell counts."}',
    '{"canary": "panelforge-structured-outputs-7f3a"}',
    "0 1 2 3 4 5 6 7 8 9 10 11 12 42 100 128 256 512 1000 true false null",
    "[ ] { } , : \" ' ( ) . - _ / ; ! ?",
    "You are an expert reader of biomedical figures. You answer with JSON only, copy text from the "
    "caption verbatim when asked to, and never invent content that is not in the image or the caption.",
    "This image is (part of) a scientific figure made of panels. Find every panel. For each, give the "
    "identifier printed on it (such as A, b, 2 or ii, without brackets; null when none is printed) and "
    "its bounding box. Caption of the figure. Describe in one short sentence what the panel shows. "
    "Give the bounding box of every region this refers to (the area the arrow points at or encloses). "
    "This is a region cut from a panel of a scientific figure. Say hello in one word.",
]


def _tokenizer():
    """Qwen2Tokenizer over a BPE trained here (BpeTrainer is deterministic for a fixed corpus)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=640, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    bpe.train_from_iterator(_CORPUS * 20, trainer)
    model = json.loads(bpe.to_str())["model"]
    return Qwen2Tokenizer(
        vocab=model["vocab"], merges=[tuple(m) for m in model["merges"]], extra_special_tokens=SPECIALS
    )


def _text_config(vocab_size: int, ids: dict[str, int], family: str) -> dict:
    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}  # sums to head_dim / 2
    config = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rope_parameters=rope,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    if family == "qwen3_vl":
        config["head_dim"] = 16
        rope["mrope_interleaved"] = True
    return config


# The vision tower both tiny families share; each adds its own patch size and attention layout.
TINY_VISION = dict(
    depth=2,
    hidden_size=64,
    intermediate_size=128,
    num_heads=4,
    out_hidden_size=64,
    spatial_merge_size=2,
    temporal_patch_size=2,
)


def _build(family: str, seed: int):
    """(model, processor) of ``family``, weights drawn from ``seed`` without touching global RNG."""
    import torch
    from transformers import GenerationConfig, Qwen2VLImageProcessor

    from pipelines.vlm.engine import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS

    tok = _tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in ["<|endoftext|>", *SPECIALS]}
    vision_ids = dict(
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    text = _text_config(len(tok), ids, family)
    if family == "qwen2_5_vl":
        from transformers import (
            Qwen2_5_VLConfig,
            Qwen2_5_VLForConditionalGeneration,
            Qwen2_5_VLProcessor,
            Qwen2VLVideoProcessor,
        )

        band = {"shortest_edge": DEFAULT_MIN_PIXELS, "longest_edge": DEFAULT_MAX_PIXELS}
        images = Qwen2VLImageProcessor(size=band)
        processor = Qwen2_5_VLProcessor(
            image_processor=images, video_processor=Qwen2VLVideoProcessor(), tokenizer=tok, chat_template=CHAT_TEMPLATE
        )
        vision = dict(TINY_VISION, patch_size=14, window_size=112, fullatt_block_indexes=[1])
        config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, **vision_ids)
        model_cls = Qwen2_5_VLForConditionalGeneration
    else:
        from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor, Qwen3VLVideoProcessor

        band = {"shortest_edge": 32 * 32 * 4, "longest_edge": 32 * 32 * 1280}
        images = Qwen2VLImageProcessor(patch_size=16, merge_size=2, temporal_patch_size=2, size=band)
        processor = Qwen3VLProcessor(
            image_processor=images, video_processor=Qwen3VLVideoProcessor(), tokenizer=tok, chat_template=CHAT_TEMPLATE
        )
        vision = dict(TINY_VISION, patch_size=16, num_position_embeddings=256, deepstack_visual_indexes=[1])
        config = Qwen3VLConfig(text_config=text, vision_config=vision, **vision_ids)
        model_cls = Qwen3VLForConditionalGeneration
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config).eval()
    # Like the real Qwen checkpoints: a turn ends at <|im_end|>, a document at <|endoftext|>.
    model.generation_config = GenerationConfig(
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]], pad_token_id=ids["<|endoftext|>"], do_sample=False
    )
    return model, processor


def build_tiny_model(directory: str | Path, family: str = "qwen2_5_vl", seed: int = 0) -> Path:
    """Build and save the tiny model into ``directory`` (created; existing files overwritten).

    Loadable with ``AutoProcessor`` / ``AutoModelForImageTextToText.from_pretrained(directory)``.
    The same ``seed`` gives byte-identical weights."""
    if family not in FAMILIES:
        raise ValueError(f"tiny model family must be one of {FAMILIES}, not {family!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model, processor = _build(family, seed)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    (directory / MARKER).write_text(json.dumps({"synthetic": True, "family": family, "seed": seed}))
    return directory


def is_synthetic(directory: str | Path) -> bool:
    """True when ``directory`` holds a model built by :func:`build_tiny_model` (hub ids: False)."""
    marker = Path(directory) / MARKER
    if not marker.is_file():
        return False
    return bool(json.loads(marker.read_text()).get("synthetic"))


def tiny_model_dir(cache_root: str | Path, family: str = "qwen2_5_vl", seed: int = 0) -> Path:
    """The tiny model under ``cache_root``, built on first use and reused afterwards.

    Built in a temporary sibling and renamed into place (``core.atomic_dir``): a concurrent
    caller sees either no directory or a complete one; the build is deterministic, so when two
    build at once either copy will do."""
    final = Path(cache_root) / f"tiny-{family}-seed{seed}"
    return build_dir_once(final, lambda staging: build_tiny_model(staging, family, seed), is_synthetic)
