"""RegionMed-CLIP's four-stage curriculum in the region-aware preset (warm-up 2, global 8, region
refinement 8, joint 8 epochs): stage boundaries, loss weights and trainable groups at hand-chosen
steps, and a few CPU steps of the real trainer (ROI processor) through all four stages."""

import math
from pathlib import Path

import pytest
import torch

from pipelines.training.multilevel import (
    PRESETS,
    MultilevelConfig,
    Trainer,
    curriculum_weights,
    stage_at,
)


@pytest.fixture
def tiny(multilevel_tiny) -> Path:
    return multilevel_tiny  # the session's tiny OpenCLIP (tests/conftest.py)


@pytest.fixture
def boxed(boxed_release) -> dict[str, str]:
    return boxed_release  # the session's figures and boxed regions (tests/conftest.py)


STAGES = PRESETS["region-aware"]["curriculum"]


def test_region_aware_stages_follow_the_papers_epochs():
    assert [s["name"] for s in STAGES] == ["warmup", "global", "region", "joint"]
    assert [s["epochs"] for s in STAGES] == [2, 8, 8, 8]
    # 26 steps without epoch_steps: a step per epoch -> 0-1 warm-up, 2-9 global, 10-17 region, 18-25 joint
    at = {s: stage_at(s, STAGES, 26) for s in (0, 1, 2, 9, 10, 17, 18, 25, 40)}
    assert at == {0: 0, 1: 0, 2: 1, 9: 1, 10: 2, 17: 2, 18: 3, 25: 3, 40: 3}
    # 13 steps: boundaries at round(13 * 2/26) = 1, round(13 * 10/26) = 5, round(13 * 18/26) = 9
    assert [stage_at(s, STAGES, 13) for s in range(13)] == [0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]
    # epoch_steps 3: warm-up 6 steps, then 24 each (0-5, 6-29, 30-53, 54-77), whatever steps says
    assert [stage_at(s, STAGES, 1000, 3) for s in (5, 6, 29, 30, 53, 54, 999)] == [0, 1, 1, 2, 2, 3, 3]
    assert stage_at(3, [], 10) is None


def test_region_aware_loss_terms_per_stage():
    base = PRESETS["region-aware"]["loss_weights"]
    on = lambda step: {k for k, w in curriculum_weights(step, base, STAGES, 26).items() if w > 0}  # noqa: E731
    assert on(1) == on(9) == {"figure"}  # warm-up and global alignment: the global term only
    assert on(10) == on(17) == {"region", "negative"}  # region refinement: region + hard negatives
    assert on(18) == {"figure", "region", "negative"}  # joint


def test_zoom_in_keeps_its_recipe():
    zoom = MultilevelConfig.from_dict({"run_dir": "-", "preset": "zoom-in"})
    assert zoom.curriculum == [] and zoom.schedule == [["figure"], ["panel"], ["region"]]
    assert zoom.unfreeze_last_blocks == 5 and zoom.freeze_text and zoom.lr == 1e-5 and zoom.warmup == 1000


def test_config_refuses_a_stage_with_two_lengths_or_an_unknown_group(tmp_path):
    def check(stage):
        MultilevelConfig.from_dict({
            "run_dir": str(tmp_path), "schedule": [["figure"]], "figure_data": ["f"], "curriculum": [stage],
        }).validate()  # fmt: skip

    with pytest.raises(ValueError, match="exactly one of steps, fraction or epochs"):
        check({"epochs": 2, "steps": 4})
    with pytest.raises(ValueError, match="train lists groups"):
        check({"epochs": 2, "train": ["vision", "decoder"]})
    check({"epochs": 2, "train": ["vision"]})


def _config(boxed, tiny, run, steps: int, **extra) -> MultilevelConfig:  # noqa: F811
    return MultilevelConfig.from_dict({
        "preset": "region-aware", "region_features": "roi_processor", "roi_heads": 4, "run_dir": str(run),
        "model": f"local-dir:{tiny}", "device": "cpu", "figure_data": [boxed["figure"]],
        "region_data": [boxed["region"]], "batch_size": 2, "steps": steps, "warmup": 1, "lr": 1e-3,
        "link_pull": 4, "max_children": 4, "negative_loss": "softmax", "checkpoint_every": 100, **extra,
    })  # fmt: skip


VISION = "model.visual.transformer.resblocks.0.mlp.c_fc.weight"
TEXT = "model.transformer.resblocks.0.mlp.c_fc.weight"
ROI = "roi_processor.attention.out_proj.weight"


