"""The trainer: the model, optimizer and readers of a run, one training step, checkpoints and
resume (weights, optimizer, schedule and every reader's data position)."""

from __future__ import annotations

import functools
import io
import math
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

import fsspec
import torch

from pipelines import launch
from pipelines.training import clip, roi
from pipelines.training.distributed import DistInfo
from pipelines.training.loader import LevelDataset, LevelFeed, resume_positions
from pipelines.training.multilevel.config import (
    CHILD,
    FIGURE_PANEL,
    LEVELS,
    NEGATIVE,
    PANEL_REGION,
    PARAM_GROUPS,
    REGION,
    ROI_REGION,
    MultilevelConfig,
)
from pipelines.training.multilevel.curriculum import curriculum_weights, levels_at, param_group, stage_at
from pipelines.training.multilevel.decoding import Decoded, box_in_parent, decode, decode_roi
from pipelines.training.multilevel.model import Batch, RoiBatch, StepInputs, StepModel, lr_factor, set_trainable
from pipelines.training.multilevel.readers import ChildBuffer, LevelReader, parent_key, roi_parent_key, shard_pattern


class Trainer:
    def __init__(self, config: MultilevelConfig, info: DistInfo | None = None):
        import open_clip

        from pipelines.training.distributed import rank_device

        self.config, self.info = config, info or DistInfo()
        torch.manual_seed(config.seed)  # the same initial weights on every rank
        self.device = torch.device(rank_device(config.device, self.info))  # no silent CPU fallback on a GPU job
        clip.hf_text.enable_hf_text_towers()  # a BMC-LongCLIP export starts a run too
        clip.check_weights(config.model, config.pretrained)
        tag = clip.resolve_pretrained(config.model, config.pretrained)
        model, self.preprocess, _ = open_clip.create_model_and_transforms(config.model, pretrained=tag)
        if config.temperature_init is not None:
            with torch.no_grad():
                model.logit_scale.fill_(math.log(1.0 / config.temperature_init))
        self.tokenizer = open_clip.get_tokenizer(config.model)
        self.params = set_trainable(model, config)
        self.core = StepModel(model, config, self.info).to(self.device)
        self.model = self.core.model
        self.parent_preprocess = (
            roi.squash_transform(self.preprocess, model.visual.image_size) if config.roi_mode else self.preprocess
        )
        if self.core.roi_processor is not None:
            self.params["trainable"] += sum(p.numel() for p in self.core.roi_processor.parameters())
        trainable = [p for p in self.core.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            trainable, lr=config.lr, betas=(config.beta1, config.beta2), weight_decay=config.wd
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, config.warmup, config.steps)
        )
        self.step_module: torch.nn.Module = self.core
        self.base_trainable = {name: p.requires_grad for name, p in self.core.named_parameters()}
        self.stage_index: int | None = None
        self._pool: ThreadPoolExecutor | None = None  # decodes the cross-level children (``_children``)
        self.ckpt_dir = config.checkpoint_dir or f"{config.run_dir.rstrip('/')}/checkpoints"
        self.step = 0
        self.skipped = 0
        self.linked = {FIGURE_PANEL: 0, PANEL_REGION: 0} | ({ROI_REGION: 0} if config.roi_mode else {})
        self.last_terms: dict[str, float] = {}  # each loss term's latest value in this run

    def wrap(self) -> None:
        """DDP after the weights are final (loaded from a checkpoint on every rank). The anchor term
        reaches every tower parameter each step; only the ROI processor sits unused (before the
        region stage, or on a rank whose parents found no region) and the groups a curriculum
        stage freezes (``train``), so only then does DDP search the graph for unused parameters."""
        if self.info.distributed:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            staged = any("train" in stage for stage in self.config.curriculum)
            self.step_module = DistributedDataParallel(
                self.core, device_ids=ids, find_unused_parameters=self.core.roi_processor is not None or staged
            )

    def apply_stage(self) -> None:
        """Freeze what the current curriculum stage does not train (its ``train`` groups, within
        what the config lets train at all). The optimizer holds every parameter that may train and
        skips those without a gradient, so a stage switch needs no new optimizer; DDP was built
        with every such parameter and finds the frozen ones unused (``wrap``)."""
        c = self.config
        index = stage_at(self.step, c.curriculum, c.steps, c.epoch_steps)
        if index == self.stage_index:
            return
        self.stage_index = index
        groups = set(c.curriculum[index].get("train", PARAM_GROUPS)) if index is not None else set(PARAM_GROUPS)
        for name, param in self.core.named_parameters():
            param.requires_grad = self.base_trainable[name] and param_group(name) in groups
        if index is not None:
            name = c.curriculum[index].get("name", index)
            launch.log(f"curriculum stage {name} from step {self.step}: trains {sorted(groups)}")

    # -- state

    def levels_used(self) -> set[str]:
        return {lv for slot in self.config.schedule for lv in slot}

    def _reader(self, level: str, skip: int) -> LevelReader:
        return LevelReader(level, self.config.data_of(level), self.config.shard_name, skip, self.info)

    @property
    def workers(self) -> int:
        """Loader workers per level (None in the config: 4 on CUDA, where decoding would stall the
        GPU, 0 on CPU, where workers would compete with the step for the same cores)."""
        if self.config.workers is not None:
            return self.config.workers
        return 4 if self.device.type == "cuda" else 0

    def _feed(self, level: str, consumed: int, saved: dict | None) -> LevelFeed:
        """The level's DataLoader, each worker resuming at its saved position (see ``loader``)."""
        c = self.config
        workers = self.workers
        positions, rotation, batches, exact = resume_positions(saved, consumed, max(1, workers))
        if not exact:
            launch.log(f"{level}: data position saved with other loader workers, resumed approximately", "warning")
        from webdataset.shardlists import expand_urls

        shards = [url for source in c.data_of(level) for url in expand_urls(shard_pattern(source, c.shard_name))]
        preprocess = self.parent_preprocess if level == c.roi_parent else self.preprocess
        decoder = functools.partial(decode, level=level, preprocess=preprocess, config=c)
        dataset = LevelDataset(
            level, shards, self.info, decoder, c.batch_size, positions, rotation, c.seed, 100 * c.batch_size
        )
        pin = c.pin_memory if c.pin_memory is not None else self.device.type == "cuda"
        return LevelFeed(dataset, batches, workers, c.prefetch_factor, pin, c.persistent_workers)

    def open_readers(self, consumed: dict[str, int], loaders: dict[str, dict] | None = None) -> None:
        c = self.config
        own = self.levels_used() - ({REGION} if c.roi_mode else set())
        loaders = loaders or {}
        self.close()
        self.readers = {lv: self._feed(lv, consumed.get(lv, 0), loaders.get(lv)) for lv in LEVELS if lv in own}
        self.links: dict[str, LevelReader] = {}
        self.buffers: dict[str, ChildBuffer] = {}
        for parent in self.levels_used() & set(CHILD):
            child, term = CHILD[parent]
            if c.loss_weights.get(term, 0.0) > 0 or any(term in s.get("weights", {}) for s in c.curriculum):
                if c.data_of(child):
                    self.links[child] = self._reader(child, consumed.get(f"link_{child}", 0))
                    self.buffers[child] = ChildBuffer(c.link_buffer)
        if c.roi_mode and REGION in self.levels_used():
            self.roi_reader = self._reader(REGION, consumed.get(ROI_REGION, 0))
            self.roi_buffer = ChildBuffer(c.link_buffer)

    def consumed(self) -> dict[str, int]:
        out = {lv: r.consumed for lv, r in self.readers.items()}
        out |= {f"link_{lv}": r.consumed for lv, r in self.links.items()}
        if getattr(self, "roi_reader", None) is not None:
            out[ROI_REGION] = self.roi_reader.consumed
        return out

    def loader_state(self) -> dict[str, dict]:
        return {lv: feed.state() for lv, feed in self.readers.items()}

    def close(self) -> None:
        for feed in getattr(self, "readers", {}).values():
            feed.close()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def state(self, consumed_by_rank: list[dict[str, int]], loaders_by_rank: list[dict[str, dict]]) -> dict:
        return {
            "step": self.step,
            "state_dict": self.model.state_dict(),
            "roi_processor": None if self.core.roi_processor is None else self.core.roi_processor.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "consumed": consumed_by_rank[0],
            "consumed_by_rank": consumed_by_rank,
            "loaders_by_rank": loaders_by_rank,  # each level's loader position (per worker, batches used)
            "skipped": self.skipped,
            "linked": dict(self.linked),
            "config": asdict(self.config),
        }

    def resume(self) -> int | None:
        """Load the newest lake checkpoint (every rank the same file); returns its step (None on a
        first launch). Each rank resumes its own data position; a run resumed on a different number
        of ranks re-splits the data and restarts every rank at rank 0's position (logged). The
        children waiting in the link buffers are not saved: they are re-read as the run goes on."""
        newest = launch.latest_checkpoint(self.ckpt_dir) if self.config.resume else None
        if newest is None:
            self.open_readers({})
            return None
        with fsspec.open(newest, "rb") as f:
            state = torch.load(io.BytesIO(f.read()), map_location=self.device, weights_only=False)
        self.model.load_state_dict(state["state_dict"])
        if self.core.roi_processor is not None and state.get("roi_processor") is not None:
            self.core.roi_processor.load_state_dict(state["roi_processor"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step, self.skipped, self.linked = state["step"], state["skipped"], {**self.linked, **state["linked"]}
        by_rank = state.get("consumed_by_rank") or [state["consumed"]]
        loaders = state.get("loaders_by_rank") or [{}] * len(by_rank)
        if len(by_rank) != self.info.world:
            launch.log(
                f"checkpoint from {len(by_rank)} rank(s), resumed on {self.info.world}: data restarts", "warning"
            )
            by_rank, loaders = [by_rank[0]] * self.info.world, [loaders[0]] * self.info.world
        self.open_readers(by_rank[self.info.rank], loaders[self.info.rank])
        return self.step

    def save(self) -> str | None:
        """Rank 0 writes the checkpoint between two barriers: every rank has finished the step (and
        sent its data position) before the write, and none reads the folder before it is whole."""
        from pipelines.training.distributed import barrier, gather_objects

        positions = gather_objects((self.consumed(), self.loader_state()), self.info)
        barrier(self.info)
        url = None
        if self.info.is_main:
            buffer = io.BytesIO()
            torch.save(self.state([p[0] for p in positions], [p[1] for p in positions]), buffer)
            url = launch.save_checkpoint(self.ckpt_dir, self.step, buffer.getvalue(), "pt")
            if self.config.keep_last_checkpoint_only:
                launch.prune_checkpoints(self.ckpt_dir, 1, upto=self.step)
        barrier(self.info)
        return url

    # -- one step's data

    def _batch(self, level: str) -> tuple[list[Decoded], torch.Tensor]:
        """The level's next decoded batch from its loader, images stacked; the samples its worker
        could not use are logged and counted here (a worker never raises for one)."""
        while True:
            loaded = self.readers[level].next()
            for key, reason in loaded.skips:
                self._count_skip(level, key, reason)
            if loaded.items:
                return loaded.items, loaded.images

    def _skip(self, level: str, sample: dict, exc: Exception) -> None:
        self._count_skip(level, str(sample.get("__key__")), str(exc))

    def _count_skip(self, level: str, key: str, reason: str) -> None:
        self.skipped += 1
        launch.log(f"skipped {level} sample {key}: {reason}", "warning")
        if self.skipped > 100 * self.config.batch_size:
            raise RuntimeError(f"more than {self.skipped} unusable samples: is the {level} subset right?")

    def _children(self, parent_level: str, parents: list[Decoded], rng: random.Random) -> list[tuple[int, Decoded]]:
        """The step's children, decoded here (only once their parent is in the step, so no
        evicted child is ever decoded) by ``workers`` threads: Pillow's decoding and resizing and
        torch's transforms release the GIL. Each child draws its text from its own generator, so
        the result does not depend on the threads' order."""
        child, _ = CHILD[parent_level]
        found = self._linked(self.links[child], self.buffers[child], parents, lambda k: parent_key(k, child))
        seed = rng.random()

        def one(sample: dict) -> Decoded | Exception:
            try:
                own = random.Random(f"{seed}:{sample.get('__key__')}")
                return decode(sample, child, self.preprocess, self.config, own)
            except Exception as exc:  # noqa: BLE001 - a bad child is skipped, never the step
                return exc

        samples_ = [sample for _, sample in found]
        results = list(self._decode_pool().map(one, samples_) if self.workers > 0 else map(one, samples_))
        out = []
        for (index, sample), result in zip(found, results, strict=True):
            if isinstance(result, Exception):
                self._skip(child, sample, result)
            else:
                out.append((index, result))
        return out

    def _decode_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="decode-children")
        return self._pool

    def _linked(self, reader: LevelReader, buffer: ChildBuffer, parents: list[Decoded], key_of) -> list:
        """Pull the next child samples into ``buffer`` and take those of ``parents``."""
        for sample in reader.take(self.config.link_pull or self.config.batch_size):
            key = sample.get("__key__", "")
            parent = key_of(key)
            if parent is not None:
                buffer.add(parent, key, sample)
        return buffer.take([p.key for p in parents], self.config.max_children or self.config.batch_size)

    def _tensors(self, items: list, negatives: bool = False, images: torch.Tensor | None = None) -> Batch:
        tokens = self.tokenizer([d.text for d in items]).to(self.device)
        if images is None and hasattr(items[0], "image"):
            images = torch.stack([d.image for d in items])
        images = images.to(self.device, non_blocking=True) if images is not None else None
        batch = Batch(images, tokens)
        k = max((len(d.negatives) for d in items), default=0) if negatives else 0
        if k:
            texts = [d.negatives[j] if j < len(d.negatives) else "" for d in items for j in range(k)]
            batch.negatives = self.tokenizer(texts).to(self.device)
            batch.negative_mask = torch.tensor([[j < len(d.negatives) for j in range(k)] for d in items])
            batch.negative_mask = batch.negative_mask.to(self.device)
        return batch

    def _roi_batch(self, parents: list[Decoded], rng: random.Random, negatives: bool) -> RoiBatch:
        """The regions of ``parents`` found in the ROI buffer, their boxes in the parent's grid;
        a region with a missing or out-of-frame box is skipped and logged."""
        c = self.config
        found = self._linked(self.roi_reader, self.roi_buffer, parents, lambda k: roi_parent_key(k, c.roi_parent))
        regions, boxes, index = [], [], []
        for i, sample in found:
            try:
                region = decode_roi(sample, c, rng)
                boxes.append(roi.box_to_grid(box_in_parent(region, parents[i]), parents[i].size, self.core.grid))
            except Exception as exc:  # noqa: BLE001
                self._skip(REGION, sample, exc)
                continue
            regions.append(region)
            index.append(i)
        self.linked[ROI_REGION] += len(regions)
        box_tensor = torch.tensor(boxes, dtype=torch.float32, device=self.device).reshape(-1, 4)
        parent_tensor = torch.tensor(index, dtype=torch.long, device=self.device)
        if not regions:
            return RoiBatch(box_tensor, parent_tensor, None)
        batch = self._tensors(regions, negatives)
        return RoiBatch(box_tensor, parent_tensor, batch.tokens, batch.negatives, batch.negative_mask)

    def inputs(self, levels: list[str], weights: dict[str, float], rng: random.Random) -> StepInputs:
        """Everything the step's tower passes need, read and decoded before the forward pass."""
        c = self.config
        out = StepInputs()
        for level in levels:
            if level not in self.readers:
                continue  # regions in an ROI mode: read with their parent below
            batch, images = self._batch(level)
            out.levels[level] = self._tensors(batch, level == REGION and weights[NEGATIVE] > 0, images)
            if level in CHILD and CHILD[level][0] in self.links and weights[CHILD[level][1]] > 0:
                children = self._children(level, batch, rng)
                tensors = self._tensors([d for _, d in children]) if children else None
                out.children[CHILD[level][1]] = (tensors, [i for i, _ in children])
                self.linked[CHILD[level][1]] += len(children)
            roi_active = weights[REGION] > 0 or weights[NEGATIVE] > 0
            if c.roi_mode and level == c.roi_parent and REGION in levels and roi_active:
                out.roi = self._roi_batch(batch, rng, weights[NEGATIVE] > 0)
        return out

    # -- one step

    def plan(self) -> tuple[list[str], dict[str, float], random.Random]:
        """The current step's levels, loss weights and text-sampling generator."""
        c = self.config
        levels = levels_at(self.step, c.schedule, c.schedule_every)
        weights = curriculum_weights(self.step, c.loss_weights, c.curriculum, c.steps, c.epoch_steps)
        rng = random.Random(c.seed * 1_000_003 + self.step + self.info.rank * 100_003)  # same texts on a re-run
        return levels, weights, rng

    def train_step(self) -> dict[str, float]:
        levels, weights, rng = self.plan()
        return self.compute(self.inputs(levels, weights, rng), weights)

    def compute(self, inputs: StepInputs, weights: dict[str, float]) -> dict[str, float]:
        """Forward, backward and update on inputs already read (split from the reading so the
        training benchmark can time the two apart)."""
        c = self.config
        self.apply_stage()
        self.step_module.train()
        autocast = torch.autocast(
            "cuda", dtype=torch.bfloat16, enabled=c.precision == "bf16" and self.device.type == "cuda"
        )
        with autocast:
            terms = self.step_module(inputs, weights)
            anchor = terms.pop("anchor")
            total = sum((weights[k] * v for k, v in terms.items()), anchor)
        self.optimizer.zero_grad(set_to_none=True)
        if total.requires_grad:
            total.backward()
            if c.grad_clip_norm:
                torch.nn.utils.clip_grad_norm_([p for p in self.core.parameters() if p.requires_grad], c.grad_clip_norm)
            self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        metrics = {"loss": float(total.detach()), "lr": self.scheduler.get_last_lr()[0]}
        metrics |= {f"loss_{k}": float(v.detach()) for k, v in terms.items()}
        self.last_terms |= {k: v for k, v in metrics.items() if k.startswith("loss_")}
        metrics |= {f"w_{k}": w for k, w in weights.items() if w}
        if not math.isfinite(metrics["loss"]):
            raise FloatingPointError(f"step {self.step}: loss is {metrics['loss']} ({metrics})")
        return metrics
