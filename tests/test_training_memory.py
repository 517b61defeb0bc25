"""The GPU memory arithmetic of a CLIP training step (``pipelines/training/memory.py``): hand-computed
numbers for a tiny tower and for BIOMEDICA's ViT-L-14 recipe, the per-block activation count checked
against the tensors PyTorch really saves, and the refusal that names the setting to change."""

import json

import pytest
import torch

from pipelines.training import memory
from pipelines.training.clip import ClipTrainConfig, architecture, check_memory, train
from pipelines.training.memory import Architecture, Tower

GB = 1e9
VIT_L14 = {  # open_clip/model_configs/ViT-L-14.json
    "embed_dim": 768,
    "vision_cfg": {"image_size": 224, "layers": 24, "width": 1024, "patch_size": 14},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 768, "heads": 12, "layers": 12},
}


def test_a_tiny_towers_activations_by_hand():
    """5 tokens, width 8, MLP 32, 2 heads, 2 layers, a stem of 40 elements, fp32. One block:
    (8·5·8 + 2·5·32) elements = 640, x 4 bytes = 2560, + log-sum-exp and LayerNorm statistics
    5·(2 + 4)·4 = 120: 2680. Stem: 40·4 = 160. Without checkpointing: 2·2680 + 160 = 5520. With:
    the block inputs 2·5·8·4 = 320, the gradients in flight 2·5·8·4 = 320, one block 2680, the
    stem 160: 3480."""
    tower = Tower(tokens=5, width=8, layers=2, heads=2, mlp=32, stem=40)
    assert tower.block_bytes("fp32") == 2680
    assert tower.activation_bytes("fp32", grad_checkpointing=False) == 5520
    assert tower.activation_bytes("fp32", grad_checkpointing=True) == 3480
    # amp: the two LayerNorm inputs in fp32 (2·5·8·4 = 320), the rest in 16 bits ((6·5·8 + 2·5·32)·2 = 1120) + 120
    assert tower.block_bytes("amp_bf16") == 1560


def test_the_batch_that_fits_by_hand():
    """Both towers the tiny one (5520 bytes per sample each without checkpointing), 100
    parameters, embedding 4, 10 input bytes, one GPU: total(b) = 100·16 + 11040·b + 10·b
    (inputs) + (b + b)·4·2·4 (features) + 2·b·b·4·3 (logits) = 1600 + 11114·b + 24·b².
    On 80,000 bytes less 10% (72,000): b = 6 gives 69,148 (fits), b = 7 gives 80,574 (does not)."""
    tower = Tower(tokens=5, width=8, layers=2, heads=2, mlp=32, stem=40)
    arch = Architecture("tiny", tower, tower, params=100, embed_dim=4, input_bytes=10)
    assert memory.estimate(arch, 6, grad_checkpointing=False).total == 69_148
    assert memory.estimate(arch, 7, grad_checkpointing=False).total == 80_574
    assert memory.max_batch(arch, 80_000, grad_checkpointing=False) == 6
    memory.check_batch(arch, 6, 80_000, grad_checkpointing=False)
    with pytest.raises(ValueError, match="lower batch_size to 6 or less") as refused:
        memory.check_batch(arch, 7, 80_000, grad_checkpointing=False)
    assert "grad_checkpointing: true" in str(refused.value)


def test_vit_l14_parameters_by_hand():
    """Vision: patch embedding 3·14²·1024 = 602,112, class 1024, positions 257·1024 = 263,168,
    ln_pre + ln_post 4096, 24 blocks of 4·1024² + 2·1024·4096 + 9·1024 + 4096 = 12,596,224
    (302,309,376), projection 1024·768 = 786,432: 303,966,208. Text: tokens 49408·768 =
    37,945,344, positions 77·768 = 59,136, 12 blocks of 4·768² + 2·768·3072 + 9·768 + 3072 =
    7,087,872 (85,054,464), ln_final 1536, projection 589,824: 123,650,304. Plus the logit scale:
    427,616,513, the count OpenCLIP's own model has."""
    import open_clip

    arch = memory.open_clip_architecture("ViT-L-14", VIT_L14)
    assert arch.params == 427_616_513
    assert (arch.vision.tokens, arch.vision.heads, arch.vision.mlp) == (257, 16, 4096)
    with torch.device("meta"):
        real = open_clip.create_model("ViT-L-14", device="meta")
    assert sum(p.numel() for p in real.parameters()) == arch.params


