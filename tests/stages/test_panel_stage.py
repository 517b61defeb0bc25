"""The panels stage on the sample release: selection, methods, provenance, captions, carry-over, crops."""

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipelines.core.panel_methods import CONSENSUS, DECISION, DETR, XYCUT
from pipelines.core.rawstore import read_raw_file
from pipelines.core.stage import Partition
from pipelines.images.boxes import Panel
from pipelines.panels.detector import DetectorConfig
from pipelines.panels.evaluate import match_at_iou, recall_precision
from pipelines.panels.stages import PanelCropsStage, PanelSettings, PanelStage, choose, needs_detector
from pipelines.text.pairing import count_agreement
from testing.pipeline import sample_lake
from tests.helpers import SHARDS
from tests.unit.test_parse import FOLDER_TO_PMCID

RELEASE = "2026"
TINY = DetectorConfig(synthetic=True, threshold=0.0)  # a random model: every query above 0 is a panel
BOXES = Path(__file__).resolve().parents[2] / "sample" / "panels" / "boxes.json"


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    return sample_lake(tmp_path_factory.mktemp("panels"), RELEASE)


def _rows(lake, table, release=RELEASE):
    return lake.read_release(table, release).to_pylist()


def test_the_detector_sees_only_figures_that_may_be_compound():
    assert not needs_detector("single panel", 4, 3)  # the concept label wins
    assert needs_detector("multiple panels with biomedical imaging and plots", 1, 0)
    assert needs_detector(None, 2, 0) and needs_detector(None, 1, 2)
    assert not needs_detector(None, 1, 1)


def test_choosing_between_the_methods():
    a = [Panel((0, 0, 100, 100)), Panel((110, 0, 200, 100))]
    same = [Panel((2, 0, 100, 100)), Panel((110, 0, 198, 100))]
    other = [Panel((0, 0, 200, 50))]
    settings = PanelSettings(detector=TINY, prefer=DETR)
    assert choose(a, None, settings) == (DECISION, a, None)  # no detector: the figure decision's panels
    method, panels, agreement = choose(a, same, settings)
    assert method == CONSENSUS and len(panels) == 2 and agreement > 0.95
    method, panels, agreement = choose(a, other, settings)
    assert (method, panels) == (DETR, other) and agreement < 0.7
    assert choose(a, other, PanelSettings(detector=TINY, prefer=DECISION))[:2] == (DECISION, a)
    assert choose(a, [], settings)[:2] == (DECISION, a)  # the detector found nothing: the decision's panels stay
    assert choose([], [], settings)[:2] == (DETR, [])


def test_layout_only_run_on_the_sample(lake):
    results = {s: PanelStage(PanelSettings()).run(lake, Partition(RELEASE, s)) for s in SHARDS}
    figures = _rows(lake, "panel_figures")
    embedded = lake.read_release("embeddings", RELEASE).num_rows if lake.releases("embeddings") else None
    images = sum(len(f["image_files"] or []) for f in _rows(lake, "figures"))
    assert len(figures) == images == 128 and embedded in (None, 128)  # every resolved figure image, once
    assert sum(r.ok + r.error for r in results.values()) == 128
    assert {f["method"] for f in figures if f["n_panels"]} == {DECISION} and not any(f["n_detr"] for f in figures)
    panels = _rows(lake, "panels")
    size = {(f["pmcid"], f["image_file"]): (f["width"], f["height"]) for f in figures}
    for p in panels:
        width, height = size[(p["pmcid"], p["image_file"])]
        assert 0 <= p["x1"] < p["x2"] <= width and 0 <= p["y1"] < p["y2"] <= height
    for result in results.values():
        assert {c.name: c.passed for c in result.checks}["panel_boxes_inside_image"]
    # one caption row per panel, joined by label or order, the preface kept apart; the figure's
    # count agreement on every row; an order match only where panels and caption labels agree
    captions = _rows(lake, "panel_captions")
    assert len(captions) == len(panels)
    assert {c["match"] for c in captions} <= {"label", "order", "none"}
    by_image = {(f["pmcid"], f["image_file"]): f for f in figures}
    for c in captions:
        figure = by_image[(c["pmcid"], c["image_file"])]
        assert c["caption_labels"] == figure["caption_labels"]
        assert c["count_agreement"] == count_agreement(figure["n_panels"], figure["caption_labels"])
        assert c["match"] != "order" or c["count_agreement"] == "equal"
        assert (c["text"] is None) == (c["match"] == "none") and c["match_detail"]
    counts = {k: sum(r.counts[k] for r in results.values()) for k in ("match_label", "match_order", "match_none")}
    assert sum(counts.values()) == len(captions)
    assert counts["match_label"] <= sum(1 for p in panels if p["label"])  # a label match needs a printed label


