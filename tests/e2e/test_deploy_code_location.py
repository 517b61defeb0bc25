"""The code location loads (``dagster definitions validate``, a separate process) with the
environment the Helm chart gives the code server, and a bad setting there fails the load.
(The deployment files themselves: tests/assets/test_deploy.py.)"""

import os
import subprocess
import sys
from pathlib import Path

from tests.assets.test_deploy import HELM_VALUES, REPO, load

# --- the code location with the cluster environment -------------------------------------------


def _validate(env: dict) -> subprocess.CompletedProcess:
    dagster = str(Path(sys.executable).with_name("dagster"))
    return subprocess.run(
        [dagster, "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_the_code_location_loads_with_the_helm_environment(tmp_path):
    (deployment,) = load(HELM_VALUES)["dagster-user-deployments"]["deployments"]
    helm_env = {item["name"]: item["value"] for item in deployment["env"]}
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PANELFORGE_", "DAGSTER_PG_"))}
    env = {**base, **helm_env, "DAGSTER_HOME": str(tmp_path)}
    done = _validate(env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "All code locations passed validation" in done.stdout + done.stderr

    # and the check is real: a bad setting in that environment fails the load, naming it
    done = _validate({**env, "PANELFORGE_SHARDS": "0"})
    assert done.returncode != 0
    assert "PANELFORGE_SHARDS must be at least 1" in done.stdout + done.stderr
