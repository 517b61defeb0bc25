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
