"""The release at every level: panel pairs, region pairs with hard negatives and long captions as
WebDataset subsets, read back by ``webdataset``, Hugging Face ``datasets`` and OpenCLIP's loader
(a 512-token text tower on the long captions).

The lake is the bundled sample, parsed, planned at the figure level and split into panels (layout
splitter). ``pairs``, ``long_captions`` and ``pair_negatives`` are written by hand for a few real
figures, so every expected value below is read off those hand-made rows (or off the upstream
tables they point at: the panel box the detector found, the figure's sample key).
"""

import glob
import hashlib
import io
import json
from argparse import Namespace

import numpy as np
import pytest
from PIL import Image

from pipelines.core.lake import Lake, dataset_dir
from pipelines.core.rawstore import read_raw_file
from pipelines.core.schemas import LONG_CAPTIONS, PAIRS, PANELS
from pipelines.core.stage import Partition, StageInputError
from pipelines.panels.stages import PanelCropsStage, PanelSettings, PanelStage
from pipelines.release.pairs import pair_key
from pipelines.release.stages import (
    DatasetCardStage,
    PairPlanStage,
    PairWebDatasetStage,
    ReleaseTablesStage,
    SamplePlanStage,
    WebDatasetStage,
    license_subsets,
)
from pipelines.release.webdataset import ShardLimits
from pipelines.training.tiny import TINY_CLIP
from testing.pipeline import sample_lake

RELEASE = "2026"
A = ("PMC900000010", "fig10.jpg")  # a compound figure: the pairs' figure
E = ("PMC900000010", "fig8-figsupp1.jpg")  # a long caption that fell back to the caption
D = ("PMC900000010", "fig8-figsupp2.jpg")  # a long caption the stage failed on
B = ("PMC900000007", "fig3.jpg")  # its article's license is removed: the figure is excluded
C = ("PMC900000004", "488149v1_fig2")  # its article is relabelled CC BY-NC
LONG = " ".join(["a cat"] * 60)  # CLIP BPE: "a</w>", "cat</w>" per repeat: 120 tokens
MODEL_PATH = "/home/someone/panelforge/data/models/vlm/tiny-qwen2_5_vl-seed0"  # a local model directory
CUT_BOX = (300, 100, 500, 300)  # hand-chosen, not a detector panel: cut from the raw image (blot and chart E)
VLM_BOX = (400, 0, 600, 200)  # the blot of panel B, a panel only the VLM proposed
AXIS_BOX = (0, 300, 100, 400)  # chart C's y axis: "Peak area" and tick labels only, a strip the gate drops
TINY_BOX = (0, 0, 40, 40)  # a 40 px corner of table A, added to the panels table: too small a crop
REGION_BOXES = [(10, 10, 60, 50), (100, 20, 200, 70), (550, 600, 700, 700)]  # the last leaves the 600 px image
NEGATIVES = [  # given out of order: the release orders them by negative_index
    (1, "Arrows mark the nuclei in the right panel.", "location"),
    (0, "Arrows mark the nuclei in the left panel\nof the image.", "laterality"),
]


def _shard_of(lake: Lake) -> dict[str, str]:
    return {r["pmcid"]: s for s in lake.shards() for r in lake.read_table("articles", RELEASE, s).to_pylist()}


def _edit_articles(lake: Lake, shard: str, edits: dict[str, dict]) -> None:
    rows = lake.read_table("articles", RELEASE, shard).to_pylist()
    for row in rows:
        row.update(edits.get(row["pmcid"], {}))
    lake.write_table("articles", RELEASE, shard, rows)


def _pair(image, level, panel_index, box, region_index=None, **fields) -> dict:
    pair_id = f"{image[0]}/{image[1]}/p{panel_index:03d}" + (
        f"/r{region_index:02d}" if region_index is not None else ""
    )
    row = dict.fromkeys(PAIRS.names)
    row.update(pair_id=pair_id, pmcid=image[0], fig_id=None, image_file=image[1], level=level)
    row.update(panel_index=panel_index, region_index=region_index, x1=box[0], y1=box[1], x2=box[2], y2=box[3])
    row.update(model="tiny-qwen", prompt_version="p1", backend="scripted", synthetic=True, **fields)
    return row


