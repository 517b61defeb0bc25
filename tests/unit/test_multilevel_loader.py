"""The multi-level trainer's DataLoader workers: rank x worker shares on hand-chosen shard lists,
and the real trainer with 2 workers on CPU over a hand-counted two-shard figure subset: every
good sample once per epoch, a bad one a counted reason, and a resumed run continuing with the
very batches an uninterrupted run uses."""

import json
from pathlib import Path

import pytest
import webdataset as wds

from pipelines.training.distributed import DistInfo
from pipelines.training.loader import Share, reader_share, resume_positions
from pipelines.training.multilevel import MultilevelConfig, Trainer, train
from tests.helpers import SAMPLE_IMAGES as IMAGES


@pytest.fixture
def data(multilevel_release) -> dict[str, str]:
    return multilevel_release  # the session's linked figure/panel/region subsets (tests/conftest.py)


@pytest.fixture
def tiny(multilevel_tiny) -> Path:
    return multilevel_tiny  # the session's tiny OpenCLIP (tests/conftest.py)


def test_reader_share_splits_ranks_then_workers():
    shards = ["a", "b", "c", "d", "e"]
    # 2 ranks: rank 0 a c e, rank 1 b d; then 2 workers each: whole shards
    assert reader_share(shards, DistInfo(0, 2), 0, 2) == Share(("a", "e"), 1, 0)
    assert reader_share(shards, DistInfo(0, 2), 1, 2) == Share(("c",), 1, 0)
    assert reader_share(shards, DistInfo(1, 2), 1, 2) == Share(("d",), 1, 0)
    # rank 1 has 2 shards, 3 workers: every 3rd of its samples
    assert reader_share(shards, DistInfo(1, 2), 2, 3) == Share(("b", "d"), 3, 2)
    # one shard, 2 ranks, 2 workers: rank 1 takes samples 1, 3, 5, ...; its worker 1 samples 3, 7, ...
    assert reader_share(["a"], DistInfo(1, 2), 1, 2) == Share(("a",), 4, 3)
    assert reader_share(["a"], DistInfo(1, 2), 0, 2) == Share(("a",), 4, 1)
    assert reader_share(["a", "b"], DistInfo(), 0, 0) == Share(("a", "b"), 1, 0)  # workers 0: the process reads all


def test_resume_positions_are_exact_only_with_the_same_workers():
    saved = {"workers": 2, "batches": 3, "positions": [4, 5]}
    # 3 batches used: worker 0 gave batches 0 and 2, worker 1 batch 1; the next is worker 1's
    assert resume_positions(saved, 9, 2) == ([4, 5], 1, 3, True)
    assert resume_positions(saved, 9, 3) == ([3, 3, 3], 0, 3, False)  # 9 samples over 3 new workers
    assert resume_positions(None, 6, 1) == ([6], 0, 0, True)  # a checkpoint from before the loaders


def test_each_rank_resumes_its_own_position_and_old_checkpoints_their_one_count():
    from pipelines.training.multilevel.checkpoint import rank_position

    loaders = [{"figure": {"workers": 2, "batches": 2, "positions": [2, 2]}},
               {"figure": {"workers": 2, "batches": 3, "positions": [4, 2]}}]  # fmt: skip
    state = {"consumed": {"figure": 4}, "consumed_by_rank": [{"figure": 4}, {"figure": 6}], "loaders_by_rank": loaders}
    assert rank_position(state, DistInfo(1, 2)) == ({"figure": 6}, loaders[1])
    assert rank_position(state, DistInfo(2, 3)) == ({"figure": 4}, loaders[0])  # 3 ranks now: rank 0's for all
    # a checkpoint from before the per-rank positions and the loaders: its one count, no worker positions
    old = {"consumed": {"figure": 6, "link_panel": 3}}
    assert rank_position(old, DistInfo()) == ({"figure": 6, "link_panel": 3}, {})


def test_config_refuses_negative_workers(tmp_path):
    base = {"run_dir": str(tmp_path), "schedule": [["figure"]], "figure_data": ["f"]}
    with pytest.raises(ValueError, match="workers must be at least 0"):
        MultilevelConfig.from_dict({**base, "workers": -1}).validate()
    with pytest.raises(ValueError, match="prefetch_factor"):
        MultilevelConfig.from_dict({**base, "workers": 2, "prefetch_factor": 0}).validate()
    MultilevelConfig.from_dict({**base, "workers": 0}).validate()


# ----------------------------------------------------------------------------------- the trainer

A = [f"PMCA-fig{i}" for i in range(4)]
B = [f"PMCB-fig{i}" for i in range(4)]


