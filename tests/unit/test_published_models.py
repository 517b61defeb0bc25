"""The production models from copies of their published configs (``tests/data/published``), loaded
through our own loaders with sockets blocked: Qwen2.5-VL-7B-Instruct through the transformers
backend and OpenCLIP's ViT-L-14 through the evaluation harness and the multi-level trainer, both in
the same config format at reduced size (real size does not fit a CPU test; ``make gpu-check``
builds them at real size). DINOv2 is in ``test_dinov2_weights.py``, the DC5 DAB-DETR in
``test_detector_published.py``. Also the one-line errors of a wrong or missing VLM, CLIP and
tokenizer path, at set-up and before any engine or job starts."""

from __future__ import annotations

import json
from pathlib import Path

import huggingface_hub.constants
import numpy as np
import pytest
import torch
from PIL import Image

from pipelines.compute.weights import ModelUnavailableError
from pipelines.training.clip import COMMONPOOL, check_weights
from pipelines.vlm.engine import VlmRequest
from resources.vlm import VlmEngineResource
from testing.loopback.sample_mirror import SAMPLE_DIR
from testing.published import QWEN_REDUCED, QWEN_REDUCED_VISION, published_config, reduced, write_qwen2_5_vl

FIGURE = SAMPLE_DIR / "articles" / "elife-46472" / "fig1.jpg"
BAND = {"min_pixels": 64 * 28 * 28, "max_pixels": 128 * 28 * 28, "dtype": "float32", "device": "cpu"}


@pytest.fixture(params=[True, False], ids=["offline", "online"])
def offline(request, monkeypatch) -> bool:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", request.param)
    return request.param


@pytest.fixture(scope="module")
def qwen7b(tmp_path_factory) -> Path:
    """Qwen2.5-VL-7B-Instruct's config with every key kept and the sizes reduced (hidden 64,
    2 + 2 layers, mrope sections 2/3/3 for head dim 16); the vocabulary stays 152,064."""
    config = reduced(published_config("qwen2.5-vl-7b-instruct"), QWEN_REDUCED, QWEN_REDUCED_VISION, [2, 3, 3])
    return write_qwen2_5_vl(tmp_path_factory.mktemp("qwen") / "Qwen2.5-VL-7B-Instruct", config)


def test_the_reduced_config_keeps_every_published_key():
    published = published_config("qwen2.5-vl-7b-instruct")
    small = reduced(published, QWEN_REDUCED, QWEN_REDUCED_VISION, [2, 3, 3])
    assert small.keys() == published.keys() and small["vision_config"].keys() == published["vision_config"].keys()
    assert (small["vocab_size"], small["model_type"], small["rope_scaling"]["type"]) == (152064, "qwen2_5_vl", "mrope")
    with pytest.raises(KeyError, match="num_layers"):
        reduced(published, {"num_layers": 2})


def test_qwen2_5_vl_7b_format_loads_through_the_transformers_backend(qwen7b, offline, no_network):
    """Through the resource, as the mining assets start it: the weights are checked, the
    engine loads the published format and answers a request on a real figure."""
    resource = VlmEngineResource(backend="transformers", model=str(qwen7b), **BAND)
    with resource.engine() as engine:
        model = engine.model
        assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
        assert model.config.text_config.vocab_size == 152064 and model.config.vision_config.depth == 2
        (answer,) = engine.generate([VlmRequest("fig1", "Describe the figure.", [Image.open(FIGURE)], max_tokens=4)])
    assert answer.error is None and answer.completion_tokens <= 4
    assert no_network == []


def test_a_missing_vlm_folder_fails_in_one_line_before_any_engine(tmp_path, offline, no_network):
    missing = tmp_path / "models" / "Qwen2.5-VL-7B-Instruct"
    for backend in ("transformers", "ray"):
        with pytest.raises(ModelUnavailableError) as failed:
            VlmEngineResource(backend=backend, model=str(missing)).engine()
        text = str(failed.value)
        assert "\n" not in text and text.startswith(f"PANELFORGE_VLM_MODEL='{missing}' (the vision-language model)")
        assert f"`hf download Qwen/Qwen2.5-VL-7B-Instruct --local-dir {missing}`" in text
        assert ("offline mode is on" in text) is offline
    assert no_network == []


def test_a_vlm_hub_id_not_cached_offline_fails_in_one_line(tmp_path, monkeypatch, no_network):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelUnavailableError) as failed:
        VlmEngineResource(backend="ray", model="Qwen/Qwen2.5-VL-3B-Instruct").engine()
    text = str(failed.value)
    assert "not in the Hugging Face cache" in text and "offline mode is on" in text
    fetch = "`hf download Qwen/Qwen2.5-VL-3B-Instruct --local-dir <folder>` and set PANELFORGE_VLM_MODEL=<folder>"
    assert fetch in text
    assert no_network == []


# ------------------------------------------------------------------------------- OpenCLIP ViT-L-14