def _longcap(image, status, caption, long_caption, before, after, reason=None) -> dict:
    return dict.fromkeys(LONG_CAPTIONS.names) | {
        "pmcid": image[0], "fig_id": None, "image_file": image[1], "caption": caption, "long_caption": long_caption,
        "status": status, "reason": reason, "verdict": "FEASIBLE" if status == "refined" else None,
        "context_sources": ["caption", "mentions"], "tokens_before": before, "tokens_after": after,
        "tokenizer": "tiny-512", "cut": False, "gained_context": status == "refined", "synthetic": True,
        "model": "tiny-qwen", "guard_failures": [],
    }  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    lake = sample_lake(tmp_path_factory.mktemp("pairs"), RELEASE)
    shard_of = _shard_of(lake)
    _edit_articles(lake, shard_of[B[0]], {B[0]: {"license_code": None}})
    _edit_articles(lake, shard_of[C[0]], {C[0]: {"license_code": "CC BY-NC", "license_group": "noncommercial"}})
    for shard in lake.shards():
        SamplePlanStage(shuffle_seed=3).run(lake, Partition(RELEASE, shard))
    shard = shard_of[A[0]]
    PanelStage(PanelSettings()).run(lake, Partition(RELEASE, shard))
    panels = lake.read_table("panels", RELEASE, shard).to_pylist()
    tiny = dict.fromkeys(PANELS.names) | {"pmcid": A[0], "image_file": A[1], "panel_index": 90, "method": "xycut"}
    lake.write_table(
        "panels", RELEASE, shard, [*panels, tiny | dict(zip(("x1", "y1", "x2", "y2"), TINY_BOX, strict=True))]
    )
    PanelCropsStage().run(lake, Partition(RELEASE, shard))
    panels = [p for p in panels if (p["pmcid"], p["image_file"]) == A]
    panel0 = next(p for p in panels if p["panel_index"] == 0)
    box0 = (panel0["x1"], panel0["y1"], panel0["x2"], panel0["y2"])
    pairs = {
        shard: [
            _pair(A, "global", 0, (0, 0, 600, 643), text="the caption", text_source="caption"),
            _pair(A, "panel", 0, box0, label="A", text="Confocal image of the cells.", text_source="caption_split",
                  extractive=True, description="a green fluorescent image", panel_source="xycut", score=1.0,
                  text_match="label", count_agreement="equal", label_source="image"),
            _pair(A, "panel", 1, VLM_BOX, label="B", text="Western blot of the lysates.", text_source="vlm",
                  panel_source="vlm", score=0.5, text_match="vlm", count_agreement="equal", label_source="vlm"),
            _pair(A, "panel", 2, AXIS_BOX, label="C", text=None, text_source="none", text_match="none"),
            _pair(A, "panel", 3, CUT_BOX, text="Nuclear levels of the protein.", text_source="caption_split",
                  panel_source="vlm", score=0.5, text_match="order", count_agreement="equal"),
            _pair(A, "panel", 4, AXIS_BOX, label="C", text="Peak areas.", text_source="caption_split",
                  panel_source="vlm", text_match="label", label_source="vlm"),
            _pair(A, "panel", 90, TINY_BOX, text="Hairpins.", text_source="caption_split", panel_source="xycut",
                  text_match="order"),
            _pair(A, "region", 0, REGION_BOXES[0], 0, text="arrows mark the nuclei", text_source="caption",
                  description="bright round nuclei", marker="arrow", region_source="caption+marker", distance=0.1),
            _pair(A, "region", 0, REGION_BOXES[1], 1, text="asterisks mark the vessels", text_source="caption",
                  marker="asterisk", region_source="caption+marker"),
            _pair(A, "region", 0, REGION_BOXES[2], 2, text="the box marks the border", text_source="caption"),
            _pair((A[0], "nonexistent.jpg"), "panel", 0, (0, 0, 10, 10), text="gone", text_source="caption"),
        ]
    }  # fmt: skip
    pairs.setdefault(shard_of[B[0]], []).append(_pair(B, "panel", 0, (0, 0, 50, 50), text="x", text_source="caption"))
    region0 = next(p["pair_id"] for p in pairs[shard] if p["level"] == "region")
    negatives = [
        {"pair_id": region0, "pmcid": A[0], "negative_index": i, "text": text, "perturbation": kind,
         "original_span": "left" if kind == "laterality" else None, "replacement": None, "source": "rule"}
        for i, text, kind in NEGATIVES
    ]  # fmt: skip
    longcaps = {
        A: _longcap(A, "refined", "Cells.", LONG, 20, 120) | {"model": MODEL_PATH},  # as lakes used to hold it
        E: _longcap(E, "fallback", "a cat", "a cat", 2, 2, reason="guard: unsupported feature"),
        D: _longcap(D, "error", "x", None, 1, None, reason="engine error"),
        B: _longcap(B, "refined", "y", "y and more", 1, 3),
        C: _longcap(C, "refined", "Original caption of C.", "Long caption of C.", 30, 90),
    }
    for s in lake.shards():
        lake.write_table("pairs", RELEASE, s, pairs.get(s, []))
        lake.write_table("pair_negatives", RELEASE, s, negatives if s == shard else [])
        lake.write_table("long_captions", RELEASE, s, [r for k, r in longcaps.items() if shard_of[k[0]] == s])
    plans = {s: PairPlanStage().run(lake, Partition(RELEASE, s)) for s in lake.shards()}
    WebDatasetStage(license_subsets(), ShardLimits(1000, 10**9)).run(lake, Partition(RELEASE))
    written = PairWebDatasetStage(ShardLimits(2, 10**9), token_sample=20).run(lake, Partition(RELEASE))
    tables = ReleaseTablesStage(token_sample=20).run(lake, Partition(RELEASE))
    card = DatasetCardStage(repo_id="me/panelforge").run(lake, Partition(RELEASE))
    figure_key = {(r["pmcid"], r["image_file"]): r["key"] for r in lake.read_release("samples", RELEASE).to_pylist()}
    return {"lake": lake, "plans": plans, "written": written, "tables": tables, "card": card, "box0": box0,
            "key": figure_key, "shard_of": shard_of,
            "crops": lake.read_table("panel_crops", RELEASE, shard).to_pylist(), "shard": shard}  # fmt: skip