def _counting_decisions(monkeypatch) -> list[str]:
    """The captions of every figure decision the panels stage makes from now on."""
    from pipelines.panels import stages

    made: list[str] = []
    real = stages.figure_decision

    def counted(data, caption=None, **kwargs):
        made.append(caption)
        return real(data, caption, **kwargs)

    monkeypatch.setattr(stages, "figure_decision", counted)
    return made


def test_a_rerun_reuses_every_figure_from_the_partition_and_from_the_previous_release(tmp_path, monkeypatch):
    """The one reuse rule of the model-stage loop: the partition's own rows (a rerun), then the
    previous release's; nothing is decided again, and the tables come out the same."""
    copy = sample_lake(tmp_path, RELEASE)  # no panels yet
    shard = SHARDS[1]
    first = PanelStage(PanelSettings()).run(copy, Partition(RELEASE, shard))
    written = {t: copy.read_table(t, RELEASE, shard).to_pylist() for t in ("panel_figures", "panels", "panel_captions")}
    images = sum(len(f["image_files"] or []) for f in copy.read_table("figures", RELEASE, shard).to_pylist())
    assert len(written["panel_figures"]) == images and first.ok == images and first.counts["carried"] == 0
    made = _counting_decisions(monkeypatch)
    again = PanelStage(PanelSettings()).run(copy, Partition(RELEASE, shard))
    assert made == [] and again.counts["carried"] == again.skipped == images and again.ok == 0
    assert {t: copy.read_table(t, RELEASE, shard).to_pylist() for t in written} == written
    assert again.version == first.version  # the same rows: downstream does not go stale
    # the next release, with no panels of its own yet: every image carried from this one
    _next_release(copy, shard)
    following = PanelStage(PanelSettings()).run(copy, Partition("2027", shard))
    assert made == [] and following.skipped == images and following.ok == 0
    assert {t: copy.read_table(t, "2027", shard).to_pylist() for t in written} == written
    # other settings are not carried: every image is decided again
    PanelStage(PanelSettings(consensus_min=0.69)).run(copy, Partition("2027", shard))
    assert len(made) == images


def _next_release(lake, shard: str, release: str = "2027", edit=None, tables=("figures", "raw_files")) -> None:
    """The next release of ``shard``: this release's ``tables`` (figures, each passed to ``edit``,
    and raw files)."""
    import os
    import shutil

    for table in tables:
        dst = lake.table_path(table, release, shard)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(lake.table_path(table, RELEASE, shard), dst)
    if edit is not None:
        figures = lake.read_table("figures", release, shard).to_pylist()
        lake.write_table("figures", release, shard, [edit(f) for f in figures])


def test_a_figure_whose_caption_changed_is_decided_again(tmp_path, monkeypatch):
    """The decision reads the caption (its label set says how many panels to expect; the panels'
    texts are cut from it), so the reuse key holds it: in the next release, the one figure whose
    caption was rewritten is decided again, with its new caption, and every other image is carried."""
    copy = sample_lake(tmp_path, RELEASE)
    shard = SHARDS[1]
    PanelStage(PanelSettings()).run(copy, Partition(RELEASE, shard))
    figures = copy.read_table("figures", RELEASE, shard).to_pylist()
    target = next(f for f in figures if f["image_files"])
    new_text = "(A) The same image. (B) A caption rewritten for the next release."

    def edit(figure):
        same = (figure["pmcid"], figure["fig_id"]) == (target["pmcid"], target["fig_id"])
        return {**figure, "caption_text": new_text} if same else figure

    _next_release(copy, shard, edit=edit)
    made = _counting_decisions(monkeypatch)
    following = PanelStage(PanelSettings()).run(copy, Partition("2027", shard))
    images = sum(len(f["image_files"] or []) for f in figures)
    assert len(made) == len(target["image_files"]) and all(c.endswith(new_text) for c in made)
    assert following.counts["carried"] == images - len(target["image_files"])
    rows = [
        f
        for f in copy.read_table("panel_figures", "2027", shard).to_pylist()
        if (f["pmcid"], f["fig_id"]) == (target["pmcid"], target["fig_id"])
    ]
    assert [f["caption_labels"] for f in rows] == [2] * len(target["image_files"])  # (A) and (B): the new caption


