"""Data loading of the multi-level trainer: each level's samples are read, decoded and transformed
by ``torch.utils.data.DataLoader`` workers (an :class:`LevelDataset` per level), so a GPU step
does not wait on JPEG decoding in the training process.

Shares. Each rank reads a disjoint share of a level's shards (``pipelines.training.distributed.
share``: every ``world``-th shard, or every ``world``-th sample when there are fewer shards than
ranks), and each of the rank's ``workers`` loader workers a disjoint share of that (every
``workers``-th of the rank's shards, or every ``workers``-th of its samples when it has fewer
shards than workers). One pass of every worker is one pass (an epoch) over the rank's share, each
sample once; a worker starts its next pass on its own, so with shares of unequal size (shards of
different lengths) the workers' epochs drift apart by up to one share.

Order and resume. ``DataLoader`` hands out an iterable dataset's batches round-robin over its
workers (worker 0's first batch, worker 1's first, ..., worker 0's second), so the sequence of
batches is a pure function of the shares. Every batch carries its worker's position (the raw
samples that worker has read, bad ones included), and the trainer keeps the position of the last
batch it *used* from each worker plus the number of batches used. A resumed run with the same
``workers`` starts each worker at its saved position and rotates the workers so that the first
batch comes from the worker whose turn it was: the run continues with exactly the batches it would
have seen (prefetched batches that were never used are read again). With ``workers`` 0 the
dataset runs in the training process and resume is exact as before. With a different ``workers``
count the shares change, so each new worker starts at the saved total divided by the workers (the
same fraction of an epoch, approximately; logged).

Bad samples. A sample that cannot be decoded becomes a ``(key, reason)`` in its batch's ``skips``
and the next sample takes its place; a tar member webdataset cannot read is a skip too. Nothing
raises in a worker except a share holding no sample at all (a configuration error). Memory: each
worker holds at most ``prefetch_factor`` decoded batches, so a level holds at most
``workers * prefetch_factor + 1`` batches.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from pipelines.training.distributed import DistInfo, share


@dataclass(frozen=True)
class Share:
    """The samples one reader takes: index ``i`` of a pass over ``urls`` (in order) when
    ``i % stride == offset``."""

    urls: tuple[str, ...]
    stride: int = 1
    offset: int = 0


def reader_share(shards: list[str], info: DistInfo, worker: int = 0, workers: int = 1) -> Share:
    """Rank share, then worker share: whole shards where there are enough of them (a reader opens
    only its own files), else every n-th sample (a small subset still feeds every reader)."""
    if len(shards) >= info.world:
        urls, stride, offset = share(shards, info), 1, 0
    else:
        urls, stride, offset = shards, info.world, info.rank
    if workers <= 1:
        return Share(tuple(urls), stride, offset)
    if stride == 1 and len(urls) >= workers:
        return Share(tuple(urls[worker::workers]), 1, 0)
    return Share(tuple(urls), stride * workers, offset + stride * worker)


def _keep_all(src: Iterator, group: Any = None) -> Iterator:
    return src


def samples(
    share: Share, what: str, on_error: Callable[[Exception], bool] | None = None,
    keep: Callable[[dict], bool] | None = None,
) -> Iterator[dict]:  # fmt: skip
    """The share's samples, pass after pass, in shard order; with ``keep`` only those it accepts
    (the held-out articles' samples dropped: ``pipelines/training/heldout.py``), dropped before
    the every-n-th-sample share is taken, so the readers sharing a shard share what is kept evenly.
    Positions count what is handed out, so a resumed run with the same split skips exactly the
    same samples. Built
    without webdataset's node and worker splitters: the share already is this reader's, and inside
    a DataLoader worker ``WebDataset`` would split the shards a second time."""
    import webdataset as wds

    handler = on_error or wds.reraise_exception
    while True:
        seen = 0
        stages = [wds.SimpleShardList(list(share.urls)), wds.tarfile_to_samples(handler=handler)]
        pipeline = wds.DataPipeline(*stages, *([wds.select(keep)] if keep is not None else []))
        for index, sample in enumerate(pipeline):
            if index % share.stride == share.offset:
                seen += 1
                yield sample
        if seen == 0:
            raise ValueError(
                f"{what} holds no sample (shards {list(share.urls)}, every {share.stride} from {share.offset})"
            )


@dataclass
class LoadedBatch:
    """One level's decoded batch from one worker. ``items`` are the decoder's objects with their
    ``image`` moved into the stacked ``images`` (one tensor crosses the process boundary, not one
    per sample); ``position``: the raw samples the worker had read after this batch."""

    level: str
    worker: int
    position: int
    items: list[Any]
    images: torch.Tensor | None
    skips: list[tuple[str, str]] = field(default_factory=list)

    def pin_memory(self) -> LoadedBatch:
        """Called by the DataLoader's pinning thread (``pin_memory`` on CUDA)."""
        if self.images is not None:
            self.images = self.images.pin_memory()
        return self


class LevelDataset(IterableDataset):
    """Endless decoded batches of one level for one rank. ``positions[w]``: raw samples logical
    worker ``w`` has already read (skipped on start); ``rotation``: physical worker ``p`` plays
    logical worker ``(p + rotation) % workers`` (see the module docstring)."""

    def __init__(
        self,
        level: str,
        shards: list[str],
        info: DistInfo,
        decode: Callable[..., Any],  # decode(sample, rng=...) -> an object with .image
        batch_size: int,
        positions: list[int],
        rotation: int = 0,
        seed: int = 0,
        max_bad: int = 1000,
        keep: Callable[[dict], bool] | None = None,  # the held-out filter (picklable: it goes to the workers)
    ):
        super().__init__()
        self.level, self.shards, self.info, self.decode = level, list(shards), info, decode
        self.batch_size, self.positions, self.rotation = batch_size, list(positions), rotation
        self.seed, self.max_bad, self.keep = seed, max_bad, keep

    @property
    def workers(self) -> int:
        return len(self.positions)

    def __iter__(self) -> Iterator[LoadedBatch]:
        worker = get_worker_info()
        physical, count = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        if count != self.workers:
            raise RuntimeError(f"{self.level}: dataset made for {self.workers} worker(s) runs on {count}")
        logical = (physical + self.rotation) % self.workers
        return self._batches(logical)

    def _batches(self, logical: int) -> Iterator[LoadedBatch]:
        skips: list[tuple[str, str]] = []

        def unreadable(exc: Exception) -> bool:  # a broken tar member: a reason, never a dead worker
            skips.append(("?", f"unreadable: {exc}"))
            return True

        share = reader_share(self.shards, self.info, logical, self.workers)
        what = f"the {self.level} share of rank {self.info.rank}, loader worker {logical}"
        stream = samples(share, what, unreadable, self.keep)
        position = self.positions[logical]
        for _ in range(position):
            next(stream)
        while True:
            items: list[Any] = []
            while len(items) < self.batch_size and len(skips) <= self.max_bad:
                sample = next(stream)
                rng = random.Random(f"{self.seed}:{self.info.rank}:{self.level}:{logical}:{position}")
                position += 1
                try:
                    items.append(self.decode(sample, rng=rng))
                except Exception as exc:  # noqa: BLE001 - a bad sample is a reason, never a dead worker
                    skips.append((str(sample.get("__key__")), f"{type(exc).__name__}: {exc}"))
            yield self._collate(logical, position, items, skips)
            skips = []

    def _collate(self, logical: int, position: int, items: list[Any], skips: list) -> LoadedBatch:
        images = None
        if items and isinstance(getattr(items[0], "image", None), torch.Tensor):
            images = torch.stack([item.image for item in items])
            for item in items:
                item.image = None
        return LoadedBatch(self.level, logical, position, items, images, list(skips))


def _as_is(batch: Any) -> Any:
    """The DataLoader's collate: batches are already collated by the dataset."""
    return batch


class LevelFeed:
    """The training process's end of one level's loader: the next batch, and the data position
    (per-worker positions and batches used) a checkpoint saves."""

    def __init__(self, dataset: LevelDataset, batches: int, workers: int, prefetch_factor: int, pin_memory: bool,
                 persistent_workers: bool):  # fmt: skip
        self.level, self.positions, self.batches = dataset.level, list(dataset.positions), batches
        options: dict[str, Any] = {"batch_size": None, "num_workers": workers, "collate_fn": _as_is}
        options["pin_memory"] = pin_memory
        if workers > 0:
            options |= {"prefetch_factor": prefetch_factor, "persistent_workers": persistent_workers}
        self.loader = DataLoader(dataset, **options)
        self._it: Iterator[LoadedBatch] | None = None

    def next(self) -> LoadedBatch:
        if self._it is None:
            self._it = iter(self.loader)
        batch = next(self._it)
        self.positions[batch.worker] = batch.position
        self.batches += 1
        return batch

    @property
    def consumed(self) -> int:
        return sum(self.positions)

    def state(self) -> dict[str, Any]:
        return {"workers": len(self.positions), "batches": self.batches, "positions": list(self.positions)}

    def close(self) -> None:
        """Stop the workers now rather than at garbage collection (a resumed run in the same
        process, as in tests, would otherwise hold two sets)."""
        shutdown = getattr(self._it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self._it = None


def resume_positions(saved: dict[str, Any] | None, consumed: int, workers: int) -> tuple[list[int], int, int, bool]:
    """(positions, rotation, batches, exact) for a level from its saved loader state (None: a
    checkpoint from before the loaders, which saved only the consumed count of one reader)."""
    if saved is None:
        saved = {"workers": 1, "batches": 0, "positions": [consumed]}
    if saved["workers"] == workers:
        return list(saved["positions"]), saved["batches"] % workers, saved["batches"], True
    total = sum(saved["positions"])
    return [total // workers] * workers, 0, saved["batches"], False
