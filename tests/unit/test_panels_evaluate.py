"""Matching at an IoU threshold and recall/precision, on a 3-figure case worked out by hand."""

from __future__ import annotations

import pytest

from pipelines.panels.evaluate import match_at_iou, recall_precision


def test_one_to_one_matching():
    truth = [(0, 0, 100, 100), (100, 0, 200, 100)]
    # both predictions overlap the first true box; only one may take it
    pred = [(0, 0, 100, 100), (10, 0, 110, 100)]  # second: IoU 90/110 with box 1, 10/190 with box 2
    assert match_at_iou(pred, truth) == (1, 1, 1)


def test_matching_maximises_the_number_of_pairs():
    # p0 overlaps t0 (IoU 0.6) and t1 (IoU 0.9 > p1's 0.6): a greedy best-first would give
    # p0-t1 and leave p1 and t0 unmatched; the right answer pairs p0-t0 and p1-t1
    t0, t1 = (0, 0, 100, 10), (40, 0, 140, 10)
    p0 = (30, 0, 130, 10)  # IoU with t0: 70/130 = 0.54, with t1: 90/110 = 0.82
    p1 = (60, 0, 160, 10)  # IoU with t1: 80/120 = 0.67, with t0: 40/160 = 0.25
    assert match_at_iou([p0, p1], [t0, t1]) == (2, 0, 0)


def test_threshold_and_empty_lists():
    assert match_at_iou([(0, 0, 10, 10)], [(5, 0, 15, 10)]) == (0, 1, 1)  # IoU 1/3
    assert match_at_iou([(0, 0, 10, 10)], [(5, 0, 15, 10)], iou_min=0.3) == (1, 0, 0)
    assert match_at_iou([], [(0, 0, 1, 1)]) == (0, 0, 1)
    assert match_at_iou([(0, 0, 1, 1)], []) == (0, 1, 0)


def test_recall_precision_three_figures_by_hand():
    # figure 1: 2 true panels, split perfectly          -> tp 2, fp 0, fn 0
    f1 = match_at_iou([(0, 0, 50, 100), (50, 0, 100, 100)], [(0, 0, 50, 100), (50, 0, 100, 100)])
    # figure 2: 3 true panels side by side, found as one box over all -> tp 0, fp 1, fn 3
    f2 = match_at_iou([(0, 0, 300, 100)], [(0, 0, 100, 100), (100, 0, 200, 100), (200, 0, 300, 100)])
    # figure 3: 1 true panel, over-split in 2 halves: each half has IoU 0.5 with it; only one
    # may match -> tp 1, fp 1, fn 0
    f3 = match_at_iou([(0, 0, 50, 100), (50, 0, 100, 100)], [(0, 0, 100, 100)])
    assert (f1, f2, f3) == ((2, 0, 0), (0, 1, 3), (1, 1, 0))
    scores = recall_precision([f1, f2, f3])
    # tp 3, fp 2, fn 3: recall 3/6, precision 3/5, f1 = 2 * 0.5 * 0.6 / 1.1
    assert scores["tp"] == 3 and scores["fp"] == 2 and scores["fn"] == 3
    assert scores["recall"] == 0.5
    assert scores["precision"] == 0.6
    assert scores["f1"] == pytest.approx(0.6 / 1.1, abs=1e-4)
    assert scores["exact"] == pytest.approx(1 / 3, abs=1e-4)
    assert scores["figures"] == 3


def test_recall_precision_nothing_to_count():
    assert recall_precision([])["recall"] == 1.0
    assert recall_precision([(0, 0, 0)])["precision"] == 1.0


# --- the figure-level measures (issue 19 §5) -----------------------------------------------------


def test_imageclef_accuracy_counts_above_0_66():
    from pipelines.panels.evaluate import imageclef_correct

    truth = [(0, 0, 100, 100), (100, 0, 200, 100)]
    # IoU 1.0 and IoU 70/100 = 0.7 (> 0.66): both correct
    assert imageclef_correct([(0, 0, 100, 100), (100, 0, 170, 100)], truth) == 2
    # IoU 60/100 = 0.6: counts at 0.5, not here
    assert imageclef_correct([(0, 0, 100, 100), (100, 0, 160, 100)], truth) == 1
    assert imageclef_correct([], truth) == 0


