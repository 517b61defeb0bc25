"""The multi-level trainer as the launcher runs a 2-GPU job: ``torchrun --nproc-per-node 2``
(the launcher's own command line) with two gloo ranks on CPU, trained, checkpointed once by rank
0, then resumed on both ranks from that checkpoint."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest
import torch

from pipelines import launch
from resources.launcher import build_command


@pytest.fixture
def data(multilevel_release) -> dict[str, str]:
    return multilevel_release  # the session's linked figure/panel/region subsets (tests/conftest.py)


@pytest.fixture
def tiny(multilevel_tiny) -> Path:
    return multilevel_tiny  # the session's tiny OpenCLIP (tests/conftest.py)


REPO = Path(__file__).resolve().parents[2]


def _torchrun(config: dict, path: Path) -> subprocess.CompletedProcess:
    path.write_text(json.dumps(config))
    command = build_command(sys.executable, "pipelines.training.multilevel", str(path), gpus=2)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_torchrun_two_cpu_ranks_train_checkpoint_once_and_resume(data, tiny, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    config = {
        "preset": "region-aware", "run_dir": str(run), "model": f"local-dir:{tiny}", "device": "cpu",
        "figure_data": [data["figure"]], "region_data": [data["region"]], "batch_size": 2, "steps": 2,
        "warmup": 1, "lr": 1e-3, "checkpoint_every": 2, "log_every": 1, "keep_last_checkpoint_only": False,
        "curriculum": [], "negative_loss": "softmax",
    }  # fmt: skip
    done = _torchrun(config, tmp_path / "config.json")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((run / "report.json").read_text())
    # per step each rank reads 2 figures and 2 regions: 8 samples a rank in 2 steps
    assert report["ranks"] == 2 and json.loads(report["samples_by_rank"]) == [8, 8]
    assert math.isfinite(report["final_loss"]) and report["loss_region"] > 0
    # gather_across_ranks (default): the figure and region logits have both ranks' 2 + 2 texts as columns
    assert json.loads(report["logit_columns"]) == {"figure": 4, "region": 4}
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["ckpt-00000002.pt"]
    with fsspec.open(launch.latest_checkpoint(str(run / "checkpoints")), "rb") as f:
        saved = torch.load(f, map_location="cpu", weights_only=False)
    assert saved["consumed_by_rank"] == [{"figure": 4, "region": 4}, {"figure": 4, "region": 4}]
    assert done.stdout.count('{"report"') == 1  # rank 0 alone reports

    done = _torchrun({**config, "steps": 3}, tmp_path / "config.json")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((run / "report.json").read_text())
    assert report["resumed_from_step"] == 2 and report["steps"] == 3
    assert json.loads(report["samples_by_rank"]) == [12, 12]  # both ranks went on from their saved position
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["ckpt-00000002.pt", "ckpt-00000003.pt"]