def _samples(lake: Lake, subset: str) -> list[dict]:
    import webdataset as wds

    tars = sorted(glob.glob(dataset_dir(lake, RELEASE, subset, "*.tar")))
    return list(wds.WebDataset(tars, shardshuffle=False).decode("pil")) if tars else []


def test_keys_trace_back_to_the_figure():
    assert pair_key("PMC1_F2_2", 3) == "PMC1_F2_2_p003"
    assert pair_key("PMC1_F2", 0, 1) == "PMC1_F2_p000_r01"
    assert "." not in pair_key("PMC1_fig-1a", 12, 5)


def test_plan_includes_and_excludes_by_the_figure_level_rules(built):
    lake, key = built["lake"], built["key"]
    rows = {r["key"]: r for r in lake.read_release("pair_samples", RELEASE).to_pylist()}
    a = key[A]
    included = {k: (r["level"], r["crop_source"]) for k, r in rows.items() if r["status"] == "included"}
    assert included == {
        f"{a}_p000": ("panel", "panel_crops"),
        f"{a}_p003": ("panel", "cut"),
        f"{a}_p000_r00": ("region", "cut"),
        f"{a}_p000_r01": ("region", "cut"),
        a: ("longcap", "figure"),
        key[E]: ("longcap", "figure"),
        key[C]: ("longcap", "figure"),
    }
    excluded = {k: (r["level"], r["reason"]) for k, r in rows.items() if r["status"] == "excluded"}
    assert excluded[f"{a}_p002"] == ("panel", "no_text")
    # a text the VLM associated is left out by default; so are crops the gate drops, whether reused
    # from panel_crops (the 40 px corner) or cut here (the axis strip)
    assert excluded[f"{a}_p001"] == ("panel", "vlm_text")
    assert excluded[f"{a}_p004"] == ("panel", "crop_gate") and rows[f"{a}_p004"]["detail"] == "text_or_lines_only"
    assert excluded[f"{a}_p090"] == ("panel", "crop_gate") and rows[f"{a}_p090"]["detail"] == "too_small"
    assert excluded[f"{a}_p000_r02"] == ("region", "bad_box")
    assert excluded[f"{key[B]}_p000"] == ("panel", "figure_excluded")
    assert rows[f"{key[B]}_p000"]["detail"] == "unknown_license"
    assert excluded[key[D]] == ("longcap", "long_caption_error") and rows[key[D]]["detail"] == "engine error"
    assert excluded["PMC900000010-nonexistent-jpg-p000"] == ("panel", "figure_not_planned")
    longcap_b = [r for r in rows.values() if r["level"] == "longcap" and r["figure_key"] == key[B]]
    assert [(r["status"], r["reason"]) for r in longcap_b] == [("excluded", "figure_excluded")]
    assert len(excluded) == 9  # the global pair is the figure level's own sample: not planned here
    for shard, result in built["plans"].items():  # every partition's plan is sorted for the merge
        table = lake.read_table("pair_samples", RELEASE, shard).to_pylist()
        assert [r["shuffle_key"] for r in table] == sorted(r["shuffle_key"] for r in table)
        assert result.ok == sum(r["status"] == "included" for r in table)
    counts = built["plans"][built["shard"]].counts
    assert counts["crops_panel_crops"] == 1
    assert (counts["panel_text_label"], counts["panel_text_order"], counts["panel_text_vlm"]) == (1, 1, 0)
    assert (counts["gate_too_small"], counts["gate_text_or_lines_only"], counts["excluded_vlm_text"]) == (1, 1, 1)
    assert counts["panel_texts_shipped"] == "label, order"


def test_the_plan_shows_its_pairs_with_their_texts(built):
    """The UI's contact sheets: the included panel and region samples (two each, read off the plan test
    above), marked synthetic as their rows are; a partition without pairs shows none."""
    import base64

    counts = built["plans"][built["shard"]].counts
    for level in ("panel", "region"):
        sheet = counts[f"{level}_samples_sheet"]
        title = f"{level} samples of {RELEASE}|{built['shard']}: 2 of 2 (SYNTHETIC: tiny random VLM)"
        prefix = f"![{title}](data:image/jpeg;base64,"
        assert sheet.startswith(prefix) and sheet.endswith(")")
        image = Image.open(io.BytesIO(base64.b64decode(sheet[len(prefix) : -1])))
        assert image.format == "JPEG" and image.width == 480
    other = next(s for s in built["plans"] if s not in (built["shard"], built["shard_of"][B[0]]))
    assert not any(k.endswith("_sheet") for k in built["plans"][other].counts)


