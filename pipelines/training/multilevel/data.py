"""The data side of a run: each level's loader, the readers and buffers that pair the cross-level
children and the ROI regions with the step's parents, the children's decoding, and the counts a
checkpoint keeps (each reader's data position, the unusable samples, the children linked)."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

from pipelines import launch
from pipelines.core.heldout import webdataset_keep
from pipelines.training import heldout
from pipelines.training.distributed import DistInfo
from pipelines.training.loader import LevelDataset, LevelFeed, resume_positions
from pipelines.training.multilevel.config import (
    CHILD,
    FIGURE_PANEL,
    LEVELS,
    PANEL_REGION,
    REGION,
    ROI_REGION,
    MultilevelConfig,
)
from pipelines.training.multilevel.decoding import Decoded, decode
from pipelines.training.multilevel.readers import ChildBuffer, LevelReader, parent_key, shard_pattern, shard_urls


def loader_workers(config: MultilevelConfig, device: torch.device) -> int:
    """Loader workers per level (None in the config: 4 on CUDA, where decoding would stall the
    GPU, 0 on CPU, where workers would compete with the step for the same cores)."""
    if config.workers is not None:
        return config.workers
    return 4 if device.type == "cuda" else 0


def open_feed(
    level: str, config: MultilevelConfig, info: DistInfo, device: torch.device, preprocess: Callable, consumed: int,
    saved: dict | None, keep: Callable[[dict], bool] | None = None,
) -> LevelFeed:  # fmt: skip
    """The level's DataLoader, each worker resuming at its saved position (see ``loader``)."""
    c = config
    workers = loader_workers(c, device)
    positions, rotation, batches, exact = resume_positions(saved, consumed, max(1, workers))
    if not exact:
        launch.log(f"{level}: data position saved with other loader workers, resumed approximately", "warning")
    from webdataset.shardlists import expand_urls

    shards = [url for source in c.data_of(level) for url in expand_urls(shard_pattern(source, c.shard_name))]
    decoder = functools.partial(decode, level=level, preprocess=preprocess, config=c)
    dataset = LevelDataset(
        level, shards, info, decoder, c.batch_size, positions, rotation, c.seed, 100 * c.batch_size, keep
    )
    pin = c.pin_memory if c.pin_memory is not None else device.type == "cuda"
    return LevelFeed(dataset, batches, workers, c.prefetch_factor, pin, c.persistent_workers)


def heldout_counts(config: MultilevelConfig) -> dict[str, int]:
    """Each level's samples of held-out articles (from the shards' sidecars), which the readers
    drop; empty without a held-out split."""
    if config.heldout is None:
        return {}
    split = heldout.load_split(config.heldout)
    out = {}
    for level in LEVELS:
        shards = [url for source in config.data_of(level) for url in shard_urls(source, config.shard_name)]
        if shards:
            out[level] = heldout.count_heldout(shards, split)[1]
    return out


def pull_linked(
    reader: LevelReader, buffer: ChildBuffer, parents: list[Decoded], key_of: Callable[[str], str | None],
    config: MultilevelConfig,
) -> list[tuple[int, dict]]:  # fmt: skip
    """Pull the next child samples into ``buffer`` and take those of ``parents`` as (parent index, sample)."""
    for sample in reader.take(config.link_pull or config.batch_size):
        key = sample.get("__key__", "")
        parent = key_of(key)
        if parent is not None:
            buffer.add(parent, key, sample)
    return buffer.take([p.key for p in parents], config.max_children or config.batch_size)


def decode_children(
    samples: list[dict], level: str, preprocess: Callable, config: MultilevelConfig, seed: float,
    pool: ThreadPoolExecutor | None,
) -> list[Decoded | Exception]:  # fmt: skip
    """Each child decoded (by ``pool``'s threads when given: Pillow's decoding and resizing and
    torch's transforms release the GIL), or the exception that made it unusable. Each child draws
    its text from its own generator, so the result does not depend on the threads' order."""

    def one(sample: dict) -> Decoded | Exception:
        try:
            own = random.Random(f"{seed}:{sample.get('__key__')}")
            return decode(sample, level, preprocess, config, own)
        except Exception as exc:  # noqa: BLE001 - a bad child is skipped, never the step
            return exc

    return list(pool.map(one, samples) if pool is not None else map(one, samples))