@pytest.fixture(scope="module")
def figures(tmp_path_factory) -> Path:
    """Two shards: A0..A3 and B0, B1, a sample without image, B2, B3 (9 samples, 8 good)."""
    folder = tmp_path_factory.mktemp("release") / "commercial"
    folder.mkdir()
    jpg = IMAGES[0].read_bytes()
    shard_b = [*B[:2], "PMCB-broken", *B[2:]]
    for index, keys in enumerate((A, shard_b)):
        with wds.TarWriter(str(folder / f"panelforge-{index:06d}.tar")) as sink:
            for key in keys:
                sample = {"__key__": key, "txt": f"caption of {key}".encode(), "json": b"{}"}
                if key != "PMCB-broken":
                    sample["jpg"] = jpg
                sink.write(sample)
    (folder / "sizes.json").write_text(json.dumps({"panelforge-000000.tar": 4, "panelforge-000001.tar": 5}))
    return folder


class KeyTrainer(Trainer):
    """The real trainer, noting the keys of each figure batch it trains on (every batch a step
    reads comes through ``data.batch``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.keys: list[list[str]] = []
        read = self.data.batch

        def noting(level):
            items, images = read(level)
            self.keys.append([d.key for d in items])
            return items, images

        self.data.batch = noting


def _config(figures: Path, tiny: Path, run: Path, steps: int) -> MultilevelConfig:  # noqa: F811
    return MultilevelConfig.from_dict({
        "run_dir": str(run), "model": f"local-dir:{tiny}", "device": "cpu", "figure_data": [str(figures)],
        "schedule": [["figure"]], "loss_weights": {"figure": 1.0}, "batch_size": 2, "steps": steps,
        "workers": 2, "warmup": 1, "lr": 1e-3, "checkpoint_every": 3, "unfreeze_last_blocks": 1,
    })  # fmt: skip


def _run(config: MultilevelConfig) -> KeyTrainer:
    """``train``'s loop, keeping the trainer to read its keys."""
    trainer = KeyTrainer(config)
    trainer.resume()
    try:
        while trainer.step < config.steps:
            trainer.train_step()
            if trainer.step % config.checkpoint_every == 0:
                trainer.save()
    finally:
        trainer.close()
    return trainer


def test_two_workers_see_each_sample_once_per_epoch_and_resume_exactly(figures, tiny, tmp_path):  # noqa: F811
    # worker 0 reads shard A, worker 1 shard B; batches alternate between them, 2 samples each
    epoch = [A[:2], B[:2], A[2:], B[2:]]
    whole = _run(_config(figures, tiny, tmp_path / "whole", 6))
    assert whole.keys == [*epoch, A[:2], B[:2]]
    assert sorted(k for batch in whole.keys[:4] for k in batch) == sorted(A + B)  # each good sample once
    assert whole.data.skipped == 1  # PMCB-broken, in the one batch of worker 1 that read past it (step 3)
    assert whole.data.consumed() == {"figure": 4 + 5 + 2 + 2}  # A twice (4 + 2 samples), B once (5) + 2
    assert whole.data.loader_state() == {"figure": {"workers": 2, "batches": 6, "positions": [6, 7]}}

    run = tmp_path / "resumed"
    first = _run(_config(figures, tiny, run, 3))  # checkpoint at step 3: the next batch is worker 1's
    assert first.keys == epoch[:3]
    resumed = _run(_config(figures, tiny, run, 6))
    assert resumed.step == 6 and resumed.keys == [B[2:], A[:2], B[:2]]
    assert resumed.data.loader_state() == whole.data.loader_state()


def test_train_reports_the_samples_read_with_workers(figures, tiny, tmp_path):  # noqa: F811
    report = train(_config(figures, tiny, tmp_path / "run", 2))
    # step 0: A0 A1 (worker 0), step 1: B0 B1 (worker 1); the broken sample comes after B1
    assert json.loads(report["consumed"]) == {"figure": 4}
    assert report["skipped_samples"] == 0 and report["steps"] == 2


def test_children_decoded_by_threads_match_the_sequential_decode(data, tiny, tmp_path):  # noqa: F811
    import random

    from pipelines.training.multilevel import Decoded

    def children(workers: int) -> list[tuple[int, str, str]]:
        config = MultilevelConfig.from_dict({
            "preset": "zoom-in", "run_dir": str(tmp_path / f"w{workers}"), "model": f"local-dir:{tiny}",
            "device": "cpu", "figure_data": [data["figure"]], "panel_data": [data["panel"]],
            "region_data": [data["region"]], "batch_size": 2, "link_pull": 4, "workers": workers,
        })  # fmt: skip
        trainer = Trainer(config)
        trainer.resume()
        try:
            parents = [Decoded("PMC1-fig1_p000", None, "stained cells"), Decoded("PMC1-fig1_p001", None, "blot")]
            found = trainer.data.children("panel", parents, random.Random(7))
        finally:
            trainer.close()
        return [(i, d.key, d.text) for i, d in found]

    sequential, threaded = children(0), children(2)
    # the 4 regions are pulled; round-robin under the cap of 2: p000's first region, then p001's
    assert [(i, k) for i, k, _ in sequential] == [(0, "PMC1-fig1_p000_r00"), (1, "PMC1-fig1_p001_r00")]
    assert {t for _, _, t in sequential} <= {"arrows mark the nuclei", "bright round nuclei", "the upper band",
                                             "a dark band"}  # fmt: skip
    assert threaded == sequential  # the same texts whatever order the threads finish in
