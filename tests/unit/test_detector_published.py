"""The panel detector from a checkpoint in its published format, loaded through our own loader
with sockets blocked: Open-PMC-18M's config as transformers 4.x saved it (two classes
{0: nothing, 1: subfigure}, ``"backbone": "resnet50"`` + ``backbone_kwargs`` with output stride
16, DC5) with random weights, at real size (ResNet-50 DC5, 300 queries, 6 + 6 layers: 43.6M
parameters, 175 MB) and, for the many cases, the same format at reduced size (timm's
``test_resnet``, still DC5). Also the one-line errors of a wrong or missing model path, and the
set-up check that gives them before any Ray worker starts."""

import json
import shutil
from pathlib import Path

import huggingface_hub.constants
import numpy as np
import pytest
import torch
from dagster import Failure
from PIL import Image
from safetensors.torch import load_file, save_file

from pipelines.compute.weights import ModelUnavailableError
from pipelines.panels.detector import (
    Classes,
    Detector,
    DetectorConfig,
    build_model,
    check_weights,
    model_config,
    prepare_image,
    to_original,
    to_tensors,
)
from resources.compute import ModelsResource
from testing.loopback.sample_mirror import SAMPLE_DIR
from tests.panel_fixtures import PUBLISHED, REDUCED, write_checkpoint

FIGURE = SAMPLE_DIR / "articles" / "elife-46472" / "fig1.jpg"  # 600 x 994