def test_vlm_texts_ship_when_asked_for(built, tmp_path):
    from pipelines.release.pairs import plan_pair_shard
    from pipelines.text.pairing import CAPTION_MATCHES, VLM

    lake, a = built["lake"], built["key"][A]
    with lake.commit("pair_samples", RELEASE, built["shard"]) as commit:  # the crops it cuts go with its commit
        plan = plan_pair_shard(
            lake, RELEASE, built["shard"], lake.path("vlm_crops.tar"), (*CAPTION_MATCHES, VLM), commit=commit
        )
    rows = {r["key"]: r for r in plan.rows}
    assert rows[f"{a}_p001"]["status"] == "included" and rows[f"{a}_p001"]["crop_source"] == "cut"
    meta = json.loads(rows[f"{a}_p001"]["meta_json"])
    assert (meta["text_match"], meta["label_source"], meta["text_source"]) == ("vlm", "vlm", "vlm")
    assert plan.panel_matches == {"label": 1, "order": 1, "vlm": 1}
    assert plan.gate == {"too_small": 1, "text_or_lines_only": 1}


def test_plan_needs_pairs_or_long_captions(tmp_path):
    lake = sample_lake(tmp_path, RELEASE)
    shard = lake.shards()[0]
    with pytest.raises(StageInputError, match="dataset_samples"):
        PairPlanStage().run(lake, Partition(RELEASE, shard))
    SamplePlanStage().run(lake, Partition(RELEASE, shard))
    with pytest.raises(StageInputError, match="has no `pairs` table: materialize `pairs` first"):
        PairPlanStage().run(lake, Partition(RELEASE, shard))
    assert lake.read_table("pair_samples", RELEASE, shard) is None


def test_panel_subset_reuses_crops_and_cuts_the_rest_once(built):
    lake, a = built["lake"], built["key"][A]
    samples = {s["__key__"]: s for s in _samples(lake, "panel-commercial")}
    assert set(samples) == {f"{a}_p000", f"{a}_p003"}
    first, second = samples[f"{a}_p000"], samples[f"{a}_p003"]
    assert first["txt"] == "Confocal image of the cells." and second["txt"] == "Nuclear levels of the protein."
    assert (first["json"]["text_match"], first["json"]["count_agreement"], first["json"]["label_source"]) == (
        "label",
        "equal",
        "image",
    )
    assert (second["json"]["text_match"], second["json"]["label_source"]) == ("order", "")  # typed, never null
    meta = first["json"]
    assert meta["figure_key"] == a and meta["pair_id"] == f"{A[0]}/{A[1]}/p000" and meta["label"] == "A"
    assert meta["box"] == list(built["box0"]) and meta["text_source"] == "caption_split"
    assert meta["description"] == "a green fluorescent image" and meta["synthetic"] is True
    assert meta["model"] == "tiny-qwen" and meta["crop_source"] == "panel_crops"
    assert meta["license_group"] == "commercial" and meta["pmcid"] == A[0] and meta["title"]
    sample = next(r for r in lake.read_release("samples", RELEASE).to_pylist() if r["key"] == a)
    assert meta["fig_id"] == sample["fig_id"] != ""  # the figure's facts, not the pair row's (fig_id None there)
    assert second["json"]["description"] == "" and second["json"]["box"] == list(CUT_BOX)  # typed, never null
    # the reused crop is panel_crops' bytes, not re-encoded
    crop = next(c for c in built["crops"] if (c["pmcid"], c["image_file"], c["panel_index"]) == (*A, 0))
    tar = _raw_members(lake, "panel-commercial")
    assert hashlib.sha256(tar[f"{a}_p000.jpg"]).hexdigest() == crop["sha256"] == meta["sha256"]
    # the cut crop holds the raw image's pixels in the box (JPEG quality 95)
    raw = next(r for r in lake.read_release("raw_files", RELEASE).to_pylist() if (r["pmcid"], r["name"]) == A)
    expected = np.asarray(Image.open(io.BytesIO(read_raw_file(lake, raw))).convert("RGB").crop(CUT_BOX), dtype=float)
    got = np.asarray(second["jpg"].convert("RGB"), dtype=float)
    assert got.shape == expected.shape == (200, 200, 3) and np.abs(got - expected).mean() < 4
    assert Image.open(io.BytesIO(tar[f"{a}_p003.jpg"])).info.get("progressive") is None