def test_an_error_row_is_tried_again_on_the_next_run(tmp_path, monkeypatch):
    """Like every model stage's errors, a figure the panels stage could not split is not carried:
    the rerun decides it again (here the first run's decoder refused one image)."""
    from pipelines.panels import stages
    from pipelines.panels.inputs import FigureSplit

    copy = sample_lake(tmp_path, RELEASE)
    shard = SHARDS[1]
    real, refused = stages.figure_decision, []

    def refuse_first(data, caption=None, **kwargs):
        if not refused:
            refused.append(caption)
            return FigureSplit(reason="unreadable image: refused once by the test")
        return real(data, caption, **kwargs)

    monkeypatch.setattr(stages, "figure_decision", refuse_first)
    first = PanelStage(PanelSettings()).run(copy, Partition(RELEASE, shard))
    assert first.error == 1 and first.errors[0][1] == "unreadable image: refused once by the test"
    monkeypatch.setattr(stages, "figure_decision", real)
    made = _counting_decisions(monkeypatch)
    again = PanelStage(PanelSettings()).run(copy, Partition(RELEASE, shard))
    images = len(copy.read_table("panel_figures", RELEASE, shard))
    assert made == refused and again.error == 0 and again.ok == 1 and again.counts["carried"] == images - 1
    assert "error" not in {f["status"] for f in copy.read_table("panel_figures", RELEASE, shard).to_pylist()}


def test_a_rerun_that_fails_the_same_image_again_is_not_a_systematic_failure(tmp_path, monkeypatch):
    """An image that fails on every run is tried again on every rerun, while the rest is carried:
    the error rate counts the carried figures among the tried ones (1 failed of every image, not
    1 of 1), so one bad image does not block what reads the partition."""
    from pipelines.panels import stages
    from pipelines.panels.inputs import FigureSplit

    copy = sample_lake(tmp_path, RELEASE)
    shard = SHARDS[1]
    real, bad = stages.figure_decision, []

    def refuse_one(data, caption=None, **kwargs):
        if not bad or bad[0] == data:
            bad[:1] = [data]
            return FigureSplit(reason="unreadable image: this one always fails")
        return real(data, caption, **kwargs)

    monkeypatch.setattr(stages, "figure_decision", refuse_one)
    first = PanelStage(PanelSettings()).run(copy, Partition(RELEASE, shard))
    again = PanelStage(PanelSettings()).run(copy, Partition(RELEASE, shard))
    images = len(copy.read_table("panel_figures", RELEASE, shard))
    assert (first.error, again.error, again.ok, again.counts["carried"]) == (1, 1, 0, images - 1)
    assert again.error_rate == pytest.approx(first.error_rate) == pytest.approx(1 / images)


def test_an_image_in_two_figures_is_carried_under_each_name(tmp_path):
    """Reuse is by the image's bytes: where two figures hold the same bytes, each keeps its own
    names (pmcid, figure, file) when carried (it took the other's before: one image twice, the
    other missing)."""
    copy = sample_lake(tmp_path, RELEASE)
    shard = SHARDS[1]
    files = copy.read_table("raw_files", RELEASE, shard).to_pylist()
    figures = copy.read_table("figures", RELEASE, shard).to_pylist()
    a, b = [f for f in figures if f["image_files"]][:2]
    where = {(f["pmcid"], f["name"]): f for f in files}
    source = where[(a["pmcid"], a["image_files"][0])]
    for f in files:  # b's first image now has a's bytes
        if (f["pmcid"], f["name"]) == (b["pmcid"], b["image_files"][0]):
            f.update({k: source[k] for k in ("tar_path", "offset", "size", "sha256")})
    copy.write_table("raw_files", RELEASE, shard, files)
    PanelStage(PanelSettings()).run(copy, Partition(RELEASE, shard))
    tables = ("panel_figures", "panels", "panel_captions")
    first = {t: copy.read_table(t, RELEASE, shard).to_pylist() for t in tables}
    names = [(f["pmcid"], f["fig_id"], f["image_file"]) for f in first["panel_figures"]]
    assert (b["pmcid"], b["fig_id"], b["image_files"][0]) in names and len(set(names)) == len(names)
    again = PanelStage(PanelSettings()).run(copy, Partition(RELEASE, shard))
    assert again.skipped == len(names) and again.ok == 0
    rerun = {t: copy.read_table(t, RELEASE, shard).to_pylist() for t in tables}
    assert [(f["pmcid"], f["fig_id"], f["image_file"]) for f in rerun["panel_figures"]] == names
    for table in ("panels", "panel_captions"):
        assert {(p["pmcid"], p["fig_id"], p["image_file"]) for p in rerun[table]} == {
            (p["pmcid"], p["fig_id"], p["image_file"]) for p in first[table]
        }


