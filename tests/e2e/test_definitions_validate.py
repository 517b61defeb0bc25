"""``dagster definitions validate`` on the workspace, as a user and the Helm chart's code server load
it (a separate process): the demo profile passes, a bad setting fails the load naming it."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _validate(**env) -> subprocess.CompletedProcess:
    """``dagster definitions validate`` on the workspace, with ``env`` added to the environment."""
    dagster = Path(sys.executable).with_name("dagster")
    return subprocess.run(
        [str(dagster), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )


def test_dagster_definitions_validate_passes():
    result = _validate(PANELFORGE_PROFILE="demo")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "All code locations passed validation" in result.stderr + result.stdout


def test_a_bad_setting_fails_the_code_location_load():
    result = _validate(PANELFORGE_SHARDS="0")
    assert result.returncode != 0
    assert "PANELFORGE_SHARDS must be at least 1, got 0" in result.stderr + result.stdout


def test_loading_the_code_location_imports_no_model_library():
    """Every code server, run worker and command line loads the definitions; torch alone added about
    2 s of CPU and 600 MB to each (measured: 4.6 s and 783 MB against 2.5 s and 175 MB), scipy's
    ndimage and spatial another 0.4 s and 30 MB (2.4 s against 2.0 s, 175 against 146 MB), OpenCV
    (the shared connected components) about 0.1 s, so these libraries are imported only by the
    steps that use them."""
    libraries = ("torch", "transformers", "open_clip", "scipy", "cv2")
    code = f"import sys, jobs.definitions; print(sorted(m for m in {libraries} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]", result.stdout
