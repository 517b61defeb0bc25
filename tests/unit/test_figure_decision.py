"""One size rule for a figure (issues 21 §6 and 23 §6): a figure is usable in every stage or in none,
for the same reason, decided once when the article is parsed.

elife-46472 (PMC900000009, eight figures ``fig1.jpg`` … ``fig8.jpg``) is published with three of
its figure files replaced: ``fig1.jpg`` by a JPEG whose header says 20,000 x 20,000 (400,000,000
pixels, over the cap of 89,478,485), ``fig2.jpg`` by the first half of its own bytes (a truncated
JPEG: its 600 x 970 header is whole, its scan is not), ``fig3.jpg`` by a 12,000 x 12,000 PNG
(144,000,000 pixels). The expected reasons below are those numbers written out by hand.
"""

from __future__ import annotations

import io
import warnings

import pytest
from PIL import Image

from pipelines.concepts.dinov2 import EmbedderConfig
from pipelines.concepts.stages import EmbedStage
from pipelines.core.lake import Lake
from pipelines.core.stage import Partition
from pipelines.images.decode import UnusableFigureError, decode_image, is_loaded, open_figure
from pipelines.images.info import image_info
from pipelines.images.jpeg import to_jpeg
from pipelines.longcap.stages import LongCapSettings, LongCapStage
from pipelines.mining.stages import MiningSettings, MiningStage
from pipelines.panels.inputs import PanelInputError, split_figure
from pipelines.panels.layout import split_panels
from pipelines.panels.split import panels_for_figure
from pipelines.panels.stages import PanelCropsStage, PanelSettings, PanelStage
from pipelines.release.stages import PairPlanStage, SamplePlanStage
from pipelines.vlm.engine import EngineConfig
from testing.actor_pool import actor_pool_in_process
from testing.loopback.sample_mirror import SAMPLE_DIR, build_legacy_mirror, sample_rows
from testing.panel_figures import huge_png, huge_uniform_jpeg
from testing.pipeline import parse_release
from testing.vlm import ScriptedEngine
from tests.helpers import run_release, source_for
from tests.stages.test_model_stages import ANSWERS  # the scripted model's answers to every prompt

PMCID, RELEASE = "PMC900000009", "2026"
FIG2 = (SAMPLE_DIR / "articles" / "elife-46472" / "fig2.jpg").read_bytes()
TOO_LARGE_JPEG = "too large: 20000x20000 px = 400,000,000 px, over the cap of 89,478,485 px"
TOO_LARGE_PNG = "too large: 12000x12000 px = 144,000,000 px, over the cap of 89,478,485 px"
TRUNCATED = "unreadable image: image file is truncated"  # PIL's words, then how many bytes were left