def _raw_members(lake: Lake, subset: str) -> dict[str, bytes]:
    import tarfile

    out = {}
    for path in sorted(glob.glob(dataset_dir(lake, RELEASE, subset, "*.tar"))):
        with tarfile.open(path) as tar:
            out |= {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    return out


def test_region_subset_carries_descriptions_and_hard_negatives(built):
    lake, a = built["lake"], built["key"][A]
    samples = {s["__key__"]: s for s in _samples(lake, "region-commercial")}
    assert set(samples) == {f"{a}_p000_r00", f"{a}_p000_r01"}
    first, second = samples[f"{a}_p000_r00"], samples[f"{a}_p000_r01"]
    assert first["txt"] == "arrows mark the nuclei" and first["json"]["description"] == "bright round nuclei"
    assert first["neg.txt"] == (
        "Arrows mark the nuclei in the left panel of the image.\nArrows mark the nuclei in the right panel."
    )
    negatives = first["json"]["negatives"]
    assert [(n["index"], n["perturbation"], n["original_span"]) for n in negatives] == [
        (0, "laterality", "left"),
        (1, "location", ""),
    ]
    assert second["neg.txt"] == "" and second["json"]["negatives"] == []
    assert first["json"]["marker"] == "arrow" and first["json"]["region_index"] == 0
    assert first["json"]["box"] == list(REGION_BOXES[0]) and first["jpg"].size == (50, 40)
    assert second["jpg"].size == (100, 50) and first["json"]["figure_key"] == a


def test_longcap_subset_is_the_figure_with_its_long_caption(built):
    lake, key = built["lake"], built["key"]
    commercial = {s["__key__"]: s for s in _samples(lake, "longcap-commercial")}
    assert set(commercial) == {key[A], key[E]}
    assert commercial[key[A]]["txt"] == LONG and commercial[key[E]]["txt"] == "a cat"
    meta = commercial[key[A]]["json"]
    assert (meta["caption"], meta["status"], meta["verdict"]) == ("Cells.", "refined", "FEASIBLE")
    assert (meta["tokens_before"], meta["tokens_after"], meta["context_sources"]) == (20, 120, ["caption", "mentions"])
    assert commercial[key[E]]["json"]["reason"] == "guard: unsupported feature"
    # the same bytes as the figure-level sample
    figure_tar = _raw_members(lake, "commercial")
    assert _raw_members(lake, "longcap-commercial")[f"{key[A]}.jpg"] == figure_tar[f"{key[A]}.jpg"]
    assert [s["__key__"] for s in _samples(lake, "longcap-noncommercial")] == [key[C]]
    assert _samples(lake, "panel-noncommercial") == [] and _samples(lake, "longcap-other") == []


def test_subsets_are_shuffled_bounded_and_sidecared(built):
    import pyarrow.parquet as pq

    lake = built["lake"]
    counts = built["written"].counts
    assert (counts["panel-commercial_samples"], counts["region-commercial_samples"]) == (2, 2)
    assert (counts["longcap-commercial_samples"], counts["longcap-noncommercial_samples"]) == (2, 1)
    assert counts["shuffle_seed"] == 3
    folder = dataset_dir(lake, RELEASE, "longcap-commercial")
    keys = [s["__key__"] for s in _samples(lake, "longcap-commercial")]
    order = sorted(keys, key=lambda k: hashlib.blake2b(f"3:{k}".encode(), digest_size=8).digest())
    assert keys == order  # the figure level's keyed hash, with the release's seed
    sidecar = pq.read_table(f"{folder}/panelforge-000000.parquet").to_pylist()
    assert [r["key"] for r in sidecar] == keys[:2]
    assert {r["level"] for r in sidecar} == {"longcap"} and sidecar[0]["figure_key"] == sidecar[0]["key"]
    manifest = json.loads(open(f"{folder}/manifest.json").read())
    assert manifest["level"] == "longcap" and manifest["samples"] == 2 and manifest["limits"]["max_samples"] == 2
    regions = pq.read_table(dataset_dir(lake, RELEASE, "region-commercial", "panelforge-000000.parquet")).to_pylist()
    assert {r["pair_id"] for r in regions} == {f"{A[0]}/{A[1]}/p000/r00", f"{A[0]}/{A[1]}/p000/r01"}


def test_statistics_count_tokens_and_pairs_per_figure(built):
    lake = built["lake"]
    stats = json.loads(open(dataset_dir(lake, RELEASE, "stats", "pairs", "pairs.json")).read())["fields"]
    before, after = stats["longcap_tokens_before"]["value"], stats["longcap_tokens_after"]["value"]
    assert (before["count"], before["mean"], before["max"]) == (3, round((20 + 2 + 30) / 3, 2), 30)
    assert (after["count"], after["mean"], after["max"]) == (3, round((120 + 2 + 90) / 3, 2), 120)
    figures = sum(r["status"] == "included" for r in lake.read_release("samples", RELEASE).to_pylist())
    panel = stats["panel_pairs_per_figure"]["value"]
    assert (panel["count"], panel["max"], panel["mean"]) == (figures, 2, round(2 / figures, 2))
    assert stats["longcap_text"]["tokens"]["max"] == 120  # CLIP BPE of the hand-written long caption
    assert built["written"].counts["longcap_tokens_after_mean"] == after["mean"]


def test_card_has_a_section_per_level(built):
    from huggingface_hub import DatasetCard

    lake = built["lake"]
    text = open(dataset_dir(lake, "README.md")).read()
    for level, n in (("panel", 2), ("region", 2), ("longcap", 2)):
        assert f"### Level `{level}`" in text and f"| `{RELEASE}/{level}-commercial` | {n} |" in text
    assert "`negatives`" in text and "`.neg.txt`" in text and f"{built['key'][A]}_p000" in text  # an example
    assert "panel_pairs_per_figure" in text and "longcap_tokens_after" in text
    # the panel level says how texts were matched, that VLM texts are left out, and what was dropped
    assert "Shipped panel samples by match: `label` 1, `order` 1." in text
    assert "This release leaves them out (the default;" in text
    assert (
        "Panel samples left out, by reason: a crop the release gate drops (2); a figure that is not released (1);"
        in text
    )
    assert "a text the VLM associated (`vlm`) (1)" in text
    assert "Release gate: text or lines only 1, too small 1." in text
    assert "a side under 64 px or an area under 8,192 px" in text
    data = DatasetCard(text).data.to_dict()
    names = {c["config_name"] for c in data["configs"]}
    assert {f"{RELEASE}-region-commercial", f"{RELEASE}-longcap-noncommercial"} <= names
    assert f"{RELEASE}-panel-other" not in names  # empty subsets are left out
    region = next(f for f in data["dataset_info"] if f["config_name"] == f"{RELEASE}-region-commercial")
    assert {"name": "neg.txt", "dtype": "string"} in region["features"]
    # figure-level counts are unchanged by the pair levels
    assert f"| `{RELEASE}/commercial` |" in text and data["size_categories"] == ["n<1K"]


def test_hugging_face_datasets_reads_every_level(built, tmp_path):
    import datasets

    lake, a = built["lake"], built["key"][A]
    cache = str(tmp_path / "hf")
    for subset, n in (("panel-commercial", 2), ("region-commercial", 2), ("longcap-commercial", 2)):
        tars = sorted(glob.glob(dataset_dir(lake, RELEASE, subset, "*.tar")))
        loaded = datasets.load_dataset("webdataset", data_files={"train": tars}, split="train", cache_dir=cache)
        assert len(loaded) == n and all(row["jpg"].size[0] > 0 for row in loaded)
    by_card = datasets.load_dataset(dataset_dir(lake), f"{RELEASE}-region-commercial", split="train", cache_dir=cache)
    rows = {r["__key__"]: r for r in by_card}
    assert rows[f"{a}_p000_r00"]["json"]["negatives"][0]["perturbation"] == "laterality"
    assert rows[f"{a}_p000_r01"]["neg.txt"] == "" and rows[f"{a}_p000_r01"]["json"]["negatives"] == []


def test_openclip_reads_long_captions_with_a_512_token_context(built, tmp_path):
    import open_clip
    import torch
    from open_clip_train.data import get_wds_dataset

    lake, key = built["lake"], built["key"]
    model_dir = tmp_path / "tiny"
    model_dir.mkdir()
    tiny = TINY_CLIP["model_cfg"]  # with a 512-token text tower
    config = {"model_cfg": {**tiny, "text_cfg": {**tiny["text_cfg"], "context_length": 512}}, "preprocess_cfg": {}}
    (model_dir / "open_clip_config.json").write_text(json.dumps(config))
    model, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{model_dir}")
    tokenizer = open_clip.get_tokenizer(f"local-dir:{model_dir}")
    folder = dataset_dir(lake, RELEASE, "longcap-commercial")
    sizes = json.loads(open(f"{folder}/sizes.json").read())
    args = Namespace(
        train_data=f"{folder}/panelforge-{{000000..{len(sizes) - 1:06d}}}.tar", val_data=None,
        train_num_samples=None, dataset_resampled=False, train_data_upsampling_factors=None, seed=0, workers=0,
        world_size=1, batch_size=1,
    )  # fmt: skip
    info = get_wds_dataset(args, preprocess, is_train=True, tokenizer=tokenizer)
    assert info.dataloader.num_samples == sum(sizes.values()) == 2
    lengths = []
    for images, texts in info.dataloader:
        assert tuple(images.shape) == (1, 3, 64, 64) and tuple(texts.shape) == (1, 512)
        lengths.append(int((texts[0] != 0).sum()))
        with torch.no_grad():
            assert tuple(model.encode_text(texts).shape) == (1, 32)
    # start + 120 tokens + end: the long caption is whole, where a 77-token context would cut it
    assert sorted(lengths) == [4, 122]
    assert key[A] in [s["__key__"] for s in _samples(lake, "longcap-commercial")]


def test_pair_assets_through_dagster(built, tmp_path):
    from dagster import DagsterInstance, MultiPartitionKey

    from assets.release import pair_samples, webdataset_pairs
    from resources.lake import LakeResource
    from tests.helpers import materialize_one, open_test_release

    lake = built["lake"]
    (tmp_path / "home").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "home"))
    open_test_release(instance, RELEASE)
    resources = {"lake": LakeResource(home=str(lake.root))}
    key = MultiPartitionKey({"release": RELEASE, "shard": built["shard"]})
    planned = materialize_one(pair_samples, key, instance, resources)
    written = materialize_one(webdataset_pairs, RELEASE, instance, resources, {"max_samples_per_shard": 2})
    meta = {}
    for result in (planned, written):
        (event,) = result.get_asset_materialization_events()
        meta |= {k: v.value for k, v in event.materialization.metadata.items()}
    assert (meta["panel_samples"], meta["region_samples"], meta["excluded_bad_box"]) == (2, 2, 1)
    assert meta["panel-commercial_samples"] == 2 and meta["longcap-noncommercial_samples"] == 1
    # nothing changed: the four non-empty subsets (panel, region, longcap commercial; longcap noncommercial) keep
    # their one shard each
    assert meta["shards_reused_from_earlier_run"] == 4