def test_biomedicas_recipe_fits_80_gb_only_with_gradient_checkpointing():
    """ViT-L-14, fp32, 1024 per GPU, 4 GPUs, 2 accumulation steps, local loss.
    Per sample with checkpointing: image tower block inputs 24·257·1024·4 = 25,264,128, stem
    (3·224·224 + 3·257·1024)·4 = 3,760,128, in flight 2·257·1024·4 = 2,105,344; text tower
    12·77·768·4 = 2,838,528, stem (77·768 + 768)·4 = 239,616, in flight 473,088; one image
    block (8·257·1024 + 2·257·4096)·4 + 257·20·4 = 16,863,312: 51,544,144. Activations 1024 x
    that = 52,781,203,456. Model states 427,616,513 x (16 + 4 for DDP's buckets) = 8,552,330,260.
    Inputs 2·1024·(3·224·224·4 + 77·8) = 1,234,386,944, features (2048 + 4096)·768·8 =
    37,748,736, logits 2·1024·4096·4·3 = 100,663,296. Total 62,706,332,692 bytes, under 80 GB
    less 10%. Without checkpointing a sample is 24·16,863,312 + 3,760,128 + 12·3,789,632 +
    239,616 = 454,194,816 bytes (a text block: (8·77·768 + 2·77·3072)·4 + 77·16·4): 465 GB for 1024."""
    arch = memory.open_clip_architecture("ViT-L-14", VIT_L14)
    recipe = dict(precision="fp32", gpus=4, accum_freq=2, local_loss=True)
    with_ckpt = memory.estimate(arch, 1024, grad_checkpointing=True, **recipe)
    assert with_ckpt.per_sample == 51_544_144
    assert with_ckpt.model_states == 8_552_330_260
    assert with_ckpt.total == 62_706_332_692
    memory.check_batch(arch, 1024, 80 * GB, grad_checkpointing=True, **recipe)
    without = memory.estimate(arch, 1024, grad_checkpointing=False, **recipe)
    assert without.per_sample == 454_194_816
    with pytest.raises(ValueError, match="grad_checkpointing: true") as refused:
        memory.check_batch(arch, 1024, 80 * GB, grad_checkpointing=False, **recipe)
    assert "batch_size 1024 per GPU does not fit" in str(refused.value)
    assert "lower batch_size to" in str(refused.value) and "raise accum_freq" in str(refused.value)


def _saved_bytes(module: torch.nn.Module, run) -> int:
    """Bytes of the distinct non-parameter tensors autograd saves while ``run`` runs."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values())


def test_the_block_count_is_what_pytorch_saves():
    """The per-block formula against the tensors autograd really keeps for OpenCLIP's
    ``ResidualAttentionBlock`` (fp32, 2 samples): equal to the byte. The whole image tower within
    0.5% (the stem's count leaves out ln_pre's and ln_post's statistics, 4·s floats)."""
    import open_clip

    cfg = {"image_size": 64, "layers": 2, "width": 64, "head_width": 16, "patch_size": 16}
    clip_cfg = {"embed_dim": 32, "vision_cfg": cfg, "text_cfg": {"context_length": 16, "width": 64, "heads": 4}}
    tower = memory.open_clip_architecture("small", clip_cfg).vision
    visual = open_clip.model._build_vision_tower(32, cfg).train()
    x = torch.randn(2, tower.tokens, tower.width, requires_grad=True)
    block = visual.transformer.resblocks[0]
    assert _saved_bytes(block, lambda: block(x)) == 2 * tower.block_bytes("fp32")
    whole = _saved_bytes(visual, lambda: visual(torch.randn(2, 3, 64, 64)))
    assert whole / 2 == pytest.approx(tower.activation_bytes("fp32", False), rel=0.005)


def test_the_job_refuses_a_batch_that_cannot_fit_before_it_starts(tmp_path, monkeypatch, no_network):
    """The launched job checks before any weights are fetched or the trainer starts: ViT-L-14 at
    1024 per GPU without checkpointing on an 80 GB GPU fails naming the settings (online mode, so
    the weights check lets the uncached tag pass: OpenCLIP would fetch it; no socket is opened)."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    (tmp_path / "sizes.json").write_text(json.dumps({"panelforge-000000.tar": 4}))
    config = ClipTrainConfig(
        train_data=[str(tmp_path)], run_dir=str(tmp_path / "run"), grad_checkpointing=False, gpu_memory_gb=80
    )
    assert architecture(config).params == 427_616_513
    with pytest.raises(ValueError, match="set grad_checkpointing: true"):
        train(config)
    assert not (tmp_path / "run" / "openclip").exists() and no_network == []
    assert check_memory(ClipTrainConfig(train_data=["-"], run_dir="-"), 80 * GB).total == 62_706_332_692


def test_the_asset_refuses_a_batch_that_cannot_fit_before_launching():
    """The asset's check (before any GPU job is launched) against ``gpu_memory_gb``, which the
    job checks again: BIOMEDICA's recipe fits 80 GB; without checkpointing it is refused with the
    settings to change; 0 turns the check off, 141 GB (an H200) fits more."""
    from types import SimpleNamespace

    from dagster import Failure

    from assets.training import ClipTrainingSettings, check_clip_job, clip_job

    launcher = SimpleNamespace(backend="ray", gpus=4)  # weights are checked on the job's own machine
    dirs = ["/lake/dataset/r1/commercial"]
    recipe = ClipTrainingSettings()
    job = clip_job(recipe, dirs)
    assert job["gpu_memory_gb"] == 80.0 and job["grad_checkpointing"] is True
    check_clip_job(job, recipe, launcher)
    plain = ClipTrainingSettings(grad_checkpointing=False)
    with pytest.raises(Failure, match="batch_size 1024 per GPU does not fit.*set grad_checkpointing: true"):
        check_clip_job(clip_job(plain, dirs), plain, launcher)
    off = ClipTrainingSettings(grad_checkpointing=False, gpu_memory_gb=0)
    check_clip_job(clip_job(off, dirs), off, launcher)
    big = ClipTrainingSettings(batch_size=1300, gpu_memory_gb=141)
    check_clip_job(clip_job(big, dirs), big, launcher)
    with pytest.raises(Failure, match="lower batch_size to 1199 or less"):
        small = ClipTrainingSettings(batch_size=1300)
        check_clip_job(clip_job(small, dirs), small, launcher)