def bad_figures() -> dict[str, bytes]:
    return {
        "fig1.jpg": huge_uniform_jpeg(20_000, 20_000),
        "fig2.jpg": FIG2[: len(FIG2) // 2],
        "fig3.jpg": huge_png(12_000, 12_000),
    }


def expected(name: str, reason: str | None) -> bool:
    if name == "fig2.jpg":
        return reason is not None and reason.startswith(TRUNCATED)
    return reason == {"fig1.jpg": TOO_LARGE_JPEG, "fig3.jpg": TOO_LARGE_PNG}[name]


@pytest.mark.parametrize("name", ["fig1.jpg", "fig2.jpg", "fig3.jpg"])
def test_every_decoder_entry_point_gives_the_same_reason(name):
    data = bad_figures()[name]
    reasons = {
        "parse (image facts)": image_info(data)["error"],
        "open_figure": open_figure(data).reason,
        "embeddings, crops, pairs, long captions (decode_image)": decode_image(data)[1],
        "panels (split_figure)": split_figure(data).reason,
        "release conversion (to_jpeg)": to_jpeg(data)[1],
    }
    assert expected(name, reasons["parse (image facts)"]), reasons
    assert len(set(reasons.values())) == 1, reasons


@pytest.mark.parametrize("name", ["fig1.jpg", "fig2.jpg", "fig3.jpg"])
def test_evaluation_and_training_read_images_by_the_same_rule(name):
    """The evaluation harness and the multi-level trainer decode through ``open_figure`` too: an
    image the release would refuse is no image to them either, for the same reason."""
    import random

    from pipelines.evaluation.harness import decode as evaluation_decode
    from pipelines.training.multilevel.config import MultilevelConfig
    from pipelines.training.multilevel.decoding import decode as training_decode

    data = bad_figures()[name]
    assert evaluation_decode(data) is None
    sample = {"__key__": "k", "jpg": data, "txt": b"a cell"}
    with pytest.raises(UnusableFigureError) as refused:
        training_decode(sample, "figure", lambda im: im, MultilevelConfig(run_dir="-"), random.Random(0))
    assert refused.value.reason == open_figure(data).reason and expected(name, refused.value.reason)


def test_transparency_is_white_paper_and_no_pixels_is_unreadable_in_every_reader(tmp_path):
    """A transparent PNG (a chart drawn on nothing) is composited on white by the one decoder, in
    the evaluation harness as in the release (``convert("RGB")`` made it black); an image of no
    pixels is one of the decoder's reasons, not a word of the detector's own."""
    from pipelines.evaluation.harness import decode as evaluation_decode
    from pipelines.images.decode import open_image

    out = io.BytesIO()
    Image.new("RGBA", (4, 3), (0, 0, 0, 0)).save(out, "PNG")
    (tmp_path / "clear.png").write_bytes(out.getvalue())
    for source in (out.getvalue(), str(tmp_path / "clear.png")):
        assert evaluation_decode(source).getpixel((1, 1)) == (255, 255, 255)
    assert evaluation_decode(str(tmp_path / "missing.png")) is None
    empty = open_image(Image.new("RGB", (0, 4)))
    assert empty.image is None and empty.reason == "unreadable image: empty image (0x4 px)"


@pytest.mark.parametrize("split", [split_panels, panels_for_figure])
@pytest.mark.parametrize("name", ["fig2.jpg", "fig3.jpg"])
def test_the_public_splitters_raise_the_reason_not_oserror_and_never_decode_a_huge_png(split, name):
    with warnings.catch_warnings():  # PIL's own warning at open: 144 Mpx is over its threshold too
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        image = Image.open(io.BytesIO(bad_figures()[name]))  # opened, not decoded: as the README does
    with image:
        with pytest.raises(PanelInputError) as raised:
            split(image)
        assert expected(name, raised.value.reason)
        if name == "fig3.jpg":
            assert not is_loaded(image)  # refused from the header: no pixel of the 12k PNG was decoded


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The one article through every stage that reads figure images; the engine counts what it
    is asked about. The embedding stage's actor pool runs in this process: what it records for a
    refused image is the question here, not Ray (tests/e2e covers the stage on Ray)."""
    root = tmp_path_factory.mktemp("decision")
    rows = [r for r in sample_rows() if r["pmcid"] == PMCID]
    mirror = build_legacy_mirror(root / "legacy", rows=rows, extra_files={PMCID: bad_figures()})
    lake = Lake(root / "lake")
    with source_for(mirror.as_uri()) as source:
        run_release(lake, source, RELEASE)
    parse_release(lake, RELEASE)
    (shard,) = [s for s in lake.shards() if lake.read_table("figures", RELEASE, s).num_rows]
    partition = Partition(RELEASE, shard)
    engine = ScriptedEngine(lambda r: ANSWERS[r.prompt_name], EngineConfig(model="scripted", synthetic=True))
    with actor_pool_in_process():
        EmbedStage(EmbedderConfig(synthetic=True)).run(lake, partition)
    SamplePlanStage().run(lake, partition)
    PanelStage(PanelSettings()).run(lake, partition)
    PanelCropsStage().run(lake, partition)
    MiningStage(engine, MiningSettings(som_views=1)).run(lake, partition)
    LongCapStage(engine, LongCapSettings()).run(lake, partition)
    PairPlanStage().run(lake, partition)
    return lake, shard, engine


def _by_image(lake, table, shard) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in lake.read_table(table, RELEASE, shard).to_pylist():
        out.setdefault(row["image_file"], []).append(row)
    return out


def test_parsing_decides_and_every_stage_records_that_decision(built):
    lake, shard, engine = built
    (figures,) = [lake.read_table("figures", RELEASE, shard).to_pylist()]
    decided = {
        name: error
        for fig in figures
        for name, error in zip(fig["image_files"], fig["image_errors"], strict=True)
        if fig["pmcid"] == PMCID
    }
    assert sorted(decided) == [f"fig{i}.jpg" for i in range(1, 9)]
    bad = {"fig1.jpg", "fig2.jpg", "fig3.jpg"}
    for name, reason in decided.items():
        assert expected(name, reason) if name in bad else reason is None, (name, reason)

    embeddings = _by_image(lake, "embeddings", shard)
    panel_figures = _by_image(lake, "panel_figures", shard)
    mining = _by_image(lake, "mining_figures", shard)
    long_captions = _by_image(lake, "long_captions", shard)
    samples = _by_image(lake, "samples", shard)
    for name in bad:
        reason = decided[name]
        assert [(r["error"], r["vector"]) for r in embeddings[name]] == [(reason, None)]
        assert [(r["status"], r["reason"]) for r in panel_figures[name]] == [("error", reason)]
        assert [(r["status"], r["reasons"]) for r in mining[name]] == [("error", [reason])]
        assert [(r["status"], r["reason"]) for r in long_captions[name]] == [("error", reason)]
        assert [(r["status"], r["reason"], r["detail"]) for r in samples[name]] == [
            ("excluded", "undecodable_image", reason)
        ]
    # the five good figures went through; nothing was cut from, or asked about, a refused one
    for name in set(decided) - bad:
        assert embeddings[name][0]["error"] is None and panel_figures[name][0]["status"] in ("split", "single")
        assert samples[name][0]["status"] == "included"
    crops = {r["image_file"] for r in lake.read_table("panel_crops", RELEASE, shard).to_pylist()}
    assert crops and not crops & bad
    asked = {image for r in engine.requests for image in [r.id.split("|", 1)[0]] if r.prompt_name != "canary"}
    assert asked and not any(a.endswith(tuple(f"/{n}" for n in bad)) for a in asked)
    planned = [r for r in lake.read_table("pair_samples", RELEASE, shard).to_pylist() if r["image_file"] in bad]
    # the long-caption rows are planned, and excluded by their figure's exclusion
    assert sorted((r["image_file"], r["level"], r["status"], r["reason"], r["detail"]) for r in planned) == [
        (name, "longcap", "excluded", "figure_excluded", "undecodable_image") for name in sorted(bad)
    ]


def test_the_panels_stage_refuses_by_its_own_decoding_what_parsing_would_have(built, tmp_path):
    """With the parse's reasons gone (a figures table written before parsing decided), the panels
    stage reads the bytes, and the model-stage loop records the decoder's reason for each refused
    image as an error, the others split as before."""
    import shutil

    lake, shard, _ = built
    copy = Lake(shutil.copytree(lake.root, tmp_path / "lake"))
    figures = copy.read_table("figures", RELEASE, shard).to_pylist()
    for fig in figures:
        fig["image_errors"] = [None] * len(fig["image_files"] or [])
    copy.write_table("figures", RELEASE, shard, figures)
    lines: list[str] = []
    result = PanelStage(PanelSettings(consensus_min=0.69)).run(copy, Partition(RELEASE, shard), lines.append)
    rows = {r["image_file"]: r for r in copy.read_table("panel_figures", RELEASE, shard).to_pylist()}
    for name in ("fig1.jpg", "fig2.jpg", "fig3.jpg"):
        assert rows[name]["status"] == "error" and expected(name, rows[name]["reason"]), rows[name]
        assert rows[name]["width"] is None and rows[name]["n_panels"] == 0
    assert result.error == 3 and result.ok == 5
    assert "unreadable 3" in lines[-1]  # the loop's progress counts them as unreadable
    before = {r["image_file"]: r for r in lake.read_table("panel_figures", RELEASE, shard).to_pylist()}
    other = ("settings", "fingerprint")  # the fingerprint holds the settings
    for name, row in rows.items():  # the same rows as when parsing refused them (other settings apart)
        assert {k: v for k, v in row.items() if k not in other} == {
            k: v for k, v in before[name].items() if k not in other
        }
