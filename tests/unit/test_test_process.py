"""What the processes the tests start inherit from the test process (tests/conftest.py).

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
