"""A model stage's process killed with -9 mid-run (a real child process) resumes from its
checkpoints. (Everything else about model stages, in this process: tests/stages/test_model_stages.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from pipelines.core.lake import Lake
from tests.stages.test_model_stages import ASKED, PARTITION, REPO, Counting, copy_of, mining, paneled_lake


@pytest.fixture(scope="module")
def base_lake(tmp_path_factory) -> Lake:
    return paneled_lake(tmp_path_factory.mktemp("model-stages"))


def test_a_process_killed_with_minus_9_mid_run_resumes_from_its_checkpoints(base_lake, tmp_path):
    """The same, with a real kill: the child process exits at once (os._exit) during a batch."""
    lake = copy_of(base_lake, tmp_path / "lake")
    script = textwrap.dedent(
        f"""
        import os
        from pipelines.core.lake import Lake
        from tests.stages.test_model_stages import PARTITION, Counting, mining

        class Killed(BaseException):
            pass

        engine = Counting(die_after=7)
        engine.die = Killed()
        try:
            mining(engine, batch=3).run(Lake({lake.root!r}), PARTITION)
        except Killed:
            os._exit(9)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    assert subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, timeout=600).returncode == 9
    rerun = Counting()
    result = mining(rerun, batch=3).run(lake, PARTITION)
    assert result.counts["resumed"] == 6 and len(rerun.per_item()) == ASKED - 6
