"""``python -m benchmarks.gpu_check`` (``make gpu-check``) on a machine without a GPU: one line that
says so and exit status 2. (The checks in dry-run: tests/unit/test_gpu_check.py.)"""

import os
import subprocess
import sys

from benchmarks.gpu_check import NO_GPU
from resources.settings import REPO


def test_without_a_gpu_it_says_so_in_one_line_and_fails():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check"], capture_output=True, text=True, env=env,
                          cwd=REPO)  # fmt: skip
    assert done.returncode == 2
    assert done.stdout == "" and done.stderr.strip().splitlines() == [NO_GPU]
