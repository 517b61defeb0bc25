"""COCO mAP for panel detection (pycocotools), and a detector evaluated on a COCO-format folder.

A COCO folder is ``images/`` plus ``annotations.json``: ``images`` [{id, file_name, width,
height}], ``annotations`` [{id, image_id, category_id (1 = panel, 2 = panel_label), bbox
[x, y, w, h] in absolute pixels, area, iscrowd}], optionally ``categories``. It may be a local
path or an fsspec URL.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json

import numpy as np

CATEGORIES = [{"id": 1, "name": "panel"}, {"id": 2, "name": "panel_label"}]


def coco_map(gt: dict, detections: list[dict], category_ids: list[int] | None = None) -> dict:
    """mAP@[.50:.95], mAP@.50 and mAP@.75 of ``detections`` ([{image_id, category_id, bbox
    [x, y, w, h], score}]) against the COCO ground truth ``gt``, by pycocotools' COCOeval
    (bbox, 101-point interpolation, averaged over the categories that have ground truth).
    ``category_ids`` restricts the evaluation (e.g. [1] for panels only). No detections -> 0."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    gt = copy.deepcopy(gt)
    gt.setdefault("categories", CATEGORIES)
    gt.setdefault("info", {})
    for ann in gt.get("annotations", []):
        ann.setdefault("iscrowd", 0)
        ann.setdefault("area", float(ann["bbox"][2] * ann["bbox"][3]))
    present = sorted({a["category_id"] for a in gt.get("annotations", [])})
    cats = [c for c in (category_ids or present) if c in present]
    if not cats:
        return {"map": float("nan"), "map_50": float("nan"), "map_75": float("nan")}
    dets = [d for d in detections if d["category_id"] in cats]
    if not dets:
        return {"map": 0.0, "map_50": 0.0, "map_75": 0.0}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
        coco_gt = COCO()
        coco_gt.dataset = gt
        coco_gt.createIndex()
        coco_dt = coco_gt.loadRes([{**d, "bbox": [float(v) for v in d["bbox"]]} for d in dets])
        evaluator = COCOeval(coco_gt, coco_dt, "bbox")
        evaluator.params.catIds = cats
        evaluator.params.maxDets = [1, 10, 100]
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    stats = evaluator.stats
    return {"map": float(stats[0]), "map_50": float(stats[1]), "map_75": float(stats[2])}


def read_coco(coco_dir: str) -> tuple[dict, object, str]:
    """(annotations dict, fsspec filesystem, root path) of a COCO folder."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(str(coco_dir))
    with fs.open(f"{root.rstrip('/')}/annotations.json", "rb") as fh:
        return json.load(fh), fs, root.rstrip("/")


def detections_to_coco(image_id: int, found) -> list[dict]:
    """One figure's :class:`Detections` as COCO result rows (panels category 1, labels 2)."""
    rows = []
    for category, boxes in ((1, found.panels), (2, found.label_boxes)):
        for p in boxes:
            x1, y1, x2, y2 = p.box
            rows.append(
                {"image_id": image_id, "category_id": category, "bbox": [x1, y1, x2 - x1, y2 - y1], "score": p.score}
            )
    return rows


def evaluate_detector(detector, coco_dir: str, batch_size: int = 8, threshold: float = 0.0) -> dict:
    """Run ``detector`` (a :class:`Detector`, or a :class:`DetectorConfig` to load) on every
    image of a COCO folder and return ``coco_map`` for panels, plus ``map_panel_label`` when the
    model has the glyph class and the folder has labels, and the image count. The score
    threshold is lowered to ``threshold`` for the evaluation (mAP ranks by score)."""
    from dataclasses import replace

    from pipelines.images.decode import decode_image
    from pipelines.panels.detector import Detector, DetectorConfig

    if isinstance(detector, DetectorConfig):
        detector = Detector(detector)
    original = detector.config
    detector.config = replace(original, threshold=threshold)
    gt, fs, root = read_coco(coco_dir)
    detections: list[dict] = []
    try:
        images = gt["images"]
        for start in range(0, len(images), batch_size):
            chunk, decoded = images[start : start + batch_size], []
            for info in chunk:
                with fs.open(f"{root}/images/{info['file_name']}", "rb") as fh:
                    image, error = decode_image(fh.read())
                if image is None:
                    raise ValueError(f"{info['file_name']}: {error}")
                decoded.append(image)
            for info, found in zip(chunk, detector.detect(decoded, batch_size), strict=True):
                detections += detections_to_coco(info["id"], found)
    finally:
        detector.config = original
    metrics = coco_map(gt, detections, [1])
    if original.labels == 2 and any(a["category_id"] == 2 for a in gt.get("annotations", [])):
        metrics["map_panel_label"] = coco_map(gt, detections, [2])["map"]
    metrics["images"] = len(gt["images"])
    return {k: (round(v, 6) if isinstance(v, float) and np.isfinite(v) else v) for k, v in metrics.items()}
