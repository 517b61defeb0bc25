"""The ``multilevel_training`` asset launches the trainer as a job (the subprocess launcher) on a
release's linked figure/panel/region subsets and reports its run. (The trainer itself, in this
process: tests/unit/test_multilevel_training.py.)"""

import json
import math
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def data(multilevel_release) -> dict[str, str]:
    return multilevel_release  # the session's linked figure/panel/region subsets (tests/conftest.py)


@pytest.fixture
def tiny(multilevel_tiny) -> Path:
    return multilevel_tiny  # the session's tiny OpenCLIP (tests/conftest.py)


def test_the_asset_launches_the_trainer_on_a_release(data, tiny, tmp_path):
    import shutil

    from dagster import DagsterInstance, materialize

    from assets.training import multilevel_training
    from pipelines.core.lake import Lake
    from resources.compute import ModelsResource
    from resources.lake import LakeResource
    from resources.launcher import JobLauncherResource

    home = tmp_path / "lake"
    for level, subset in (("figure", "commercial"), ("panel", "panel-commercial"), ("region", "region-commercial")):
        shutil.copytree(data[level], Lake(str(home)).path("dataset", "r1", subset))
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("releases", ["r1"])
    settings = {"preset": "region-aware", "model": f"local-dir:{tiny}", "steps": 2, "batch_size": 2, "warmup": 1}
    settings |= {"device": "cpu", "log_every": 1, "overrides": json.dumps({"negative_loss": "softmax"})}
    # this lake has shards but no articles table to split: the held-out path is test_training_synthetic's
    settings |= {"exclude_heldout": False}
    launcher = JobLauncherResource(backend="subprocess", cwd=str(REPO), env={"PYTHONPATH": str(REPO)})
    result = materialize(
        [multilevel_training],
        partition_key="r1",
        instance=instance,
        resources={"lake": LakeResource(home=str(home)), "launcher": launcher, "models": ModelsResource()},
        run_config={"ops": {"multilevel_training": {"config": settings}}},
    )
    assert result.success
    (materialization,) = result.asset_materializations_for_node("multilevel_training")
    metadata = {k: v.value for k, v in materialization.metadata.items()}
    assert metadata["preset"] == "region-aware" and metadata["steps"] == 2
    assert math.isfinite(metadata["final_loss"])
    run_dir = Path(metadata["launch_run_dir"])
    assert run_dir.parent == home / "models" / "multilevel" / "runs"
    assert json.loads((run_dir / "config.json").read_text())["negative_loss"] == "softmax"
    assert (run_dir / "model" / "open_clip_model.safetensors").exists()
