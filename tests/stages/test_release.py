"""Serialization: the sample plan, WebDataset shards and mixtures, read back by real consumers.

The lake is the bundled sample acquired from the loopback PMC Cloud server and parsed. Expected
numbers come from ``sample/articles/FIGURES.csv`` (written from the files, see SOURCES.md) and
from the edits each test makes to its input by hand.
"""

import hashlib
import io
import json
import os
import tarfile
from collections import Counter, defaultdict

import pyarrow.parquet as pq
import pytest
from PIL import Image

from pipelines.core.lake import Lake
from pipelines.core.stage import Partition
from pipelines.release import webdataset as wds_writer
from pipelines.release.samples import sample_key
from pipelines.release.stages import SamplePlanStage
from pipelines.release.webdataset import (
    LICENSE_SUBSETS,
    ShardLimits,
    by_license,
    concept_cap,
    concept_filter,
    dataset_dir,
    shuffled_samples,
    write_release_subsets,
    write_subset,
)
from tests.helpers import SHARDS, copy_lake
from tests.unit.test_parse import FIGURES_CSV, FOLDER_TO_PMCID

RELEASE = "2025"


def plan_release(lake: Lake, seed: int = 0) -> dict[str, list[dict]]:
    plans = {}
    for shard in SHARDS:
        SamplePlanStage(seed).run(lake, Partition(RELEASE, shard))
        plans[shard] = lake.read_table("samples", RELEASE, shard).to_pylist()
    return plans


def all_rows(plans) -> list[dict]:
    return [r for rows in plans.values() for r in rows]


def read_tar(path) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]


def test_sample_keys_have_no_dots():
    assert sample_key("PMC123", "F1", 0, 1) == "PMC123_F1"
    assert sample_key("PMC123", "fig.1a", 1, 2) == "PMC123_fig-1a_2"
    assert sample_key("PMC123", None, 0, 1) == "PMC123_fig"


def test_plan_matches_the_figure_files_of_every_article(parsed_lake, tmp_path):
    lake = copy_lake(parsed_lake, tmp_path)
    rows = all_rows(plan_release(lake))
    with_files = defaultdict(int)
    non_jpeg = defaultdict(int)
    for row in rows:
        if row["image_file"] is not None and row["reason"] not in ("missing_image", "no_graphic"):
            with_files[row["pmcid"]] += 1
            non_jpeg[row["pmcid"]] += row["converted_from"] is not None
    expected_files, expected_non_jpeg = defaultdict(int), defaultdict(int)
    released = {r["pmcid"] for r in rows}
    for folder, graphics in FIGURES_CSV.items():
        pmcid = FOLDER_TO_PMCID.get(folder)
        if pmcid not in released:
            continue
        renditions = defaultdict(set)  # one figure may list a TIFF and a PNG, or a full JPEG and a thumbnail
        for graphic in graphics:
            if graphic["local_file"]:
                renditions[graphic["fig_id"]].add(graphic["format"])
        for formats in renditions.values():
            expected_files[pmcid] += 1
            expected_non_jpeg[pmcid] += "jpeg" not in formats
    assert dict(with_files) == {k: v for k, v in expected_files.items() if v}
    included = [r for r in rows if r["status"] == "included"]
    assert {r["pmcid"]: 0 for r in included} | dict(non_jpeg) == {r["pmcid"]: 0 for r in included} | {
        k: v for k, v in expected_non_jpeg.items() if v
    }
    # the bioRxiv hemibrain preprint: 29 figures, JPEG bytes without a file extension
    hemibrain = [r for r in included if r["pmcid"] == FOLDER_TO_PMCID["biorxiv-2020.04.07.030213"]]
    assert len(hemibrain) == 29 and all(r["converted_from"] is None for r in hemibrain)
    assert all("." not in r["key"] for r in rows) and len({r["key"] for r in rows}) == len(rows)
    for shard_rows in plan_release(lake).values():  # each partition's plan is sorted for the merge
        assert [r["shuffle_key"] for r in shard_rows] == sorted(r["shuffle_key"] for r in shard_rows)


