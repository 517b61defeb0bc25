"""SoM-guided panel deconstruction: views, per-identifier NMS, reconciliation, panel texts, gate.

Every model answer below is written by hand in the model's frame, and every expected box is
worked out by hand from it. The figure is 400x300 with panel A = (0, 0, 200, 300) and panel
B = (200, 0, 400, 300). The engine's pixel band is min 56*56, so smart_resize (factor 28) gives:

* full view 400x300 -> frame 392x308 (round(400/28)=14, round(300/28)=11): A = [0, 0, 196, 308];
* half view 200x150 -> frame 196x140 (7 and 5 patches): A = [0, 0, 98, 140];
* x1.4 view 560x420 -> frame 560x420 (20 and 15 patches, no resize): A = [0, 0, 280, 420];
* crop (190, 0, 400, 300) at scale 1 -> 210x300 -> frame 224x308 (round(7.5)=8, 11): a frame x
  maps to 210/224 = 15/16 of itself in the view, so frame x 32 is view x 30, original x 220.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from pipelines.images.boxes import Panel
from pipelines.mining.som import View, panel_views, propose_panels, reconcile
from pipelines.mining.text import describe_panels, gate, panel_texts
from pipelines.vlm import prompts
from pipelines.vlm.engine import EngineConfig, VlmEngine, VlmOutage, VlmRequest
from testing.vlm import ScriptedEngine

CONFIG = EngineConfig(model="scripted", synthetic=True, min_pixels=56 * 56)
W, H = 400, 300


def figure() -> Image.Image:
    image = Image.new("RGB", (W, H), "white")
    image.paste((200, 30, 30), (0, 0, 200, 300))
    image.paste((30, 30, 200), (200, 0, 400, 300))
    return image


def full_view(image: Image.Image) -> View:
    return View(image, (0, 0, W, H), (1.0, 1.0), (W, H))


def scaled_view(image: Image.Image, scale: float) -> View:
    size = (round(W * scale), round(H * scale))
    return View(image.resize(size), (0, 0, W, H), (scale, scale), (W, H))


def crop_view(image: Image.Image) -> View:
    return View(image.crop((190, 0, 400, 300)), (190, 0, 400, 300), (1.0, 1.0), (W, H))


def panels_json(*items: tuple[str | None, list[int]]) -> str:
    return json.dumps({"panels": [{"label": label, "bbox_2d": box} for label, box in items]})


def by_size(answers: dict[tuple[int, int], str | Exception]) -> ScriptedEngine:
    """An engine answering each view by the size of its image (each test view has its own)."""
    return ScriptedEngine(lambda request: answers[request.images[0].size], CONFIG)


# --- views -----------------------------------------------------------------------------------


def test_views_are_deterministic_and_map_back_to_their_region():
    image = figure()
    views = panel_views(image, 6, seed=3)
    again = panel_views(image.copy(), 6, seed=3)
    other = panel_views(image, 6, seed=4)
    assert len(views) == 6
    assert views[0].crop == (0, 0, W, H) and views[0].scale == (1.0, 1.0) and views[0].image.size == (W, H)
    assert [(v.crop, v.scale, v.image.size) for v in views] == [(v.crop, v.scale, v.image.size) for v in again]
    assert [(v.crop, v.scale) for v in views] != [(v.crop, v.scale) for v in other]
    for view in views:
        w, h = view.image.size
        assert view.to_original((0, 0, w, h)) == pytest.approx(view.crop)  # the whole view is its region
        x1, y1, x2, y2 = view.crop
        assert 0 <= x1 < x2 <= W and 0 <= y1 < y2 <= H
    with pytest.raises(ValueError):
        panel_views(image, 0, seed=0)


# --- proposals -------------------------------------------------------------------------------


def test_crop_view_maps_back_and_cut_panels_are_left_out():
    image = figure()
    engine = by_size(
        {
            (400, 300): panels_json(("A", [0, 0, 196, 308]), ("B", [196, 0, 392, 308])),
            # A shows only as the 10 px strip left of x=200, cut by the crop: left out.
            (210, 300): panels_json(("A", [0, 0, 16, 308]), ("B", [32, 0, 224, 308])),
        }
    )
    proposals = propose_panels(engine, image, [full_view(image), crop_view(image)])
    got = {p.label: (p.box, p.score) for p in proposals.panels}
    # B: the median of (200, 0, 400, 300) and (220, 0, 400, 300); two of two views
    assert got == {"A": ((0, 0, 200, 300), 0.5), "B": ((210, 0, 400, 300), 1.0)}
    assert proposals.reasons == [None, None]
    assert proposals.counts == [2, 1]
    assert proposals.dropped == {"cut by crop": 1}
    request = engine.requests[0]
    assert request.system == prompts.SYSTEM and request.schema == prompts.PANELS.schema
    assert request.max_tokens == prompts.PANELS.max_tokens


def test_garbage_and_failed_views_are_reasons_and_the_others_still_vote():
    image = figure()
    engine = by_size(
        {
            (400, 300): panels_json(("A", [0, 0, 196, 308]), ("B", [196, 0, 392, 308])),
            (200, 150): "I am sorry, I cannot find any panels in this image.",
            (560, 420): RuntimeError("image could not be decoded"),
            (210, 300): panels_json(("B", [32, 0, 224, 308])),
        }
    )
    views = [full_view(image), scaled_view(image, 0.5), scaled_view(image, 1.4), crop_view(image)]
    proposals = propose_panels(engine, image, views)
    assert proposals.reasons[0] is None and proposals.reasons[3] is None
    assert isinstance(proposals.reasons[1], str) and proposals.reasons[1]
    assert "image could not be decoded" in proposals.reasons[2]
    assert [f.split(":")[0] for f in proposals.failures] == ["view 1", "view 2"]
    assert proposals.counts == [2, None, None, 1]
    got = {p.label: (p.box, p.score) for p in proposals.panels}
    assert got == {"A": ((0, 0, 200, 300), 0.25), "B": ((210, 0, 400, 300), 0.5)}
    assert proposals.split_share == 0.25  # only the full view found two panels
    # the scripted engine counts words: what came back is summed over the views that answered
    assert proposals.completion_tokens == sum(
        len(a.split()) for a in (engine.answer(r) for r in engine.requests) if isinstance(a, str)
    )


def test_per_identifier_nms_merges_one_label_across_views():
    image = figure()
    engine = by_size(
        {
            (400, 300): panels_json(("A", [0, 0, 196, 308]), ("B", [196, 0, 392, 308])),
            # "(a)" is A as printed in another case and with brackets; B's label was not read
            (200, 150): panels_json(("(a)", [0, 0, 98, 140]), (None, [98, 0, 196, 140])),
            # A a little narrower (190 px); a second "A" far from the others (a misread letter)
            (560, 420): panels_json(("A", [0, 0, 266, 420]), ("B", [280, 0, 560, 420]), ("A", [0, 0, 56, 56])),
        }
    )
    views = [full_view(image), scaled_view(image, 0.5), scaled_view(image, 1.4)]
    proposals = propose_panels(engine, image, views)
    got = sorted((p.box, p.score, p.label) for p in proposals.panels)
    assert got == [
        ((0, 0, 40, 40), 0.3333, None),  # the stray "A" loses the label to the cluster of 3 views
        ((0, 0, 200, 300), 1.0, "A"),  # median of x2 200, 200, 190
        ((200, 0, 400, 300), 1.0, "B"),  # the unlabelled box of the half view joined B
    ]
    assert proposals.dropped == {"label elsewhere": 1}
    assert proposals.split_share == 1.0


def test_unlabelled_boxes_are_merged_among_themselves():
    image = figure()
    engine = by_size(
        {
            (400, 300): panels_json((None, [0, 0, 196, 308]), (None, [196, 0, 392, 308])),
            (200, 150): panels_json((None, [0, 0, 98, 140])),
        }
    )
    proposals = propose_panels(engine, image, [full_view(image), scaled_view(image, 0.5)])
    assert sorted((p.box, p.score, p.label) for p in proposals.panels) == [
        ((0, 0, 200, 300), 1.0, None),
        ((200, 0, 400, 300), 0.5, None),
    ]


def test_an_outage_is_raised_not_recorded():
    class Down(VlmEngine):
        config = CONFIG

        def generate(self, requests):
            raise VlmOutage("connection refused")

    image = figure()
    with pytest.raises(VlmOutage):
        propose_panels(Down(), image, [full_view(image)])


# --- reconciliation --------------------------------------------------------------------------


def test_reconcile_keeps_the_table_geometry_and_reports_disagreement():
    detector = [
        Panel((0, 0, 200, 300)),
        Panel((200, 0, 400, 300), label="B"),
        Panel((0, 300, 400, 400)),
    ]
    vlm = [
        Panel((10, 0, 200, 300), 1.0, "A"),  # IoU 190*300 / 200*300 = 0.95
        Panel((200, 0, 400, 300), 1.0, "C"),  # IoU 1.0, a different label
        Panel((100, 350, 150, 390), 0.5, "D"),  # IoU with the third 50*40 / 400*100 = 0.05
    ]
    out = reconcile(vlm, detector)
    assert out.decision == "detector"
    assert [(r.panel.box, r.panel.label, r.source) for r in out.panels] == [
        ((0, 0, 200, 300), "A", "detector"),  # the VLM's label, the table's box
        ((200, 0, 400, 300), "B", "detector"),  # the table's label wins the conflict
        ((0, 300, 400, 400), None, "detector"),
    ]
    assert [(i, j, round(o, 4)) for i, j, o in out.matches] == [(0, 0, 0.95), (1, 1, 1.0)]
    assert out.vlm_only == [2] and out.detector_only == [2]
    assert out.label_conflicts == [(1, 1, "C", "B")]
    # the table's printed label is the first reader, the VLM's a second opinion where it had none
    assert [r.label_source for r in out.panels] == ["vlm", "image", None]
    assert out.mean_iou == pytest.approx(0.975)
    assert out.agreement == pytest.approx(1.95 / 3)


def test_reconcile_uses_consistent_vlm_panels_when_the_detector_saw_one_panel():
    whole = [Panel((0, 0, 400, 300))]
    vlm = [Panel((0, 0, 200, 300), 1.0, "A"), Panel((200, 0, 400, 300), 0.6667, "B"), Panel((0, 0, 40, 40), 0.25)]
    out = reconcile(vlm, whole, size=(400, 300), split_share=0.5)
    assert out.decision == "vlm_split"
    assert [(r.panel.box, r.panel.label, r.source, r.vlm_index) for r in out.panels] == [
        ((0, 0, 200, 300), "A", "vlm", 0),
        ((200, 0, 400, 300), "B", "vlm", 1),  # the 0.25 box was seen by too few views
    ]
    assert [r.label_source for r in out.panels] == ["vlm", "vlm"]
    assert out.detector_only == [0]
    # not consistent enough: the detector's single panel stands, the VLM panels are reported
    out = reconcile(vlm, whole, size=(400, 300), split_share=0.4)
    assert out.decision == "detector"
    assert [(r.panel.box, r.source) for r in out.panels] == [((0, 0, 400, 300), "detector")]
    assert out.vlm_only == [1, 2]  # A matched the whole figure at IoU 0.5
    # a single detector panel that does not cover the figure is not the detector's failure
    out = reconcile(vlm, [Panel((0, 0, 200, 150))], size=(400, 300), split_share=1.0)
    assert out.decision == "detector"


def test_reconcile_of_nothing_agrees():
    out = reconcile([], [])
    assert out.panels == [] and out.mean_iou is None and out.agreement == 1.0


# --- panel texts -----------------------------------------------------------------------------

CAPTION = "Effects of drug X. (A) Western blot of lysates. (B) Quantification of band intensity. (C) Confocal images."
ROW = [Panel((0, 0, 100, 100)), Panel((110, 0, 210, 100)), Panel((220, 0, 320, 100))]  # one row of three
GRID = [Panel((0, 0, 100, 100)), Panel((110, 0, 210, 100)), Panel((0, 110, 100, 210)), Panel((110, 110, 210, 210))]


def _labelled(panels: list[Panel], labels: list[str | None]) -> list[Panel]:
    return [Panel(p.box, label=label) for p, label in zip(panels, labels, strict=True)]


def test_caption_split_first_and_the_vlm_only_for_residual_panels():
    answer = {
        "panels": [
            {"label": "D", "text": "Confocal\n images."},  # verbatim once white space is normalised
            {"label": "E", "text": "confocal images."},  # not verbatim: the caption has a capital C
        ]
    }
    engine = ScriptedEngine(lambda request: json.dumps(answer), CONFIG)
    five = [*ROW, Panel((330, 0, 430, 100)), Panel((440, 0, 540, 100))]
    texts = panel_texts(_labelled(five, ["A", "B", "C", "D", "E"]), CAPTION, None, engine)
    assert [(t.panel_index, t.label, t.text, t.source, t.extractive, t.reason, t.match) for t in texts] == [
        (0, "A", "Western blot of lysates.", "caption_split", True, None, "label"),
        (1, "B", "Quantification of band intensity.", "caption_split", True, None, "label"),
        (2, "C", "Confocal images.", "caption_split", True, None, "label"),
        (3, "D", "Confocal images.", "vlm", True, None, "vlm"),
        (4, "E", None, "vlm", False, "not extractive", "none"),
    ]
    assert {t.count_agreement for t in texts} == {"more_panels"}  # five panels, three caption labels
    assert len(engine.requests) == 1
    request = engine.requests[0]
    assert "The figure has the panels D, E." in request.prompt
    assert request.images == [] and request.schema == prompts.ASSOCIATE.schema


def test_no_residual_panels_means_no_request():
    engine = ScriptedEngine(lambda request: "{}", CONFIG)
    texts = panel_texts(_labelled(ROW, ["A", "B", "C"]), CAPTION, None, engine)
    assert [t.source for t in texts] == ["caption_split"] * 3
    unlabelled = panel_texts(ROW, CAPTION, None, engine)  # one row, as many panels as labels: by order
    assert [(t.panel_index, t.label, t.text, t.match) for t in unlabelled] == [
        (0, "A", "Western blot of lysates.", "order"),
        (1, "B", "Quantification of band intensity.", "order"),
        (2, "C", "Confocal images.", "order"),
    ]
    assert engine.requests == []


def test_an_unpaired_panel_without_a_label_cannot_be_asked_about():
    """A 2x2 grid, no label read, three caption labels: no text for any panel, and no request
    (the VLM is asked about a label, not a position)."""
    engine = ScriptedEngine(lambda request: "{}", CONFIG)
    texts = panel_texts(GRID, CAPTION, None, engine)
    assert [(t.text, t.source, t.match) for t in texts] == [(None, None, "none")] * 4
    assert texts[0].reason == "no caption text: 4 panels, 3 caption labels"
    assert engine.requests == []


def test_a_bad_answer_is_a_reason():
    engine = ScriptedEngine(lambda request: "no idea", CONFIG)
    texts = panel_texts(_labelled(ROW, ["A", "D", None]), CAPTION, None, engine)
    assert (texts[0].source, texts[0].text, texts[0].match) == ("caption_split", "Western blot of lysates.", "label")
    assert texts[1].text is None and texts[1].source == "vlm" and texts[1].reason and texts[1].match == "none"
    # the third of a row of three, as many as the caption's labels: C by reading order, "D" aside
    assert (texts[2].text, texts[2].match) == ("Confocal images.", "order")
    assert "The figure has the panels D." in engine.requests[0].prompt


def test_describe_panels_is_one_batched_call_with_errors_per_crop():
    calls = []

    class Counting(ScriptedEngine):
        def generate(self, requests):
            calls.append(len(requests))
            return super().generate(requests)

    answers = iter(['{"description": "A western  blot of two lanes."}', "garbage", RuntimeError("bad image")])
    engine = Counting(lambda request: next(answers), CONFIG)
    crops = [Image.new("RGB", (64, 64)), Image.new("RGB", (80, 40)), Image.new("RGB", (30, 30))]
    out = describe_panels(engine, crops, ["Western blot of lysates.", None, "x"])
    assert calls == [3]
    assert out[0] == ("A western blot of two lanes.", None)
    assert out[1][0] is None and out[1][1]
    assert out[2][0] is None and "bad image" in out[2][1]
    assert "Western blot of lysates." in engine.requests[0].prompt
    assert describe_panels(engine, [], []) == [] and calls == [3]


def test_gate_skips_non_photographic_panels():
    assert not gate("Plots and Charts")
    assert not gate("bar chart")  # a local concept stands for its global one
    assert not gate("Tables") and not gate("schematic")
    assert gate("Microscopy") and gate("histology") and gate("western blot")
    assert gate(None) and gate("")  # unknown passes
    only = ("Microscopy", "clinical photograph")
    assert gate("histology", only) and gate("clinical photograph", only)
    assert not gate("computed tomography", only) and not gate("Plots and Charts", only)
    assert gate(None, only)


def test_request_fields_are_the_prompt_module_s():
    engine = by_size({(400, 300): panels_json()})
    image = figure()
    propose_panels(engine, image, [full_view(image)])
    (request,) = engine.requests
    assert isinstance(request, VlmRequest)
    assert request.prompt == prompts.PANELS.render()


# --- the tiny real model, end to end ---------------------------------------------------------

SAMPLE_FIGURE = (
    Path(__file__).resolve().parents[2] / "sample" / "images" / "PMC7003341" / "40779_2020_233_Fig1_HTML.jpg"
)


def test_propose_panels_with_the_tiny_real_model(tmp_path):
    """A random model answers noise: whatever it says must end as panels inside the image or as
    recorded reasons, never as an exception."""
    from pipelines.vlm.hf import TransformersEngine
    from pipelines.vlm.tiny import build_tiny_model

    directory = build_tiny_model(tmp_path / "tiny")
    config = EngineConfig(model=str(directory), synthetic=True, min_pixels=56 * 56, max_pixels=28 * 28 * 64)
    image = Image.open(SAMPLE_FIGURE)
    image.load()
    views = panel_views(image, 3, seed=0)
    with TransformersEngine(config, device="cpu", batch_size=3) as engine:
        proposals = propose_panels(engine, image, views)
    assert proposals.views == 3 and len(proposals.reasons) == 3 and len(proposals.counts) == 3
    for reason, count in zip(proposals.reasons, proposals.counts, strict=True):
        assert count is not None or (isinstance(reason, str) and reason)  # nothing read is explained
    for panel in proposals.panels:
        x1, y1, x2, y2 = panel.box
        assert 0 <= x1 < x2 <= image.width and 0 <= y1 < y2 <= image.height
        assert 0 < panel.score <= 1
    assert proposals.prompt_tokens > 0
