"""The held-out articles stay out of training: on a hand-built release of three articles (PMC1,
PMC2, PMC3) at figure, panel and region level with a recorded split naming PMC2, what OpenCLIP's
job is given (the filtered shard stream and its sample count) and what the multi-level trainer's
readers hand out hold none of PMC2's samples and every other one.

The release, by hand:
  commercial/         shard 0: PMC1-fig1, PMC2-fig1, PMC1-fig2   shard 1: PMC3-fig1, PMC2-fig2
  panel-commercial/   shard 0: PMC1-fig1_p000, PMC2-fig1_p000, PMC2-fig1_p001, PMC3-fig1_p000
  region-commercial/  shard 0: PMC1-fig1_p000_r00, PMC2-fig1_p000_r00, PMC3-fig1_p000_r00 (no sidecar)
so PMC2 has 2 figure, 2 panel and 1 region samples; kept: 3 figure, 2 panel, 2 region samples."""

import hashlib
import io
import json
import pickle
from itertools import count
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import webdataset as wds

from pipelines.core.heldout import (
    DEFAULT_KEY,
    DEFAULT_SHARE,
    HeldoutSplit,
    heldout_path,
    load_heldout,
    record_split,
    training_split,
    webdataset_keep,
)
from pipelines.core.lake import Lake, dataset_dir
from pipelines.core.schemas import TABLES, Table
from pipelines.training import heldout
from pipelines.training.clip import ClipTrainConfig, resolve_data, trainer_args
from pipelines.training.multilevel import MultilevelConfig, Trainer
from tests.helpers import SAMPLE_IMAGES as IMAGES

RELEASE = "r1"
FIGURES = [["PMC1-fig1", "PMC2-fig1", "PMC1-fig2"], ["PMC3-fig1", "PMC2-fig2"]]
PANELS = [["PMC1-fig1_p000", "PMC2-fig1_p000", "PMC2-fig1_p001", "PMC3-fig1_p000"]]
REGIONS = [["PMC1-fig1_p000_r00", "PMC2-fig1_p000_r00", "PMC3-fig1_p000_r00"]]
KEPT = {
    "figure": ["PMC1-fig1", "PMC1-fig2", "PMC3-fig1"],
    "panel": ["PMC1-fig1_p000", "PMC3-fig1_p000"],
    "region": ["PMC1-fig1_p000_r00", "PMC3-fig1_p000_r00"],
}


def _pmcid(key: str) -> str:
    return key.split("-")[0]


def _write(folder: Path, shards: list[list[str]], sidecars: bool = True) -> str:
    """A release-like subset: tars (jpg, json with the PMCID, txt) and their sizes.json, and the
    release writer's Parquet sidecars (key, pmcid: the columns training reads) unless told not to."""
    folder.mkdir(parents=True)
    jpg = IMAGES[0].read_bytes()
    for index, keys in enumerate(shards):
        with wds.TarWriter(str(folder / f"panelforge-{index:06d}.tar")) as sink:
            for key in keys:
                meta = json.dumps({"pmcid": _pmcid(key), "description": ""}).encode()
                sink.write({"__key__": key, "jpg": jpg, "json": meta, "txt": f"text of {key}".encode()})
        if sidecars:
            table = pa.table({"key": keys, "pmcid": [_pmcid(k) for k in keys]})
            pq.write_table(table, folder / f"panelforge-{index:06d}.parquet")
    sizes = {f"panelforge-{i:06d}.tar": len(keys) for i, keys in enumerate(shards)}
    (folder / "sizes.json").write_text(json.dumps(sizes))
    return str(folder)


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> tuple[Lake, dict[str, str], str]:
    """The lake, {level: subset folder} and the recorded split's path (PMC2 held out)."""
    lake = Lake(tmp_path_factory.mktemp("heldout") / "lake")
    dirs = {
        "figure": _write(Path(dataset_dir(lake, RELEASE, "commercial")), FIGURES),
        "panel": _write(Path(dataset_dir(lake, RELEASE, "panel-commercial")), PANELS),
        "region": _write(Path(dataset_dir(lake, RELEASE, "region-commercial")), REGIONS, sidecars=False),
    }
    path = record_split(lake, HeldoutSplit(RELEASE, 0.3, "chosen-by-hand", frozenset({"PMC2"}), 3))
    return lake, dirs, path


def _samples_of_tar(data: bytes) -> list[dict]:
    stream = [{"url": "filtered", "stream": io.BytesIO(data)}]
    return list(wds.tariterators.group_by_keys(wds.tariterators.tar_file_expander(stream)))


def _keys_of_tar(data: bytes) -> list[str]:
    return [s["__key__"] for s in _samples_of_tar(data)]


# ----------------------------------------------------------------------------------- the split


