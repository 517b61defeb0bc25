"""Panel boxes against hand-drawn truth: one-to-one matching at an IoU threshold, recall and
precision over many figures, and the hand-boxed evaluation set (``sample/panels``)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from pipelines.images.boxes import Box, iou


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
