"""Training DAB-DETR on a tiny COCO folder: finite loss, checkpoints that reload, a killed run
that resumes at its saved step and ends where an uninterrupted run ends, COCO mAP by hand,
and the job's report through Dagster Pipes."""

import json
import math
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pipelines.launch import LaunchInfo
from pipelines.panels.coco_eval import coco_map, evaluate_detector
from pipelines.panels.detector import Classes, Detector, DetectorConfig, build_model
from pipelines.panels.train import CocoDataset, TrainConfig, batch_indices, collate, load_checkpoint, main, train
from tests.panel_fixtures import REDUCED, make_coco, write_checkpoint

REPO = Path(__file__).resolve().parents[1]
DETECTOR = DetectorConfig(synthetic=True, input_size=96, labels=2, threshold=0.0, max_panels=10)


@pytest.fixture(scope="module")
def coco(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("coco")
    make_coco(folder / "train", n=12, seed=0)
    make_coco(folder / "val", n=4, seed=1)
    return folder


def _config(coco: Path, out: Path, **kwargs) -> TrainConfig:
    base = dict(
        train_dir=str(coco / "train"), output_dir=str(out), steps=4, batch_size=4, lr=1e-3,
        checkpoint_every=2, log_every=1, seed=7, device="cpu", detector=DETECTOR,
    )  # fmt: skip
    return TrainConfig(**{**base, **kwargs})


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_batch_order_depends_only_on_seed_and_step():
    epoch = [i for step in range(3) for i in batch_indices(step, 4, 12, seed=7)]
    assert sorted(epoch) == list(range(12))  # one epoch is a permutation
    assert batch_indices(5, 4, 12, seed=7) == batch_indices(5, 4, 12, seed=7) != batch_indices(5, 4, 12, seed=8)


def test_a_few_steps_train_checkpoint_reload_and_evaluate(coco, tmp_path):
    out = tmp_path / "run"
    report = train(_config(coco, out, val_dir=str(coco / "val")))
    metrics = _metrics(out)
    train_lines = [m for m in metrics if m["kind"] == "train"]
    assert [m["step"] for m in train_lines] == [1, 2, 3, 4]
    assert all(math.isfinite(m["loss"]) and {"loss_ce", "loss_bbox", "loss_giou"} <= set(m) for m in train_lines)
    assert report["steps"] == 4 and report["resumed_from"] is None and math.isfinite(report["final_loss"])
    assert {"map", "map_50", "map_75", "map_panel_label"} <= set(report["eval"]) and report["eval"]["images"] == 4
    assert 0.0 <= report["eval"]["map"] <= report["eval"]["map_50"] <= 1.0
    assert metrics[-1]["kind"] == "eval" and json.loads((out / "report.json").read_text())["steps"] == 4
    # the last two checkpoints are kept; the newest reloads into the exported model's weights
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["ckpt-00000002.pt", "ckpt-00000004.pt"]
    state = load_checkpoint(str(out / "checkpoints" / "ckpt-00000004.pt"))
    assert state["step"] == 4 and state["config"]["detector"] == asdict(DETECTOR) and state["optimizer"]["state"]
    model = build_model(DETECTOR)
    model.load_state_dict(state["model"])
    exported = Detector(DetectorConfig(**{**asdict(DETECTOR), "synthetic": False, "model": str(out / "model")}))
    reloaded, saved = model.state_dict(), exported.model.state_dict()
    assert reloaded.keys() == saved.keys() and all(torch.equal(reloaded[k], saved[k]) for k in saved)
    untrained = build_model(DETECTOR).state_dict()
    assert not all(torch.equal(reloaded[k], untrained[k]) for k in untrained)  # it did learn something
    again = evaluate_detector(exported, str(coco / "val"))
    assert again["map"] == pytest.approx(report["eval"]["map"], abs=1e-6)


def test_resuming_in_process_continues_from_the_saved_step(coco, tmp_path):
    straight = train(_config(coco, tmp_path / "straight"))
    train(_config(coco, tmp_path / "split", steps=2))
    resumed = train(_config(coco, tmp_path / "split"))
    assert resumed["resumed_from"] == 2 and resumed["steps"] == 4
    assert [m["step"] for m in _metrics(tmp_path / "split")] == [1, 2, 3, 4]
    assert resumed["final_loss"] == pytest.approx(straight["final_loss"], rel=1e-5)
    fresh = train(_config(coco, tmp_path / "split", resume=False, steps=1))
    assert fresh["resumed_from"] is None and [m["step"] for m in _metrics(tmp_path / "split")] == [1]


def test_a_killed_job_resumes_at_its_saved_step(coco, tmp_path):
    out = tmp_path / "killed"
    config = _config(coco, out, steps=30, checkpoint_every=3, keep_checkpoints=100)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config.to_dict()))
    command = [sys.executable, "-m", "pipelines.panels.train", "--config", str(path)]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (out / "checkpoints" / "ckpt-00000003.pt").exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = max(int(p.stem.split("-")[1]) for p in (out / "checkpoints").glob("ckpt-*.pt"))
    assert 3 <= saved < 30 and not (out / "report.json").exists()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, check=True)
    report = json.loads(done.stdout.strip().splitlines()[-1])["report"]  # printed when not under Pipes
    assert report["resumed_from"] == saved and report["steps"] == 30
    steps = [m["step"] for m in _metrics(out)]
    assert steps == list(range(1, 31))  # lines logged after the checkpoint, before the kill, were redone once
    straight = train(_config(coco, tmp_path / "straight", steps=30, checkpoint_every=30))
    assert report["final_loss"] == pytest.approx(straight["final_loss"], rel=1e-4)


