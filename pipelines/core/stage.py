"""The stage contract: one object per pipeline step, the same shape for every stage.

A stage declares the lake tables it reads and writes, whether it runs once per release or
once per (release, shard), and what one run needs (CPUs, GPUs, Ray actors, a concurrency
pool). ``run`` does the stage's own lake I/O and returns a :class:`StageResult` with the same
counters everywhere (items ok / error / skipped, bytes, seconds) plus the stage's own numbers,
previews, paths and checks. The Dagster assets only resolve the partition and report; tests,
benchmarks, the demo and Ray workers call exactly the same ``run``.

The settings a stage needs are its constructor arguments (plain values, or clients opened by
the caller), never the environment: resources turn configuration into stages.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import ClassVar

from pipelines.core.errors import ServiceUnavailableError, StageInputError  # noqa: F401 (the two error bases, re-exported)
from pipelines.core.fingerprints import fingerprint
from pipelines.core.lake import WRITERS, Lake, import_stages  # noqa: F401 (import_stages re-exported)

RELEASE, SHARD = "release", "shard"
PROGRESS_INTERVAL_S = 30.0

ProgressSink = Callable[[str], None]
# Where progress lines go during ``Stage.run``: the run log when an asset runs the stage. A context
# variable, so a stage deep in its helpers reports without every signature passing a callback.
_progress_sink: ContextVar[ProgressSink | None] = ContextVar("panelforge_progress_sink", default=None)
_log = logging.getLogger("panelforge.progress")


@dataclass(frozen=True)
class Partition:
    """A release, or one shard of it (``shard`` None means the whole release)."""

    release: str
    shard: str | None = None

    def __str__(self) -> str:
        return self.release if self.shard is None else f"{self.release}|{self.shard}"


def chunks(items: list, size: int) -> Iterator[list]:
    """``items`` in consecutive lists of ``size``: what bounds a stage's memory by its batch."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def fingerprint_unless_error(row: dict) -> str | None:
    """A model-calling stage's row is reusable by its fingerprint unless it recorded an error."""
    return row["fingerprint"] if row["status"] != "error" else None


IMAGE_LINK = ("pmcid", "image_file")  # how a child row names its parent: the figure image


def _by_key(
    rows: list[dict], child_rows: list[dict] | None, key: Callable[[dict], str | None], link: tuple[str, ...]
) -> dict[str, tuple[dict, list[dict]]]:
    by_parent: dict[tuple, list[dict]] = {}
    for row in child_rows or []:
        by_parent.setdefault(tuple(row[c] for c in link), []).append(row)
    found = {}
    for row in rows:
        k = key(row)
        if k:
            found[k] = (row, by_parent.get(tuple(row[c] for c in link), []))
    return found


def reuse_releases(lake: Lake, tables: tuple[str, ...], partition: Partition, this_release: bool = True) -> list[str]:
    """Where a stage looks for results to reuse, in order (a later release's rows win): the release
    before ``partition``'s that has ``tables[0]``, then, with ``this_release``, the partition itself
    (a rerun). A release is left out unless every table of ``tables`` is there for the shard and
    they were published by one commit (:meth:`Lake.commit`), so an item's rows in one table are
    never reused with another run's rows in the next. :func:`reusable_results` reads the rows; a
    stage whose tables must stream (parsing) reads them itself from the same releases."""
    previous = lake.previous_release(tables[0], partition.release)
    releases = [previous] + ([partition.release] if this_release else [])
    return [
        release
        for release in releases
        if release
        and all(lake.exists(lake.table_path(t, release, partition.shard)) for t in tables)
        and same_commit(lake, tables, release, partition.shard)
    ]


