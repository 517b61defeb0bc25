"""Shared fixtures: the sample mirrors, loopback servers, an isolated lake and rate-limit state,
the expensive things built once per session (a parsed sample lake, tiny training data and
models, one local Ray), and the rule that keeps the fast tiers fast.

The tiers are directories: ``tests/unit`` (plain functions), ``tests/stages`` (stage objects on a
lake), ``tests/assets`` (through Dagster, in this process) and ``tests/e2e`` (anything that starts
a process: ``dagster dev``, PostgreSQL, Ray, Chromium, launched jobs, the command line). A test
that uses a fixture of :data:`PROCESS_FIXTURES` is marked ``e2e`` and must live in ``tests/e2e``;
a test outside it that starts a heavy program anyway, in a fixture or in its body, fails at once
(:func:`_no_heavy_programs`).
docs/testing.md says how to run each tier.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

# The Dagster definitions read these at import: 4 shards keep the tests' partition counts small.
os.environ["PANELFORGE_SHARDS"] = "4"
os.environ.setdefault("PANELFORGE_PROFILE", "local")
# Ray reads its auth mode when it is imported, and the Ray clusters the tests start spawn their
# servers with the environment of ray.init: both must agree whatever imports Ray first (collecting
# tests/e2e/test_vlm_ray.py does). Token auth is Ray 2.60's default for a local cluster; RayResource
# says so too (resources/compute.py).
os.environ.setdefault("RAY_AUTH_MODE", "token")
# Under pytest-xdist (`make test` and `make test-fast` run the fast tiers with -n auto) each worker
# gets its share of the cores for torch's intra-op threads (OpenMP reads this when torch is imported,
# after this file): N workers each running a thread per core oversubscribe the machine, and OpenMP's
# waiting threads spin.
if workers := os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // int(workers))))
# A runner that starts `make test` as a background job of a non-interactive shell starts it with
# SIGINT ignored (POSIX shells do that), and an ignored signal is inherited across fork and exec.
# `dagster dev`, its web server, daemon and code servers make SIGTERM do what SIGINT does
# (dagster._utils.interrupts.setup_interrupt_handlers), so each one the tests start ignored SIGTERM
# too and outlived its stop (CI, twice). The test process handles SIGINT as an interactive one does;
# a handled signal is reset to its default in a child, so every process the tests start sees it so.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest

from pipelines.core.lake import Lake
from testing.loopback.faults import FaultPlan
from testing.loopback.ftp_server import FtpLoopbackServer
from testing.loopback.s3_server import S3LoopbackServer
from testing.loopback.sample_mirror import build_cloud_mirror, build_legacy_mirror, sample_rows
from tests.helpers import REPO, SAMPLE_IMAGES, source_for, write_subset

E2E = REPO / "tests" / "e2e"

# Every fixture that starts a process, and what it starts. A test using one (directly or through
# another fixture) is end-to-end: marked ``e2e`` here and refused at collection outside tests/e2e.
PROCESS_FIXTURES = {
    "local_ray": "a local Ray (GCS, raylet, worker processes) for the session",
    "ray_cluster": "a two-node Ray cluster, each node its own `ray start` (e2e/test_ray_multinode.py)",
    "postgres": "a PostgreSQL server for the session (e2e/test_postgres_instance.py, `dagster_dev`'s database)",
    "dagster_dev": "`dagster dev` on PostgreSQL for its module, the cluster profile (e2e/test_e2e_dagster_dev.py)",
    "dagster_ui": "`dagster dev` on a demo-like instance, set up by the CLI (e2e/test_ui_browser.py)",
    "headless_chromium": "headless Chromium through Playwright (e2e/test_ui_browser.py)",
    "daemon_refresh": "`dagster dev` and the CLI carrying two releases of a five-article mirror through "
    "(e2e/test_refresh_daemon.py)",
}

# What a fast-tier test may not start even without a fixture: a Python interpreter (a CLI, a
# launched job, a killed writer), Dagster, Ray, torchrun, a browser, a database server. Small
# programs (tesseract, git, make -n, duckdb) stay allowed.
HEAVY_PROGRAM = re.compile(
    r"(^|/)(python[0-9.]*|dagster(-webserver|-daemon)?|ray|raylet|gcs_server|torchrun|chrom(e|ium)[\w-]*|"
    r"postgres|initdb|pg_ctl)$"
)


def _in_e2e(item: pytest.Item) -> bool:
    return Path(str(item.path)).resolve().is_relative_to(E2E)


# Under xdist `make test` runs tests/e2e one module per worker at a time (--dist loadfile, so module
# fixtures are built once), the modules that take longest first (--no-loadscope-reorder keeps this
# order; xdist would otherwise start the modules with most tests): the refresh daemon alone is about a
# third of the tier. `dagster dev` on PostgreSQL (the `dagster_dev` fixture) serves the one module
# that uses it, booted once for its tests and stopped when they end, so it idles through no other
# module (about a tenth of a core, its daemon's loops).
DAGSTER_DEV_MODULE = "tests/e2e/test_e2e_dagster_dev.py"
LONGEST_FIRST = ("tests/e2e/test_refresh_daemon.py", DAGSTER_DEV_MODULE)


@pytest.hookimpl(wrapper=True)
def pytest_xdist_auto_num_workers(config: pytest.Config):
    """``-n auto`` (``make test-fast``, and the fast tiers of ``make test``): a worker more than the
    cores xdist counts, unless ``PYTEST_XDIST_AUTO_NUM_WORKERS`` names the number. Part of each
    worker's time is waiting (servers answering, rate-limit slots, retries' back-off) while its
    core stands idle; the spare worker fills it. On 2 cores, three interleaved pairs of runs took
    178-200 s with three workers against 206-218 s with two, for about the same CPU
    (docs/testing.md, the eleventh pass). The e2e tier has its own count (``E2E_WORKERS``)."""
    cores = yield
    return cores if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") else cores + 1


def _module(item: pytest.Item) -> str:
    return Path(str(item.path)).resolve().relative_to(REPO).as_posix()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    misplaced, unshared = [], []
    for item in items:
        starts = sorted(PROCESS_FIXTURES.keys() & set(item.fixturenames))
        if _in_e2e(item):
            item.add_marker(pytest.mark.e2e)
            if "dagster_dev" in starts and _module(item) != DAGSTER_DEV_MODULE:
                unshared.append(f"  {item.nodeid}")
        elif starts:
            item.add_marker(pytest.mark.e2e)
            misplaced.append(f"  {item.nodeid}: uses {', '.join(starts)} ({PROCESS_FIXTURES[starts[0]]})")
        elif item.get_closest_marker("e2e"):
            misplaced.append(f"  {item.nodeid}: marked e2e")
    if misplaced:
        raise pytest.UsageError(
            "tests that start a process belong in tests/e2e (conftest.PROCESS_FIXTURES), not in the fast tiers:\n"
            + "\n".join(misplaced)
        )
    if unshared:
        raise pytest.UsageError(
            f"tests on the dagster_dev fixture belong in {DAGSTER_DEV_MODULE} (it boots once per module):\n"
            + "\n".join(unshared)
        )

    def rank(item: pytest.Item) -> int:
        module = _module(item)
        return LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: collection order within each rank


@contextlib.contextmanager
def _no_heavy_programs(nodeid: str):
    """While the block runs, starting a heavy program (see :data:`HEAVY_PROGRAM`) raises with the
    program's name: what starts one belongs in tests/e2e."""
    execute = subprocess.Popen._execute_child

    def guarded(self, args, executable, *rest, **kwargs):
        argv = [args] if isinstance(args, str | bytes | os.PathLike) else list(args)
        program = os.fsdecode(executable or argv[0])
        if HEAVY_PROGRAM.search(program):
            raise RuntimeError(
                f"{nodeid} starts {program!r} ({' '.join(map(os.fsdecode, argv))[:200]}): "
                "a test that starts a process belongs in tests/e2e (see tests/conftest.py)"
            )
        return execute(self, args, executable, *rest, **kwargs)

    subprocess.Popen._execute_child = guarded
    try:
        yield
    finally:
        subprocess.Popen._execute_child = execute


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    """Outside tests/e2e no fixture may start a heavy program while it is set up: module- and
    session-scoped ones included (they are set up before any function-scoped fixture, so an autouse
    fixture would not see them; a module fixture once started a whole local Ray unnoticed)."""
    if _in_e2e(item):
        return (yield)
    with _no_heavy_programs(item.nodeid):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """Outside tests/e2e the test itself may not start a heavy program either."""
    if _in_e2e(item):
        return (yield)
    with _no_heavy_programs(item.nodeid):
        return (yield)