def test_a_reused_crop_whose_bytes_are_not_the_indexed_ones_is_cut_again(built, tmp_path):
    """What the old panel_crops left after a kill between its tar and its index (issue 23 §2):
    index rows whose sha256 does not match the bytes they point at. The plan reads a crop before
    it reuses one, so such a panel is cut again from the raw image instead of shipping other bytes."""
    import shutil

    lake = Lake(shutil.copytree(built["lake"].root, tmp_path / "lake"))
    shard, a = built["shard"], built["key"][A]
    crop = next(c for c in built["crops"] if (c["pmcid"], c["image_file"], c["panel_index"]) == (*A, 0))
    with open(lake.path(crop["tar_path"]), "r+b") as fh:  # other bytes where the index points
        fh.seek(crop["offset"] + 100)
        fh.write(b"\xff" * 8)
    PairPlanStage().run(lake, Partition(RELEASE, shard))
    row = next(r for r in lake.read_table("pair_samples", RELEASE, shard).to_pylist() if r["key"] == f"{a}_p000")
    # cut again: the same JPEG panel_crops once made (the encoder is deterministic), in the plan's own tar
    assert row["status"] == "included" and row["crop_source"] == "cut" and row["image_sha256"] == crop["sha256"]
    assert row["image_tar"] != crop["tar_path"]
    with open(lake.path(row["image_tar"]), "rb") as fh:
        fh.seek(row["image_offset"])
        assert hashlib.sha256(fh.read(row["image_size"])).hexdigest() == row["image_sha256"]


