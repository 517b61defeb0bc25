"""The panel detector's training set from the release and a tiny DAB-DETR trained as a job launched
through Dagster Pipes (a separate process). (The panel stage itself: tests/stages/test_panel_stage.py.)"""

import json

import pytest

from testing.pipeline import sample_lake
from tests.stages.test_panel_stage import RELEASE


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    return sample_lake(tmp_path_factory.mktemp("panels"), RELEASE)


def test_synthetic_set_and_a_launched_detector_training(lake, tmp_path):
    """The release's own single-panel figures become a synthetic COCO set; DAB-DETR (tiny,
    random, 3 steps on CPU) trains on it as a job launched through Dagster Pipes, and reports
    synthetic-val mAP and recall/precision on the hand-boxed real figures."""
    from dagster import DagsterInstance

    from assets.panels import panel_detector, panel_training_set
    from resources.compute import ModelsResource
    from resources.lake import LakeResource
    from resources.launcher import JobLauncherResource
    from resources.settings import REPO
    from tests.helpers import materialize_one, open_test_release

    (tmp_path / "home").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "home"))
    open_test_release(instance, RELEASE)
    resources = {
        "lake": LakeResource(home=str(lake.root)),
        "models": ModelsResource(synthetic=True),
        "launcher": JobLauncherResource(backend="subprocess", cwd=str(REPO)),
    }
    made = materialize_one(panel_training_set, RELEASE, instance, resources, {"figures": 12, "val_share": 0.25})
    meta = {k: v.value for k, v in made.get_asset_materialization_events()[0].materialization.metadata.items()}
    assert (meta["train_figures"], meta["val_figures"]) == (9, 3) and meta["source_panels"] > 0
    train = json.loads(open(f"{meta['train']}/annotations.json").read())
    assert len(train["images"]) == 9 and {c["name"] for c in train["categories"]} == {"panel", "panel_label"}
    again = materialize_one(panel_training_set, RELEASE, instance, resources, {"figures": 12, "val_share": 0.25})
    assert again.get_asset_materialization_events()[0].materialization.metadata["reused"].value is True

    trained = materialize_one(
        panel_detector, RELEASE, instance, resources, {"steps": 3, "batch_size": 2, "checkpoint_every": 2}
    )
    report = {k: v.value for k, v in trained.get_asset_materialization_events()[0].materialization.metadata.items()}
    assert report["steps"] == 3 and report["model"] == "synthetic-tiny-dab-detr"
    assert 0.0 <= report["eval_map"] <= 1.0 and 0.0 <= report["eval_map_50"] <= 1.0
    assert report["real_figures"] == 20 and 0.0 <= report["real_recall"] <= 1.0
    assert lake.fs.glob(lake.path("models", "panels", "runs", "*", "checkpoints", "*"))
    assert lake.exists(report["model_dir"])
