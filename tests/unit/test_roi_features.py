"""ROI region features of the multi-level trainer: the box -> patch-grid arithmetic and RoIAlign
pooling on hand-chosen maps, the ROI processor's start, and both ROI modes training a few CPU
steps on real sample figures, checkpointing, reloading and resuming."""

import json
import math
from pathlib import Path

import fsspec
import pytest
import torch

from pipelines import launch
from pipelines.training.multilevel import Decoded, MultilevelConfig, RoiRegion, box_in_parent, decode_roi, train
from pipelines.training.roi import RoiProcessor, box_to_grid, roi_pool, token_grid


@pytest.fixture
def tiny(multilevel_tiny) -> Path:
    return multilevel_tiny  # the session's tiny OpenCLIP (tests/conftest.py)


# ----------------------------------------------------------------------------------- arithmetic


def test_box_to_grid_on_a_224_image_with_16_px_patches():
    # 224 / 16 = 14 cells a side: x 32..96 -> cells 2..6, y 48..112 -> cells 3..7
    assert box_to_grid((32, 48, 96, 112), (224, 224), (14, 14)) == (2.0, 3.0, 6.0, 7.0)
    # a 448x224 image squashed to the same grid: x scales by 14/448, y by 14/224
    assert box_to_grid((64, 48, 192, 112), (448, 224), (14, 14)) == (2.0, 3.0, 6.0, 7.0)
    # a box off a patch boundary: x 8 -> half a cell
    assert box_to_grid((8, 0, 24, 16), (224, 224), (14, 14)) == (0.5, 0.0, 1.5, 1.0)
    with pytest.raises(ValueError, match="outside"):
        box_to_grid((200, 0, 240, 10), (224, 224), (14, 14))
    with pytest.raises(ValueError, match="empty"):
        box_to_grid((10, 10, 10, 20), (224, 224), (14, 14))


def test_token_grid_is_row_major():
    # 2 rows x 3 columns; token t holds the value t
    tokens = torch.arange(6.0).view(1, 6, 1)
    grid = token_grid(tokens, (3, 2))
    assert grid.shape == (1, 1, 2, 3)
    assert grid[0, 0].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


def test_roi_pool_of_hand_built_maps():
    rows = torch.arange(14.0).view(14, 1).expand(14, 14)
    cols = torch.arange(14.0).view(1, 14).expand(14, 14)
    # channel 0: 7 on cells rows 2..7, cols 1..6 (the box's cells 3..6 / 2..5 and their neighbours), 0 elsewhere
    constant = torch.zeros(14, 14)
    constant[2:8, 1:7] = 7.0
    # channel 1: 10 * row + col; the box covers rows 3..6 and cols 2..5, whose mean is 10 * 4.5 + 3.5
    linear = 10 * rows + cols
    fmap = torch.stack([constant, linear]).unsqueeze(0)
    box = torch.tensor([[2.0, 3.0, 6.0, 7.0]])
    got = roi_pool(fmap, box, torch.tensor([0]), output=2)
    assert got.shape == (1, 2)
    assert got[0, 0].item() == pytest.approx(7.0, abs=1e-5)
    assert got[0, 1].item() == pytest.approx(48.5, abs=1e-4)
    # a second map in the batch, the same box on it: only that map's values count
    two = torch.cat([fmap, fmap * 0 + 1.0])
    got = roi_pool(two, torch.cat([box, box]), torch.tensor([1, 0]), output=1)
    assert got[0].tolist() == pytest.approx([1.0, 1.0]) and got[1, 1].item() == pytest.approx(48.5, abs=1e-4)


def test_roi_processor_starts_as_plain_roi_pooling():
    torch.manual_seed(0)
    processor = RoiProcessor(32, heads=8)
    rois, context = torch.randn(3, 32), torch.randn(3, 4, 32)
    assert torch.equal(processor(rois, context), rois)  # zero output projection: the residual alone
    assert processor.attention.num_heads == 8
    with pytest.raises(ValueError, match="divide"):
        RoiProcessor(30, heads=8)


def test_region_box_moves_into_its_panel_frame_and_bad_regions_are_refused():
    region = RoiRegion("f_p000_r00", (120.0, 60.0, 180.0, 90.0), "a cell", [])
    figure = Decoded("f", None, "fig", size=(787, 393), meta="{}")
    panel = Decoded("f_p000", None, "panel", size=(300, 200), meta=json.dumps({"box": [100, 40, 400, 240]}))
    assert box_in_parent(region, figure) == (120.0, 60.0, 180.0, 90.0)
    assert box_in_parent(region, panel) == (20.0, 20.0, 80.0, 50.0)
    # the same panel stored at half its size: the offsets halve too
    small = Decoded("f_p000", None, "panel", size=(150, 100), meta=json.dumps({"box": [100, 40, 400, 240]}))
    assert box_in_parent(region, small) == (10.0, 10.0, 40.0, 25.0)
    config = MultilevelConfig(run_dir="unused", region_description_prob=0.0)
    import random

    with pytest.raises(ValueError, match="box"):
        decode_roi({"__key__": "k", "txt": b"a cell", "json": b"{}"}, config, random.Random(0))
    ok = {"__key__": "k", "txt": b"a cell", "json": json.dumps({"box": [1, 2, 3, 4]}).encode(), "neg.txt": b"x\n"}
    assert decode_roi(ok, config, random.Random(0)) == RoiRegion("k", (1.0, 2.0, 3.0, 4.0), "a cell", ["x"])


