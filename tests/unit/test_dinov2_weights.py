"""DINOv2 from checkpoints in their published format, loaded through our own loader with sockets
blocked: ``facebook/dinov2-large`` at real size (304M parameters, from a copy of its config.json
and preprocessor_config.json) and the registers model BIOMEDICA's labeler used
(``facebook/dinov2-with-registers-large``, ``dinov2_vitl14_reg``), which must load as the class its
config names, never as a plain ``Dinov2Model``. Also the one-line errors of a wrong or missing
model path, at the resource's set-up."""

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import huggingface_hub.constants
import numpy as np
import pytest
import torch
from dagster import Failure
from PIL import Image

from pipelines.compute.weights import ModelUnavailableError
from pipelines.concepts.dinov2 import (
    Embedder,
    EmbedderConfig,
    Resize,
    check_weights,
    load_model,
    load_processor,
    model_class,
    model_id,
    prepare,
    resize_from,
    resize_of,
)
from resources.compute import ModelsResource
from testing.loopback.sample_mirror import SAMPLE_DIR

PUBLISHED = Path(__file__).parents[1] / "data" / "published"
LARGE = json.loads((PUBLISHED / "dinov2-large.config.json").read_text())
REGISTERS_LARGE = json.loads((PUBLISHED / "dinov2-with-registers-large.config.json").read_text())
FIGURE = SAMPLE_DIR / "articles" / "elife-46472" / "fig1.jpg"
SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": 224}