def test_the_hand_boxed_sample_figures(lake):
    """The 10 sample figures boxed by hand (sample/panels): the stage's panels reach the figure
    decision's measured recall/precision on them (the layout splitter alone: 0.80 / 0.50)."""
    truth = {}
    for figure in json.load(open(BOXES))["figures"]:
        if figure["file"].startswith("sample/articles/"):
            _, _, folder, name = figure["file"].split("/")
            truth[(FOLDER_TO_PMCID[folder], name)] = [tuple(p["box"]) for p in figure["panels"]]
    found: dict[tuple, list] = {}
    for p in _rows(lake, "panels"):
        found.setdefault((p["pmcid"], p["image_file"]), []).append((p["x1"], p["y1"], p["x2"], p["y2"]))
    # pone.0056489.g002 resolves to its TIFF rendition now (the boxes were drawn on the PNG_M)
    results = [match_at_iou(found.get(key, []), boxes) for key, boxes in truth.items() if key in found]
    assert len(results) == 9
    scores = recall_precision(results)
    # measured with the figure decision: 26 of 28 panels, no extra box (0.929 / 1.0)
    assert scores["recall"] >= 0.9 and scores["precision"] >= 0.95


def test_crops_are_the_panels_pixels(lake):
    shard = SHARDS[0]
    PanelStage(PanelSettings()).run(lake, Partition(RELEASE, shard))
    result = PanelCropsStage().run(lake, Partition(RELEASE, shard))
    crops = lake.read_table("panel_crops", RELEASE, shard).to_pylist()
    panels = lake.read_table("panels", RELEASE, shard).to_pylist()
    assert len(crops) == len(panels) == result.ok > 0
    files = {(f["pmcid"], f["name"]): f for f in lake.read_table("raw_files", RELEASE, shard).to_pylist()}
    crop = max(crops, key=lambda c: c["width"] * c["height"])
    panel = next(
        p
        for p in panels
        if (p["pmcid"], p["image_file"], p["panel_index"]) == (crop["pmcid"], crop["image_file"], crop["panel_index"])
    )
    image = Image.open(io.BytesIO(read_raw_file(lake, files[(crop["pmcid"], crop["image_file"])]))).convert("RGB")
    expected = np.asarray(image.crop((panel["x1"], panel["y1"], panel["x2"], panel["y2"])), dtype=float)
    got = np.asarray(Image.open(io.BytesIO(read_raw_file(lake, crop))).convert("RGB"), dtype=float)
    assert got.shape == expected.shape == (crop["height"], crop["width"], 3)
    assert np.abs(got - expected).mean() < 4  # JPEG quality 95
    # the UI shows the first crops with the gate's verdict, as a Markdown image
    sheet = result.counts["crops_sheet"]
    shown = min(12, len(crops))
    assert sheet.startswith(f"![panel crops of {RELEASE}|{shard}: {shown} of {len(crops)}, with the gate's verdict]")