@pytest.fixture(scope="module")
def reduced(tmp_path_factory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("reduced") / "pmc-18m-dab-detr"
    model = write_checkpoint(folder, REDUCED)
    return folder, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def real_size(tmp_path_factory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("real") / "pmc-18m-dab-detr"
    model = write_checkpoint(folder, PUBLISHED)
    return folder, model.state_dict()


@pytest.fixture(params=[True, False], ids=["offline", "online"])
def offline(request, monkeypatch) -> bool:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", request.param)
    return request.param


def _same_weights(model, state: dict) -> bool:
    loaded = model.state_dict()
    return loaded.keys() == state.keys() and all(torch.equal(loaded[k], state[k]) for k in state)


def test_transformers_alone_asks_the_hub_for_the_backbone_of_a_4x_config(offline, no_network):
    """Why the config is rewritten: transformers 5.23 reads ``"backbone": "resnet50"`` by asking
    the hub whether ``resnet50`` is a repository: a connection error, or offline the hub's
    "offline mode is enabled" (an ``OSError``, which a loader would take for missing weights)."""
    from transformers import DabDetrConfig

    with pytest.raises(Exception, match="offline mode is enabled" if offline else None) as exc:
        DabDetrConfig.from_dict(dict(PUBLISHED))
    assert isinstance(exc.value, OSError) or not offline
    assert bool(no_network) is not offline  # online, it tried to connect


def test_a_4x_config_becomes_an_explicit_timm_backbone_with_its_stride(no_network):
    config = model_config(PUBLISHED)
    backbone = config.backbone_config
    assert (backbone.model_type, backbone.backbone, backbone.num_channels) == ("timm_backbone", "resnet50", 3)
    assert backbone.out_indices == [1, 2, 3, 4] and backbone.output_stride == 16  # DC5 kept
    assert config.id2label == {0: "nothing", 1: "subfigure"} and config.num_queries == 300
    assert not hasattr(config, "backbone_kwargs") or not config.backbone_kwargs
    # 4.x filled backbone_kwargs from `dilation` when none were given
    bare = {k: v for k, v in PUBLISHED.items() if k != "backbone_kwargs"}
    assert model_config(bare).backbone_config.output_stride == 16
    assert model_config({**bare, "dilation": False}).backbone_config.output_stride is None
    with pytest.raises(ValueError, match=r"\['drop_rate'\]"):
        model_config({**PUBLISHED, "backbone_kwargs": {**PUBLISHED["backbone_kwargs"], "drop_rate": 0.1}})
    assert no_network == []


def test_the_published_checkpoint_loads_at_real_size_without_the_network(real_size, monkeypatch, no_network):
    """Online mode (offline mode is checked at reduced size), so any hub call would show up as
    an attempt to connect."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    folder, state = real_size
    config = DetectorConfig(model=str(folder), input_size=256, threshold=0.0, max_panels=10)
    check_weights(config)
    detector = Detector(config)
    assert detector.classes == Classes(panel=1)  # "subfigure" is class 1; class 0 "nothing" is never read
    assert sum(p.numel() for p in detector.model.parameters()) == pytest.approx(43.6e6, rel=0.01)
    assert _same_weights(detector.model, state)
    # DC5: a 256 x 256 input gives a 16 x 16 last feature map (stride 16, not 32)
    encoder = detector.model.model.backbone.conv_encoder
    features = encoder(torch.zeros(1, 3, 256, 256), torch.ones(1, 256, 256, dtype=torch.long))
    assert features[-1][0].shape[-2:] == (16, 16)
    image = Image.open(FIGURE).convert("RGB")
    (found,) = detector.detect([image])
    assert len(found.panels) == 10 and found.label_boxes == []
    assert all(0 <= p.box[0] < p.box[2] <= 600 and 0 <= p.box[1] < p.box[3] <= 994 for p in found.panels)
    assert no_network == []


def test_a_padded_input_gives_the_boxes_of_the_visible_image_alone(real_size):
    """The premise of the box frame, on the production architecture: the 600 x 994 figure at
    input 256 is 155 x 256 pixels padded to 256 x 256. With the mask, the model predicts the same
    normalised boxes as on the 155 x 256 image alone, so a box maps to the figure by its own width
    and height: x = cx * 600, y = cy * 994. The box head is given random weights first (trained
    weights would; a fresh DAB-DETR's last box layer is zero, which makes every box the same
    whatever the image)."""
    folder, _ = real_size
    config = DetectorConfig(model=str(folder), input_size=256)
    model = build_model(config)
    with torch.no_grad():
        last = model.bbox_predictor.layers[-1].weight
        last.copy_(torch.randn(last.shape, generator=torch.Generator().manual_seed(1)) * 0.5)
    image = Image.open(FIGURE).convert("RGB")
    pixels, frame = prepare_image(image, 256)
    assert frame.resized == (155, 256)
    values, mask = to_tensors(pixels[None], [frame])
    with torch.no_grad():
        padded = model(pixel_values=values, pixel_mask=mask).pred_boxes[0].numpy()
        alone = model(pixel_values=values[:, :, :256, :155].contiguous()).pred_boxes[0].numpy()
        other = model(pixel_values=torch.randn(1, 3, 256, 155)).pred_boxes[0].numpy()
    assert np.abs(padded - alone).max() < 1e-4 < np.abs(alone - other).max()
    cx, cy, w, h = alone.T.astype(np.float64)
    by_hand = np.stack([(cx - w / 2) * 600, (cy - h / 2) * 994, (cx + w / 2) * 600, (cy + h / 2) * 994], 1)
    assert np.abs(to_original(padded, frame) - by_hand).max() < 0.2  # pixels


def test_a_reduced_checkpoint_loads_from_a_folder_without_the_network(reduced, offline, no_network):
    folder, state = reduced
    detector = Detector(DetectorConfig(model=str(folder), input_size=128, threshold=0.0, max_panels=5))
    assert detector.classes == Classes(panel=1) and _same_weights(detector.model, state)
    assert detector.model.config.backbone_config.output_stride == 16
    assert no_network == []


def test_a_cached_hub_id_loads_without_the_network(reduced, tmp_path, monkeypatch, offline, no_network):
    """A hub id found in the Hugging Face cache (the layout ``hf download`` without
    ``--local-dir`` leaves: refs/main -> snapshots/<commit>/)."""
    folder, state = reduced
    hub = tmp_path / "hub"
    repo = hub / "models--vector-institute--pmc-18m-dab-detr"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(folder, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    check_weights(DetectorConfig())
    detector = Detector(DetectorConfig(input_size=128))
    assert detector.classes == Classes(panel=1) and _same_weights(detector.model, state)
    assert no_network == []


def test_weights_that_do_not_fit_the_config_are_an_error(reduced, tmp_path, no_network):
    folder, _ = reduced
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    tensors = load_file(broken / "model.safetensors")
    del tensors["class_embed.weight"]
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"PANELFORGE_PANEL_DETECTOR=.*weights do not fit.*class_embed\.weight"):
        build_model(DetectorConfig(model=str(broken)))


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_a_missing_folder_fails_in_one_line(tmp_path, offline, no_network):
    path = tmp_path / "weights" / "dab-detr"
    for load in (check_weights, build_model):
        with pytest.raises(ModelUnavailableError) as exc:
            load(DetectorConfig(model=str(path)))
        text = _one_line(exc)
        assert text.startswith(f"PANELFORGE_PANEL_DETECTOR={str(path)!r} (panel detector, DAB-DETR): no such folder")
        assert f"`hf download vector-institute/pmc-18m-dab-detr --local-dir {path}`" in text
        assert ("offline mode is on" in text) is offline
    assert no_network == []  # a path is never looked up on the hub


def test_a_folder_without_weights_or_config_fails_in_one_line(reduced, tmp_path, offline, no_network):
    folder, _ = reduced
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelUnavailableError, match="the folder has no config.json") as exc:
        check_weights(DetectorConfig(model=str(empty)))
    assert f"--local-dir {empty}`" in _one_line(exc)
    (empty / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(ModelUnavailableError, match=r"the folder has no weights \(model.safetensors or pytorch_model"):
        build_model(DetectorConfig(model=str(empty)))
    (empty / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    (empty / "config.json").write_text(json.dumps({"model_type": "dinov2"}))
    with pytest.raises(ValueError, match="is not a usable DAB-DETR config: model_type is 'dinov2'"):
        check_weights(DetectorConfig(model=str(empty)))
    assert no_network == []


def test_a_hub_id_not_in_the_cache_offline_fails_in_one_line(tmp_path, monkeypatch, no_network):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelUnavailableError) as exc:
        check_weights(DetectorConfig(revision="v1"))
    text = _one_line(exc)
    assert "PANELFORGE_PANEL_DETECTOR='vector-institute/pmc-18m-dab-detr'" in text
    assert "not in the Hugging Face cache" in text and "offline mode is on" in text
    assert "`hf download vector-institute/pmc-18m-dab-detr --revision v1 --local-dir <folder>`" in text
    assert no_network == []


def test_the_resource_checks_the_weights_when_the_stage_is_built(reduced, tmp_path, offline, no_network):
    """``ModelsResource.detector_config`` (called by the ``panels`` and ``panel_detector`` assets
    before they build their stage or launch a job) fails as a Dagster ``Failure`` with the one
    line, and no retry; a synthetic model or ``check=False`` is not checked."""
    folder, _ = reduced
    missing = tmp_path / "nowhere"
    with pytest.raises(Failure) as exc:
        ModelsResource(panel_detector=str(missing)).detector_config()
    assert exc.value.description.startswith(f"PANELFORGE_PANEL_DETECTOR={str(missing)!r}")
    assert "\n" not in exc.value.description and exc.value.allow_retries is False
    with pytest.raises(Failure, match="no panel-label class"):
        ModelsResource(panel_detector=str(folder), panel_labels=2).detector_config()
    assert ModelsResource(panel_detector=str(missing)).detector_config(check=False).model == str(missing)
    assert ModelsResource(panel_detector=str(missing), synthetic=True).detector_config().synthetic
    config = ModelsResource(panel_detector=str(folder), panel_class=1).detector_config()
    assert (config.model, config.labels, config.panel_class) == (str(folder), 1, 1)
    assert no_network == []
