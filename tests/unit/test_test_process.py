"""What the processes the tests start inherit from the test process, and how many workers ``-n auto``
starts (tests/conftest.py).

A runner that starts the suite as a background job hands it SIGINT ignored; a `dagster dev` that
inherits that ignores SIGTERM as well and outlives its stop (see the conftest), so the conftest
restores SIGINT's handler before any test runs.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import pytest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/status")
def test_a_process_the_tests_start_does_not_inherit_sigint_ignored():
    status = subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True, check=True).stdout
    ignored = int(re.search(r"^SigIgn:\s*([0-9a-f]+)$", status, re.MULTILINE).group(1), 16)
    assert not ignored & (1 << (signal.SIGINT - 1)), f"SigIgn {ignored:#x}: SIGINT ignored"


def test_auto_workers_are_one_more_than_the_cores(request, monkeypatch):
    """``-n auto`` (``make test-fast``) asks this hook: the conftest adds a spare worker to the
    cores xdist counts, and leaves a count the user names alone."""
    xdist = pytest.importorskip("xdist.plugin")
    hook = request.config.pluginmanager.hook
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    cores = xdist.pytest_xdist_auto_num_workers(request.config)
    assert hook.pytest_xdist_auto_num_workers(config=request.config) == cores + 1
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "5")
    assert hook.pytest_xdist_auto_num_workers(config=request.config) == 5
