"""How `make test` spreads tests/e2e over its xdist workers (tests/conftest.py): one module a worker
at a time, except the modules on the session's ``dagster dev``, which go to one worker together so
it boots once (session fixtures are per worker)."""

from __future__ import annotations

from tests import conftest


class _Config:
    """What xdist's schedulers read of pytest's config: the ``--dist`` mode and the workers."""

    def __init__(self, dist: str) -> None:
        self.values = {"dist": dist, "tx": ["3*popen"]}

    def getvalue(self, name: str):
        return self.values[name]


def test_the_modules_on_the_session_dagster_dev_are_one_unit_of_work():
    scheduler = conftest.pytest_xdist_make_scheduler(_Config("loadfile"), log=None)
    scope = scheduler._split_scope
    web = scope("tests/e2e/test_e2e_dagster_dev.py::test_sample_release_through_the_web_server")
    postgres = scope("tests/e2e/test_postgres_instance.py::test_local_profile_keeps_sqlite")
    assert web == postgres == "tests/e2e/test_e2e_dagster_dev.py"
    # every other module stays its own unit
    assert scope("tests/e2e/test_cli.py::test_x") == "tests/e2e/test_cli.py"
    assert scope("tests/e2e/test_refresh_daemon.py::test_y") == "tests/e2e/test_refresh_daemon.py"


def test_other_distribution_modes_keep_xdists_own_scheduler():
    assert conftest.pytest_xdist_make_scheduler(_Config("load"), log=None) is None