def reusable_results(
    lake: Lake,
    table: str,
    partition: Partition,
    key: Callable[[dict], str | None],
    children: str | None = None,
    this_release: bool = True,
    link: tuple[str, ...] = IMAGE_LINK,
) -> dict[str, tuple[dict, list[dict]]]:
    """Per-item results an earlier run left that a stage may carry instead of computing again,
    by ``key`` (a fingerprint of the inputs and settings; None: not reusable, e.g. an error).

    The one reuse rule of every stage: read from the releases :func:`reuse_releases` names, the
    previous release and then, with ``this_release``, this partition itself (a rerun), so a
    rerun's own rows win. Each row comes with its rows in the ``children`` table with the same
    ``link`` columns (pmcid and image_file: a figure with its panels or pairs; pair_id: a region
    pair with its negatives). Rows are used only when both tables were published by the same
    commit, so a parent is never reused with another run's children; a killed run's finished
    items are in :class:`Checkpoints`."""
    found: dict[str, tuple[dict, list[dict]]] = {}
    tables = (table, children) if children else (table,)
    for release in reuse_releases(lake, tables, partition, this_release):
        rows = lake.read_table(table, release, partition.shard)
        child_rows = lake.read_table(children, release, partition.shard) if children else None
        if rows is None or (children and child_rows is None):
            continue
        child_list = child_rows.to_pylist() if child_rows is not None else None
        found.update(_by_key(rows.to_pylist(), child_list, key, link))
    return found


def same_commit(lake: Lake, tables: Iterable[str], release: str, shard: str) -> bool:
    """The partitions of ``tables`` were published together (files from before commit ids were
    stamped carry none and are trusted)."""
    commits = {lake.commit_of(t, release, shard) for t in tables} - {None}
    return len(commits) <= 1


class Checkpoints:
    """The finished items of a run that has not finished yet, so a killed run resumes where it
    stopped instead of sending every request again.

    A model stage saves its finished items every few batches as one part (a folder of its tables'
    rows under ``checkpoints/<stage>/release=R/shard=S/``), published as a commit, so a part is
    whole or absent. The run's final commit removes them with the same step that publishes the
    tables, so checkpoints never outlive the output they were for."""

    def __init__(self, lake: Lake, stage: str, partition: Partition, tables: tuple[str, ...]):
        self.lake, self.stage, self.partition, self.tables = lake, stage, partition, tables
        self.folder = lake.path("checkpoints", stage, f"release={partition.release}", f"shard={partition.shard}")
        self.saved = 0  # parts saved by this run

    def save(self, rows: dict[str, list[dict]]) -> None:
        """One part: the rows of each table for some finished items, published together."""
        part = f"{self.folder}/part-{time.time_ns():020d}"
        with self.lake.commit(self.stage, self.partition.release, self.partition.shard) as commit:
            for table in self.tables:
                commit.write_table(table, rows.get(table, []), dest=f"{part}/{table}.parquet")
        self.saved += 1

    def results(
        self, key: Callable[[dict], str | None], link: tuple[str, ...] = IMAGE_LINK
    ) -> dict[str, tuple[dict, list[dict]]]:
        """The items the checkpoints hold, by ``key``, each with its rows in the second table."""
        self.lake.recover(self.partition.release)
        found: dict[str, tuple[dict, list[dict]]] = {}
        try:
            parts = sorted(self.lake.fs.ls(self.folder, detail=False))
        except FileNotFoundError:
            return found
        for part in parts:
            tables = [self.lake.read_file(table, f"{part}/{table}.parquet") for table in self.tables]
            if any(t is None for t in tables):
                continue
            rows, *children = (t.to_pylist() for t in tables)
            found.update(_by_key(rows, children[0] if children else None, key, link))
        return found

    def clear(self, commit) -> None:
        """Remove every part when ``commit`` (the run's output) is published."""
        commit.remove(self.folder)


GPU_POOL = "gpu"  # the Dagster pool of every step that holds GPUs (its limit: PANELFORGE_GPU_SLOTS)


