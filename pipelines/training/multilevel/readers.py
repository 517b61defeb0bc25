"""Reading the levels' WebDataset subsets: each rank's share of a level, and the bounded buffer
that pairs a parent with its children (or ROI regions) from an independently shuffled reader."""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable

from pipelines.training import clip
from pipelines.training.distributed import DistInfo
from pipelines.training.loader import reader_share, samples
from pipelines.training.multilevel.config import FIGURE, FIGURE_OF_REGION, PARENT_SUFFIX, REGION


def parent_key(key: str, level: str) -> str | None:
    """A panel's figure key or a region's panel key, from the release's key suffixes."""
    pattern = PARENT_SUFFIX.get(level)
    match = pattern.match(key) if pattern else None
    return match.group(1) if match else None


def shard_pattern(source: str, shard_name: str) -> str:
    """A brace pattern of tars as given; a release folder through its ``sizes.json`` (a remote
    one streamed by ``pipe:``, as the CLIP trainer does)."""
    if re.search(r"\.tar(\}|$)", source):
        return source
    return clip.subset_data(source, shard_name)[0]


def shard_urls(source: str, shard_name: str) -> list[str]:
    """The tars of a source as their own URLs (no ``pipe:``): a brace pattern expanded, a release
    folder's shards from its ``sizes.json``."""
    from webdataset.shardlists import expand_urls

    if re.search(r"\.tar(\}|$)", source):
        return list(expand_urls(source))
    base, indices, _ = clip.subset_shards(source, shard_name)
    return [f"{base}/{shard_name}-{i:06d}.tar" for i in indices]


def roi_parent_key(key: str, parent: str) -> str | None:
    """The key of the image whose tokens a region's ROI features pool: its figure or its panel."""
    if parent == FIGURE:
        match = FIGURE_OF_REGION.match(key)
        return match.group(1) if match else None
    return parent_key(key, REGION)


class LevelReader:
    """An endless reader of one level's subsets in the training process (pass after pass, in shard
    order) that counts what it hands out, so a resumed run skips exactly that many samples: the
    cross-level children and the ROI regions, which are matched to the step's parents here (the
    levels' own batches come from :class:`pipelines.training.loader.LevelFeed`).

    Under DDP each rank reads a disjoint share (``loader.reader_share``): every ``world``-th shard
    from its rank when there are at least as many shards as ranks (each rank opens only its own
    files), else every ``world``-th sample (a small subset of one shard still feeds every rank)."""

    def __init__(
        self, level: str, sources: list[str], shard_name: str, skip: int = 0, info: DistInfo | None = None,
        keep: Callable[[dict], bool] | None = None,
    ):  # fmt: skip
        from webdataset.shardlists import expand_urls

        self.level, self.info = level, info or DistInfo()
        self.patterns = [shard_pattern(s, shard_name) for s in sources]
        shards = [url for pattern in self.patterns for url in expand_urls(pattern)]
        what = f"the {level} subsets {self.patterns} for rank {self.info.rank}"
        self._it = samples(reader_share(shards, self.info), what, keep=keep)
        for _ in range(skip):
            next(self._it)
        self.consumed = skip

    def next(self) -> dict:
        self.consumed += 1
        return next(self._it)

    def take(self, n: int) -> list[dict]:
        return [self.next() for _ in range(n)]


class ChildBuffer:
    """Children waiting for their parent, keyed by parent key; the oldest go first when full."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.items: OrderedDict[str, tuple[str, dict]] = OrderedDict()  # child key -> (parent key, sample)
        self.evicted = 0

    def add(self, parent: str, key: str, sample: dict) -> None:
        self.items[key] = (parent, sample)
        while len(self.items) > self.capacity:
            self.items.popitem(last=False)
            self.evicted += 1

    def take(self, parents: list[str], limit: int) -> list[tuple[int, dict]]:
        """Up to ``limit`` children of ``parents`` as (parent index, sample), removed from the buffer;
        taken round-robin (each parent's first child, then each one's second, ...), so a capped
        step still pairs as many parents as it can: one parent alone gives a 1x1 softmax, no signal."""
        index = {p: i for i, p in enumerate(parents)}
        by_parent: dict[int, list[str]] = {}
        for key, (parent, _) in self.items.items():
            if parent in index:
                by_parent.setdefault(index[parent], []).append(key)
        order = sorted(
            ((rank, i, key) for i, keys in by_parent.items() for rank, key in enumerate(keys)), key=lambda t: t[:2]
        )
        return [(i, self.items.pop(key)[1]) for _, i, key in order[:limit]]
