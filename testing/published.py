"""Checkpoints in their published formats, rebuilt offline with random weights.

The published weights cannot be downloaded here, but their ``config.json`` files can be copied:
``tests/data/published/`` holds them (with attribution in ``tests/data/README.md``). A checkpoint
written from such a config has the production architecture, so our loaders read it exactly as
they read the published one; at real size where memory allows, else :func:`reduced`, the same
keys with smaller numbers. Used by the published-config tests and by ``make gpu-check``, which
builds the real sizes on a GPU.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

PUBLISHED = Path(__file__).resolve().parents[1] / "tests" / "data" / "published"
DINOV2_PROCESSOR = "dinov2-large.preprocessor_config.json"
# the special tokens of Qwen2.5-VL's config and the tokenizer entry each names
QWEN_TOKEN_IDS = {
    "image_token_id": "<|image_pad|>",
    "video_token_id": "<|video_pad|>",
    "vision_start_token_id": "<|vision_start|>",
    "vision_end_token_id": "<|vision_end|>",
    "vision_token_id": "<|vision_pad|>",
    "eos_token_id": "<|im_end|>",
    "bos_token_id": "<|endoftext|>",
}
# Qwen2.5-VL at reduced size: its published keys, small numbers (head dim 16 = 2 x (2 + 3 + 3))
QWEN_REDUCED = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "max_window_layers": 2}  # fmt: skip
QWEN_REDUCED_VISION = {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 4, "out_hidden_size": 64,
                       "fullatt_block_indexes": [1]}  # fmt: skip


def published_config(name: str) -> dict:
    """A copy of a published ``config.json`` (``tests/data/published/<name>.config.json``)."""
    return json.loads((PUBLISHED / f"{name}.config.json").read_text())


def reduced(config: dict, sizes: dict, vision: dict | None = None, rope_section: list[int] | None = None) -> dict:
    """``config`` with ``sizes`` (and ``vision`` in its ``vision_config``) replaced: every key kept."""
    out = json.loads(json.dumps(config))
    unknown = set(sizes) - set(out) | (set(vision or {}) - set(out.get("vision_config", {})))
    if unknown:
        raise KeyError(f"not keys of the published config: {sorted(unknown)}")
    out.update(sizes)
    if vision:
        out["vision_config"].update(vision)
    if rope_section is not None:
        out["rope_scaling"]["mrope_section"] = rope_section
    return out


def write_dinov2(folder: Path, config: dict, seed: int = 0):
    """A ``save_pretrained`` folder of a DINOv2 config (the class its ``architectures`` names)
    with seeded random weights and DINOv2's published image processor config; returns the model."""
    import torch
    import transformers

    cls = getattr(transformers, config["architectures"][0])
    torch.manual_seed(seed)
    model = cls(cls.config_class.from_dict(config)).eval()
    model.save_pretrained(str(folder))
    shutil.copy(PUBLISHED / DINOV2_PROCESSOR, Path(folder) / "preprocessor_config.json")
    return model


def write_qwen2_5_vl(folder: Path, config: dict, dtype: str = "float32", device: str = "cpu", seed: int = 0) -> Path:
    """A Qwen2.5-VL checkpoint of ``config`` (a published one, or :func:`reduced`) with random
    weights and a processor: the tiny model's processor and byte-level BPE tokenizer
    (``pipelines/vlm/tiny.py``, Qwen's special tokens and chat template), the config's
    special-token ids set to that tokenizer's (the only keys changed). The vocabulary stays the
    published size, so the embedding matrices are the real ones."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from pipelines.vlm.tiny import MARKER, build_tiny_model

    folder = Path(folder)
    build_tiny_model(folder)  # the processor and tokenizer files; its weights are replaced below
    (folder / MARKER).unlink()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in (*QWEN_TOKEN_IDS.values(), "<|endoftext|>")}
    config = dict(config, **{key: ids[token] for key, token in QWEN_TOKEN_IDS.items()})
    cfg = Qwen2_5_VLConfig.from_dict(config)
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))  # built in its dtype: a 7B model never exists in fp32
    try:
        with torch.device(device):
            model = Qwen2_5_VLForConditionalGeneration(cfg).eval()
    finally:
        torch.set_default_dtype(default)
    model.generation_config = GenerationConfig(
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]], pad_token_id=ids["<|endoftext|>"], do_sample=False
    )
    for stale in folder.glob("model*.safetensors*"):
        stale.unlink()
    model.save_pretrained(str(folder))
    return folder