def test_a_crops_tar_and_its_index_are_published_together(lake, tmp_path, monkeypatch):
    """Issue 23 §2: the tar was replaced, then the index written; killed in between, every index
    row pointed at other bytes. Now a kill before the index leaves the old tar and the old index,
    whose sha256 still match the bytes they point at."""
    import hashlib
    import shutil

    from pipelines.core import lake as lake_module
    from pipelines.core.lake import Lake

    copy = Lake(shutil.copytree(lake.root, tmp_path / "lake"))
    shard = SHARDS[2]
    PanelStage(PanelSettings()).run(copy, Partition(RELEASE, shard))
    PanelCropsStage().run(copy, Partition(RELEASE, shard))
    before = copy.read_table("panel_crops", RELEASE, shard).to_pylist()
    # the panels change (one fewer per figure), then panel_crops dies after its tar, before its index
    panels = copy.read_table("panels", RELEASE, shard).to_pylist()
    copy.write_table("panels", RELEASE, shard, [p for p in panels if p["panel_index"] > 0])
    real = lake_module.Commit.write_table

    def killed(self, table, data, *args, **kwargs):
        raise KeyboardInterrupt("killed after the tar, before the index")

    monkeypatch.setattr(lake_module.Commit, "write_table", killed)
    with pytest.raises(KeyboardInterrupt):
        PanelCropsStage().run(copy, Partition(RELEASE, shard))
    monkeypatch.setattr(lake_module.Commit, "write_table", real)
    after = copy.read_table("panel_crops", RELEASE, shard).to_pylist()
    assert after == before
    for crop in after:
        assert hashlib.sha256(read_raw_file(copy, crop)).hexdigest() == crop["sha256"]


@pytest.fixture(scope="module")
def paneled(tmp_path_factory):
    """A sample lake whose first shard has its panels (40 panels of 15 images) and no crops yet."""
    lake = sample_lake(tmp_path_factory.mktemp("paneled"), RELEASE)
    PanelStage(PanelSettings()).run(lake, Partition(RELEASE, SHARDS[0]))
    return lake


def _lake_copy(lake, tmp_path):
    import shutil

    from pipelines.core.lake import Lake

    return Lake(shutil.copytree(lake.root, tmp_path / "lake"))


def _counting_cuts(monkeypatch) -> dict[str, list]:
    """Every image the crops stage decodes (its bytes' sha256) and every box it cuts, from now on."""
    import hashlib

    from pipelines.panels import crops

    seen: dict[str, list] = {"decoded": [], "cut": []}
    decode, cut = crops.decode_image, crops.crop_panel

    def decoded(data, *args, **kwargs):
        seen["decoded"].append(hashlib.sha256(data).hexdigest())
        return decode(data, *args, **kwargs)

    def counted(image, box):
        seen["cut"].append(tuple(box))
        return cut(image, box)

    monkeypatch.setattr(crops, "decode_image", decoded)
    monkeypatch.setattr(crops, "crop_panel", counted)
    return seen


def _crops(lake, release: str, shard: str) -> tuple[list[dict], bytes]:
    """The ``panel_crops`` rows of a partition and its tar's bytes."""
    from pipelines.panels.crops import crops_tar

    with open(crops_tar(lake, release, shard), "rb") as fh:
        return lake.read_table("panel_crops", release, shard).to_pylist(), fh.read()


def _cut_afresh(lake, release: str, shard: str, tmp_path) -> tuple[list[dict], bytes]:
    """What cutting every crop of the partition again (nothing reused) writes: rows and tar bytes."""
    import tarfile

    import pyarrow as pa

    from pipelines.core.rawstore import RawReader
    from pipelines.core.schemas import PANEL_CROPS
    from pipelines.images.gate import GateSettings
    from pipelines.panels.crops import crops_tar, cut_crops

    panels = lake.read_table("panels", release, shard).to_pylist()
    files = lake.read_table("raw_files", release, shard).to_pylist()
    path = tmp_path / "afresh.tar"
    relative = lake.relative(crops_tar(lake, release, shard))
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar, RawReader(lake) as reader:
        cut = cut_crops(panels, files, tar, reader, relative, GateSettings())
    rows = pa.Table.from_pylist(cut.rows, schema=PANEL_CROPS).to_pylist()  # as stored: float32 measures
    return rows, path.read_bytes()


def _by_image(panels: list[dict]) -> dict[tuple[str, str], list[dict]]:
    found: dict[tuple[str, str], list[dict]] = {}
    for p in panels:
        found.setdefault((p["pmcid"], p["image_file"]), []).append(p)
    return found


