"""BMC-LongCLIP as a configuration of the continual-pretraining module: a Hugging Face text tower
(BioClinical ModernBERT in production, a tiny ModernBERT with a hand-made tokenizer here, built
offline) on a CLIP vision tower, 512-token captions, OpenCLIP's real trainer on CPU on a mixture
of a figure-level and a long-caption subset of real sample figures."""

import io
import json
import os
import tarfile
from dataclasses import replace
from pathlib import Path

import fsspec
import numpy as np
import open_clip
import pytest
import torch
from safetensors.torch import load_file

from pipelines.compute import hf_text
from pipelines.training.clip import EXPORT_WEIGHTS as WEIGHTS
from pipelines.training.clip import ClipTrainConfig, assemble_model, longclip_config, train
from pipelines.training.tiny import TINY_CLIP, write_tiny_clip, write_tiny_modernbert

REPO = Path(__file__).resolve().parents[2]
IMAGES = sorted((REPO / "sample" / "images").glob("*/*.jpg"))
# 10 words repeated 12 times: 120 words, each one token, so 122 tokens with [CLS] and [SEP] (> 77)
LONG = " ".join(["fluorescence microscopy of stained cells with nuclei in blue and"] * 12)
SHORT = "western blot of protein lysates"  # 5 tokens, 7 with [CLS] and [SEP]
# the tiny CLIP of pipelines/training/tiny.py with a smaller text tower (only its vision tower is used)
TINY_VISION = {
    "model_cfg": {
        **TINY_CLIP["model_cfg"],
        "text_cfg": {"context_length": 16, "vocab_size": 64, "width": 32, "heads": 2, "layers": 1},
    },
    "preprocess_cfg": {},
}


def write_tiny_vision(folder: Path) -> Path:
    """A tiny CLIP whose vision tower stands in for DFN-2B's ViT-L/14 (its weights beside its config)."""
    return write_tiny_clip(folder, seed=1, model_cfg=TINY_VISION["model_cfg"])