@dataclass(frozen=True)
class Compute:
    """What one run of a stage holds, declared on the class and read by its asset's decorator:
    ``pool``, the Dagster concurrency pool a run waits for (``GPU_POOL`` for model stages: the
    GPUs are shared by every such step); ``kinds``, what it runs on (``ray``, ``pytorch``,
    ``vllm``), shown in the UI. How many Ray actors and GPUs per actor is a setting of the stage
    instance (``actors``, ``gpus_per_actor``), not a declaration of its class."""

    pool: str | None = None
    kinds: tuple[str, ...] = ()


@dataclass
class Check:
    """A verdict on the stage's output; ``blocking`` failures stop downstream stages."""

    name: str
    passed: bool
    description: str
    blocking: bool = True
    metadata: dict = field(default_factory=dict)


class Markdown(str):
    """A metadata value shown as Markdown (plots as data-URI images, tables)."""


@dataclass
class Preview:
    rows: list[dict]
    columns: list[str]
    limit: int = 10


@dataclass
class StageResult:
    """Uniform counters of one stage run. ``ok`` / ``error`` / ``skipped`` count the stage's
    items (articles, images, samples...); ``skipped`` is work not needed (carried over from an
    earlier release, reused, excluded by rule); ``error`` are items recorded as failed."""

    stage: str
    partition: Partition
    ok: int = 0
    error: int = 0
    skipped: int = 0
    # of ``skipped``, the items carried from an earlier run or release: they succeeded then, so
    # they count among the tried items of the error rate (see :attr:`error_rate`)
    carried: int = 0
    bytes: int = 0
    seconds: float = 0.0
    counts: dict[str, object] = field(default_factory=dict)
    errors: list[tuple[str, str]] = field(default_factory=list)
    previews: dict[str, Preview] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    # a hash of what the stage produced, when it can say: Dagster's data version, so downstream
    # assets are marked stale only when it changes
    version: str | None = None

    @property
    def items(self) -> int:
        return self.ok + self.error + self.skipped

    @property
    def error_rate(self) -> float:
        """Failed items among the items the stage tried, carried ones included: errors are never
        carried (every run tries them again), so without the carried items a rerun that carries
        999 results and fails one bad image again would report a 100 % error rate and block
        what reads the partition. Items skipped by rule do not count."""
        tried = self.ok + self.error + self.carried
        return self.error / tried if tried else 0.0

    def add_errors(self, rows: Iterable[dict], item: str, reason: str) -> None:
        self.errors.extend((str(r[item]), str(r[reason])) for r in rows)

    def summary(self) -> dict[str, object]:
        return {
            "items_ok": self.ok,
            "items_error": self.error,
            "items_skipped": self.skipped,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            **self.counts,
        }