def test_score_figures_by_hand():
    from pipelines.images.boxes import Panel
    from pipelines.panels.evaluate import score_figures

    compound = {
        "kind": "compound",
        "boxes": [(0, 0, 100, 100), (100, 0, 200, 100)],
        "labels": ["A", "B"],
        "caption": "(A) red cells. (B) blue cells.",
        "phrases": {"A": ["red cells"], "B": ["blue cells"]},
    }
    single = {"kind": "single", "boxes": [(0, 0, 300, 200)], "labels": [None], "caption": "", "phrases": {}}
    predictions = [
        [Panel((0, 0, 100, 100), label="A"), Panel((100, 0, 200, 100), label="b")],  # b: case differs
        [Panel((0, 0, 150, 200)), Panel((150, 0, 300, 200))],  # a single figure cut in two
    ]

    def pair(panels, caption):  # what a pairing by printed label gives here
        texts = {"a": "red cells", "b": "blue cells"}
        return [texts.get((p.label or "").casefold()) for p in panels]

    scores = score_figures([compound, single], predictions, pair)
    # compound: tp 2; single: one half has IoU 0.5 with the truth, the other is extra
    assert (scores["tp"], scores["fp"], scores["fn"]) == (3, 1, 0)
    # ImageCLEF: compound 2/2; single 0 correct above 0.66 / max(1, 2): mean 0.5
    assert scores["imageclef_accuracy"] == 0.5
    assert scores["single_figures"] == 1 and scores["single_whole"] == 0.0
    assert scores["count_exact"] == 0.5 and scores["count_exact_compound"] == 1.0
    assert scores["labelled_panels"] == 2 and scores["labels_read"] == 0.5 and scores["labels_read_casefold"] == 1.0
    assert scores["panel_text_panels"] == 2 and scores["panel_text"] == 1.0


def test_label_reading_by_position_and_text():
    from pipelines.panels.evaluate import label_reading
    from pipelines.panels.labels import PrintedLabel

    fig = {"width": 200, "height": 100, "boxes": [(0, 0, 100, 100), (100, 0, 200, 100)], "labels": ["a", "b"]}
    found = [
        PrintedLabel("a", (2, 2, 10, 12)),
        PrintedLabel("b", (20, 50, 28, 60)),  # inside panel a: a wrong place for b
        PrintedLabel("b", (104, 2, 112, 12)),
    ]
    assert label_reading([fig], [found]) == {"labelled_panels": 2, "labels_read": 3, "recall": 1.0, "precision": 0.6667}


def test_the_evaluation_set_is_loaded_once_per_file(tmp_path):
    import json

    from pipelines.panels.evaluate import load_eval_figures

    panel = {"label": None, "box": [0, 0, 5, 5]}
    boxes = {"figures": [{"file": "x.png", "width": 10, "height": 10, "panels": [panel]}]}
    (tmp_path / "boxes.json").write_text(json.dumps(boxes))
    entry = {
        "file": "x.png",
        "split": "tune",
        "kind": "single",
        "width": 10,
        "height": 10,
        "panels": [{"box": [0, 0, 10, 10], "label": None}],
        "caption": "One chart.",
    }
    held = {**entry, "file": "y.png", "split": "holdout"}
    skipped = {**entry, "file": "z.png", "kind": "skip"}
    (tmp_path / "figures-A.json").write_text(json.dumps([entry, held, skipped]))
    tune = load_eval_figures(tmp_path / "boxes.json", [tmp_path / "figures-A.json"], tmp_path, split="tune")
    assert [(f["file"], f["boxes"], f["caption"]) for f in tune] == [("x.png", [(0, 0, 10, 10)], "One chart.")]
    every = load_eval_figures(tmp_path / "boxes.json", [tmp_path / "figures-A.json"], tmp_path)
    assert sorted(f["file"] for f in every) == ["x.png", "y.png"]


def test_the_renditions_benchmark_scales_the_truth_with_the_image():
    """benchmarks/panel_scales.py: a 100 x 50 figure at 0.5x is 50 x 25 and its panel (10, 10, 50,
    40) becomes (5, 5, 25, 20); at 1.5x, 150 x 75 and (15, 15, 75, 60); JPEG keeps the size."""
    from PIL import Image

    from benchmarks.panel_scales import render, scaled_truth

    image = Image.new("RGB", (100, 50), "white")
    figure = {"width": 100, "height": 50, "boxes": [(10, 10, 50, 40)], "caption": None}
    half, larger, jpeg = render(image, "0.5x"), render(image, "1.5x"), render(image, "JPEG q75")
    assert half.size == (50, 25) and larger.size == (150, 75) and jpeg.size == (100, 50)
    assert scaled_truth(figure, *half.size)["boxes"] == [(5, 5, 25, 20)]
    assert scaled_truth(figure, *larger.size)["boxes"] == [(15, 15, 75, 60)]
    assert render(image, "as given") is image
    # sizes round on their own: 101 x 51 at 0.75x is 76 x 38 (75.75 and 38.25 rounded), so x
    # scales by 76/101 and y by 38/51: (10, 10, 50, 40) -> (7.525, 7.451, 37.624, 29.804)
    odd = render(Image.new("RGB", (101, 51), "white"), "0.75x")
    assert odd.size == (76, 38)
    box = scaled_truth({**figure, "width": 101, "height": 51}, *odd.size)["boxes"][0]
    assert box == pytest.approx((7.525, 7.451, 37.624, 29.804), abs=1e-3)