# --- what the release says about itself -------------------------------------------------------

# Read off the hand-made rows: panel and region pairs exist only for figure A (commercial; B's figure is
# excluded), long captions are included for A and E (commercial) and C (noncommercial).
SKIPPED = {
    "panel-noncommercial": "no included panel pair in license group 'noncommercial'",
    "panel-other": "no included panel pair in license group 'other'",
    "region-noncommercial": "no included region pair in license group 'noncommercial'",
    "region-other": "no included region pair in license group 'other'",
    "longcap-other": "no included long caption in license group 'other'",
}


def test_no_empty_subset_is_written_and_the_card_says_why(built):
    import os

    lake = built["lake"]
    info = json.loads(open(dataset_dir(lake, RELEASE, "release.json")).read())
    for subset, reason in SKIPPED.items():
        assert not os.path.exists(dataset_dir(lake, RELEASE, subset)), subset
        assert info["skipped_subsets"][subset] == {"reason": reason, "level": subset.split("-")[0], "mixture": None}
    for subset in ("panel-commercial", "region-commercial", "longcap-commercial", "longcap-noncommercial"):
        assert subset not in info["skipped_subsets"] and os.path.exists(dataset_dir(lake, RELEASE, subset))
    for sizes in glob.glob(dataset_dir(lake, RELEASE, "*", "sizes.json")):  # every folder written holds samples
        assert sum(json.loads(open(sizes).read()).values()) > 0, sizes
    assert built["written"].counts["subsets_skipped"] == SKIPPED
    text = open(dataset_dir(lake, "README.md")).read()
    assert f"`{RELEASE}/panel-other` (no included panel pair in license group 'other')" in text
    assert "empty" not in open(dataset_dir(lake, "LICENSES.md")).read()


def test_a_subset_that_loses_its_samples_is_removed(built):
    import os

    from pipelines.release.webdataset import missing_subsets, shuffled_samples, skipped_path, write_subset

    lake = built["lake"]
    folder = dataset_dir(lake, RELEASE, "scratch")
    first = next(shuffled_samples(lake, RELEASE))
    assert write_subset(lake, RELEASE, "scratch", [first]).samples == 1 and os.path.exists(f"{folder}/sizes.json")
    assert not os.path.exists(skipped_path(lake, RELEASE, "scratch"))
    result = write_subset(lake, RELEASE, "scratch", [], empty_reason="nothing left")
    assert (result.samples, result.skipped) == (0, "nothing left") and not os.path.exists(folder)
    assert json.loads(open(skipped_path(lake, RELEASE, "scratch")).read())["reason"] == "nothing left"
    # what a training job that wants these subsets is told
    assert missing_subsets(lake, RELEASE, ["scratch", "panel-commercial", "never"]) == [
        "scratch: no sample (nothing left)",
        "never: not written yet (materialize its shards)",
    ]
    os.remove(skipped_path(lake, RELEASE, "scratch"))