def write_hand_labels(lake: Lake, concept_of) -> None:
    """``figure_concepts`` written by hand: every image of an article gets ``concept_of(pmcid)``
    (None: an unannotated cluster)."""
    for shard in SHARDS:
        rows = []
        for fig in lake.read_table("figures", RELEASE, shard).to_pylist():
            concept = concept_of(fig["pmcid"])
            for name in fig["image_files"]:
                rows.append(
                    {"pmcid": fig["pmcid"], "fig_id": fig["fig_id"], "image_file": name, "sha256": None,
                     "model_version": "hand", "cluster_id": 0 if concept == "Microscopy" else 1, "distance": 0.0,
                     "panel_type": "single panel", "global_concept": concept, "local_concepts": [],
                     "label_status": "labeled" if concept else "unannotated_cluster", "synthetic": False}
                )  # fmt: skip
        lake.write_table("figure_concepts", RELEASE, shard, rows)


def _edit(lake: Lake, table: str, shard: str, edit) -> None:
    rows = lake.read_table(table, RELEASE, shard).to_pylist()
    for row in rows:
        edit(row)  # edits the row in place
    lake.write_table(table, RELEASE, shard, rows)


def test_bad_input_is_excluded_with_a_reason(parsed_lake, tmp_path):
    lake = copy_lake(parsed_lake, tmp_path)
    baseline = [r for r in all_rows(plan_release(lake)) if r["status"] == "included"]
    by_article = defaultdict(list)
    for row in baseline:
        by_article[row["pmcid"]].append(row)
    victims = sorted(by_article, key=lambda p: (-len(by_article[p]), p))[:4]
    shard_of = {r["pmcid"]: s for s in SHARDS for r in lake.read_table("articles", RELEASE, s).to_pylist()}
    unlicensed = victims[3]
    zero, broken, uncaptioned = (by_article[p][0] for p in victims[:3])

    def raw_edit(row):
        if (row["pmcid"], row["name"]) == (zero["pmcid"], zero["image_file"]):
            row["size"] = 0
        if (row["pmcid"], row["name"]) == (broken["pmcid"], broken["image_file"]):  # point at the article's XML
            xml = next(r for r in raw_rows[broken["pmcid"]] if r["kind"] == "xml")
            row.update(offset=xml["offset"], size=xml["size"], name=broken["image_file"])
        return row

    raw_rows = defaultdict(list)
    for shard in SHARDS:
        for row in lake.read_table("raw_files", RELEASE, shard).to_pylist():
            raw_rows[row["pmcid"]].append(row)
    for pmcid in {zero["pmcid"], broken["pmcid"]}:
        _edit(lake, "raw_files", shard_of[pmcid], raw_edit)
    gone = by_article[victims[0]][1]  # a figure whose image file is not in the package
    shard = shard_of[gone["pmcid"]]
    kept = [
        r
        for r in lake.read_table("raw_files", RELEASE, shard).to_pylist()
        if (r["pmcid"], r["name"]) != (gone["pmcid"], gone["image_file"])
    ]
    lake.write_table("raw_files", RELEASE, shard, kept)

    def figure_edit(row):
        if (row["pmcid"], row["fig_id"]) == (uncaptioned["pmcid"], uncaptioned["fig_id"]):
            row.update(caption_title=None, caption_text="  ")

    _edit(lake, "figures", shard_of[uncaptioned["pmcid"]], figure_edit)
    _edit(
        lake,
        "articles",
        shard_of[unlicensed],
        lambda r: r.update(license_code=None) if r["pmcid"] == unlicensed else None,
    )

    rows = {r["key"]: r for r in all_rows(plan_release(lake))}
    assert rows[zero["key"]]["reason"] == "zero_byte_image"
    assert rows[gone["key"]]["reason"] == "missing_image"
    assert rows[uncaptioned["key"]]["reason"] == "empty_caption"
    # the broken image is not JPEG (it is XML), so conversion tries to decode it and records why not
    assert rows[broken["key"]]["reason"] == "undecodable_image" and rows[broken["key"]]["detail"]
    assert {rows[r["key"]]["reason"] for r in by_article[unlicensed]} == {"unknown_license"}
    changed = {zero["key"], gone["key"], broken["key"], uncaptioned["key"], *(r["key"] for r in by_article[unlicensed])}
    still = {k for k, r in rows.items() if r["status"] == "included"}
    assert still == {r["key"] for r in baseline} - changed  # the rest of the release is untouched


