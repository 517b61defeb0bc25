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
    (9·5·8 + 2·5·32) elements = 680, x 4 bytes = 2720, + the log-sum-exp, 5 tokens padded to 32,
    2·32·4 = 256, and LayerNorm statistics 4·5·4 = 80: 3056. Stem: 40·4 = 160. Without
    checkpointing: 2·3056 + 160 = 6272. With: the block inputs 2·5·8·4 = 320, the gradients in
    flight 2·5·8·4 = 320, one block 3056, the stem 160: 3856."""
    tower = Tower(tokens=5, width=8, layers=2, heads=2, mlp=32, stem=40)
    assert tower.block_bytes("fp32") == 3056
    assert tower.activation_bytes("fp32", grad_checkpointing=False) == 6272
    assert tower.activation_bytes("fp32", grad_checkpointing=True) == 3856
    # amp: the two LayerNorm inputs in fp32 (2·5·8·4 = 320), the rest in 16 bits ((7·5·8 + 2·5·32)·2 = 1200) + 336
    assert tower.block_bytes("amp_bf16") == 1856


def test_the_batch_that_fits_by_hand():
    """Both towers the tiny one (6272 bytes per sample each without checkpointing), 100
    parameters, embedding 4, 10 input bytes, one GPU: total(b) = 100·16 + 12544·b + 10·b
    (inputs) + (b + b)·4·2·4 (features) + 2·b·b·4·3 (logits) = 1600 + 12618·b + 24·b².
    On 80,000 bytes less 10% (72,000): b = 5 gives 65,290 (fits), b = 6 gives 78,172 (does not)."""
    tower = Tower(tokens=5, width=8, layers=2, heads=2, mlp=32, stem=40)
    arch = Architecture("tiny", tower, tower, params=100, embed_dim=4, input_bytes=10)
    assert memory.estimate(arch, 5, grad_checkpointing=False).total == 65_290
    assert memory.estimate(arch, 6, grad_checkpointing=False).total == 78_172
    assert memory.max_batch(arch, 80_000, grad_checkpointing=False) == 5
    memory.check_batch(arch, 5, 80_000, grad_checkpointing=False)
    with pytest.raises(ValueError, match="lower batch_size to 5 or less") as refused:
        memory.check_batch(arch, 6, 80_000, grad_checkpointing=False)
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
    block (9·257·1024 + 2·257·4096)·4 + (16·288 + 4·257)·4 = 17,917,968 (257 tokens padded to
    288 for the log-sum-exp): 52,598,800. Activations 1024 x that = 53,861,171,200. Model
    states 427,616,513 x (16 + 4 for DDP's buckets) = 8,552,330,260. Inputs 2·1024·(3·224·224·4
    + 77·8) = 1,234,386,944, features (2048 + 4096)·768·8 = 37,748,736, logits 2·1024·4096·4·3
    = 100,663,296. Total 63,786,300,436 bytes, under 80 GB less 10%. Without checkpointing a
    sample is 24·17,917,968 + 3,760,128 + 12·4,027,088 + 239,616 = 482,356,032 bytes (a text
    block: (9·77·768 + 2·77·3072)·4 + (12·96 + 4·77)·4): 494 GB for 1024."""
    arch = memory.open_clip_architecture("ViT-L-14", VIT_L14)
    recipe = dict(precision="fp32", gpus=4, accum_freq=2, local_loss=True)
    with_ckpt = memory.estimate(arch, 1024, grad_checkpointing=True, **recipe)
    assert with_ckpt.per_sample == 52_598_800
    assert with_ckpt.model_states == 8_552_330_260
    assert with_ckpt.total == 63_786_300_436
    memory.check_batch(arch, 1024, 80 * GB, grad_checkpointing=True, **recipe)
    without = memory.estimate(arch, 1024, grad_checkpointing=False, **recipe)
    assert without.per_sample == 482_356_032
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
    ``ResidualAttentionBlock`` (fp32, 2 samples). The formula counts what CUDA saves (measured on
    an H100 with ViT-B-16: the image tower to within 0.01%, the text tower 0.1%); on CPU a block
    keeps, to the byte, one s·w tensor less (the output projection's input is the attention
    output itself there) and an unpadded log-sum-exp: 17 tokens x 64 wide x 4 bytes = 4352 and
    4 heads x (32 - 17) x 4 = 240 less, 4592. The whole image tower within 0.5% of the formula
    less that per block (the stem's count leaves out ln_pre's and ln_post's statistics, 4·s floats)."""
    import open_clip

    cfg = {"image_size": 64, "layers": 2, "width": 64, "head_width": 16, "patch_size": 16}
    clip_cfg = {"embed_dim": 32, "vision_cfg": cfg, "text_cfg": {"context_length": 16, "width": 64, "heads": 4}}
    tower = memory.open_clip_architecture("small", clip_cfg).vision
    assert (tower.tokens, tower.width, tower.heads) == (17, 64, 4)
    visual = open_clip.model._build_vision_tower(32, cfg).train()
    x = torch.randn(2, tower.tokens, tower.width, requires_grad=True)
    block = visual.transformer.resblocks[0]
    cpu_less = 4592
    assert _saved_bytes(block, lambda: block(x)) == 2 * (tower.block_bytes("fp32") - cpu_less)
    whole = _saved_bytes(visual, lambda: visual(torch.randn(2, 3, 64, 64)))
    assert whole / 2 == pytest.approx(tower.activation_bytes("fp32", False) - 2 * cpu_less, rel=0.005)


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
    assert check_memory(ClipTrainConfig(train_data=["-"], run_dir="-"), 80 * GB).total == 63_786_300_436


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
    with pytest.raises(Failure, match="lower batch_size to 1175 or less"):
        small = ClipTrainingSettings(batch_size=1300)
        check_clip_job(clip_job(small, dirs), small, launcher)
