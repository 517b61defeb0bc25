"""``make gpu-check``: on a machine without a GPU it says so in one line and exits non-zero; its
``--dry-run`` runs every check's code on the CPU with the models at reduced size, which is how its
correctness is tested here (no GPU is lent to the test suite)."""

import json

from benchmarks.gpu_check import CHECKS, main


def test_the_dry_run_runs_every_check_and_writes_its_json(tmp_path):
    assert main(["--dry-run", "--out", str(tmp_path)]) == 0
    results = {name: json.loads((tmp_path / f"gpu_{name}.json").read_text()) for name in CHECKS}
    for name, result in results.items():
        assert "error" not in result, (name, result.get("error"))
        assert result["dry_run"] is True and result["device"] == "cpu" and result["wall_seconds"] > 0
        assert result["memory"]["peak_allocated_gb"] is None and "gpu_utilisation" in result
    for name, unit in (("dinov2", "images_per_second"), ("detector", "batched_figures_per_second")):
        # timed against the host-normalised inputs they had before; on the CPU both paths run the
        # same float32 arithmetic, so the model's outputs are the same to the bit
        result = results[name]
        assert result[unit] > 0 and result[f"baseline_{unit}"] > 0 and "host" in result["baseline"]
        assert result["max_abs_difference_from_baseline"] == 0.0
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