def test_pair_sidecars_carry_boxes_texts_and_sources(built):
    import pyarrow.parquet as pq

    lake, a = built["lake"], built["key"][A]

    def sidecar(subset: str) -> dict[str, dict]:
        paths = sorted(glob.glob(dataset_dir(lake, RELEASE, subset, "*.parquet")))
        return {r["key"]: r for p in paths for r in pq.read_table(p).to_pylist()}

    regions = sidecar("region-commercial")
    box = lambda r: (r["x1"], r["y1"], r["x2"], r["y2"])  # noqa: E731
    first, second = regions[f"{a}_p000_r00"], regions[f"{a}_p000_r01"]
    assert box(first) == REGION_BOXES[0] and box(second) == REGION_BOXES[1]
    assert (first["text"], first["text_source"], first["description"]) == (
        "arrows mark the nuclei",
        "caption",
        "bright round nuclei",
    )
    assert (second["text"], second["description"], second["synthetic"]) == ("asterisks mark the vessels", "", True)
    panels = sidecar("panel-commercial")
    assert box(panels[f"{a}_p000"]) == built["box0"] and box(panels[f"{a}_p003"]) == CUT_BOX
    assert (panels[f"{a}_p003"]["text"], panels[f"{a}_p003"]["text_source"]) == (
        "Nuclear levels of the protein.",
        "caption_split",
    )
    longcap = sidecar("longcap-commercial")[a]
    assert box(longcap) == (None, None, None, None) and longcap["text"] == LONG and longcap["text_source"] is None


def test_release_parquet_holds_what_the_pair_levels_were_made_from(built):
    import pyarrow.parquet as pq

    lake = built["lake"]
    tables = json.loads(open(dataset_dir(lake, RELEASE, "parquet", "tables.json")).read())
    # pairs: the 11 rows of PMC900000010 (global, six panels, three regions, the missing image); B's row is
    # withheld with its unlicensed article. Long captions: A, E, D and C; B's withheld. Negatives: 2.
    assert (tables["pairs"]["rows"], tables["long_captions"]["rows"], tables["negatives"]["rows"]) == (11, 4, 2)
    licensed = {r["pmcid"] for r in lake.read_release("articles", RELEASE).to_pylist() if r["license_code"]}
    panels = [p for p in lake.read_release("panels", RELEASE).to_pylist() if p["pmcid"] in licensed]
    assert tables["panels"]["rows"] == len(panels) > 0
    assert "labels" not in tables and "pubmed" not in tables  # the sample lake has neither: nothing written empty
    read = pq.read_table(dataset_dir(lake, RELEASE, "parquet", "long_captions")).to_pylist()
    assert {r["image_file"]: r["model"] for r in read}[A[1]] == "local:tiny-qwen2_5_vl-seed0"
    assert {
        (r["level"], r["text_source"])
        for r in pq.read_table(dataset_dir(lake, RELEASE, "parquet", "pairs")).to_pylist()
    } >= {("panel", "vlm"), ("panel", "none"), ("region", "caption")}  # what the subsets left out too
    assert built["tables"].counts["negatives_rows"] == 2


def test_no_machine_path_anywhere_in_the_release(built):
    from pipelines.release.audit import find_machine_paths
    from pipelines.release.stages import NO_MACHINE_PATHS

    lake, a = built["lake"], built["key"][A]
    assert find_machine_paths(dataset_dir(lake)) == []  # every file, every member, every column
    (check,) = [c for c in built["card"].checks if c.name == NO_MACHINE_PATHS]
    assert check.passed and check.metadata == {"found": 0}
    commercial = {s["__key__"]: s for s in _samples(lake, "longcap-commercial")}
    assert commercial[a]["json"]["model"] == "local:tiny-qwen2_5_vl-seed0"  # the lake row held MODEL_PATH


def test_the_card_and_every_plot_say_what_is_synthetic(built):
    lake = built["lake"]
    text = open(dataset_dir(lake, "README.md")).read()
    assert "**Test build: synthetic parts.**" in text
    assert (
        "**Panel pairs** (2 of 2 samples) were mined by a tiny random Qwen2.5-VL: the `description` of 1 of 2 "
        "are random strings; texts taken from the caption are real." in text
    )
    assert (
        "**Region pairs** (2 of 2 samples) were mined by a tiny random Qwen2.5-VL: the `description` of 1 of 2 "
        "are random strings" in text
    )
    assert (
        "**Long captions** (3 of 3) were written by a tiny random Qwen2.5-VL; 1 of 3 are the original caption "
        "unchanged" in text
    )
    assert "and 2 are the model's" in text
    assert "Concept labels" not in text and "Panel boxes" not in text  # no labels, no detector in this lake
    expected = ["panel descriptions", "region descriptions", "long captions"]
    for summary in ("stats/stats.json", "stats/pairs/pairs.json"):
        assert json.loads(open(dataset_dir(lake, RELEASE, summary)).read())["synthetic"] == expected
    pngs = glob.glob(dataset_dir(lake, RELEASE, "stats", "*.png")) + glob.glob(
        dataset_dir(lake, RELEASE, "stats", "pairs", "*.png")
    )
    assert len(pngs) > 5
    for png in pngs:  # the footer's red text (#c0392b) in the bottom tenth of every plot
        pixels = np.asarray(Image.open(png).convert("RGB"), dtype=int)
        bottom = pixels[-pixels.shape[0] // 10 :]
        red = (bottom[..., 0] > 150) & (bottom[..., 1] < 110) & (bottom[..., 2] < 100)
        assert red.sum() > 30, png
