"""The loop every stage that calls a model runs: one skeleton, so reuse, the canary, progress,
memory bounds, checkpoints and the commit work the same way in mining, long captions, the hard
negatives and whatever comes next.

For one partition: build the items (each with a fingerprint of its inputs and settings) → carry
what an earlier run made with the same fingerprint (``reusable_results``: the previous release,
then the partition's own rows) → resume what a killed run of this partition had checkpointed →
send the canary if anything is left for the model → in batches of ``batch_size`` items: read and
decode the images (:meth:`ModelStage.prepare`), ask the model (:meth:`ModelStage.run_batch`),
advance the progress → checkpoint the finished items every ``checkpoint_every`` items → publish
the tables, in item order, in one commit that also removes the checkpoints.

A rerun after a kill therefore sends no request for an item a checkpoint holds, and writes the
same tables as a run that was never interrupted. A subclass says what an item is and what the
model makes of a batch of them; the loop stays here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import ClassVar

from PIL import Image

from pipelines.core.fingerprints import fingerprint
from pipelines.core.lake import Lake
from pipelines.core.rawstore import RawReader
from pipelines.core.stage import (
    IMAGE_LINK,
    Checkpoints,
    Partition,
    Progress,
    Stage,
    StageResult,
    chunks,
    fingerprint_unless_error,
    reusable_results,
)
from pipelines.images.decode import decode_image
from pipelines.vlm.canary import CanaryResult, require_structured_outputs
from pipelines.vlm.engine import VlmEngine, engine_fingerprint
from pipelines.vlm.metering import MeteredEngine

CHECKPOINT_EVERY = 256  # items per checkpoint: a kill costs at most this much model time


@dataclass
class Item:
    """One unit of a model stage's work. ``key`` names it (ids, error lists); ``fingerprint`` is
    what a reused result must have been made from; ``ref`` is where its image is in the raw store
    (``tar_path``, ``offset``, ``size``), None when the model reads text only; ``data`` is the
    stage's own description of it. ``image`` holds what :meth:`ModelStage.prepare` made of its
    bytes (the decoded image, unless the stage says otherwise) while its batch runs."""

    key: str
    fingerprint: str
    data: object
    ref: dict | None = None
    image: Image.Image | object | None = None


@dataclass
class Outcome:
    """What one item produced: its row of the stage's table, its rows of the child table (pairs,
    negatives), and the reason when it failed (an error the run records and counts)."""

    row: dict
    children: list[dict] = field(default_factory=list)
    error: str | None = None


@dataclass
class ModelRun:
    """Everything a model stage's result is made from."""

    items: list[Item]
    outcomes: list[Outcome]
    engine: MeteredEngine | None
    carried: int = 0  # reused from the previous release or an earlier run of this partition
    resumed: int = 0  # finished by a killed run of this partition (its checkpoints)
    computed: int = 0  # sent to the model (or to the rules) by this run
    canary: CanaryResult | None = None

    @property
    def rows(self) -> list[dict]:
        return [o.row for o in self.outcomes]

    @property
    def children(self) -> list[dict]:
        return [c for o in self.outcomes for c in o.children]

    @property
    def errors(self) -> list[tuple[str, str]]:
        return [(item.key, o.error) for item, o in zip(self.items, self.outcomes, strict=True) if o.error]

    def version(self) -> str:
        """The data version: a hash of every item's key and fingerprint (a row's own, where its
        table has the column; errors have none), so downstream assets go stale only when an
        input, a setting, the model or the code changed."""
        pairs = zip(self.items, self.outcomes, strict=True)
        return fingerprint(sorted((item.key, o.row.get("fingerprint", item.fingerprint)) for item, o in pairs))

    def totals(self) -> dict[str, object]:
        """The model's totals for the run's metadata (zeros when no model was given)."""
        zeros = {"vlm_requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "vlm_seconds": 0.0}
        return {**zeros, **(self.engine.meter.totals() if self.engine else {})}


class ModelStage(Stage):
    """A stage whose items go through a model, in the loop the module docstring describes.

    A subclass sets ``version`` (an explicit constant: bump it when the stage's logic changes
    what it writes), ``table`` and ``child_table``, and implements :meth:`items`,
    :meth:`run_batch`, :meth:`hashed_settings` and :meth:`summarize` (and :meth:`unreadable`
    when its items have images); :meth:`carried`, :meth:`precomputed`, :meth:`reuse_key`,
    :meth:`prepare`, :meth:`derived_tables` and :meth:`run_version` have defaults. Its
    ``engine`` may be None (rules only: no canary, no checkpoints, unless :attr:`checkpointing`
    says a model other than a VLM runs, as the panel detector does)."""

    version: ClassVar[str]
    table: ClassVar[str]
    child_table: ClassVar[str | None] = None
    link: ClassVar[tuple[str, ...]] = IMAGE_LINK  # the columns by which a child row names its item's row
    unit: ClassVar[str] = "figures"
    label: ClassVar[str] = ""  # what the progress lines say ("mining", "long captions")

    engine: VlmEngine | None
    settings: object  # a dataclass with ``figures_per_batch`` and ``require_canary`` (or override both)
    checkpoint_every: int = CHECKPOINT_EVERY

    @property
    def batch_size(self) -> int:
        """Items per batch: what bounds memory (decoded images) and what goes to the model at once."""
        return self.settings.figures_per_batch

    @property
    def require_canary(self) -> bool:
        """Refuse to run when the engine does not apply JSON schemas (the canary fails)."""
        return self.settings.require_canary

    @property
    def checkpointing(self) -> bool:
        """Save finished items every ``checkpoint_every``: where a model runs (rules alone are cheap
        to redo)."""
        return self.engine is not None

    # ---- what a subclass says ------------------------------------------------------------------

    def items(self, lake: Lake, partition: Partition) -> list[Item]:
        raise NotImplementedError

    def run_batch(self, items: list[Item], engine: MeteredEngine | None, done: Callable[[], None]) -> list[Outcome]:
        """One batch: an outcome per item, in order (images decoded when the item has a ``ref``).
        Call ``done()`` when an item is finished before the whole batch is (its answer is back):
        the progress line moves inside the batch; items not reported are counted at its end."""
        raise NotImplementedError

    def summarize(self, partition: Partition, run: ModelRun) -> StageResult:
        raise NotImplementedError

    def hashed_settings(self) -> dict:
        """The settings that change what the stage makes (hashed into every fingerprint)."""
        raise NotImplementedError

    def settings_fingerprint(self) -> str:
        """The stage's version, its settings and the engine's identity, hashed one way."""
        parts = {"version": self.version, **self.hashed_settings()}
        if self.engine is None:
            return fingerprint({"engine": None, **parts})
        return engine_fingerprint(self.engine, **parts)

    def carried(self, item: Item, row: dict, children: list[dict]) -> Outcome:
        """An item reused from an earlier run or release."""
        return Outcome(row, children)

    def precomputed(self, item: Item) -> Outcome | None:
        """The outcome of an item that needs no model (None: it does)."""
        return None

    def unreadable(self, item: Item, reason: str) -> Outcome:
        raise NotImplementedError

    def reuse_key(self, row: dict) -> str | None:
        """The key by which an earlier run's row stands for an item (its ``fingerprint``; None: not
        reusable). A table without a fingerprint column says how its rows make one."""
        return fingerprint_unless_error(row)

    def prepare(self, item: Item, data: bytes) -> tuple[object | None, str | None]:
        """What an item's batch holds of its image, made as its bytes are read: ``(the decoded
        image, None)`` or ``(None, the reason it cannot be used)``. A stage whose per-image work
        needs one image at a time does that work here, so a batch holds its results, not its
        images."""
        return decode_image(data)

    def derived_tables(self, run: ModelRun) -> dict[str, list[dict]]:
        """Tables made from the finished outcomes (carried ones included), written in the same
        commit as :attr:`table` and :attr:`child_table`."""
        return {}

    def run_version(self, run: ModelRun) -> str | None:
        """The run's data version (:meth:`ModelRun.version`). None: the digest of the tables
        written (:meth:`Stage.data_version`), for a stage whose items' fingerprints do not hold
        everything its tables do."""
        return run.version()

    def tallies(self, outcomes: list[Outcome]) -> dict[str, int]:
        """Numbers added to the progress line for a finished batch."""
        return {}

    # ---- the loop --------------------------------------------------------------------------------

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        items = self.items(lake, partition)
        tables = (self.table, self.child_table) if self.child_table else (self.table,)
        known = reusable_results(lake, self.table, partition, self.reuse_key, self.child_table, link=self.link)
        checkpoints = Checkpoints(lake, self.name, partition, tables)
        resumed = checkpoints.results(self.reuse_key, self.link)
        engine = MeteredEngine(self.engine) if self.engine is not None else None
        run = ModelRun(items, [None] * len(items), engine)  # type: ignore[list-item]
        todo = []
        for index, item in enumerate(items):
            if item.fingerprint in known:
                run.outcomes[index] = self.carried(item, *known[item.fingerprint])
                run.carried += 1
            elif item.fingerprint in resumed:
                row, children = resumed[item.fingerprint]
                run.outcomes[index] = Outcome(row, children)
                run.resumed += 1
            elif (outcome := self.precomputed(item)) is not None:
                run.outcomes[index] = outcome
            else:
                todo.append(index)
        if todo and self.engine is not None:
            run.canary = require_structured_outputs(self.engine, self.require_canary)
        self._compute(lake, partition, run, todo, checkpoints)
        with lake.commit(self.name, partition.release, partition.shard) as commit:
            commit.write_table(self.table, run.rows)
            if self.child_table:
                commit.write_table(self.child_table, run.children)
            for table, rows in self.derived_tables(run).items():
                commit.write_table(table, rows)
            checkpoints.clear(commit)
        result = self.summarize(partition, run)
        result.version = result.version or self.run_version(run)
        return result

    def _compute(self, lake: Lake, partition: Partition, run: ModelRun, todo: list[int], checkpoints) -> None:
        progress = Progress(f"{self.label or self.name} {partition}", len(todo), self.unit)
        unsaved: list[int] = []
        with RawReader(lake) as reader, progress.heartbeat():
            for chunk in chunks(todo, max(1, self.batch_size)):
                ready = []
                for index in chunk:
                    item = run.items[index]
                    if item.ref is not None:
                        ref = item.ref
                        image, reason = None, ref.get("image_error")  # refused when parsed: that reason
                        if reason is None:
                            image, reason = self.prepare(item, reader.read(ref["tar_path"], ref["offset"], ref["size"]))
                        if image is None:
                            run.outcomes[index] = self.unreadable(item, reason)
                            unsaved.append(index)
                            progress.advance(1, unreadable=1)
                            continue
                        item.image = image
                    ready.append(index)
                requests_before, reported = run.totals()["vlm_requests"], []
                done = partial(_report, reported, progress)
                outcomes = self.run_batch([run.items[i] for i in ready], run.engine, done) if ready else []
                for index, outcome in zip(ready, outcomes, strict=True):
                    run.outcomes[index] = outcome
                    run.items[index].image = None
                run.computed += len(ready)
                unsaved += ready
                progress.advance(
                    len(ready) - len(reported),
                    vlm_requests=run.totals()["vlm_requests"] - requests_before,
                    **self.tallies(outcomes),
                )
                if self.checkpointing and len(unsaved) >= self.checkpoint_every:
                    self._save(checkpoints, run, unsaved)
                    unsaved = []

    def _save(self, checkpoints: Checkpoints, run: ModelRun, indices: list[int]) -> None:
        outcomes = [run.outcomes[i] for i in indices]
        rows = {self.table: [o.row for o in outcomes]}
        if self.child_table:
            rows[self.child_table] = [c for o in outcomes for c in o.children]
        checkpoints.save(rows)


def _report(reported: list[int], progress: Progress) -> None:
    """One item of a running batch is finished: count it now."""
    reported.append(1)
    progress.advance(1)