def test_a_rerun_of_panel_crops_cuts_nothing_and_writes_the_same_bytes(paneled, tmp_path, monkeypatch):
    """The one reuse rule: a rerun carries every crop from the partition's own rows (no image read,
    no crop cut) and writes the same rows and the same tar, byte for byte; the next release with the
    same figures carries every crop from this one, its bytes copied into its own tar."""
    from pipelines.images.gate import GateSettings

    copy, shard = _lake_copy(paneled, tmp_path), SHARDS[0]
    panels = copy.read_table("panels", RELEASE, shard).to_pylist()
    first = PanelCropsStage().run(copy, Partition(RELEASE, shard))
    assert first.ok == len(panels) == 40 and first.skipped == first.counts["carried"] == 0
    rows, tar = _crops(copy, RELEASE, shard)
    assert all(r["fingerprint"] for r in rows)
    seen = _counting_cuts(monkeypatch)
    again = PanelCropsStage().run(copy, Partition(RELEASE, shard))
    assert seen == {"decoded": [], "cut": []}
    assert again.ok == 0 and again.skipped == again.counts["carried"] == 40 and again.error == 0
    assert _crops(copy, RELEASE, shard) == (rows, tar)
    assert again.version == first.version and again.counts["gate_passed"] == first.counts["gate_passed"]
    # the next release, same figures and panels, no crops of its own: every crop carried into its tar
    _next_release(copy, shard, tables=("figures", "raw_files", "panels"))
    following = PanelCropsStage().run(copy, Partition("2027", shard))
    assert seen == {"decoded": [], "cut": []} and following.skipped == 40 and following.ok == 0
    next_rows, next_tar = _crops(copy, "2027", shard)
    assert next_tar == tar  # the same members, names and bytes
    assert next_rows == [{**r, "tar_path": f"panels/release=2027/shard={shard}/crops.tar"} for r in rows]
    # other gate settings (the verdict is in the row): every crop cut again, from each image once
    PanelCropsStage(GateSettings(min_side=65)).run(copy, Partition("2027", shard))
    assert len(seen["cut"]) == 40 and len(seen["decoded"]) == len(_by_image(panels)) == 15


def test_earlier_crops_that_cannot_be_trusted_are_cut_again(paneled, tmp_path, monkeypatch):
    """A crop is carried only with the bytes its row recorded: one whose bytes in the earlier tar
    changed is cut again (and only that one), and rows written before the fingerprint column
    reuse nothing. Either way the rows and the tar are what cutting again writes."""
    from pipelines.panels.crops import crops_tar

    copy, shard = _lake_copy(paneled, tmp_path), SHARDS[0]
    PanelCropsStage().run(copy, Partition(RELEASE, shard))
    rows, tar = _crops(copy, RELEASE, shard)
    damaged = rows[3]
    with open(crops_tar(copy, RELEASE, shard), "r+b") as fh:  # one byte of the fourth crop flipped
        fh.seek(damaged["offset"] + damaged["size"] // 2)
        byte = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([byte[0] ^ 0xFF]))
    seen = _counting_cuts(monkeypatch)
    again = PanelCropsStage().run(copy, Partition(RELEASE, shard))
    assert seen["cut"] == [_box_of(copy, damaged)] and again.ok == 1
    assert again.skipped == 39 and _crops(copy, RELEASE, shard) == (rows, tar)
    copy.write_table("panel_crops", RELEASE, shard, [{**r, "fingerprint": None} for r in rows])
    again = PanelCropsStage().run(copy, Partition(RELEASE, shard))
    assert len(seen["cut"]) == 1 + 40 and again.ok == 40 and again.skipped == 0
    assert _crops(copy, RELEASE, shard) == (rows, tar)


def _box_of(lake, crop: dict) -> tuple[int, int, int, int]:
    """The box of ``crop``'s panel, read from the ``panels`` table."""
    (panel,) = [
        p
        for p in lake.read_table("panels", RELEASE, SHARDS[0]).to_pylist()
        if (p["pmcid"], p["image_file"], p["panel_index"]) == (crop["pmcid"], crop["image_file"], crop["panel_index"])
    ]
    return (panel["x1"], panel["y1"], panel["x2"], panel["y2"])