@pytest.fixture(autouse=True)
def _isolated_rate_state(tmp_path, monkeypatch):
    """Each test gets its own rate-limit slot files, so tests never wait on each other."""
    monkeypatch.setenv("PANELFORGE_RATE_DIR", str(tmp_path / "ratelimit"))


@pytest.fixture
def no_network(monkeypatch) -> list[str]:
    """No socket can connect or resolve a name: what loads here loads offline. Yields the list of
    attempts (each refused at once), so a test can also check that none was made."""
    attempts: list[str] = []

    def refuse(sock, address, *args):
        attempts.append(f"connect {address!r}")
        raise ConnectionRefusedError(f"no network in this test (connect to {address!r})")

    def no_dns(host, *args, **kwargs):
        attempts.append(f"resolve {host!r}")
        raise socket.gaierror(socket.EAI_NONAME, f"no network in this test (resolve {host!r})")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    return attempts


@pytest.fixture(scope="session")
def rows() -> list[dict]:
    return sample_rows()


@pytest.fixture
def sample(rows) -> list[dict]:
    """A private copy of the sample release rows that a test may edit."""
    return copy.deepcopy(rows)


@pytest.fixture(scope="session")
def cloud_mirror(tmp_path_factory) -> Path:
    return build_cloud_mirror(tmp_path_factory.mktemp("cloud"))