def test_stage_freezes_the_groups_it_does_not_train(boxed, tiny, tmp_path):  # noqa: F811
    # epoch_steps 2: warm-up steps 0-3, global 4-19, region 20-35, joint 36-51
    trainer = Trainer(_config(boxed, tiny, tmp_path / "run", 52, epoch_steps=2))
    params = dict(trainer.core.named_parameters())
    trains = {}
    for step in (3, 4, 19, 20, 35, 36, 51, 60):
        trainer.step = step
        trainer.apply_stage()
        trains[step] = {name for name in (VISION, TEXT, ROI) if params[name].requires_grad}
    assert trains[3] == trains[4] == trains[19] == {VISION, TEXT}
    assert trains[20] == trains[35] == {VISION, ROI}
    assert trains[36] == trains[51] == trains[60] == {VISION, TEXT, ROI}
    assert not params["model.logit_scale"].requires_grad  # train_logit_scale False holds in every stage
    # a stage never unfreezes what the config freezes: the text tower with freeze_text
    held = Trainer(_config(boxed, tiny, tmp_path / "held", 52, epoch_steps=2, freeze_text=True))
    held.step = 40
    held.apply_stage()
    assert not dict(held.core.named_parameters())[TEXT].requires_grad


def test_a_few_cpu_steps_run_through_all_four_stages(boxed, tiny, tmp_path):  # noqa: F811
    # 8 steps: boundaries round(8 * 2/26) = 1, round(8 * 10/26) = 3, round(8 * 18/26) = 6
    trainer = Trainer(_config(boxed, tiny, tmp_path / "run", 8))
    trainer.resume()
    snapshots, terms = {}, []
    try:
        for step in range(8):
            if step in (0, 3, 6):
                snapshots[step] = {k: v.detach().clone() for k, v in trainer.core.state_dict().items()}
            metrics = trainer.train_step()
            assert math.isfinite(metrics["loss"])
            terms.append({k[len("loss_") :] for k in metrics if k.startswith("loss_")})
    finally:
        trainer.close()
    snapshots[8] = trainer.core.state_dict()
    assert terms[:3] == [{"figure"}] * 3  # warm-up (step 0), global (1-2)
    assert terms[3:6] == [{"region", "negative"}] * 3  # region refinement (3-5)
    assert terms[6:] == [{"figure", "region", "negative"}] * 2  # joint (6-7)

    def changed(name: str, a: int, b: int) -> bool:
        return not torch.equal(snapshots[a][name], snapshots[b][name])

    assert changed(VISION, 0, 3) and changed(TEXT, 0, 3) and not changed(ROI, 0, 3)
    assert changed(VISION, 3, 6) and changed(ROI, 3, 6) and not changed(TEXT, 3, 6)  # the text tower held
    assert changed(TEXT, 6, 8) and changed(ROI, 6, 8)


def test_two_ddp_ranks_with_loader_workers_run_the_four_stages(boxed, tiny, tmp_path):  # noqa: F811
    """DDP must cope with the groups a stage freezes (found unused) and with loader workers."""
    import json

    import fsspec

    from pipelines import launch
    from tests.e2e.test_multilevel_torchrun import _torchrun

    run = tmp_path / "ddp"
    config = {
        "preset": "region-aware", "region_features": "roi_processor", "roi_heads": 4, "run_dir": str(run),
        "model": f"local-dir:{tiny}", "device": "cpu", "figure_data": [boxed["figure"]],
        "region_data": [boxed["region"]], "batch_size": 2, "steps": 8, "warmup": 1, "lr": 1e-3,
        "link_pull": 4, "max_children": 4, "negative_loss": "softmax", "checkpoint_every": 8, "log_every": 1,
        "workers": 1,
    }  # fmt: skip
    done = _torchrun(config, tmp_path / "config.json")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((run / "report.json").read_text())
    assert report["ranks"] == 2 and report["steps"] == 8 and math.isfinite(report["final_loss"])
    assert report["loss_figure"] > 0 and report["loss_region"] > 0  # the joint stage's terms
    with fsspec.open(launch.latest_checkpoint(str(run / "checkpoints")), "rb") as f:
        saved = torch.load(f, map_location="cpu", weights_only=False)
    # one figure shard, two ranks: each rank every other figure; its one worker read 2 a step for 8 steps
    assert saved["loaders_by_rank"] == [{"figure": {"workers": 1, "batches": 8, "positions": [16]}}] * 2
    assert saved["roi_processor"]["attention.out_proj.weight"].abs().sum() > 0  # trained from the region stage