def test_a_changed_image_or_box_is_cut_again_and_the_rest_carried(paneled, tmp_path, monkeypatch):
    """In the next release one image has other bytes (another figure's) and one panel another box:
    exactly those crops are cut again, from the new bytes; the rows and the tar are what cutting
    every crop again writes."""
    copy, shard = _lake_copy(paneled, tmp_path), SHARDS[0]
    PanelCropsStage().run(copy, Partition(RELEASE, shard))
    panels = copy.read_table("panels", RELEASE, shard).to_pylist()
    images = _by_image(panels)
    (a, a_panels), (b, _) = sorted(images.items(), key=lambda kv: -len(kv[1]))[:2]  # a: 5 panels
    files = copy.read_table("raw_files", RELEASE, shard).to_pylist()
    source = next(f for f in files if (f["pmcid"], f["name"]) == b)
    _next_release(copy, shard, tables=("figures", "raw_files", "panels"))
    moved = [
        {**f, **{k: source[k] for k in ("tar_path", "offset", "size", "sha256")}} if (f["pmcid"], f["name"]) == a else f
        for f in files
    ]
    copy.write_table("raw_files", "2027", shard, moved)
    c = next(p for key, ps in images.items() if key not in (a, b) for p in ps)  # a panel of a third image
    copy.write_table("panels", "2027", shard, [{**p, "x2": p["x2"] - 1} if p == c else p for p in panels])
    c_sha = next(f["sha256"] for f in files if (f["pmcid"], f["name"]) == (c["pmcid"], c["image_file"]))
    seen = _counting_cuts(monkeypatch)
    following = PanelCropsStage().run(copy, Partition("2027", shard))
    a_boxes = [(p["x1"], p["y1"], p["x2"], p["y2"]) for p in a_panels]
    assert sorted(seen["cut"]) == sorted([*a_boxes, (c["x1"], c["y1"], c["x2"] - 1, c["y2"])])
    assert sorted(seen["decoded"]) == sorted([source["sha256"], c_sha])  # each image read once
    assert following.ok == len(a_panels) + 1 and following.skipped == 40 - following.ok
    assert _crops(copy, "2027", shard) == _cut_afresh(copy, "2027", shard, tmp_path)


def test_an_image_the_crops_stage_could_not_decode_is_tried_again(paneled, tmp_path, monkeypatch):
    """An image that failed leaves no row, so nothing of it is carried: the rerun decodes it again
    and cuts its panels, and carries every other crop."""
    from pipelines.panels import crops

    copy, shard = _lake_copy(paneled, tmp_path), SHARDS[0]
    real, refused = crops.decode_image, []

    def refuse_first(data, *args, **kwargs):
        if not refused:
            refused.append(data)
            return None, "unreadable image: refused once by the test"
        return real(data, *args, **kwargs)

    monkeypatch.setattr(crops, "decode_image", refuse_first)
    first = PanelCropsStage().run(copy, Partition(RELEASE, shard))
    panels = copy.read_table("panels", RELEASE, shard).to_pylist()
    (failed, failed_panels), *_ = sorted(_by_image(panels).items())  # images are cut in (pmcid, image_file) order
    assert first.errors == [(f"{failed[0]} {failed[1]}", "unreadable image: refused once by the test")]
    assert first.error == len(failed_panels) and first.ok == 40 - len(failed_panels)
    monkeypatch.setattr(crops, "decode_image", real)
    seen = _counting_cuts(monkeypatch)
    again = PanelCropsStage().run(copy, Partition(RELEASE, shard))
    assert len(seen["decoded"]) == 1 and len(seen["cut"]) == len(failed_panels) == again.ok
    assert again.error == 0 and again.skipped == 40 - len(failed_panels) and not again.errors
    assert _crops(copy, RELEASE, shard) == _cut_afresh(copy, RELEASE, shard, tmp_path)


def test_the_panel_assets_through_dagster(lake, tmp_path):
    from dagster import DagsterInstance, MultiPartitionKey

    from assets.panels import panel_crops, panels
    from resources.compute import ModelsResource, RayResource
    from resources.lake import LakeResource
    from resources.quality import QualityResource
    from tests.helpers import materialize_one, open_test_release

    (tmp_path / "home").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "home"))
    open_test_release(instance, RELEASE)
    resources = {
        "lake": LakeResource(home=str(lake.root)),
        "models": ModelsResource(synthetic=True, panel_detector=None),  # the figure decision only
        "ray": RayResource(),
        "quality": QualityResource(),
    }
    key = MultiPartitionKey({"release": RELEASE, "shard": SHARDS[2]})
    result = materialize_one(panels, key, instance, resources)
    (event,) = result.get_asset_materialization_events()
    meta = {k: v.value for k, v in event.materialization.metadata.items()}
    figures = lake.read_table("panel_figures", RELEASE, SHARDS[2]).to_pylist()
    assert meta["images"] == len(figures) and meta["detector"] == "none (figure decision)"
    assert meta["panels"] == lake.read_table("panels", RELEASE, SHARDS[2]).num_rows
    checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
    assert set(checks) == {"panel_boxes_inside_image", "panel_count_matches_caption", "zero_panel_share", "error_rate"}
    assert checks["panel_boxes_inside_image"] and checks["error_rate"]
    crops = materialize_one(panel_crops, key, instance, resources)
    assert crops.success and lake.read_table("panel_crops", RELEASE, SHARDS[2]).num_rows == meta["panels"]