@pytest.fixture(scope="module")
def vit_l14(tmp_path_factory) -> Path:
    """OpenCLIP's ViT-L-14.json with its keys kept and the widths and depths reduced, weights
    beside it: a ``local-dir:`` model, as a training run exports one."""
    from pipelines.training.tiny import write_tiny_clip

    cfg = json.loads((Path(__file__).parents[1] / "data" / "published" / "open_clip-ViT-L-14.json").read_text())
    cfg["embed_dim"] = 32
    cfg["vision_cfg"].update(layers=2, width=64)  # head_width stays OpenCLIP's 64: one head
    cfg["text_cfg"].update(width=64, heads=2, layers=2)
    return write_tiny_clip(tmp_path_factory.mktemp("clip") / "ViT-L-14", model_cfg=cfg)


def test_vit_l14_format_loads_through_the_harness_and_the_trainer(vit_l14, offline, no_network, tmp_path):
    from pipelines.evaluation.harness import embed_images, embed_texts, load_clip
    from pipelines.training.multilevel import MultilevelConfig, Trainer

    check_weights(f"local-dir:{vit_l14}", COMMONPOOL)  # a local-dir: model ignores the tag
    clip = load_clip(f"local-dir:{vit_l14}")
    images, ok = embed_images(clip, [FIGURE.read_bytes()])
    assert images.shape == (1, 32) and ok.all() and clip.tokenizer(["a cell"]).shape == (1, 77)
    assert np.isfinite(embed_texts(clip, ["stained cells"])).all()
    config = MultilevelConfig.from_dict({"run_dir": str(tmp_path), "preset": "zoom-in", "model": f"local-dir:{vit_l14}",
                                         "device": "cpu", "figure_data": ["f"], "panel_data": ["p"],
                                         "region_data": ["r"]})  # fmt: skip
    trainer = Trainer(config)
    assert trainer.params["trainable"] > 0 and trainer.params["frozen"] > 0  # text tower frozen: trained weights
    assert torch.equal(trainer.model.state_dict()["visual.proj"], clip.model.state_dict()["visual.proj"])
    assert no_network == []


def test_clip_weights_that_are_not_at_hand_fail_in_one_line(tmp_path, monkeypatch, no_network):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelUnavailableError) as failed:
        check_weights("ViT-L-14", COMMONPOOL)
    text = str(failed.value)
    assert "\n" not in text and text.startswith("pretrained='commonpool_xl_clip_s13b_b90k' (ViT-L-14 weights)")
    assert "`hf download laion/CLIP-ViT-L-14-CommonPool.XL.clip-s13B-b90K --local-dir <folder>`" in text
    assert "offline mode is on" in text
    with pytest.raises(ModelUnavailableError, match=r"model='local-dir:/nowhere/model': no open_clip_config.json"):
        check_weights("local-dir:/nowhere/model", "")
    with pytest.raises(ValueError, match="not an OpenCLIP weight tag of ViT-L-14"):
        check_weights("ViT-L-14", "commonpool_xl_s13b_b9k")
    with pytest.raises(ModelUnavailableError, match="no such file"):
        check_weights("ViT-L-14", str(tmp_path / "bmc_clip.pt"))
    assert no_network == []


def test_the_clip_asset_refuses_missing_weights_before_launching(tmp_path, no_network):
    from dagster import DagsterInstance

    from assets.training import clip_continual_pretraining
    from pipelines.core.lake import Lake
    from resources.compute import ModelsResource
    from resources.lake import LakeResource
    from resources.launcher import JobLauncherResource
    from tests.helpers import materialize_one

    home = tmp_path / "lake"
    subset = Path(Lake(str(home)).path("dataset", "r1", "commercial"))
    subset.mkdir(parents=True)
    (subset / "sizes.json").write_text(json.dumps({"panelforge-000000.tar": 4}))
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("releases", ["r1"])
    resources = {"lake": LakeResource(home=str(home)), "models": ModelsResource(),
                 "launcher": JobLauncherResource(backend="subprocess")}  # fmt: skip
    result = materialize_one(clip_continual_pretraining, "r1", instance, resources,
                             {"model": f"local-dir:{tmp_path / 'gone'}"}, raise_on_error=False)  # fmt: skip
    assert not result.success
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    message = failure.event_specific_data.error.message
    assert f"model='local-dir:{tmp_path / 'gone'}': no open_clip_config.json" in message
    assert not (home / "models" / "clip" / "runs").exists()  # nothing was launched


def test_a_missing_tokenizer_fails_in_one_line(tmp_path, offline):
    from pipelines.longcap.tokens import TokenizerUnavailableError, load_tokenizer

    missing = tmp_path / "BioClinical-ModernBERT-base"
    with pytest.raises(TokenizerUnavailableError) as failed:
        load_tokenizer(f"hf:{missing}", 512)
    text = str(failed.value)
    assert "\n" not in text and text.startswith(f"PANELFORGE_TEXT_TOKENIZER='hf:{missing}'")
    assert f"`hf download thomas-sounack/BioClinical-ModernBERT-base --local-dir {missing}`" in text
    assert ("offline mode is on" in text) is offline