class TrainingData:
    """What a run reads, on one rank: opened at its saved positions (:meth:`open`), read a step at
    a time (:meth:`batch`, :meth:`children`, :meth:`regions`), and counted for the checkpoint."""

    def __init__(self, config: MultilevelConfig, info: DistInfo, device: torch.device, preprocess, parent_preprocess):
        self.config, self.info, self.device = config, info, device
        self.preprocess, self.parent_preprocess = preprocess, parent_preprocess
        self.workers = loader_workers(config, device)
        # the held-out articles' filter, applied by every reader (each level's own batches, the
        # cross-level children and the ROI regions alike)
        self.keep = webdataset_keep(heldout.load_split(config.heldout)) if config.heldout else None
        self.feeds: dict[str, LevelFeed] = {}  # each level's own batches
        self.links: dict[str, LevelReader] = {}  # child level -> its reader, for the cross-level terms
        self.buffers: dict[str, ChildBuffer] = {}
        self.roi_reader: LevelReader | None = None  # the ROI modes' regions, read with their parent
        self.roi_buffer: ChildBuffer | None = None
        self._pool: ThreadPoolExecutor | None = None  # decodes the cross-level children
        self.skipped = 0
        self.linked = {FIGURE_PANEL: 0, PANEL_REGION: 0} | ({ROI_REGION: 0} if config.roi_mode else {})

    def open(self, consumed: dict[str, int], loaders: dict[str, dict] | None = None) -> None:
        """Every reader the run needs, each at its position in ``consumed`` (and each loader
        worker at its own in ``loaders``): a child level only while its cross-level term may be on."""
        c, info = self.config, self.info
        used = {lv for slot in c.schedule for lv in slot}
        own = used - ({REGION} if c.roi_mode else set())
        loaders = loaders or {}
        self.close()
        self.feeds = {}
        for lv in (lv for lv in LEVELS if lv in own):
            preprocess = self.parent_preprocess if lv == c.roi_parent else self.preprocess
            self.feeds[lv] = open_feed(
                lv, c, info, self.device, preprocess, consumed.get(lv, 0), loaders.get(lv), self.keep
            )
        self.links, self.buffers = {}, {}
        for parent in used & set(CHILD):
            child, term = CHILD[parent]
            if c.loss_weights.get(term, 0.0) > 0 or any(term in s.get("weights", {}) for s in c.curriculum):
                if c.data_of(child):
                    skip = consumed.get(f"link_{child}", 0)
                    self.links[child] = LevelReader(child, c.data_of(child), c.shard_name, skip, info, self.keep)
                    self.buffers[child] = ChildBuffer(c.link_buffer)
        if c.roi_mode and REGION in used:
            skip = consumed.get(ROI_REGION, 0)
            self.roi_reader = LevelReader(REGION, c.data_of(REGION), c.shard_name, skip, info, self.keep)
            self.roi_buffer = ChildBuffer(c.link_buffer)

    def consumed(self) -> dict[str, int]:
        """Samples each reader has handed out: the data position a checkpoint saves."""
        out = {lv: r.consumed for lv, r in self.feeds.items()}
        out |= {f"link_{lv}": r.consumed for lv, r in self.links.items()}
        if self.roi_reader is not None:
            out[ROI_REGION] = self.roi_reader.consumed
        return out

    def loader_state(self) -> dict[str, dict]:
        return {lv: feed.state() for lv, feed in self.feeds.items()}

    def close(self) -> None:
        for feed in self.feeds.values():
            feed.close()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def batch(self, level: str) -> tuple[list[Decoded], torch.Tensor]:
        """The level's next decoded batch from its loader, images stacked; the samples its worker
        could not use are logged and counted here (a worker never raises for one)."""
        while True:
            loaded = self.feeds[level].next()
            for key, reason in loaded.skips:
                self.skip(level, key, reason)
            if loaded.items:
                return loaded.items, loaded.images

    def children(self, parent_level: str, parents: list[Decoded], rng: random.Random) -> list[tuple[int, Decoded]]:
        """The step's children of ``parents`` as (parent index, child), decoded here, only once
        their parent is in the step, so no evicted child is ever decoded."""
        child, _ = CHILD[parent_level]
        key_of = functools.partial(parent_key, level=child)
        found = pull_linked(self.links[child], self.buffers[child], parents, key_of, self.config)
        seed = rng.random()
        pool = self._decode_pool() if self.workers > 0 else None
        results = decode_children([sample for _, sample in found], child, self.preprocess, self.config, seed, pool)
        out = []
        for (index, sample), result in zip(found, results, strict=True):
            if isinstance(result, Exception):
                self.skip(child, str(sample.get("__key__")), str(result))
            else:
                out.append((index, result))
        return out

    def regions(self, parents: list[Decoded], key_of: Callable[[str], str | None]) -> list[tuple[int, dict]]:
        """The ROI regions of ``parents`` found in the region buffer, raw, as (parent index, sample)."""
        return pull_linked(self.roi_reader, self.roi_buffer, parents, key_of, self.config)

    def _decode_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="decode-children")
        return self._pool

    def skip(self, level: str, key: str, reason: str) -> None:
        """Log and count an unusable sample; too many mean the subset is wrong, not a few bad files."""
        self.skipped += 1
        launch.log(f"skipped {level} sample {key}: {reason}", "warning")
        if self.skipped > 100 * self.config.batch_size:
            raise RuntimeError(f"more than {self.skipped} unusable samples: is the {level} subset right?")
