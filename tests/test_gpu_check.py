"""``make gpu-check``: on a machine without a GPU it says so in one line and exits non-zero; its
``--dry-run`` runs every check's code on the CPU with the models at reduced size, which is how its
correctness is tested here (no GPU is lent to the test suite)."""

import json
import os
import subprocess
import sys

from benchmarks.gpu_check import CHECKS, NO_GPU, main
from resources.settings import REPO


def test_without_a_gpu_it_says_so_in_one_line_and_fails():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check"], capture_output=True, text=True, env=env,
                          cwd=REPO)  # fmt: skip
    assert done.returncode == 2
    assert done.stdout == "" and done.stderr.strip().splitlines() == [NO_GPU]


def test_the_dry_run_runs_every_check_and_writes_its_json(tmp_path):
    assert main(["--dry-run", "--out", str(tmp_path)]) == 0
    results = {name: json.loads((tmp_path / f"gpu_{name}.json").read_text()) for name in CHECKS}
    for name, result in results.items():
        assert "error" not in result, (name, result.get("error"))
        assert result["dry_run"] is True and result["device"] == "cpu" and result["wall_seconds"] > 0
        assert result["memory"]["peak_allocated_gb"] is None and "gpu_utilisation" in result
    assert results["dinov2"]["images_per_second"] > 0
    assert results["detector"]["figures_per_second"] > 0
    assert results["vlm_7b"]["new_tokens_per_second"] > 0 and results["vlm_7b"]["prompt_tokens_per_batch"] > 0
    clip = results["clip_train"]
    assert clip["precision"] == "fp32" and clip["grad_checkpointing"] is True and clip["samples_per_second"] > 0
    assert clip["largest_batch_estimated"] >= clip["batch_per_gpu"] > 0 and clip["out_of_memory_at"] == []


def test_an_unknown_check_is_refused(capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["--only", "dinov3"])
    assert "unknown checks ['dinov3']" in capsys.readouterr().err