def test_shards_are_bounded_shuffled_and_reproducible(parsed_lake, tmp_path):
    lake = copy_lake(parsed_lake, tmp_path / "a")
    plans = plan_release(lake, seed=7)
    included = [r for r in all_rows(plans) if r["status"] == "included"]
    result = write_subset(lake, RELEASE, "commercial", shuffled_samples(lake, RELEASE), ShardLimits(10, 10**9))
    keys = []
    for shard in result.shards:
        members = read_tar(dataset_dir(lake, RELEASE, "commercial", shard["name"]))
        assert len(members) == 3 * shard["samples"] <= 30
        keys += [name.split(".")[0] for name, _ in members[::3]]
        assert [n.split(".", 1)[1] for n, _ in members[:3]] == ["jpg", "json", "txt"]
        sidecar = pq.read_table(dataset_dir(lake, RELEASE, "commercial", shard["name"].replace(".tar", ".parquet")))
        assert sidecar.column("key").to_pylist() == keys[-shard["samples"] :]
    # the order is the keyed hash of each key: an oracle independent of the writer
    expected = sorted(included, key=lambda r: hashlib.blake2b(f"7:{r['key']}".encode(), digest_size=8).digest())
    assert keys == [r["key"] for r in expected if r["license_group"] == "commercial"]
    assert json.loads(open(dataset_dir(lake, RELEASE, "commercial", "sizes.json")).read()) == {
        s["name"]: s["samples"] for s in result.shards
    }
    # a byte limit: every tar stays under it
    small = write_subset(lake, RELEASE, "by-bytes", shuffled_samples(lake, RELEASE), ShardLimits(10_000, 2_000_000))
    assert len(small.shards) > 1 and all(s["bytes"] <= 2_000_000 for s in small.shards)
    assert small.samples == result.samples

    # the same inputs in another lake give byte-identical shards
    other = copy_lake(parsed_lake, tmp_path / "b")
    plan_release(other, seed=7)
    again = write_subset(other, RELEASE, "commercial", shuffled_samples(other, RELEASE), ShardLimits(10, 10**9))
    assert [s["sha256"] for s in again.shards] == [s["sha256"] for s in result.shards]
    for shard in result.shards:
        path = dataset_dir(lake, RELEASE, "commercial", shard["name"])
        assert hashlib.sha256(open(path, "rb").read()).hexdigest() == shard["sha256"]


def test_original_jpeg_bytes_and_converted_images(parsed_lake, tmp_path):
    lake = copy_lake(parsed_lake, tmp_path)
    plans = plan_release(lake)
    write_subset(lake, RELEASE, "commercial", shuffled_samples(lake, RELEASE), ShardLimits(1000, 10**9))
    raw = {(r["pmcid"], r["name"]): r for r in lake.read_release("raw_files", RELEASE).to_pylist()}
    plan = {r["key"]: r for r in all_rows(plans)}
    members = read_tar(dataset_dir(lake, RELEASE, "commercial", "panelforge-000000.tar"))
    converted = 0
    for name, data in members:
        key, ext = name.split(".", 1)
        if ext != "jpg":
            continue
        row, meta = plan[key], json.loads(dict(members)[f"{key}.json"])
        source = raw[(row["pmcid"], row["image_file"])]
        assert meta["source_sha256"] == source["sha256"] and meta["sha256"] == hashlib.sha256(data).hexdigest()
        if row["converted_from"] is None:
            assert hashlib.sha256(data).hexdigest() == source["sha256"]  # the original bytes, not re-encoded
        else:
            converted += 1
            image = Image.open(io.BytesIO(data))
            assert image.format == "JPEG" and image.mode == "RGB" and image.size == (meta["width"], meta["height"])
        assert "body_text" not in meta and meta["pmcid"] == row["pmcid"] and meta["title"]
    assert converted == sum(1 for r in plan.values() if r["status"] == "included" and r["converted_from"])


