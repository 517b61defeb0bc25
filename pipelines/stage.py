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

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar

from pipelines.lake import Lake

RELEASE, SHARD = "release", "shard"


class StageInputError(RuntimeError):
    """The stage cannot run on what the lake holds or on how it is configured (an upstream
    stage has not run, a setting is missing); the message says what to do."""


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


def reusable_results(
    lake: Lake,
    table: str,
    partition: Partition,
    key: Callable[[dict], str | None],
    children: str | None = None,
    this_release: bool = True,
) -> dict[str, tuple[dict, list[dict]]]:
    """Per-image results an earlier run left that a stage may carry instead of computing again,
    by ``key`` (a fingerprint of the inputs and settings; None: not reusable, e.g. an error).

    Read from the previous release with ``table`` and then, with ``this_release``, from this
    partition itself (a rerun), so a rerun's own rows win. Each row comes with its rows in the
    ``children`` table under the same (pmcid, image_file): a figure with its panels or pairs."""
    found: dict[str, tuple[dict, list[dict]]] = {}
    previous = lake.previous_release(table, partition.release)
    releases = [previous] + ([partition.release] if this_release else [])
    for release in [r for r in releases if r]:
        rows = lake.read_table(table, release, partition.shard)
        child_rows = lake.read_table(children, release, partition.shard) if children else None
        if rows is None or (children and child_rows is None):
            continue
        by_image: dict[tuple[str, str], list[dict]] = {}
        for row in child_rows.to_pylist() if child_rows is not None else []:
            by_image.setdefault((row["pmcid"], row["image_file"]), []).append(row)
        for row in rows.to_pylist():
            k = key(row)
            if k:
                found[k] = (row, by_image.get((row["pmcid"], row["image_file"]), []))
    return found


@dataclass(frozen=True)
class Compute:
    """What one run of a stage needs. ``ray_actors`` > 0: model replicas in a Ray Data actor
    pool of ``gpus_per_actor`` GPUs each; ``pool``: the Dagster concurrency pool it holds."""

    cpus: float = 1.0
    ray_actors: int = 0
    gpus_per_actor: float = 0.0
    pool: str | None = None

    @property
    def gpus(self) -> float:
        return self.ray_actors * self.gpus_per_actor


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
        """Failed items among the items the stage tried (skipped ones do not count)."""
        tried = self.ok + self.error
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


class Stage:
    """Base class of every stage. Subclasses set the class attributes and implement
    ``process``; callers use ``run``."""

    name: ClassVar[str]
    level: ClassVar[str] = SHARD
    reads: ClassVar[tuple[str, ...]] = ()
    writes: ClassVar[tuple[str, ...]] = ()
    compute: Compute = Compute()

    def run(self, lake: Lake, partition: Partition) -> StageResult:
        if (partition.shard is None) != (self.level == RELEASE):
            raise ValueError(f"stage {self.name} runs per {self.level}, not on partition {partition}")
        started = time.perf_counter()
        result = self.process(lake, partition)
        if any(table in lake.tables for table in self.writes):
            lake.refresh_catalog()
        result.seconds = time.perf_counter() - started
        return result

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        raise NotImplementedError

    def result(self, partition: Partition, **fields) -> StageResult:
        return StageResult(stage=self.name, partition=partition, **fields)