def write_checkpoint(folder: Path, config: dict, seed: int = 0):
    """A ``save_pretrained`` folder of ``config`` (its own class) with seeded random weights and
    DINOv2's published image processor config.

    The model is built on the meta device and its weights filled once: biases 0, norm scales 1,
    layer scales the config's value, every other tensor from one seeded block of uniform values
    (standard deviation the config's ``initializer_range``), tiled from an offset of its own, so
    no two tensors hold the same values. Building it on the CPU ran every initializer of the
    304M-parameter model twice (the layers' own, then transformers' truncated normal) and drawing
    304M random numbers takes seconds more: that was most of this module's time."""
    import transformers

    cls = getattr(transformers, config["architectures"][0])
    cfg = cls.config_class.from_dict(config)
    with torch.device("meta"):
        model = cls(cfg)
    model.to_empty(device="cpu").eval()
    bound = cfg.initializer_range * 3**0.5
    block = torch.empty(1 << 20).uniform_(-bound, bound, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        for index, (name, tensor) in enumerate(model.state_dict().items()):
            if name.endswith(".bias"):
                tensor.zero_()
            elif name.endswith(".lambda1"):
                tensor.fill_(cfg.layerscale_value)
            elif tensor.ndim == 1:  # the layer norms' scales
                tensor.fill_(1.0)
            else:
                flat, ring = tensor.view(-1), block.roll(-7919 * index)
                for at in range(0, flat.numel(), ring.numel()):
                    flat[at : at + ring.numel()] = ring[: flat.numel() - at]
    model.save_pretrained(str(folder))
    shutil.copy(PUBLISHED / "dinov2-large.preprocessor_config.json", folder / "preprocessor_config.json")
    return model


@pytest.fixture(params=[True, False], ids=["offline", "online"])
def offline(request, monkeypatch) -> bool:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", request.param)
    return request.param


@pytest.fixture(scope="module")
def registers(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    """The registers model's published config at reduced size (4 register tokens kept)."""
    folder = tmp_path_factory.mktemp("reg") / "dinov2-with-registers"
    return folder, write_checkpoint(folder, {**REGISTERS_LARGE, **SMALL})


def test_dinov2_large_loads_at_real_size_without_the_network(tmp_path, monkeypatch, no_network):
    """Online mode, so a hub call would show up as a connection attempt. 304.4M parameters, the
    weights as saved, and the published preprocessing (shortest edge 256, bicubic, crop 224)."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    folder = tmp_path / "dinov2-large"
    saved = write_checkpoint(folder, LARGE)
    config = EmbedderConfig(model=str(folder), device="cpu")
    check_weights(config)
    embedder = Embedder(config)
    assert type(embedder.model).__name__ == "Dinov2Model" and embedder.registers == 0
    assert sum(p.numel() for p in embedder.model.parameters()) == pytest.approx(304.4e6, rel=0.002)
    loaded = embedder.model.state_dict()
    assert loaded.keys() == saved.state_dict().keys()
    assert all(torch.equal(loaded[key], weights) for key, weights in saved.state_dict().items())
    processor = embedder.processor
    assert processor.size["shortest_edge"] == 256 and processor.crop_size["height"] == 224 and processor.resample == 3
    assert embedder.resize == Resize(shortest_edge=256, crop=(224, 224), resample=3)  # the same file, read alone
    vectors = embedder.embed_images([Image.open(FIGURE).convert("RGB")])
    assert vectors.shape == (1, 1024) and np.isfinite(vectors).all()
    assert no_network == []


def test_a_registers_model_loads_as_its_own_class_and_mean_pooling_skips_the_registers(registers, offline, no_network):
    """Token layout of Dinov2WithRegistersModel: [CLS, 4 registers, 256 patches] at 224 px. Mean
    pooling is the mean of the 256 patch tokens: computed here by hand from the hidden states."""
    folder, saved = registers
    embedder = Embedder(EmbedderConfig(model=str(folder), pooling="mean", device="cpu"))
    assert type(embedder.model).__name__ == "Dinov2WithRegistersModel" and embedder.registers == 4
    assert embedder.model.state_dict().keys() == saved.state_dict().keys()
    assert torch.equal(embedder.model.embeddings.register_tokens, saved.embeddings.register_tokens)
    image = Image.open(FIGURE).convert("RGB")
    pixels = np.stack([prepare(image, embedder.resize, False)])
    mean = embedder.embed(pixels)
    normalized = (pixels.astype(np.float32) / 255 - np.array([0.485, 0.456, 0.406], np.float32)) / np.array(
        [0.229, 0.224, 0.225], np.float32
    )
    with torch.no_grad():
        hidden = saved(pixel_values=torch.from_numpy(normalized.transpose(0, 3, 1, 2).copy())).last_hidden_state
    assert hidden.shape[1] == 1 + 4 + 256
    by_hand = hidden[:, 5:].mean(dim=1).numpy()
    assert np.allclose(mean, by_hand, rtol=2e-3, atol=1e-3)  # float16 output
    with_registers = hidden[:, 1:].mean(dim=1).numpy()
    assert np.abs(with_registers - by_hand).max() > 20 * np.abs(mean - by_hand).max()
    assert no_network == []


def test_a_plain_dinov2_model_is_never_what_a_registers_checkpoint_becomes(registers):
    """What transformers does by itself: ``Dinov2Model.from_pretrained`` on the registers
    checkpoint builds a model without register tokens (the weights it cannot place are dropped);
    our loader reads the class from the config instead, and refuses a config it does not know."""
    from transformers import Dinov2Model

    folder, _ = registers
    plain = Dinov2Model.from_pretrained(str(folder))
    assert not hasattr(plain.embeddings, "register_tokens")
    assert type(load_model(EmbedderConfig(model=str(folder), device="cpu"))).__name__ == "Dinov2WithRegistersModel"
    # a custom-code checkpoint that calls itself dinov2 but names another class (hibou's style)
    with pytest.raises(ValueError, match="PanelForge embeds with Dinov2Model or Dinov2WithRegistersModel"):
        model_class({"model_type": "dinov2", "architectures": ["Dinov2ModelWithRegisters"]})
    with pytest.raises(ValueError, match="model_type='vit'"):
        model_class({"model_type": "vit", "architectures": ["ViTModel"]})


def test_torch_hub_names_are_read_as_their_hub_ids():
    assert model_id("dinov2_vitl14_reg") == "facebook/dinov2-with-registers-large"
    assert model_id("dinov2_vitl14") == "facebook/dinov2-large"
    assert model_id("dinov2_vitg14_reg") == "facebook/dinov2-with-registers-giant"
    assert model_id("/models/dinov2") == "/models/dinov2"


def test_a_missing_folder_fails_in_one_line_at_set_up(tmp_path, offline, no_network):
    missing = tmp_path / "nowhere" / "dinov2-large"
    with pytest.raises(Failure) as failed:
        ModelsResource(dinov2=str(missing)).dinov2_config(check=True)
    text = str(failed.value.description)
    assert "\n" not in text and text.startswith(f"PANELFORGE_DINOV2_MODEL='{missing}' (DINOv2 image embeddings)")
    assert "no such folder" in text and f"`hf download facebook/dinov2-large --local-dir {missing}`" in text
    assert ("offline mode is on" in text) is offline
    assert no_network == []


def test_a_hub_name_not_in_the_cache_offline_fails_in_one_line(tmp_path, monkeypatch, no_network):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelUnavailableError) as failed:
        load_processor(EmbedderConfig(model="dinov2_vitl14_reg"))
    text = str(failed.value)
    assert "\n" not in text and "not in the Hugging Face cache" in text and "offline mode is on" in text
    assert "`hf download facebook/dinov2-with-registers-large --local-dir <folder>`" in text
    assert "PANELFORGE_DINOV2_MODEL=<folder>" in text
    assert no_network == []


def test_the_resource_checks_the_class_at_set_up(registers, tmp_path, no_network):
    folder, _ = registers
    assert ModelsResource(dinov2=str(folder)).dinov2_config(check=True).model == str(folder)
    vit = tmp_path / "vit"
    shutil.copytree(folder, vit)
    config = json.loads((vit / "config.json").read_text())
    (vit / "config.json").write_text(json.dumps({**config, "model_type": "vit", "architectures": ["ViTModel"]}))
    with pytest.raises(Failure, match="model_type='vit'"):
        ModelsResource(dinov2=str(vit)).dinov2_config(check=True)
    assert ModelsResource(dinov2=str(tmp_path / "absent"), synthetic=True).dinov2_config(check=True).synthetic


def test_the_decode_stage_reads_the_processors_resize_as_transformers_does():
    """What ``BitImageProcessor`` makes of a preprocessor_config.json, read with the json module
    alone (the CPU decode tasks never import transformers): the published DINOv2-large file says
    shortest edge 256, crop 224 x 224, resample 3 (bicubic); a missing field is the processor's
    default, a number a shortest edge or a square crop."""
    from transformers import BitImageProcessor

    published = json.loads((PUBLISHED / "dinov2-large.preprocessor_config.json").read_text())
    assert resize_from(published) == Resize(shortest_edge=256, crop=(224, 224), resample=3)
    for config in (published, {}, {"size": 300, "crop_size": 256, "resample": 2}):
        theirs = BitImageProcessor(**{k: v for k, v in config.items() if k != "image_processor_type"})
        ours = resize_from(config)
        assert ours.shortest_edge == theirs.size["shortest_edge"]
        assert ours.crop == (theirs.crop_size["height"], theirs.crop_size["width"])
        assert ours.resample == theirs.resample
    assert resize_from({"size": 300, "crop_size": 256, "resample": 2}) == Resize(300, (256, 256), 2)
    assert resize_of(EmbedderConfig(synthetic=True)) == Resize()
    synthetic = load_processor(EmbedderConfig(synthetic=True))
    assert (synthetic.size["shortest_edge"], synthetic.crop_size["height"], synthetic.resample) == (256, 224, 3)
    with pytest.raises(ValueError, match="has no shortest_edge"):
        resize_from({"size": {"height": 224, "width": 224}})


@pytest.mark.parametrize("pad, shape", [(False, (256, 192)), (True, (256, 256))])
def test_an_image_that_does_not_decode_is_zeros_of_the_checkpoints_crop(tmp_path, pad, shape):
    """A checkpoint whose crop is not DINOv2's 224 x 224 (here 256 high, 192 wide): a decode batch
    of a good and an undecodable image stacks, the bad one as zeros with its error (the zeros were
    224 x 224 whatever the checkpoint said, so such a batch failed to stack). The good one, a red
    300 x 200 image, is red at the centre either way (cropped, or letterboxed on white)."""
    from pipelines.concepts.embed import _prepare_batch

    Image.new("RGB", (300, 200), (200, 30, 30)).save(tmp_path / "figure.png")
    (tmp_path / "broken.png").write_bytes(b"not an image at all")
    files = ["figure.png", "broken.png"]
    batch = {"tar_path": files, "offset": [0, 0], "size": [(tmp_path / f).stat().st_size for f in files]}
    resize = Resize(shortest_edge=256, crop=(256, 192))
    out = _prepare_batch(batch, str(tmp_path), asdict(resize), pad)
    assert out["pixels"].shape == (2, *shape, 3) and out["pixels"].dtype == np.uint8
    assert out["error"][0] == "" and out["error"][1]
    assert out["pixels"][0, shape[0] // 2, shape[1] // 2].tolist() == [200, 30, 30]
    assert not out["pixels"][1].any()
