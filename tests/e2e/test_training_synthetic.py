"""The training and evaluation assets in the synthetic profile (``make demo``, ``make ui``) with every
setting at its production default: they train and evaluate the tiny local models (built once in
the lake, marked synthetic) for a few CPU steps instead of fetching ViT-L-14 weights, and a
setting a person changed is kept."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from dagster import DagsterInstance

from assets.evaluation import clip_evaluation
from assets.training import (
    SYNTHETIC_CLIP,
    ClipTrainingSettings,
    clip_continual_pretraining,
    multilevel_training,
    synthetic_clip_settings,
)
from pipelines.core.heldout import HeldoutSplit, make_heldout_split, record_split
from pipelines.core.lake import Lake
from pipelines.training.tiny import is_synthetic
from resources.compute import ModelsResource
from resources.lake import LakeResource
from resources.launcher import JobLauncherResource
from resources.settings import REPO
from tests.helpers import SAMPLE_IMAGES as IMAGES
from tests.helpers import materialize_one
from tests.helpers import write_subset as _write
from tests.unit.test_evaluation import _release_lake


@pytest.fixture
def data(multilevel_release) -> dict[str, str]:
    return multilevel_release  # the session's linked figure/panel/region subsets (tests/conftest.py)


def _resources(home: Path) -> dict:
    return {
        "lake": LakeResource(home=str(home), shards=4),
        "models": ModelsResource(synthetic=True),
        "launcher": JobLauncherResource(backend="subprocess", cwd=str(REPO), env={"PYTHONPATH": str(REPO)}),
    }


def test_a_changed_setting_is_kept_and_the_rest_take_the_demo_sizes(tmp_path):
    changed = synthetic_clip_settings(ClipTrainingSettings(epochs=2, lr=1e-3), str(tmp_path))
    assert (changed.epochs, changed.lr) == (2, 1e-3)  # set by hand: kept
    assert (changed.batch_size, changed.device) == (SYNTHETIC_CLIP["batch_size"], "cpu")
    assert changed.model == f"local-dir:{tmp_path / 'tiny-openclip-seed0'}" and changed.pretrained == ""
    assert is_synthetic(tmp_path / "tiny-openclip-seed0")
    longclip = synthetic_clip_settings(ClipTrainingSettings(recipe="bmc-longclip"), str(tmp_path))
    assert longclip.text_model == str(tmp_path / "tiny-modernbert-seed0")
    mine = synthetic_clip_settings(ClipTrainingSettings(model="local-dir:/mine"), str(tmp_path))
    assert mine.model == "local-dir:/mine"


def test_the_training_assets_run_with_their_defaults(data, tmp_path):  # noqa: F811
    home = tmp_path / "lake"
    lake = Lake(str(home))
    jpg = [p.read_bytes() for p in IMAGES[:4]]
    figures = [
        {
            "__key__": f"PMC{i}-fig1",
            "jpg": jpg[i % 4],
            "txt": b"stained cells",
            "json": f'{{"pmcid": "PMC{i}"}}'.encode(),
        }
        for i in range(16)
    ]
    _write(Path(lake.path("dataset", "r1", "commercial")), figures)
    # the release's recorded held-out split: PMC3 and PMC5, whose two figures training leaves out
    record_split(lake, HeldoutSplit("r1", 0.1, "chosen-by-hand", frozenset({"PMC3", "PMC5"}), 16))
    for level, subset in (("panel", "panel-commercial"), ("region", "region-commercial")):
        src = Path(data[level])
        dest = Path(lake.path("dataset", "r1", subset))
        dest.mkdir(parents=True)
        for name in ("panelforge-000000.tar", "sizes.json"):
            (dest / name).write_bytes((src / name).read_bytes())
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("releases", ["r1"])

    clip = materialize_one(clip_continual_pretraining, "r1", instance, _resources(home))
    (event,) = clip.get_asset_materialization_events()
    meta = {k: v.value for k, v in event.materialization.metadata.items()}
    assert meta["synthetic"] is True and meta["epochs"] == 1 and meta["samples_per_epoch"] == 14
    assert meta["heldout_samples_excluded"] == 2 and meta["heldout_articles"] == 2
    assert meta["heldout_split"] == lake.path("models", "eval", "r1", "heldout.json")
    assert meta["model"] == f"local-dir:{lake.path('models', 'synthetic', 'tiny-openclip-seed0')}"
    assert math.isfinite(meta["final_loss"])
    exported = Path(meta["launch_run_dir"]) / "model"
    assert is_synthetic(exported)  # the export of a synthetic model says so too

    multi = materialize_one(multilevel_training, "r1", instance, _resources(home))
    (event,) = multi.get_asset_materialization_events()
    meta = {k: v.value for k, v in event.materialization.metadata.items()}
    assert meta["synthetic"] is True and meta["preset"] == "zoom-in" and meta["steps"] == 4
    # the figure level loses PMC3's and PMC5's figures; the panels and regions (tests/conftest.py) name no PMCID
    assert json.loads(meta["heldout_samples_excluded"]) == {"figure": 2, "panel": 0, "region": 0}
    assert math.isfinite(meta["final_loss"])


def test_the_evaluation_asset_runs_with_its_defaults(tmp_path):
    lake = _release_lake(tmp_path)
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("releases", ["2025"])
    refused = materialize_one(clip_evaluation, "2025", instance, _resources(lake.root), raise_on_error=False)
    assert not refused.success  # no split recorded and no share: refused before launching, in one line
    (failure,) = [e for e in refused.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "no held-out split recorded for release 2025: set share" in failure.event_specific_data.error.message

    make_heldout_split(lake, "2025", share=0.999999, pmcids=["PMC1", "PMC2", "PMC3", "PMC9"])
    other_rule = materialize_one(
        clip_evaluation, "2025", instance, _resources(lake.root), {"share": 0.5}, raise_on_error=False
    )
    assert not other_rule.success  # a split by another rule over the recorded one: refused before launching
    (failure,) = [e for e in other_rule.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "release 2025 already has a held-out split (share 0.999999" in failure.event_specific_data.error.message
    result = materialize_one(clip_evaluation, "2025", instance, _resources(lake.root), {"n_resamples": 20})
    (event,) = result.get_asset_materialization_events()
    meta = {k: v.value for k, v in event.materialization.metadata.items()}
    assert meta["synthetic"] is True and meta["model"].endswith("tiny-openclip-seed0")
    assert "(synthetic)" in meta["report"]
    report = json.loads(next((Path(lake.root) / "models" / "eval" / "2025").glob("*/report.json")).read_text())
    assert report["model"].endswith("tiny-openclip-seed0 (synthetic)")