# Boxes chosen by looking at each figure (tune-split articles only; sample/panels/eval/README.md),
# with what the crop is and the gate's expected verdict.
GATE_CASES = [
    ("elife-46472", "fig7.jpg", (0, 0, 292, 112), None),  # QTL plot a, boxes.json's panel
    ("elife-46472", "fig8.jpg", (48, 543, 562, 728), None),  # a sequencing chromatogram
    ("biorxiv-2022.04.13.488149", "488149v1_fig4_S1", (396, 686, 531, 820), None),  # a micrograph
    ("biorxiv-2020.04.07.030213", "030213v1_fig23", (2, 1, 159, 414), None),  # diagram (a): two arrows, a box
    ("elife-46472", "fig2.jpg", (87, 891, 596, 965), "text_or_lines_only"),  # x ticks 0-120 and "Time (min)"
    ("biorxiv-2022.04.13.488149", "488149v1_fig1_S1", (150, 90, 423, 347), "text_or_lines_only"),  # row headers
    ("biorxiv-2022.04.13.488149", "488149v1_fig1_S1", (1136, 578, 1278, 683), "text_or_lines_only"),  # 2 words
    ("pone.0056489", "pone.0056489.g003.tif", (144, 713, 1336, 801), "too_elongated"),  # 1192 x 88 tick strip
    ("scielo-bjmbr-54-10-e11439", "afd520e3ff23a23f2c973bbbaa26094e9e50f487.jpg", (1, 2, 43, 231), "too_small"),
    ("pone.0178565", "g003.png", (13, 391, 396, 436), "too_small"),  # a 45 px strip of a genome map
]


def test_the_release_gate_on_crops_of_real_figures(tmp_path_factory):
    """panel_crops records the gate's reason per crop (and still cuts it) and counts them."""
    from pipelines.core.schemas import PANELS

    lake = sample_lake(tmp_path_factory.mktemp("gate"), RELEASE)
    shard_of = {r["pmcid"]: s for s in SHARDS for r in lake.read_table("articles", RELEASE, s).to_pylist()}
    rows: dict[str, list[dict]] = {s: [] for s in SHARDS}
    for index, (folder, image_file, box, _) in enumerate(GATE_CASES):
        pmcid = FOLDER_TO_PMCID[folder]
        row = dict.fromkeys(PANELS.names) | {"pmcid": pmcid, "image_file": image_file, "panel_index": index}
        row |= dict(zip(("x1", "y1", "x2", "y2"), box, strict=True)) | {"method": XYCUT}
        rows[shard_of[pmcid]].append(row)
    counts: dict[str, int] = {}
    for shard in SHARDS:
        lake.write_table("panels", RELEASE, shard, rows[shard])
        result = PanelCropsStage().run(lake, Partition(RELEASE, shard))
        for name, value in result.counts.items():
            if name.startswith("gate_"):
                counts[name] = counts.get(name, 0) + value
    crops = {c["panel_index"]: c for c in lake.read_release("panel_crops", RELEASE).to_pylist()}
    assert [crops[i]["gate"] for i in range(len(GATE_CASES))] == [case[3] for case in GATE_CASES]
    assert all(crops[i]["size"] > 0 for i in crops)  # a gated crop is still cut, for inspection
    assert counts == {
        "gate_passed": 4,
        "gate_too_small": 2,
        "gate_too_elongated": 1,
        "gate_blank": 0,
        "gate_text_or_lines_only": 3,
    }
    assert crops[0]["ink"] > 0.05 and crops[0]["text_run"] > 3
