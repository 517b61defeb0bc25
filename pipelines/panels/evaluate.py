"""Panel boxes against hand-drawn truth: one-to-one matching at an IoU threshold, recall and
precision over many figures, and the hand-boxed evaluation set (``sample/panels``)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from pipelines.images.boxes import Box, iou

LABEL_MARGIN = 0.05


def match_at_iou(pred: Sequence[Box], truth: Sequence[Box], iou_min: float = 0.5) -> tuple[int, int, int]:
    """``(tp, fp, fn)``: predicted and true boxes matched one to one (each used at most once),
    a pair counting only at IoU >= ``iou_min``; the matching maximises the number of such pairs
    (then their total IoU). ``fp`` = unmatched predictions, ``fn`` = unmatched true boxes."""
    if not pred or not truth:
        return 0, len(pred), len(truth)
    from scipy.optimize import linear_sum_assignment

    m = np.array([[iou(p, t) for t in truth] for p in pred])
    weight = np.where(m >= iou_min, 1.0 + m, 0.0)
    rows, cols = linear_sum_assignment(weight, maximize=True)
    tp = int(sum(1 for i, j in zip(rows, cols, strict=True) if weight[i, j] > 0))
    return tp, len(pred) - tp, len(truth) - tp


def recall_precision(results: Iterable[tuple[int, int, int]]) -> dict:
    """Micro-averaged over figures from per-figure ``(tp, fp, fn)``: ``figures``, ``tp``,
    ``fp``, ``fn``, ``recall`` = tp / (tp + fn), ``precision`` = tp / (tp + fp), ``f1`` and
    ``exact`` (share of figures with fp = fn = 0). A ratio with nothing to count (no true or
    no predicted box at all) is 1.0."""
    results = list(results)
    tp = sum(r[0] for r in results)
    fp = sum(r[1] for r in results)
    fn = sum(r[2] for r in results)
    recall = tp / (tp + fn) if tp + fn else 1.0
    precision = tp / (tp + fp) if tp + fp else 1.0
    f1 = 2 * recall * precision / (recall + precision) if recall + precision else 0.0
    exact = sum(1 for r in results if r[1] == 0 and r[2] == 0) / len(results) if results else 1.0
    return {
        "figures": len(results),
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "recall": round(recall, 4),
        "precision": round(precision, 4),
        "f1": round(f1, 4),
        "exact": round(exact, 4),
    }


def load_eval_set(path: str | Path, root: str | Path) -> list[dict]:
    """The hand-boxed figures of ``boxes.json``: dicts with ``path`` (under ``root``), ``width``,
    ``height``, ``boxes`` and ``labels``."""
    data = json.loads(Path(path).read_text())
    out = []
    for fig in data["figures"]:
        out.append(
            {
                "file": fig["file"],
                "path": Path(root) / fig["file"],
                "width": fig["width"],
                "height": fig["height"],
                "boxes": [tuple(p["box"]) for p in fig["panels"]],
                "labels": [p["label"] for p in fig["panels"]],
            }
        )
    return out


def load_eval_figures(
    boxes: str | Path | None, figure_files: Iterable[str | Path], root: str | Path, split: str | None = None
) -> list[dict]:
    """The evaluation set: the figures of ``boxes.json`` (all ``tune``, compound, no caption)
    and of the annotators' ``figures-*.json`` files (``sample/panels/eval/README.md``), one
    entry per image file (an annotator's entry replaces the ``boxes.json`` one), entries of
    ``kind: skip`` left out. ``split``: only that split ("tune", "holdout"), None for all.

    Each entry: ``file``, ``path``, ``split``, ``kind`` (single/compound), ``width``,
    ``height``, ``boxes``, ``labels``, ``caption`` (None when unknown), ``phrases``,
    ``shared``, ``no_panel``, ``content``, ``label_position``."""
    out: dict[str, dict] = {}
    if boxes is not None:
        for fig in load_eval_set(boxes, root):
            out[fig["file"]] = {
                **fig,
                "split": "tune",
                "kind": "compound" if len(fig["boxes"]) > 1 else "single",
                "caption": None,
                "phrases": {},
                "shared": [],
                "no_panel": [],
                "content": None,
                "label_position": None,
            }
    for path in figure_files:
        for fig in json.loads(Path(path).read_text("utf-8")):
            if split is not None and fig.get("split") != split:
                continue
            if fig.get("kind") not in ("single", "compound"):
                continue
            out[fig["file"]] = {
                "file": fig["file"],
                "path": Path(root) / fig["file"],
                "split": fig["split"],
                "kind": fig["kind"],
                "width": fig["width"],
                "height": fig["height"],
                "boxes": [tuple(p["box"]) for p in fig["panels"]],
                "labels": [p.get("label") for p in fig["panels"]],
                "caption": fig.get("caption"),
                "phrases": fig.get("phrases") or {},
                "shared": fig.get("shared") or [],
                "no_panel": fig.get("no_panel") or [],
                "content": fig.get("content"),
                "label_position": fig.get("label_position"),
            }
    return [f for f in out.values() if split is None or f["split"] == split]


def imageclef_correct(pred: Sequence[Box], truth: Sequence[Box], iou_over: float = 0.66) -> int:
    """Predictions matched one to one to true boxes with IoU > ``iou_over`` (ImageCLEF 2016
    compound figure separation counts a predicted panel correct above 0.66)."""
    if not pred or not truth:
        return 0
    from scipy.optimize import linear_sum_assignment

    m = np.array([[iou(p, t) for t in truth] for p in pred])
    weight = np.where(m > iou_over, 1.0 + m, 0.0)
    rows, cols = linear_sum_assignment(weight, maximize=True)
    return int(sum(1 for i, j in zip(rows, cols, strict=True) if weight[i, j] > 0))


def _matches(pred: Sequence[Box], truth: Sequence[Box], iou_min: float = 0.5) -> dict[int, int]:
    """truth index -> prediction index for the one-to-one matching of ``match_at_iou``."""
    if not pred or not truth:
        return {}
    from scipy.optimize import linear_sum_assignment

    m = np.array([[iou(p, t) for t in truth] for p in pred])
    weight = np.where(m >= iou_min, 1.0 + m, 0.0)
    rows, cols = linear_sum_assignment(weight, maximize=True)
    return {int(j): int(i) for i, j in zip(rows, cols, strict=True) if weight[i, j] > 0}


def _phrase_in(phrase: str, text: str | None) -> bool:
    from pipelines.text.captions import normalize_caption

    return bool(text) and normalize_caption(phrase) in normalize_caption(text)


def score_figures(figures: Sequence[dict], predictions: Sequence[Sequence], pair=None) -> dict:
    """Every quality measure of one method over figures (``load_eval_figures`` entries) and
    its predictions (lists of ``Panel``, same order):

    * ``recall``/``precision``/``f1``/``exact`` at IoU >= 0.5 (``recall_precision``);
    * ``imageclef_accuracy``: per figure, predictions correct at IoU > 0.66 / max(true,
      predicted), averaged over figures;
    * ``single_whole``: single-panel figures predicted as one panel matching the truth;
    * ``count_exact``: figures with as many predicted panels as true ones (all, compound);
    * ``labels_read``: true panels with a printed label whose matched prediction carries that
      label as printed (``labels_read_casefold``: ignoring case);
    * ``panel_text``: end to end, true panels with caption phrases whose matched prediction's
      assigned text (``pair(panels, caption)`` -> texts, the stage's pairing) contains each of
      its phrases and none of another panel's.
    """
    results, clef, singles, counts, compound_counts = [], [], [], [], []
    labelled = read = read_fold = 0
    text_total = text_ok = 0
    for fig, pred in zip(figures, predictions, strict=True):
        boxes = [p.box for p in pred]
        truth = fig["boxes"]
        results.append(match_at_iou(boxes, truth, 0.5))
        clef.append(imageclef_correct(boxes, truth) / max(len(truth), len(boxes), 1))
        counts.append(len(boxes) == len(truth))
        matched = _matches(boxes, truth)
        if fig["kind"] == "single":
            singles.append(len(boxes) == 1 and 0 in matched)
        else:
            compound_counts.append(len(boxes) == len(truth))
        for t, label in enumerate(fig["labels"]):
            if not label:
                continue
            labelled += 1
            got = pred[matched[t]].label if t in matched else None
            read += got == label
            read_fold += got is not None and got.casefold() == label.casefold()
        phrases = {k.casefold(): v for k, v in (fig.get("phrases") or {}).items()}
        if pair is None or fig.get("caption") is None or not phrases:
            continue
        texts = pair(list(pred), fig["caption"])
        for t, label in enumerate(fig["labels"]):
            own = phrases.get((label or "").casefold())
            if not own:
                continue
            text_total += 1
            if t not in matched:
                continue
            text = texts[matched[t]]
            others = [p for k, v in phrases.items() if k != label.casefold() for p in v]
            text_ok += all(_phrase_in(p, text) for p in own) and not any(_phrase_in(p, text) for p in others)
    out = recall_precision(results)
    out.update(
        {
            "imageclef_accuracy": round(float(np.mean(clef)), 4) if clef else None,
            "single_figures": len(singles),
            "single_whole": round(sum(singles) / len(singles), 4) if singles else None,
            "count_exact": round(sum(counts) / len(counts), 4) if counts else None,
            "count_exact_compound": round(sum(compound_counts) / len(compound_counts), 4) if compound_counts else None,
            "labelled_panels": labelled,
            "labels_read": round(read / labelled, 4) if labelled else None,
            "labels_read_casefold": round(read_fold / labelled, 4) if labelled else None,
            "panel_text_panels": text_total,
            "panel_text": round(text_ok / text_total, 4) if text_total else None,
        }
    )
    return out


def _inside(label, box: Box, margin: float) -> bool:
    cx, cy = (label.box[0] + label.box[2]) / 2, (label.box[1] + label.box[3]) / 2
    return box[0] - margin <= cx <= box[2] + margin and box[1] - margin <= cy <= box[3] + margin


def label_reading(figures: Sequence[dict], found: Sequence[Sequence]) -> dict:
    """Printed labels read against the truth, whatever the panels: ``recall`` = true labelled
    panels with a label of the same text (as printed) read inside their box grown by
    ``LABEL_MARGIN`` of the figure's longest side (labels are printed just outside a panel,
    too); ``precision`` = labels read that sit so in a true panel with that label."""
    panels = hits = read = right = 0
    for fig, labels in zip(figures, found, strict=True):
        m = LABEL_MARGIN * max(fig["width"], fig["height"])
        truth = [(box, label) for box, label in zip(fig["boxes"], fig["labels"], strict=True) if label]

        panels += len(truth)
        hits += sum(1 for box, label in truth if any(lab.text == label and _inside(lab, box, m) for lab in labels))
        read += len(labels)
        right += sum(1 for lab in labels if any(lab.text == label and _inside(lab, box, m) for box, label in truth))
    return {
        "labelled_panels": panels,
        "labels_read": read,
        "recall": round(hits / panels, 4) if panels else None,
        "precision": round(right / read, 4) if read else None,
    }