def write_subset(folder: Path, captions: list[str], per_shard: int = 4) -> Path:
    """One ``panelforge-000000.tar`` of (jpg, txt) samples of real figures and its sizes.json."""
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(folder / "panelforge-000000.tar", "w") as tar:
        for n in range(per_shard):
            for ext, data in (("jpg", IMAGES[n % len(IMAGES)].read_bytes()), ("txt", captions[n % 2].encode())):
                info = tarfile.TarInfo(f"sample{n:06d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    (folder / "sizes.json").write_text(json.dumps({"panelforge-000000.tar": per_shard}))
    return folder


@pytest.fixture(scope="module")
def offline():
    with pytest.MonkeyPatch.context() as mp:  # this process and the trainer child: no Hub
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        yield


@pytest.fixture(scope="module")
def towers(tmp_path_factory, offline) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("towers")
    return write_tiny_vision(root / "vision"), write_tiny_modernbert(root / "modernbert")


# ------------------------------------------------------------------------------- configuration


def test_the_model_config_for_77_154_and_512_tokens():
    vit_l14 = open_clip.get_model_config("ViT-L-14-quickgelu")
    for context in (77, 154, 512):
        cfg = hf_text.hf_text_model_cfg(vit_l14, "thomas-sounack/BioClinical-ModernBERT-base", context)
        assert cfg == {
            "embed_dim": 768,
            "quick_gelu": True,
            "vision_cfg": {"image_size": 224, "layers": 24, "width": 1024, "patch_size": 14},
            "text_cfg": {
                "hf_model_name": "thomas-sounack/BioClinical-ModernBERT-base",
                "hf_tokenizer_name": "thomas-sounack/BioClinical-ModernBERT-base",
                "hf_proj_type": "mlp",
                "hf_pooler_type": "mean_pooler",
                "context_length": context,
            },
        }
    assert ("ViT-L-14-quickgelu", "dfn2b") in open_clip.list_pretrained()  # the vision tower's tag exists


def test_the_recipe_is_the_papers_on_a_figure_and_longcap_mixture():
    config = longclip_config(
        ["/lake/dataset/r1/commercial", "/lake/dataset/r1/longcap-commercial"],
        "/lake/runs/x",
        context_length=154,
        upsampling_factors=[1.0, 2.0],
    )
    config.validate()
    assert (config.model, config.pretrained) == ("ViT-L-14-quickgelu", "dfn2b")
    assert config.text_model == "thomas-sounack/BioClinical-ModernBERT-base" and config.context_length == 154
    assert (config.batch_size, config.gpus, config.accum_freq) == (1024, 8, 1)  # 8192 a step
    assert (config.lr, config.warmup, config.epochs, config.precision) == (5e-4, 1000, 20, "fp32")
    assert (config.beta1, config.beta2, config.grad_clip_norm) == (0.9, 0.95, 1.0)
    assert config.dataset_resampled and config.wise_ft_alpha == 1.0
    with pytest.raises(ValueError, match="context_length"):
        ClipTrainConfig(train_data=["a"], run_dir="r", text_model="m", context_length=1).validate()


# ------------------------------------------------------------------------------- the tiny model


def test_the_tiny_long_context_model_builds_offline_tokenizes_to_512_and_encodes(towers, tmp_path):
    vision, bert = towers
    cfg = hf_text.hf_text_model_cfg(TINY_VISION["model_cfg"], str(bert), 512)
    source = open_clip.create_model(f"local-dir:{vision}").state_dict()
    folder = hf_text.assemble(cfg, {}, source, tmp_path / "base")
    model, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{folder}")
    tokenizer = open_clip.get_tokenizer(f"local-dir:{folder}")

    tokens = tokenizer([LONG, SHORT])
    assert tokens.shape == (2, 512)
    assert (tokens != 0).sum(dim=1).tolist() == [122, 7]  # nothing of the long caption cut at 77
    assert tokens[0, 0].item() == 2 and tokens[0, 121].item() == 3  # [CLS] ... [SEP], then [PAD]
    text = model.encode_text(tokens)
    assert text.shape == (2, 32) and torch.isfinite(text).all()
    assert not torch.allclose(text[0], text[1])
    assert model.encode_image(torch.zeros(1, 3, 64, 64)).shape == (1, 32)
    # the vision tower is the source's, the text tower the pretrained (saved) ModernBERT's
    state = model.state_dict()
    assert torch.equal(state["visual.conv1.weight"], source["visual.conv1.weight"])
    from transformers import AutoModel

    bert_state = AutoModel.from_pretrained(str(bert)).state_dict()
    key = "embeddings.tok_embeddings.weight"
    assert torch.equal(state[f"text.transformer.{key}"], bert_state[key])


def test_the_evaluation_harness_loads_a_longclip_export(towers, tmp_path):
    """A BMC-LongCLIP export (what ``train`` writes to ``<run>/model``: WiSE-FT weights, config,
    tokenizer files) loads through ``load_clip``. Stock OpenCLIP 3.3, run in a fresh process,
    cannot build it: ModernBERT rejects OpenCLIP's ``add_pooling_layer``."""
    import subprocess
    import sys

    from pipelines.evaluation.harness import embed_images, embed_texts, load_clip
    from pipelines.training.clip import export_wise_ft

    vision, bert = towers
    config = longclip_config(["-"], str(tmp_path / "run"), 512, model=f"local-dir:{vision}", pretrained="",
                             text_model=str(bert))  # fmt: skip
    assembled = assemble_model(config, tmp_path / "base")
    base = load_file(str(tmp_path / "base" / WEIGHTS))
    trained = {k: v + 0.01 if v.is_floating_point() else v for k, v in base.items()}
    torch.save({"state_dict": {f"module.{k}": v for k, v in trained.items()}}, tmp_path / "epoch_1.pt")
    export = export_wise_ft(assembled, tmp_path / "epoch_1.pt", str(tmp_path / "model"))

    stock = subprocess.run(
        [sys.executable, "-c", f"import open_clip; open_clip.create_model_and_transforms('local-dir:{export}')"],
        capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert stock.returncode != 0 and "add_pooling_layer" in stock.stderr

    clip = load_clip(f"local-dir:{export}", name="bmc-longclip")
    texts = embed_texts(clip, [LONG, SHORT])
    assert texts.shape == (2, 32) and np.allclose(np.linalg.norm(texts, axis=1), 1.0, atol=1e-5)
    assert clip.tokenizer([LONG]).shape == (1, 512)  # the export's own tokenizer, 512 tokens
    images, ok = embed_images(clip, [IMAGES[0].read_bytes(), b"not an image"])
    assert images.shape == (1, 32) and ok.tolist() == [True, False]
    # the weights are the export's (alpha 1: the trained ones), not a fresh init
    key = "text.transformer.embeddings.tok_embeddings.weight"
    assert torch.equal(clip.model.state_dict()[key], trained[key])


# ------------------------------------------------------------------------------- real training


def test_longclip_trains_on_the_mixture_exports_and_resumes(towers, tmp_path):
    from safetensors.torch import load_file

    vision, bert = towers
    figures = write_subset(tmp_path / "r1" / "commercial", [SHORT, "line plot of survival over time"])
    longcap = write_subset(tmp_path / "r1" / "longcap-commercial", [LONG, LONG.replace("blue", "green")])
    run_dir = tmp_path / "runs" / "longclip"

    def config(epochs: int) -> ClipTrainConfig:
        return longclip_config(
            [str(figures), str(longcap)],
            str(run_dir),
            context_length=512,
            model=f"local-dir:{vision}",
            pretrained="",
            text_model=str(bert),
            upsampling_factors=[1.0, 1.0],
            train_num_samples=8,
            batch_size=4,
            gpus=0,
            lr=1e-4,
            warmup=1,
            epochs=epochs,
            workers=1,
            device="cpu",
            log_every_n_steps=1,
        )

    first = train(config(1))
    assert first["text_model"] == str(bert) and first["context_length"] == 512
    assert first["epochs"] == 1 and first["resumed_from_epoch"] is None and first["samples_per_epoch"] == 8
    assert "::" in first["train_data"]  # both subsets, as a mixture
    assert first["final_loss"] is not None and torch.isfinite(torch.tensor(first["final_loss"]))
    second = train(config(2))  # the same run dir: resumes from epoch 1 instead of starting over
    assert second["resumed_from_epoch"] == 1 and second["epochs_run"] == "1"
    assert torch.isfinite(torch.tensor(second["final_loss"]))
    with pytest.raises(ValueError, match="another model"):  # the same run dir with another context length
        train(replace(config(3), context_length=154))

    # the checkpoint reloads into the assembled base model; the export (alpha 1) is the checkpoint
    base = run_dir / "openclip" / "base-model"
    checkpoint = torch.load(Path(second["checkpoint"]), map_location="cpu", weights_only=False)
    assert checkpoint["epoch"] == 2
    model = open_clip.create_model(f"local-dir:{base}")
    model.load_state_dict(checkpoint["state_dict"])
    exported = load_file(str(run_dir / "model" / "open_clip_model.safetensors"))
    assert all(torch.equal(exported[k], v) for k, v in checkpoint["state_dict"].items())
    before = load_file(str(base / "open_clip_model.safetensors"))
    assert not torch.equal(before["text.proj.0.weight"], exported["text.proj.0.weight"])  # it trained

    # the exported folder is whole: model and tokenizer reload from it alone
    reloaded = open_clip.create_model(f"local-dir:{run_dir / 'model'}")
    tokens = open_clip.get_tokenizer(f"local-dir:{run_dir / 'model'}")([LONG])
    assert tokens.shape == (1, 512)
    assert torch.isfinite(reloaded.encode_text(tokens)).all()
    assert fsspec.filesystem("file").exists(str(run_dir / "model" / "tokenizer.json"))


# ------------------------------------------------------------------------------- the asset's recipe


def test_the_clip_asset_selects_bmc_longclip_as_a_recipe():
    from dagster import Failure

    from assets.training import ClipTrainingSettings, clip_job

    dirs = ["/lake/dataset/r1/commercial", "/lake/dataset/r1/longcap-commercial"]
    job = clip_job(ClipTrainingSettings(recipe="bmc-longclip", context_length=154), dirs)
    assert job == {
        "train_data": dirs,
        "upsampling_factors": None,
        "dataset_resampled": True,
        "epochs": 20,
        "model": "ViT-L-14-quickgelu",
        "pretrained": "dfn2b",
        "batch_size": 1024,
        "accum_freq": 1,
        "lr": 5e-4,
        "warmup": 1000,
        "precision": "fp32",
        "workers": 8,
        "device": "cuda",
        "grad_checkpointing": True,
        "wise_ft_alpha": 1.0,
        "text_model": "thomas-sounack/BioClinical-ModernBERT-base",
        "context_length": 154,
        "log_every_n_steps": 50,
        "seed": 0,
        "gpu_memory_gb": 80.0,
    }
    ClipTrainConfig.from_dict({**job, "run_dir": "/lake/runs/x"}).validate()  # the launched module accepts it
    # a setting changed from its default is kept; the BIOMEDICA recipe has no text tower
    changed = clip_job(ClipTrainingSettings(recipe="bmc-longclip", lr=1e-4, epochs=3), dirs)
    assert (changed["lr"], changed["epochs"], changed["context_length"]) == (1e-4, 3, 512)
    assert "text_model" not in clip_job(ClipTrainingSettings(), dirs[:1])
    with pytest.raises(Failure, match="context_length"):
        clip_job(ClipTrainingSettings(recipe="bmc-longclip", context_length=100), dirs)