def test_license_groups_never_share_a_shard(parsed_lake, tmp_path):
    lake = copy_lake(parsed_lake, tmp_path)
    # test input: relabel two articles (one NC, one without a CC license) to exercise every subset
    with_samples = sorted({r["pmcid"] for r in all_rows(plan_release(lake)) if r["status"] == "included"})
    nc, other = with_samples[0], with_samples[-1]
    for shard in SHARDS:
        _edit(
            lake,
            "articles",
            shard,
            lambda r: r.update(license_code="CC BY-NC", license_group="noncommercial") if r["pmcid"] == nc else None,
        )
        _edit(
            lake,
            "articles",
            shard,
            lambda r: r.update(license_code="NO-CC CODE", license_group="other") if r["pmcid"] == other else None,
        )
    plans = plan_release(lake)
    results = write_release_subsets(lake, RELEASE, {g: by_license(g) for g in LICENSE_SUBSETS}, ShardLimits(7, 10**9))
    included = [r for r in all_rows(plans) if r["status"] == "included"]
    for group in LICENSE_SUBSETS:
        sidecars = [
            pq.read_table(dataset_dir(lake, RELEASE, group, s["name"].replace(".tar", ".parquet")))
            for s in results[group].shards
        ]
        groups = {g for t in sidecars for g in t.column("license_group").to_pylist()}
        assert groups <= {group}
        assert results[group].samples == sum(1 for r in included if r["license_group"] == group)
    assert {r["pmcid"] for r in included if r["license_group"] == "noncommercial"} == {nc}
    assert results["noncommercial"].samples > 0 and results["other"].samples > 0


def test_concept_mixtures(parsed_lake, tmp_path):
    lake = copy_lake(parsed_lake, tmp_path)
    # hand-written labels: the hemibrain preprint is Microscopy, every other figure Plots and Charts,
    # except one article left unlabeled
    hemibrain = FOLDER_TO_PMCID["biorxiv-2020.04.07.030213"]
    articles = [r["pmcid"] for r in lake.read_release("articles", RELEASE).to_pylist() if r["n_figures"]]
    unlabeled = next(p for p in articles if p != hemibrain)
    write_hand_labels(
        lake, lambda pmcid: None if pmcid == unlabeled else ("Microscopy" if pmcid == hemibrain else "Plots and Charts")
    )
    plans = plan_release(lake)
    included = [r for r in all_rows(plans) if r["status"] == "included"]
    per = Counter(r["global_concept"] for r in included)
    assert per["Microscopy"] == 29
    filtered = write_release_subsets(lake, RELEASE, {"f": concept_filter("commercial", ["Microscopy", "Maps"])})
    assert filtered["f"].samples == 29 and filtered["f"].concepts == {"Microscopy": 29}
    balanced = write_release_subsets(lake, RELEASE, {"b": concept_cap("commercial", 5)})
    assert balanced["b"].concepts == {"Microscopy": 5, "Plots and Charts": 5}
    # the capped five are the first five of each concept in shuffle order
    order = [r["key"] for r in sorted(included, key=lambda r: r["shuffle_key"]) if r["global_concept"] == "Microscopy"]
    kept = pq.read_table(dataset_dir(lake, RELEASE, "b", "panelforge-000000.parquet")).to_pylist()
    assert [r["key"] for r in kept if r["global_concept"] == "Microscopy"] == order[:5]


