"""The ``clip_evaluation`` asset launches the evaluation job through the job launcher (a
subprocess here) and shows its report; the job reads the release's shards from the lake and the
benchmarks named in its config (one run covers both: each launch costs a Python start-up)."""

from __future__ import annotations

import json

import pytest
from dagster import DagsterInstance

from assets.evaluation import clip_evaluation
from pipelines.core.heldout import make_heldout_split
from pipelines.evaluation.job import EvalJobConfig, main
from pipelines.training.tiny import TINY_CLIP as TINY
from resources.compute import ModelsResource
from resources.lake import LakeResource
from resources.launcher import JobLauncherResource
from resources.settings import REPO
from tests.helpers import materialize_one
from tests.unit.test_evaluation import _release_lake
from tests.unit.test_evaluation_benchmarks import write_vqa_rad


def test_clip_evaluation_asset_launches_the_job_and_reports(tmp_path):
    lake = _release_lake(tmp_path)
    make_heldout_split(lake, "2025", share=0.999999, pmcids=["PMC1", "PMC2", "PMC3", "PMC9"])
    model = tmp_path / "tiny-clip"
    model.mkdir()
    (model / "open_clip_config.json").write_text(json.dumps(TINY))
    (tmp_path / "home").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "home"))
    instance.add_dynamic_partitions("releases", ["2025"])
    resources = {
        "lake": LakeResource(home=str(lake.root), shards=4),
        "models": ModelsResource(synthetic=True),
        "launcher": JobLauncherResource(backend="subprocess", cwd=str(REPO), env={"PYTHONPATH": str(REPO)}),
    }
    benchmarks = [  # a VQA-RAD folder written by hand; an absent MedMNIST file
        {"kind": "vqa-rad", "path": str(write_vqa_rad(tmp_path / "vqarad"))},
        {"kind": "medmnist", "path": str(tmp_path / "absent" / "pathmnist.npz"), "name": "pathmnist"},
    ]
    config = {
        "model": f"local-dir:{model}",
        "pretrained": "",
        "baseline": f"local-dir:{model}",
        "n_resamples": 20,
        "benchmarks": benchmarks,
    }
    result = materialize_one(clip_evaluation, "2025", instance, resources, config)
    assert result.success
    (event,) = result.get_asset_materialization_events()
    metadata = event.materialization.metadata
    # the figure level (k01, k03 held out; k09 undecodable), long-caption retrieval (one pair per
    # article) and vqa-rad; the absent benchmark has no rows
    assert metadata["datasets"].value == 3 and metadata["synthetic"].value is True
    assert "image_to_text_R@1" in metadata["report"].value
    reports = list((tmp_path / "lake" / "models" / "eval" / "2025").glob("*/report.json"))
    assert len(reports) == 1
    report = json.loads(reports[0].read_text())
    vqa = [r for r in report["rows"] if r["dataset"] == "vqa-rad"]
    # closed questions 1, 2 and 6 of the hand-written file; marked synthetic like the run
    assert [(r["metric"], r["n"], r["synthetic"]) for r in vqa] == [("accuracy", 3, True)]
    errors = {(d, k): reason for d, k, reason in report["errors"]}
    assert errors[("vqa-rad", "4")] == "image not found: synpic999.jpg"
    assert errors[("pathmnist", "*")].startswith("benchmark not loaded:")


def test_the_job_refuses_unknown_keys_by_name(tmp_path):
    # a misspelt key used to be dropped silently: the evaluation then ran its default (1000 resamples)
    near = r"unknown evaluation config keys: \['n_resample'\] \('n_resample': did you mean 'n_resamples'\?\)"
    with pytest.raises(ValueError, match=near):
        EvalJobConfig.from_dict({"lake": "l", "release": "2025", "model": "m", "n_resample": 20})
    path = tmp_path / "config.json"
    job = {"lake": str(tmp_path / "lake"), "release": "2025", "model": "m", "basline": "b"}
    path.write_text(json.dumps({**job, "launch": {"run_id": "r", "run_dir": str(tmp_path / "r")}}))
    with pytest.raises(ValueError, match=r"\['basline'\] \('basline': did you mean 'baseline'\?\)"):
        main(["--config", str(path)])
    assert not (tmp_path / "r").exists() and not (tmp_path / "lake").exists()