def test_the_job_reports_through_dagster_pipes(coco, tmp_path):
    from dagster import AssetExecutionContext, PipesSubprocessClient, asset, materialize

    path = tmp_path / "config.json"
    path.write_text(json.dumps(_config(coco, tmp_path / "pipes", steps=2, val_dir=str(coco / "val")).to_dict()))
    messages = []

    @asset
    def panel_detector(context: AssetExecutionContext, pipes_subprocess_client: PipesSubprocessClient):
        command = [sys.executable, "-m", "pipelines.panels.train", "--config", str(path)]
        invocation = pipes_subprocess_client.run(command=command, context=context, cwd=str(REPO))
        messages.extend(invocation.get_custom_messages())
        return invocation.get_materialize_result()

    result = materialize([panel_detector], resources={"pipes_subprocess_client": PipesSubprocessClient()})
    assert result.success
    (event,) = result.get_asset_materialization_events()
    metadata = event.materialization.metadata
    assert metadata["steps"].value == 2 and metadata["model"].value == "synthetic-tiny-dab-detr"
    assert 0.0 <= metadata["eval_map"].value <= 1.0
    assert [(m["kind"], m["step"]) for m in messages] == [("train", 1), ("train", 2), ("eval", 2)]
    assert math.isfinite(messages[0]["metrics"]["loss"]) and messages[-1]["metrics"]["images"] == 4


def test_the_job_refuses_unknown_keys_by_name_and_trains_in_the_launched_run_dir(tmp_path):
    with pytest.raises(
        ValueError, match=r"unknown training config keys: \['setps'\] \('setps': did you mean 'steps'\?\)"
    ):
        TrainConfig.from_dict({"train_dir": "t", "output_dir": "o", "setps": 5})
    path = tmp_path / "config.json"  # the launcher's file: its section names the run's folder
    path.write_text(
        json.dumps({"train_dir": "t", "setps": 5, "launch": {"run_id": "r", "run_dir": str(tmp_path / "r")}})
    )
    with pytest.raises(ValueError, match=r"\['setps'\]"):
        main(["--config", str(path)])
    assert not (tmp_path / "r").exists()  # refused before anything was written
    job = {"train_dir": "t", "detector": {"input_size": 96, "synthetic": True}}
    launched = TrainConfig.from_job(job, LaunchInfo(run_id="r", run_dir="s3://lake/runs/r"))
    assert launched.output_dir == "s3://lake/runs/r" and launched.checkpoint_dir == "s3://lake/runs/r/checkpoints"
    assert launched.detector == DetectorConfig(input_size=96, synthetic=True)
    assert TrainConfig.from_job({**job, "output_dir": "/mine"}, LaunchInfo(run_dir="/lake")).output_dir == "/mine"