def test_a_crash_mid_shard_leaves_no_partial_shard_and_a_rerun_finishes_the_same(parsed_lake, tmp_path, monkeypatch):
    clean = copy_lake(parsed_lake, tmp_path / "clean")
    plan_release(clean)
    expected = write_subset(clean, RELEASE, "commercial", shuffled_samples(clean, RELEASE), ShardLimits(10, 10**9))

    lake = copy_lake(parsed_lake, tmp_path / "crash")
    plan_release(lake)
    real_add, calls = wds_writer.add_member, {"n": 0}

    def crashing_add(tar, name, fileobj, size):
        calls["n"] += 1
        if calls["n"] == 3 * 25 + 2:  # in the middle of the third shard
            raise OSError("disk full (simulated)")
        return real_add(tar, name, fileobj, size)

    monkeypatch.setattr(wds_writer, "add_member", crashing_add)
    with pytest.raises(OSError, match="simulated"):
        write_subset(lake, RELEASE, "commercial", shuffled_samples(lake, RELEASE), ShardLimits(10, 10**9))
    folder = dataset_dir(lake, RELEASE, "commercial")
    visible = sorted(p.rsplit("/", 1)[1] for p in lake.fs.glob(f"{folder}/*"))
    assert visible == [
        "panelforge-000000.parquet",
        "panelforge-000000.tar",
        "panelforge-000001.parquet",
        "panelforge-000001.tar",
    ]
    monkeypatch.setattr(wds_writer, "add_member", real_add)
    rerun = write_subset(lake, RELEASE, "commercial", shuffled_samples(lake, RELEASE), ShardLimits(10, 10**9))
    assert [s["sha256"] for s in rerun.shards] == [s["sha256"] for s in expected.shards]
    assert [s["reused"] for s in rerun.shards[:3]] == [True, True, False]
    assert not [p for p in lake.fs.glob(f"{folder}/.*")]  # no temporary files left behind


def test_temporary_files_never_sit_among_the_shards_and_old_orphans_are_swept(parsed_lake, tmp_path, monkeypatch):
    lake = copy_lake(parsed_lake, tmp_path)
    plan_release(lake)
    folder = dataset_dir(lake, RELEASE, "commercial")
    os.makedirs(folder)
    # what a writer killed with -9 left here before temporary files moved to the lake's _tmp/
    with open(f"{folder}/.panelforge-000000.tar.0123456789abcdef.tmp", "wb") as fh:
        fh.write(b"truncated")
    real_add, seen = wds_writer.add_member, []

    def watching_add(tar, name, fileobj, size):  # runs while a shard's temporary file is open
        seen.append((sorted(n for n in os.listdir(folder) if n.startswith(".")), _tmp_files(lake)))
        return real_add(tar, name, fileobj, size)

    monkeypatch.setattr(wds_writer, "add_member", watching_add)
    result = write_subset(lake, RELEASE, "commercial", shuffled_samples(lake, RELEASE), ShardLimits(10, 10**9))
    assert len(result.shards) > 1 and seen
    # mid-write the folder held only the old orphan; the open temporary file was in _tmp/
    assert all(dot == [".panelforge-000000.tar.0123456789abcdef.tmp"] for dot, _ in seen)
    # (under the shard's own path in _tmp/files/, with the lock that tells a sweeper its writer lives)
    shard_tmp = "files/dataset/" + os.path.relpath(folder, dataset_dir(lake)) + "/panelforge-"
    assert all(
        len(tmp) == 2 and tmp[0].startswith(shard_tmp) and tmp[0].endswith(".tmp") and tmp[1] == tmp[0] + ".lock"
        for _, tmp in seen
    )
    assert not [n for n in os.listdir(folder) if n.startswith(".") or ".tmp" in n]
    assert _tmp_files(lake) == []


def _tmp_files(lake: Lake) -> list[str]:
    root = lake.path("_tmp")
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, names in os.walk(root) for f in names)


