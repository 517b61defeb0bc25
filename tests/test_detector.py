"""The DAB-DETR panel detector: aspect-preserving preprocessing with exact box mapping,
post-processing on hand-built outputs, the synthetic model on the sample's figures, and the
Ray Data actor pool against in-process inference (bad images become error rows)."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from pipelines.concepts.dinov2 import ModelUnavailableError
from pipelines.lake import Lake
from pipelines.panels.detector import (
    Detector,
    DetectorConfig,
    Frame,
    build_model,
    decode_and_detect,
    detect_images,
    frame_for,
    openpmc_detect,
    pixel_box,
    postprocess,
    prepare_image,
    to_model,
    to_original,
    to_tensors,
)
from pipelines.panels.types import Panel
from testing.loopback.sample_mirror import SAMPLE_DIR
from tests.panel_fixtures import write_tar

SYNTHETIC = DetectorConfig(synthetic=True, threshold=0.0, input_size=256, max_panels=5, labels=2)
FIGURES = [SAMPLE_DIR / "articles" / "elife-46472" / f"fig{i}.jpg" for i in (1, 2, 3)]


def _png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def test_a_wide_figure_is_scaled_not_squashed_and_padded_below():
    frame = frame_for(400, 200, 800)
    assert frame.resized == (800, 400) and frame.padded == (800, 800) and frame.scale == (2.0, 2.0)
    image = Image.new("RGB", (400, 200), (255, 0, 0))
    pixels, prepared = prepare_image(image, 800)
    assert prepared == frame and pixels.shape == (800, 800, 3)
    assert (pixels[:400] == (255, 0, 0)).all() and (pixels[400:] == 0).all()
    values, mask = to_tensors(pixels[None], [frame])
    assert values.shape == (1, 3, 800, 800) and mask.shape == (1, 800, 800)
    assert mask[0, :400].all() and not mask[0, 400:].any()
    assert torch.allclose(values[0, 0, 0, 0], torch.tensor((1.0 - 0.485) / 0.229))
    assert (values[0, :, 400:] == 0).all()
    tall = frame_for(100, 300, 600)
    assert tall.resized == (200, 600) and tall.scale == (2.0, 2.0)


def test_boxes_map_back_to_original_pixels_exactly():
    frame = frame_for(400, 200, 800)
    # normalised cxcywh in the 800 x 800 padded frame: centre (200, 100), size 80 x 40 padded pixels
    xyxy = to_original(np.array([[0.25, 0.125, 0.1, 0.05]]), frame)
    assert np.allclose(xyxy, [[80, 40, 120, 60]])
    assert np.allclose(to_model(np.array([[80, 40, 120, 60]]), frame), [[0.25, 0.125, 0.1, 0.05]])
    assert pixel_box(xyxy[0], 400, 200) == (80, 40, 120, 60)
    # an awkward size: 333 x 100 -> 800 x 240, per-axis scales 800/333 and 2.4; still exact
    odd = frame_for(333, 100, 800)
    assert odd.resized == (800, 240) and odd.scale == (800 / 333, 2.4)
    whole = np.array([[0, 0, 333, 100], [17, 3, 250, 99]])
    assert np.allclose(to_original(to_model(whole, odd), odd), whole)
    assert pixel_box(to_original(to_model(whole, odd), odd)[1], 333, 100) == (17, 3, 250, 99)
    # clamped to the figure; a box lying in the padding is dropped
    assert pixel_box(np.array([-5.2, 10.4, 410.0, 250.0]), 400, 200) == (0, 10, 400, 200)
    assert pixel_box(to_original(np.array([0.5, 0.9, 0.2, 0.1]), frame)[0], 400, 200) is None


def test_postprocess_on_a_hand_built_output():
    frame = frame_for(400, 200, 800)
    logit = lambda p: float(np.log(p / (1 - p)))  # noqa: E731
    logits = torch.tensor(
        [[[logit(0.9), logit(0.1)], [logit(0.2), logit(0.8)], [logit(0.7), logit(0.3)], [logit(0.95), logit(0.01)]]]
    )
    boxes = torch.tensor(
        [
            [
                [0.25, 0.125, 0.1, 0.05],  # -> (80, 40, 120, 60)
                [0.05, 0.05, 0.02, 0.02],  # a label glyph -> (16, 16, 24, 24)
                [0.75, 0.125, 0.5, 0.25],  # -> (200, 0, 400, 100)
                [0.5, 0.9, 0.2, 0.1],  # in the padding: dropped despite its score
            ]
        ]
    )
    (found,) = postprocess(logits, boxes, [frame], threshold=0.5, max_panels=10)
    assert [p.box for p in found.panels] == [(80, 40, 120, 60), (200, 0, 400, 100)]
    assert [round(p.score, 6) for p in found.panels] == [0.9, 0.7]
    assert found.label_boxes == [Panel(box=(16, 16, 24, 24), score=pytest.approx(0.8))]
    (top1,) = postprocess(logits, boxes, [frame], threshold=0.5, max_panels=1)
    assert top1.panels == []  # the top query lies in the padding; top-k comes before the drop
    (single_class,) = postprocess(logits[..., :1], boxes, [frame], threshold=0.0, max_panels=10)
    assert len(single_class.panels) == 3 and single_class.label_boxes == []


def test_synthetic_model_finds_panels_inside_real_figures_deterministically():
    images = [Image.open(p).convert("RGB") for p in FIGURES]
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    first = Detector(SYNTHETIC).detect(images, batch_size=2)
    assert torch.equal(torch.rand(3), expected)  # the seeded build leaves the global RNG alone
    again = Detector(SYNTHETIC).detect(images, batch_size=3)
    for f, a in zip(first, again, strict=True):  # other batch sizes: same boxes, scores to rounding
        assert [p.box for p in f.panels] == [p.box for p in a.panels]
        assert np.allclose([p.score for p in f.panels], [p.score for p in a.panels], atol=1e-5)
    for image, found in zip(images, first, strict=True):
        assert len(found.panels) == 5 and len(found.label_boxes) == 5
        for p in found.panels + found.label_boxes:
            x1, y1, x2, y2 = p.box
            assert 0 <= x1 < x2 <= image.width and 0 <= y1 < y2 <= image.height and 0 <= p.score <= 1
    assert SYNTHETIC.model_label == "synthetic-tiny-dab-detr"
    assert DetectorConfig(revision="abc123").model_label == "vector-institute/pmc-18m-dab-detr@abc123"
    model = build_model(SYNTHETIC)
    assert next(model.parameters()).dtype == torch.float32 and model.config.num_labels == 2


def test_openpmc_baseline_squashes_and_suppresses():
    images = [Image.open(p).convert("RGB") for p in FIGURES[:2]]
    detector = Detector(DetectorConfig(synthetic=True, threshold=0.0))
    baseline = openpmc_detect(detector, images, batch_size=128)
    ours = Detector(DetectorConfig(synthetic=True, threshold=0.0, max_panels=100)).detect(images)
    for image, panels, raw in zip(images, baseline, ours, strict=True):
        assert panels and len(panels) < len(raw.panels)  # NMS at IoU 0.2 drops most boxes
        assert all(0 <= p.box[0] < p.box[2] <= image.width and 0 <= p.box[1] < p.box[3] <= image.height for p in panels)


def test_offline_without_weights_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelUnavailableError, match="'vector-institute/pmc-18m-dab-detr' are not available"):
        build_model(DetectorConfig())
    with pytest.raises(ValueError, match="labels must be"):
        DetectorConfig(labels=3)


def test_a_saved_model_loads_by_directory(tmp_path):
    build_model(SYNTHETIC).save_pretrained(tmp_path / "m")
    images = [Image.open(FIGURES[0]).convert("RGB")]
    loaded = Detector(DetectorConfig(model=str(tmp_path / "m"), threshold=0.0, input_size=256, max_panels=5, labels=2))
    assert [p.box for p in loaded.detect(images)[0].panels] == [
        p.box for p in Detector(SYNTHETIC).detect(images)[0].panels
    ]
    with pytest.raises(ValueError, match="has 2 classes"):
        Detector(DetectorConfig(model=str(tmp_path / "m"), labels=1))


def test_ray_actor_pool_equals_in_process_and_bad_images_are_rows(tmp_path):
    lake = Lake(tmp_path / "lake")
    good = [p.read_bytes() for p in FIGURES] + [_png(Image.new("RGBA", (90, 300), (0, 0, 0, 0)))]
    truncated = good[0][:300]
    members = [("PMC1/fig1.jpg", good[0]), ("PMC1/broken.jpg", truncated), ("PMC2/fig2.jpg", good[1])]
    members += [("PMC2/doc.pdf", b"%PDF-1.4 not an image"), ("PMC3/fig3.jpg", good[2]), ("PMC3/alpha.png", good[3])]
    refs = write_tar(tmp_path / "lake", "raw/release=2025/shard=00/part-00000.tar", members)
    for i, ref in enumerate(refs):
        ref.update(pmcid=ref["image_file"].split("/")[0], fig_id=None if i == 3 else f"F{i}", sha256=str(i))
    rows = detect_images(lake, refs, SYNTHETIC, batch_size=2, actors=1)
    assert [r["image_file"] for r in rows] == [m for m, _ in members]
    assert rows[1]["error"].startswith("undecodable image") and rows[3]["error"].startswith("not an image")
    assert rows[1]["panels"] == [] and rows[3]["label_boxes"] == [] and rows[3]["fig_id"] is None
    local = decode_and_detect(Detector(SYNTHETIC), [d for _, d in members], batch_size=2)
    assert isinstance(local[1], str) and isinstance(local[3], str)
    for row, expected in zip(rows, local, strict=True):
        if isinstance(expected, str):
            continue
        assert row["error"] is None and (row["width"], row["height"]) in [
            (600, 994),
            (600, 970),
            (600, 1170),
            (90, 300),
        ]
        for got, want in ((row["panels"], expected.panels), (row["label_boxes"], expected.label_boxes)):
            assert [p.box for p in got] == [p.box for p in want]
            assert np.allclose([p.score for p in got], [p.score for p in want], atol=1e-5)


def test_frame_is_plain_data():
    assert Frame(10, 20, (5, 10), (10, 10)).scale == (0.5, 0.5)