def test_roi_modes_need_the_parent_in_the_region_slot(tmp_path):
    config = MultilevelConfig.from_dict({
        "run_dir": str(tmp_path), "preset": "zoom-in", "region_features": "roi_pool",
        "figure_data": ["f"], "panel_data": ["p"], "region_data": ["r"],
    })  # fmt: skip
    with pytest.raises(ValueError, match="roi_parent figure"):
        config.validate()
    with pytest.raises(ValueError, match="region_features"):
        MultilevelConfig.from_dict(
            {"run_dir": str(tmp_path), "region_features": "mask", "schedule": [["figure"]], "figure_data": ["f"]}
        ).validate()


# ----------------------------------------------------------------------------------- training


@pytest.fixture
def boxed(boxed_release) -> dict[str, str]:
    """2 figures and 4 regions with boxes in figure pixels, the last off its figure (tests/conftest.py)."""
    return boxed_release


def _config(mode: str, data: dict, model: Path, run: Path, steps: int, **extra) -> MultilevelConfig:
    return MultilevelConfig.from_dict({
        "preset": "region-aware", "region_features": mode, "run_dir": str(run), "model": f"local-dir:{model}",
        "device": "cpu", "figure_data": [data["figure"]], "region_data": [data["region"]], "batch_size": 2,
        "steps": steps, "warmup": 1, "lr": 1e-3, "checkpoint_every": 2, "log_every": 1, "link_pull": 4,
        "max_children": 4, "negative_loss": "softmax", **extra,
    })  # fmt: skip


def _checkpoint(run: Path) -> dict:
    with fsspec.open(launch.latest_checkpoint(str(run / "checkpoints")), "rb") as f:
        return torch.load(f, map_location="cpu", weights_only=False)


def test_roi_pool_trains_checkpoints_reloads_and_resumes(boxed, tiny, tmp_path):  # noqa: F811
    import open_clip

    run = tmp_path / "roipool"
    report = train(_config("roi_pool", boxed, tiny, run, 2, curriculum=[]))
    # each step: figures [fig1, fig3]; the 4 regions are pulled, fig1's 3 pair, fig3's one is off its image
    assert report["region_features"] == "roi_pool" and report["steps"] == 2
    assert json.loads(report["linked_children"])["roi_region"] == 6 and report["skipped_samples"] == 2
    assert math.isfinite(report["final_loss"]) and report["loss_region"] > 0 and report["loss_negative"] > 0
    saved = _checkpoint(run)
    assert saved["roi_processor"] is None and saved["consumed"] == {"figure": 4, "roi_region": 8}
    open_clip.create_model(f"local-dir:{tiny}").load_state_dict(saved["state_dict"])

    resumed = train(_config("roi_pool", boxed, tiny, run, 3, curriculum=[]))
    assert resumed["resumed_from_step"] == 2 and resumed["steps"] == 3 and math.isfinite(resumed["final_loss"])
    assert _checkpoint(run)["consumed"] == {"figure": 6, "roi_region": 12}


def test_roi_processor_trains_from_the_region_stage_and_resumes(boxed, tiny, tmp_path):  # noqa: F811
    run = tmp_path / "roiproc"
    stages = [{"steps": 2, "weights": {"region": 0.0, "negative": 0.0}}, {"steps": 2, "weights": {}}]
    first = train(_config("roi_processor", boxed, tiny, run, 2, curriculum=stages, roi_heads=4))
    assert "loss_region" not in first and json.loads(first["linked_children"])["roi_region"] == 0
    before = _checkpoint(run)["roi_processor"]
    assert not before["attention.out_proj.weight"].any()  # the global stage leaves it untouched

    resumed = train(_config("roi_processor", boxed, tiny, run, 4, curriculum=stages, roi_heads=4))
    assert resumed["resumed_from_step"] == 2 and resumed["loss_region"] > 0 and math.isfinite(resumed["final_loss"])
    after = _checkpoint(run)["roi_processor"]
    assert after["attention.out_proj.weight"].abs().sum() > 0  # trained once the region terms are on
    assert after["attention.in_proj_weight"].shape == (3 * 32, 32)