def test_statistics_are_exact_in_count_mean_and_range():
    import numpy as np

    from pipelines.release.stats import ReleaseStats, Reservoir

    reservoir = Reservoir(size=3, rng=np.random.default_rng(0))
    for value in (5, 1, 9, 3):
        reservoir.add(value)
    summary = reservoir.summary()
    assert (summary["count"], summary["mean"], summary["min"], summary["max"]) == (4, 4.5, 1, 9)
    assert len(reservoir.values) == 3  # bounded, whatever the count
    stats = ReleaseStats(reservoir=10, token_sample=10)
    stats.add_text("caption", "a cat")  # CLIP BPE: "a</w>", "cat</w>"
    result = stats.result()
    assert result["fields"]["caption"]["chars"]["max"] == 5
    assert result["fields"]["caption"]["tokens"]["max"] == 2


def test_histogram_axes_span_the_data(monkeypatch):
    import numpy as np

    from pipelines.release import stats as stats_module
    from pipelines.release.stats import ReleaseStats, log_bins

    edges = log_bins(np.array([300.0, 1000.0, 3000.0]), edges=3)
    assert edges.tolist() == pytest.approx([300, 948.683, 3000])  # 300 * sqrt(10), then 300 * 10
    assert log_bins(np.array([500.0, 500.0]), edges=3).tolist() == pytest.approx([500 / 1.1, 500, 550])
    limits = {}
    real_png = stats_module.figure_png

    def recording_png(fig, plt, synthetic=None):
        limits[fig.axes[0].get_title()] = fig.axes[0].get_xlim()
        return real_png(fig, plt, synthetic)

    monkeypatch.setattr(stats_module, "figure_png", recording_png)
    stats = ReleaseStats(reservoir=10, token_sample=0)
    for width in (120, 640, 2400):
        stats.add_value("image_width", width)
    pngs = stats.histograms()
    assert pngs["image_width.png"].startswith(b"\x89PNG")
    half_bin = (2400 / 120) ** (1 / 39 / 2)  # 40 edges from 120 to 2400: 39 equal ratios
    assert limits["image width: n = 3"] == pytest.approx((120 / half_bin, 2400 * half_bin))  # not from 1


def test_histogram_units_scales_and_the_synthetic_mark(monkeypatch):
    from pipelines.release import stats as stats_module
    from pipelines.release.stats import ReleaseStats

    drawn = {}
    real_png = stats_module.figure_png

    def recording_png(fig, plt, synthetic=None):
        ax, texts = fig.axes[0], fig.texts  # the list the footer is drawn into
        png = real_png(fig, plt, synthetic)
        drawn[ax.get_title()] = (ax.get_xscale(), ax.get_xlabel(), ax.get_ylabel(), [t.get_text() for t in texts])
        return png

    monkeypatch.setattr(stats_module, "figure_png", recording_png)
    stats = ReleaseStats(reservoir=10, token_sample=0)
    for n in (0, 0, 1, 2, 2):
        stats.add_value("panel_pairs_per_figure", n)
    for length in (40, 60, 95):  # 2.4x: no decade to show on a log axis
        stats.add_text("caption", "x" * length)
    for width in (100, 3000):
        stats.add_value("image_width", width)
    stats.histograms()
    assert drawn["panel pairs per figure: n = 5"][:3] == ("linear", "panel pairs per figure (pairs)", "figures")
    assert drawn["caption: n = 3"][:2] == ("linear", "caption length (characters)")
    assert drawn["image width: n = 2"][:2] == ("log", "image width (px)")
    assert drawn["caption: n = 3"][3] == []
    drawn.clear()
    stats.histograms(synthetic="SYNTHETIC TEST BUILD (tiny random models):\nconcept labels")
    assert set(drawn) == {
        "panel pairs per figure: n = 5 (synthetic)",
        "caption: n = 3 (synthetic)",
        "image width: n = 2 (synthetic)",
    }
    assert all(d[3] == ["SYNTHETIC TEST BUILD (tiny random models):\nconcept labels"] for d in drawn.values())