def documented_rule(pmcid: str, key: str) -> float:
    """The rule as its description says (core/heldout.py RULE), written again here."""
    digest = hashlib.blake2b(pmcid.strip().upper().encode(), key=key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def test_training_uses_the_recorded_split_else_records_one_by_the_evaluation_defaults(release, tmp_path):
    lake, _, path = release
    split, recorded = training_split(lake, RELEASE)  # recorded by hand: used as it is
    assert not recorded and split.pmcids == {"PMC2"} and split.key == "chosen-by-hand"
    assert path == heldout_path(lake, RELEASE)

    # a release with no record: split by the default rule (1%, the default key) and recorded
    held = next(f"PMC{i}" for i in count() if documented_rule(f"PMC{i}", DEFAULT_KEY) < DEFAULT_SHARE)
    kept = next(f"PMC{i}" for i in count() if documented_rule(f"PMC{i}", DEFAULT_KEY) >= DEFAULT_SHARE)
    other = Lake(tmp_path / "lake")
    shards = other.ensure_layout(2)
    names = TABLES[Table.ARTICLES].names
    other.write_table(
        Table.ARTICLES,
        "r2",
        shards[1],
        [dict.fromkeys(names) | {"pmcid": p, "parse_status": "ok"} for p in (held, kept)],
    )
    split, recorded = training_split(other, "r2")
    assert recorded and split.pmcids == {held} and (split.share, split.key) == (DEFAULT_SHARE, DEFAULT_KEY)
    assert load_heldout(other, "r2") == split  # what a later evaluation reads
    assert training_split(other, "r2") == (split, False)
    with pytest.raises(ValueError, match="release r3 has no articles"):
        training_split(other, "r3")  # no empty split recorded for good
    assert not other.exists(heldout_path(other, "r3"))


def test_the_predicate_pickles_for_dataloader_workers():
    keep = pickle.loads(pickle.dumps(webdataset_keep(HeldoutSplit(RELEASE, 0.3, "k", frozenset({"PMC2"})))))
    assert not keep({"json": b'{"pmcid": "pmc2"}'}) and keep({"json": b'{"pmcid": "PMC1"}'}) and keep({"txt": b""})


# ----------------------------------------------------------------------------------- OpenCLIP


def test_openclip_reads_every_shard_through_the_filter_and_counts_the_kept_samples(release):
    _, dirs, path = release
    config = ClipTrainConfig(train_data=[dirs["figure"]], run_dir="-", heldout=path, python="py")
    data = resolve_data(config)
    assert data.samples == 3 and data.heldout_excluded == 2  # 5 figures, PMC2's two out
    (pattern,) = data.patterns
    urls = list(wds.shardlists.expand_urls(pattern))
    assert urls == [
        f"pipe:py -m pipelines.training.heldout --heldout {path} '{dirs['figure']}/panelforge-{i:06d}.tar'"
        for i in (0, 1)
    ]
    args = trainer_args(config, data, "logs")
    assert args[args.index("--train-num-samples") + 1] == "3" and args[args.index("--train-data") + 1] == pattern

    unfiltered = resolve_data(ClipTrainConfig(train_data=[dirs["figure"]], run_dir="-"))
    assert (
        unfiltered.samples == 5 and unfiltered.heldout_excluded == 0 and not unfiltered.patterns[0].startswith("pipe:")
    )
    assert resolve_data(ClipTrainConfig(train_data=[dirs["figure"]], run_dir="-", heldout=path, train_num_samples=7)
                        ).samples == 7  # fmt: skip


def test_the_filter_command_streams_the_shard_without_the_heldout_samples(release, capsysbinary):
    _, dirs, path = release
    streamed = []
    for index in (0, 1):  # what each pipe: URL above runs, in this process
        heldout.main(["--heldout", path, f"{dirs['figure']}/panelforge-{index:06d}.tar"])
        streamed += _keys_of_tar(capsysbinary.readouterr().out)
    assert streamed == KEPT["figure"]


def test_the_filtered_tar_keeps_every_member_of_a_kept_sample(release):
    _, dirs, _ = release
    keep = webdataset_keep(HeldoutSplit(RELEASE, 0.3, "k", frozenset({"PMC2"})))
    out = io.BytesIO()
    with open(f"{dirs['figure']}/panelforge-000000.tar", "rb") as src:
        assert heldout.filter_tar(src, out, keep) == (2, 1)
    samples = _samples_of_tar(out.getvalue())
    assert [s["__key__"] for s in samples] == ["PMC1-fig1", "PMC1-fig2"]
    assert all(s["jpg"] == IMAGES[0].read_bytes() and s["txt"] == f"text of {s['__key__']}".encode() for s in samples)


def test_held_out_counts_come_from_sidecars_or_the_tar_itself(release):
    _, dirs, _ = release
    split = HeldoutSplit(RELEASE, 0.3, "k", frozenset({"PMC2"}))
    figure = [f"{dirs['figure']}/panelforge-{i:06d}.tar" for i in (0, 1)]
    assert heldout.count_heldout(figure, split) == (5, 2)
    assert heldout.count_heldout([f"{dirs['region']}/panelforge-000000.tar"], split) == (3, 1)  # no sidecar


# ----------------------------------------------------------------------------------- multi-level


@pytest.fixture
def tiny(multilevel_tiny) -> Path:
    return multilevel_tiny  # the session's tiny OpenCLIP (tests/conftest.py)


def _config(dirs: dict, tiny: Path, run: Path, heldout: str | None, **extra) -> MultilevelConfig:
    return MultilevelConfig.from_dict({
        "preset": "zoom-in", "run_dir": str(run), "model": f"local-dir:{tiny}", "device": "cpu",
        "figure_data": [dirs["figure"]], "panel_data": [dirs["panel"]], "region_data": [dirs["region"]],
        "batch_size": 2, "steps": 3, "warmup": 1, "lr": 1e-3, "checkpoint_every": 3, "log_every": 1,
        "workers": 0, "heldout": heldout, **extra,
    })  # fmt: skip


@pytest.mark.parametrize("workers", [0, 2])
def test_multilevel_readers_hand_out_no_heldout_sample_at_any_level(release, tiny, tmp_path, workers):
    _, dirs, path = release
    trainer = Trainer(_config(dirs, tiny, tmp_path / "run", path, workers=workers))
    trainer.resume()
    try:
        seen = {}
        for level in ("figure", "panel", "region"):  # each level's own batches: two passes' worth
            keys = []
            while len(keys) < 2 * len(KEPT[level]):
                items, images = trainer.data.batch(level)
                assert isinstance(images, torch.Tensor)
                keys += [d.key for d in items]
            seen[level] = keys
        # the cross-level children's readers (figure -> panel, panel -> region)
        children = {lv: [s["__key__"] for s in trainer.data.links[lv].take(4)] for lv in ("panel", "region")}
    finally:
        trainer.close()
    if workers == 0:  # one reader, shard order: each pass is the kept samples in order
        for level, keys in seen.items():
            assert keys[: len(KEPT[level])] == KEPT[level], level
    for level, keys in seen.items():
        assert set(keys) == set(KEPT[level]), level  # none of PMC2's, all of the others
    assert children == {lv: KEPT[lv] * 2 for lv in ("panel", "region")}
    assert trainer.data.skipped == 0


def test_multilevel_train_reports_the_excluded_samples(release, tiny, tmp_path):
    from pipelines.training.multilevel import train

    _, dirs, path = release
    report = train(_config(dirs, tiny, tmp_path / "run", path))
    assert report["steps"] == 3 and report["heldout"] == path
    assert json.loads(report["heldout_samples_excluded"]) == {"figure": 2, "panel": 2, "region": 1}
    unfiltered = train(_config(dirs, tiny, tmp_path / "all", None, steps=1))
    assert unfiltered["heldout"] is None and json.loads(unfiltered["heldout_samples_excluded"]) == {}


def test_a_split_is_recorded_once_and_evaluation_refuses_another_rule_over_it(release, tmp_path):
    from pipelines.core.heldout import evaluation_split

    lake, _, _ = release
    recorded = load_heldout(lake, RELEASE)  # by hand: PMC2, key "chosen-by-hand"
    assert evaluation_split(lake, RELEASE) == recorded  # share unset: the recorded split
    assert evaluation_split(lake, RELEASE, recorded.share, "chosen-by-hand") == recorded  # the same rule
    with pytest.raises(ValueError, match=r"already has a held-out split \(share .*'chosen-by-hand'.* 1 articles"):
        evaluation_split(lake, RELEASE, 0.5)  # another rule would score articles training saw
    assert load_heldout(lake, RELEASE) == recorded  # and nothing was replaced

    # a release with no record: training records it by the share it is given, and the evaluation
    # with that same share then scores exactly those articles
    held = next(f"PMC{i}" for i in count() if documented_rule(f"PMC{i}", DEFAULT_KEY) < 0.2)
    kept = next(f"PMC{i}" for i in count() if documented_rule(f"PMC{i}", DEFAULT_KEY) >= 0.2)
    other = Lake(tmp_path / "lake")
    shards = other.ensure_layout(1)
    names = TABLES[Table.ARTICLES].names
    rows = [dict.fromkeys(names) | {"pmcid": p, "parse_status": "ok"} for p in (held, kept)]
    other.write_table(Table.ARTICLES, "r2", shards[0], rows)
    split, recorded_now = training_split(other, "r2", share=0.2)
    assert recorded_now and split.pmcids == {held} and split.share == 0.2
    assert evaluation_split(other, "r2", 0.2) == split
    with pytest.raises(ValueError, match="share 0.2"):
        evaluation_split(other, "r2", DEFAULT_SHARE)