class Progress:
    """How far a long stage is, told to a person watching the run: a line when ``interval_s`` has
    passed since the last one, and one at the end.

    Lines go to the sink ``Stage.run`` was given (the run log), else to the ``panelforge.progress``
    logger. ``advance`` may be called from worker threads. ``heartbeat()`` adds a thread that
    writes the line even while no item finishes (one slow download, Ray starting its actors), so
    a run log is never silent for longer than the interval. ``clock`` is for tests."""

    def __init__(
        self,
        label: str,
        total: int,
        unit: str = "items",
        *,
        sink: ProgressSink | None = None,
        interval_s: float = PROGRESS_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.label, self.total, self.unit = label, total, unit
        self.sink = sink or _progress_sink.get() or _log.info
        self.interval_s, self.clock = interval_s, clock
        self.done = 0
        self.counts: Counter[str] = Counter()
        self.lines = 0
        self._started = self._last = clock()
        self._lock = threading.Lock()

    def advance(self, n: int = 1, **counts: int) -> None:
        """``n`` more items done; ``counts`` add to the named tallies shown on the line."""
        with self._lock:
            self.done += n
            self.counts.update(counts)
        self.beat()

    def beat(self) -> None:
        """Write the line if the interval has passed since the last one."""
        with self._lock:
            now = self.clock()
            if now - self._last < self.interval_s:
                return
            self._last = now
            self.lines += 1
            line = self._line(now)
        self.sink(line)

    def finish(self) -> None:
        """The last line, always written."""
        with self._lock:
            self.lines += 1
            line = self._line(self.clock(), final=True)
        self.sink(line)

    @contextmanager
    def heartbeat(self, poll_s: float = 1.0) -> Iterator[Progress]:
        """Beat from a background thread while the block runs, then write the final line."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(min(poll_s, self.interval_s)):
                self.beat()

        thread = threading.Thread(target=loop, name=f"progress {self.label}", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
        self.finish()

    def _line(self, now: float, final: bool = False) -> str:
        count = f"{self.done}/{self.total} {self.unit} ({self.done / self.total:.0%})" if self.total else ""
        count = count or f"{self.done} {self.unit}"  # an open-ended count: a job's steps
        tallies = "".join(f", {k} {v}" for k, v in sorted(self.counts.items()))
        state = "done" if final else "progress"
        return f"{self.label} {state}: {count}{tallies}; {now - self._started:.0f}s"


def written_bytes(lake: Lake, tables: Iterable[str], partition: Partition) -> int:
    """Bytes of the tables a shard stage wrote for ``partition``: the size of its output, for
    stages (the model stages) that do not count what they wrote themselves."""
    if partition.shard is None:
        return 0
    paths = [lake.table_path(t, partition.release, partition.shard) for t in tables if t in lake.tables]
    return sum(lake.fs.size(p) for p in paths if lake.exists(p))


class Stage:
    """Base class of every stage. Subclasses set the class attributes and implement
    ``process``; callers use ``run``."""

    name: ClassVar[str]
    level: ClassVar[str] = SHARD
    reads: ClassVar[tuple[str, ...]] = ()
    writes: ClassVar[tuple[str, ...]] = ()
    compute: ClassVar[Compute] = Compute()

    def __init_subclass__(cls, **kwargs) -> None:
        """A stage class that names itself declares the tables it writes: record it as their
        writer, so ``Lake.require`` can name the asset to materialize."""
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if isinstance(name, str):
            for table in cls.__dict__.get("writes", ()):
                WRITERS.setdefault(str(table), name)

    def run(self, lake: Lake, partition: Partition, progress: ProgressSink | None = None) -> StageResult:
        """``progress`` receives the lines of the stage's :class:`Progress` reports (the asset
        passes the run log's ``info``)."""
        if (partition.shard is None) != (self.level == RELEASE):
            raise ValueError(f"stage {self.name} runs per {self.level}, not on partition {partition}")
        started = time.perf_counter()
        lake.recover(partition.release)  # a commit a killed run left half-published is finished first
        token = _progress_sink.set(progress)
        try:
            result = self.process(lake, partition)
        finally:
            _progress_sink.reset(token)
        if any(table in lake.tables for table in self.writes):
            lake.refresh_catalog()
        if not result.bytes:
            result.bytes = written_bytes(lake, self.writes, partition)
        if result.version is None:
            result.version = self.data_version(lake, partition)
        result.seconds = time.perf_counter() - started
        return result

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        raise NotImplementedError

    def data_version(self, lake: Lake, partition: Partition) -> str | None:
        """Dagster's data version of what the run left: a hash of the rows of every table the stage
        writes in the partition (the release's shards for a release-level stage), so downstream
        assets go stale only when a row changed. Stages whose output is not tables (or whose
        inputs say more cheaply what changed) set ``StageResult.version`` themselves."""
        shards = [partition.shard] if partition.shard is not None else [*lake.shards(), "all"]
        digests = {
            f"{table}/{shard}": digest
            for table in self.writes
            for shard in shards
            if (digest := lake.data_digest(table, partition.release, shard)) is not None
        }
        return fingerprint(digests) if digests else None

    def result(self, partition: Partition, **fields) -> StageResult:
        return StageResult(stage=self.name, partition=partition, **fields)