def test_targets_are_relative_to_the_visible_image_in_the_models_classes(tmp_path):
    """A 200 x 100 figure with a panel at COCO bbox [50, 25, 100, 50] (corners (50, 25) and
    (150, 75), centre (100, 50)) and a label glyph at [10, 20, 8, 10] (corners (10, 20), (18, 30)).
    At input 96 the figure is 96 x 48 padded to 96 x 96 with a mask over the top 48 rows; the
    targets are normalised by the visible figure: the panel (100/200, 50/100, 100/200, 50/100) =
    (0.5, 0.5, 0.5, 0.5) (in the padded square it would be (0.5, 0.25, 0.5, 0.25)), the glyph
    (14/200, 25/100, 8/200, 10/100) = (0.07, 0.25, 0.04, 0.1)."""
    (tmp_path / "images").mkdir()
    Image.new("RGB", (200, 100), (255, 255, 255)).save(tmp_path / "images" / "fig.png")
    annotations = [
        {"id": 1, "image_id": 1, "category_id": 1, "bbox": [50, 25, 100, 50], "area": 5000, "iscrowd": 0},
        {"id": 2, "image_id": 1, "category_id": 2, "bbox": [10, 20, 8, 10], "area": 80, "iscrowd": 0},
    ]
    coco = {"images": [{"id": 1, "file_name": "fig.png", "width": 200, "height": 100}], "annotations": annotations}
    (tmp_path / "annotations.json").write_text(json.dumps(coco))
    _, frame, classes, boxes = CocoDataset(str(tmp_path), 96, Classes(0, 1))[0]
    assert frame.resized == (96, 48) and frame.padded == (96, 96)
    assert classes.tolist() == [0, 1] and np.allclose(boxes, [[0.5, 0.5, 0.5, 0.5], [0.07, 0.25, 0.04, 0.1]])
    batch = collate([CocoDataset(str(tmp_path), 96, Classes(0, 1))[0]])
    assert batch["pixel_mask"][0, :48].all() and not batch["pixel_mask"][0, 48:].any()
    # Open-PMC-18M's classes {0: nothing, 1: subfigure}: the panel is class 1, the glyph has no class
    _, _, classes, boxes = CocoDataset(str(tmp_path), 96, Classes(panel=1))[0]
    assert classes.tolist() == [1] and np.allclose(boxes, [[0.5, 0.5, 0.5, 0.5]])


def test_fine_tuning_the_published_checkpoint_trains_its_subfigure_class(coco, tmp_path):
    published = tmp_path / "published"
    write_checkpoint(published, REDUCED)
    detector = DetectorConfig(model=str(published), input_size=96, threshold=0.0, max_panels=10)
    report = train(_config(coco, tmp_path / "run", steps=1, batch_size=2, detector=detector))
    assert math.isfinite(report["final_loss"])
    exported = Detector(DetectorConfig(**{**asdict(detector), "model": str(tmp_path / "run" / "model")}))
    assert exported.model.config.id2label == {0: "nothing", 1: "subfigure"} and exported.classes == Classes(1)


# -- COCO mAP by hand ----------------------------------------------------------------------

GT = {
    "images": [{"id": 1, "width": 100, "height": 100}, {"id": 2, "width": 100, "height": 100}],
    "annotations": [
        {"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 10, 40, 40], "area": 1600, "iscrowd": 0},
        {"id": 2, "image_id": 2, "category_id": 1, "bbox": [50, 20, 30, 60], "area": 1800, "iscrowd": 0},
    ],
    "categories": [{"id": 1, "name": "panel"}, {"id": 2, "name": "panel_label"}],
}
HIT1 = {"image_id": 1, "category_id": 1, "bbox": [10, 10, 40, 40], "score": 0.9}
HIT2 = {"image_id": 2, "category_id": 1, "bbox": [50, 20, 30, 60], "score": 0.8}


def test_coco_map_hand_cases():
    assert coco_map(GT, [HIT1, HIT2]) == {"map": 1.0, "map_50": 1.0, "map_75": 1.0}
    # One of two found: recall 0.5 at precision 1, nothing beyond. COCO's 101-point
    # interpolation counts recall thresholds 0.00..0.50 (51 of 101) at precision 1: AP = 51/101.
    missed = coco_map(GT, [HIT1])
    assert missed == pytest.approx({"map": 51 / 101, "map_50": 51 / 101, "map_75": 51 / 101})
    # A false positive ranked first (disjoint from every box): precision 0/1, 1/2, 2/3 at recall
    # 0, 0.5, 1; interpolated precision is the max to the right, 2/3 everywhere: AP = 2/3.
    false = {"image_id": 1, "category_id": 1, "bbox": [60, 60, 30, 30], "score": 0.95}
    assert coco_map(GT, [false, HIT1, HIT2]) == pytest.approx({"map": 2 / 3, "map_50": 2 / 3, "map_75": 2 / 3})
    # The same false positive ranked last costs nothing.
    assert coco_map(GT, [{**false, "score": 0.1}, HIT1, HIT2])["map"] == pytest.approx(1.0)
    # A box at IoU 0.6 with the truth (40 x 40 vs 40 x 24 inside it) counts at .50 but not at .75:
    # it is a hit for thresholds .50, .55, .60 (3 of 10), so map = (3 * 1 + 7 * 51/101) / 10.
    loose = {**HIT2, "bbox": [50, 20, 30, 36]}
    got = coco_map(GT, [HIT1, loose])
    assert got["map_50"] == pytest.approx(1.0) and got["map_75"] == pytest.approx(51 / 101)
    assert got["map"] == pytest.approx((3 + 7 * 51 / 101) / 10)
    assert coco_map(GT, []) == {"map": 0.0, "map_50": 0.0, "map_75": 0.0}