@pytest.fixture(scope="session")
def legacy_mirror(tmp_path_factory) -> Path:
    return build_legacy_mirror(tmp_path_factory.mktemp("legacy"))


@pytest.fixture
def lake(tmp_path) -> Lake:
    return Lake(tmp_path / "lake")


@pytest.fixture
def s3_server(cloud_mirror):
    with S3LoopbackServer(cloud_mirror, plan=FaultPlan()) as server:
        yield server


@pytest.fixture
def ftp_server(legacy_mirror):
    with FtpLoopbackServer(legacy_mirror, plan=FaultPlan()) as server:
        yield server


# ------------------------------------------------------------------ built once per session


PARSED_RELEASE = "2025"


@pytest.fixture(scope="session")
def parsed_lake(tmp_path_factory, cloud_mirror) -> Lake:
    """The sample release ``2025`` acquired through the S3 loopback server and parsed, 4 shards.
    Shared by the session: never write to it; ``tests.helpers.copy_lake`` it first."""
    from testing.pipeline import parse_release
    from tests.helpers import run_release

    lake = Lake(tmp_path_factory.mktemp("parsed") / "lake")
    with S3LoopbackServer(cloud_mirror) as server, source_for(server.url) as source:
        run_release(lake, source, PARSED_RELEASE)
    parse_release(lake, PARSED_RELEASE)
    return lake


HARD_NEGATIVES = "arrows mark the cytoplasm\narrows mark the membrane"  # two hard negatives, one a line


@pytest.fixture(scope="session")
def multilevel_tiny(tmp_path_factory) -> Path:
    """The multi-level trainer's tiny OpenCLIP ``local-dir:`` model (32 px, seed 0); read-only."""
    from pipelines.training.tiny import TINY_CLIP_32PX, write_tiny_clip

    folder = tmp_path_factory.mktemp("model") / "tiny"
    return write_tiny_clip(folder, seed=0, model_cfg=TINY_CLIP_32PX["model_cfg"])


@pytest.fixture(scope="session")
def multilevel_release(tmp_path_factory) -> dict[str, str]:
    """2 figures -> 3 panels -> 4 regions of real sample images, linked by key; two regions with
    hard negatives. {level: subset folder}; read-only."""
    root = tmp_path_factory.mktemp("release")
    jpg = [p.read_bytes() for p in SAMPLE_IMAGES[:4]]
    figures = [("PMC1-fig1", "Panels of stained cells and blots."), ("PMC2-fig3", "Survival curves and scans.")]
    panels = [("PMC1-fig1_p000", "stained cells"), ("PMC1-fig1_p001", "western blot"), ("PMC2-fig3_p000", "a scan")]
    regions = [
        ("PMC1-fig1_p000_r00", "arrows mark the nuclei", "bright round nuclei", HARD_NEGATIVES),
        ("PMC1-fig1_p000_r01", "asterisk marks a vessel", "", ""),
        ("PMC1-fig1_p001_r00", "the upper band", "a dark band", "the lower band"),
        ("PMC2-fig3_p000_r00", "the left lesion", "a round lesion", ""),
    ]  # fmt: skip
    meta = lambda d="": json.dumps({"description": d}).encode()  # noqa: E731
    return {
        "figure": str(write_subset(root / "commercial", [
            {"__key__": k, "jpg": jpg[i], "txt": t.encode(), "json": meta()} for i, (k, t) in enumerate(figures)
        ])),
        "panel": str(write_subset(root / "panel-commercial", [
            {"__key__": k, "jpg": jpg[i % 4], "txt": t.encode(), "json": meta()} for i, (k, t) in enumerate(panels)
        ])),
        "region": str(write_subset(root / "region-commercial", [
            {"__key__": k, "jpg": jpg[(i + 1) % 4], "txt": t.encode(), "json": meta(d), "neg.txt": n.encode()}
            for i, (k, t, d, n) in enumerate(regions)
        ])),
    }  # fmt: skip