def test_sample_json_is_complete_and_typed():
    from pipelines.release.samples import JSON_FIELDS, stable_json

    meta = dict.fromkeys(JSON_FIELDS)
    stable = stable_json(meta)
    assert stable["cluster_id"] == -1 and stable["title"] == "" and stable["mentions"] == []
    with pytest.raises(ValueError, match="differ from JSON_FIELDS"):
        stable_json({**meta, "body_text": "x"})


def _shard_of_key(lake: Lake, result, subset: str) -> dict[str, str]:
    return {
        key: shard["name"]
        for shard in result.shards
        for key in pq.read_table(dataset_dir(lake, RELEASE, subset, shard["name"].replace(".tar", ".parquet")))
        .column("key")
        .to_pylist()
    }


def test_a_shard_is_reused_only_when_its_planned_rows_are_unchanged(parsed_lake, tmp_path):
    """An edited caption in the plan rewrites the one shard that holds it; the others are reused.
    (Reported: edited long captions were released in 0 of 128 samples while 14 of 14 shards were
    reused, because reuse compared only keys and sizes.)"""
    lake = copy_lake(parsed_lake, tmp_path)
    plans = plan_release(lake)
    first = write_subset(lake, RELEASE, "commercial", shuffled_samples(lake, RELEASE), ShardLimits(10, 10**9))
    assert len(first.shards) >= 3
    where = _shard_of_key(lake, first, "commercial")
    victim = next(r for r in all_rows(plans) if r["key"] in where)
    shard = next(s for s in SHARDS if victim in plans[s])
    edited = "An edited caption that must reach the released tar."
    _edit(lake, "samples", shard, lambda r: r.update(caption=edited) if r["key"] == victim["key"] else None)

    again = write_subset(lake, RELEASE, "commercial", shuffled_samples(lake, RELEASE), ShardLimits(10, 10**9))
    reused = {s["name"]: s["reused"] for s in again.shards}
    assert reused == {s["name"]: s["name"] != where[victim["key"]] for s in first.shards}
    members = dict(read_tar(dataset_dir(lake, RELEASE, "commercial", where[victim["key"]])))
    assert members[f"{victim['key']}.txt"].decode() == edited
    manifest = json.loads(open(dataset_dir(lake, RELEASE, "commercial", "manifest.json")).read())
    path = dataset_dir(lake, RELEASE, "commercial", where[victim["key"]])
    listed = next(s for s in manifest["shards"] if s["name"] == where[victim["key"]])
    # the manifest vouches for the new tar
    assert listed["sha256"] == hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_image_bytes_that_no_longer_match_their_plan_are_refused(parsed_lake, tmp_path):
    """A plan row whose image bytes changed after planning (an archive rewritten under its index)
    is refused with a message naming what to re-materialize, not shipped."""
    lake = copy_lake(parsed_lake, tmp_path)
    plans = plan_release(lake)
    victim = next(r for r in all_rows(plans) if r["status"] == "included" and r["license_group"] == "commercial")
    shard = next(s for s in SHARDS if victim in plans[s])
    _edit(lake, "samples", shard, lambda r: r.update(image_sha256="0" * 64) if r["key"] == victim["key"] else None)
    with pytest.raises(wds_writer.StaleImageError, match=victim["key"]):
        write_subset(lake, RELEASE, "commercial", shuffled_samples(lake, RELEASE), ShardLimits(10, 10**9))


