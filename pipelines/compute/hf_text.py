"""CLIP models with a Hugging Face text tower (OpenCLIP's ``hf_model_name``) that OpenCLIP 3.3 cannot
build by itself, and the assembly of such a model from a pretrained vision tower.

BMC-LongCLIP (``shared/papers/003_9645439f2590c986.txt``) pairs a DFN-2B ViT-L/14 with BioClinical
ModernBERT. OpenCLIP's ``HFTextEncoder`` knows a text model's width only from its ``arch_dict``,
which has no ``modernbert`` entry, and it always passes ``add_pooling_layer`` to ``AutoModel``, which
``ModernBertModel`` rejects (the paper used a fork). :func:`enable_hf_text_towers` adds both, once,
in whatever process builds the model: this one (WiSE-FT, assembly) and the trainer child, which is
started as ``python -m pipelines.compute.hf_text <open_clip_train args>``.
"""

from __future__ import annotations

import json
import sys
from copy import deepcopy
from pathlib import Path

HF_ARCHS = {
    # ModernBERT: https://huggingface.co/docs/transformers/model_doc/modernbert
    "modernbert": {
        "config_names": {
            "context_length": "max_position_embeddings",
            "vocab_size": "vocab_size",
            "width": "hidden_size",
            "heads": "num_attention_heads",
            "layers": "num_hidden_layers",
            "layer_attr": "layers",
            "token_embeddings_attr": "embeddings",
        },
        "pooler": "mean_pooler",
    },
}
NO_POOLING_LAYER = {"modernbert"}  # model types whose __init__ takes no add_pooling_layer
CONFIG_FILE = "open_clip_config.json"
WEIGHTS_FILE = "open_clip_model.safetensors"


class _AutoModel:
    """``transformers.AutoModel`` as OpenCLIP's HF adapter calls it, minus ``add_pooling_layer``
    for the model types that have no pooling layer to switch off."""

    @staticmethod
    def from_pretrained(name_or_path, **kwargs):
        from transformers import AutoConfig, AutoModel

        if AutoConfig.from_pretrained(name_or_path).model_type in NO_POOLING_LAYER:
            kwargs.pop("add_pooling_layer", None)
        return AutoModel.from_pretrained(name_or_path, **kwargs)

    @staticmethod
    def from_config(config, **kwargs):
        from transformers import AutoModel

        if config.model_type in NO_POOLING_LAYER:
            kwargs.pop("add_pooling_layer", None)
        return AutoModel.from_config(config, **kwargs)


def enable_hf_text_towers() -> None:
    """Teach this process's OpenCLIP the text towers of :data:`HF_ARCHS` (idempotent; an entry
    OpenCLIP ships itself is left as it is)."""
    from open_clip import hf_configs, hf_model

    for name, arch in HF_ARCHS.items():
        hf_configs.arch_dict.setdefault(name, deepcopy(arch))
    hf_model.AutoModel = _AutoModel


def hf_text_model_cfg(
    vision_model_cfg: dict,
    text_model: str,
    context_length: int,
    pooler: str = "mean_pooler",
    proj: str = "mlp",
) -> dict:
    """An OpenCLIP ``model_cfg``: the vision side (embedding size, QuickGELU, vision tower) of
    ``vision_model_cfg`` and ``text_model`` (a Hub id or a local folder) as the text tower, its
    tokenizer truncating and padding to ``context_length``."""
    return {
        "embed_dim": vision_model_cfg["embed_dim"],
        "quick_gelu": vision_model_cfg.get("quick_gelu", False),
        "vision_cfg": deepcopy(vision_model_cfg["vision_cfg"]),
        "text_cfg": {
            "hf_model_name": text_model,
            "hf_tokenizer_name": text_model,
            "hf_proj_type": proj,
            "hf_pooler_type": pooler,
            "context_length": context_length,
        },
    }


def assemble(model_cfg: dict, preprocess_cfg: dict, vision_state: dict, dest: Path, seed: int = 0) -> Path:
    """Write a ``local-dir:`` model to ``dest``: the text tower's pretrained weights, the vision
    tower's weights from ``vision_state`` (a CLIP state dict, ``visual.*`` used), a fresh text
    projection and logit scale (seeded, so a fresh machine assembles the same base for WiSE-FT),
    and the tokenizer's files, which OpenCLIP reads from the local dir itself.

    ``hf_model_name`` stays the id: OpenCLIP then builds the tower from its config only (the
    weights come from the folder's checkpoint), so the folder and its exports stay movable."""
    import open_clip
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    enable_hf_text_towers()
    dest.mkdir(parents=True, exist_ok=True)
    (dest / CONFIG_FILE).write_text(json.dumps({"model_cfg": model_cfg, "preprocess_cfg": preprocess_cfg}, indent=2))
    torch.manual_seed(seed)
    model = open_clip.create_model(f"local-dir:{dest}", device="cpu", pretrained_text=True)
    visual = {k.removeprefix("visual."): v for k, v in vision_state.items() if k.startswith("visual.")}
    model.visual.load_state_dict(visual, strict=True)
    AutoTokenizer.from_pretrained(model_cfg["text_cfg"]["hf_tokenizer_name"]).save_pretrained(str(dest))
    tmp = dest / f".{WEIGHTS_FILE}.tmp"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp))
    tmp.replace(dest / WEIGHTS_FILE)  # last: a folder with weights is a whole one
    return dest


def main(argv: list[str] | None = None) -> None:
    """``open_clip_train.main`` with the text towers of :data:`HF_ARCHS` enabled."""
    enable_hf_text_towers()
    from open_clip_train.main import main as train_main

    train_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