@pytest.fixture(scope="session")
def boxed_release(tmp_path_factory) -> dict[str, str]:
    """2 figures (787x393 sample images) and 4 regions with boxes in figure pixels; the last
    region's box runs off its figure (x2 900 > 787), so it is skipped at every read. Read-only."""
    root = tmp_path_factory.mktemp("boxed")
    jpg = [p.read_bytes() for p in SAMPLE_IMAGES[:2]]
    meta = lambda **m: json.dumps(m).encode()  # noqa: E731
    figures = [
        {"__key__": "PMC1-fig1", "jpg": jpg[0], "txt": b"Panels of stained cells.", "json": meta()},
        {"__key__": "PMC2-fig3", "jpg": jpg[1], "txt": b"Survival curves.", "json": meta()},
    ]
    regions = [
        ("PMC1-fig1_p000_r00", [100, 50, 300, 200], "arrows mark the nuclei", "the cytoplasm\nthe membrane"),
        ("PMC1-fig1_p000_r01", [400, 100, 500, 390], "asterisk marks a vessel", ""),
        ("PMC1-fig1_p001_r00", [0, 0, 787, 393], "the upper band", "the lower band"),
        ("PMC2-fig3_p000_r00", [700, 300, 900, 400], "the left lesion", ""),
    ]  # fmt: skip
    region_samples = [
        {"__key__": k, "jpg": jpg[0], "txt": t.encode(), "json": meta(box=b, figure_key=k.split("_")[0]),
         "neg.txt": n.encode()}
        for k, b, t, n in regions
    ]  # fmt: skip
    return {
        "figure": str(write_subset(root / "commercial", figures)),
        "region": str(write_subset(root / "region-commercial", region_samples)),
    }


# ------------------------------------------------------------------ processes (tests/e2e only)


def _start_local_ray():
    import ray

    if ray.is_initialized():  # another Ray in this process (a cluster's driver): its workers lack PYTHONPATH
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    return ray


@pytest.fixture(scope="session")
def _local_ray_session():
    """One local Ray for the session. Its workers import ``pipelines`` (the stages' functions are
    pickled by reference), so they get the repository on PYTHONPATH; offline, so a model's config
    is never fetched. No dashboard: ray[default] is not installed here."""
    pytest.importorskip("ray")
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "HF_HUB_OFFLINE")}
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), saved["PYTHONPATH"]]))
    os.environ["HF_HUB_OFFLINE"] = "1"
    ray = _start_local_ray()
    yield
    ray.shutdown()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def local_ray(_local_ray_session):
    """The session's local Ray (started again if a test in between shut it down, as the
    multi-node cluster's driver does)."""
    import ray

    if not ray.is_initialized():
        _start_local_ray()
    return ray


@pytest.fixture(scope="session")
def postgres():
    """One throwaway PostgreSQL server on 127.0.0.1 for the session (Debian's binaries): skipped
    without them, failed under ``PANELFORGE_REQUIRE_SYSTEM=1``. Tests create their own databases."""
    from testing.loopback.postgres import postgres_server
    from testing.system import postgres_bindir, require

    bindir = postgres_bindir()
    require(bindir, "PostgreSQL server binaries (initdb, pg_ctl) not found: apt-get install postgresql")
    with postgres_server(bindir) as pg:
        yield pg


@pytest.fixture(scope="module")
def dagster_dev(tmp_path_factory, postgres, cloud_mirror):
    """One ``dagster dev`` (web server + daemon) for its module: the cluster profile on its own
    database of the session's PostgreSQL, the sample mirror behind the loopback S3 server, a local
    lake, 4 shards, automation slowed to once an hour (an inventory does not set off the graph).
    Tests share it: each opens its own release (a year no other test uses) and reads only that.
    Stopping it must leave none of its processes (code servers, run workers) behind."""
    from testing.dagster_dev import SharedDagsterDev

    with SharedDagsterDev.start(tmp_path_factory.mktemp("dagster_dev"), postgres, cloud_mirror) as shared:
        yield shared