def test_the_machine_path_audit_reads_every_file_member_and_column(tmp_path):
    import io

    import pyarrow as pa

    from pipelines.release.audit import Finding, find_machine_paths

    folder = tmp_path / "dataset"
    (folder / "r" / "sub").mkdir(parents=True)
    (folder / "README.md").write_text("See https://www.ncbi.nlm.nih.gov/pmc/tools/ and doi 10.1371/journal.pone/1.\n")
    (folder / "r" / "release.json").write_text(
        json.dumps({"a": {"model": "/home/me/models/qwen"}, "caption": "Taar1+/+/Oprm1B6/B6 mice, 5 mg/kg"})
    )
    with tarfile.open(folder / "r" / "sub" / "p-000000.tar", "w") as tar:
        for name, data in (
            ("k.jpg", b"\xff\xd8/home/not/read"),
            ("k.json", json.dumps({"tokenizer": "hf:/scratch/u/tok@512", "caption": "see /usr/bin/tool"}).encode()),
            ("k.txt", b"run /usr/local/bin/tool first"),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    table = pa.table({"model": ["Qwen/Qwen2.5-VL-7B-Instruct", "local:tiny"], "paths": [["~/x/y"], ["ok"]]})
    pq.write_table(table.replace_schema_metadata({"made_in": "C:\\Users\\me\\lake"}), folder / "r" / "t.parquet")
    (folder / "r" / "notes.txt").write_text("lake at /lakes/panelforge/data and /lakesx/no")
    found = find_machine_paths(folder, roots=("/lakes/panelforge",))
    assert found == [
        Finding("r/notes.txt", "", "/lakes/panelforge/data"),
        Finding("r/release.json", "a.model", "/home/me/models/qwen"),
        Finding("r/sub/p-000000.tar", "k.json:tokenizer", "/scratch/u/tok@512"),
        Finding("r/sub/p-000000.tar", "k.json:caption", "/usr/bin/tool"),
        Finding("r/sub/p-000000.tar", "k.txt", "/usr/local/bin/tool"),
        Finding("r/t.parquet", "metadata:made_in", "C:\\Users"),
        Finding("r/t.parquet", "paths", "~/x"),
    ]
    # article text aside (the caption key, the .txt member): what a real release is checked for
    assert [f.where for f in find_machine_paths(folder, content=False)] == [
        "a.model",
        "k.json:tokenizer",
        "metadata:made_in",
        "paths",
    ]


def test_synthetic_parts_are_counted_from_what_the_stages_stored(tmp_path):
    """A hand-made lake of one shard: three figures, two labelled by a synthetic model; two figures run
    through the synthetic detector, whose boxes one of three panels kept; nothing mined."""
    import pyarrow as pa

    from pipelines.core.schemas import PANEL_FIGURES, PANELS, SAMPLES
    from pipelines.release.synthetic import synthetic_parts

    def row(schema, **values) -> dict:  # the required columns filled, the rest null
        filled = {f.name: ("x" if pa.types.is_string(f.type) else 0) for f in schema if not f.nullable}
        return dict.fromkeys(schema.names) | filled | values

    lake = Lake(tmp_path / "lake")
    (shard,) = lake.ensure_layout(1)
    samples = [
        row(SAMPLES, key=f"k{i}", status="included", meta_json=json.dumps({"labels_from_synthetic_model": i < 2}))
        for i in range(3)
    ]
    samples.append(row(SAMPLES, key="gone", status="excluded", reason="empty_caption"))
    lake.write_table("samples", "r1", shard, samples)
    lake.write_table("panel_figures", "r1", shard, [row(PANEL_FIGURES, synthetic=i < 2) for i in range(3)])
    lake.write_table("panels", "r1", shard, [row(PANELS, method=m) for m in ("decision", "xycut", "detr")])
    parts = synthetic_parts(lake, "r1")
    assert parts.short == ["concept labels", "panel boxes"]
    assert parts.parts[0].endswith(
        "of 2 of 3 figures come from a tiny randomly initialised model, not DINOv2: they are placeholders."
    )
    assert parts.parts[1] == (
        "**Panel detector**: 2 figures were also run through a tiny randomly initialised DAB-DETR; 1 of 3 panels kept "
        "its boxes (`method` `detr` or `consensus`: noise), the others are the weight-free split's (`decision` or "
        "`xycut`)."
    )
    assert parts.footer() == "SYNTHETIC TEST BUILD (tiny random models):\nconcept labels, panel boxes"
    assert not synthetic_parts(lake, "r2")  # another release: nothing synthetic, no banner
