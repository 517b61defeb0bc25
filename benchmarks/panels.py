"""Panel splitting: speed (figures per second per core, decode included) and recall/precision at
IoU >= 0.5 on the hand-boxed real evaluation set, one entry per method.

Figures: the 20 hand-boxed figures of ``sample/panels/boxes.json`` (10 from PMC7003341,
10 from the bundled sample) for quality; for speed those plus every figure image of the sample
(``sample/articles/FIGURES.csv`` rows in a ``fig`` context, and ``sample/images``), each file
once. Speed is CPU time of this process (``time.process_time``) for reading the bytes,
``prepare_image`` (decode, mode conversion) and the method, so figures/s per core =
figures / CPU seconds; wall time is reported too. One warm-up pass is not timed.

    python -m benchmarks.panels [--methods xycut detr consensus trained_detr] [--repeat 3]
        [--detector-repeat 1] [--steps 150] [--synthetic 240] [--holdout] [--external-dir DIR]

Methods (``methods.<name>`` in ``benchmarks/results/panels.json``; entries of methods not run
this time are kept), the named speed baseline being ``xycut`` (``speed_vs_xycut`` = a method's
figures/s per core over xycut's, same run):

* ``xycut``: the weight-free layout splitter (``METHODS``).
* ``detr``: the tiny synthetic DAB-DETR (``DetectorConfig(synthetic=True)``: **random weights**,
  seed 0), pipeline defaults (800 px, threshold 0.5), its boxes through ``finalize`` as in the
  stage. ``detr@0.0``: the same at threshold 0.0, run when 0.5 finds no panel at all.
* ``consensus`` (and ``consensus@0.0``): what the panels stage keeps per figure: xycut, then
  the detector when ``stages.needs_detector`` says so (no concept label, no caption here: when
  xycut finds two panels or more), then ``stages.choose`` with
  ``PanelSettings(detector=..., prefer="xycut")`` (a random detector is never preferred).
* ``trained_detr`` (and ``trained_detr@0.0``, ``trained_consensus``): the tiny DAB-DETR trained
  in this run (``train.train``, ``--steps`` steps on the CPU, 480 px) on a synthetic COCO set
  written by ``synthetic.write_coco_dataset`` from the sample's figures marked ``single`` in
  ``FIGURES.csv`` (none of them in the evaluation set). Tiny model, few steps: not a quality
  claim; the published Open-PMC-18M weights cannot be downloaded here.

Detector speed is measured once over the speed figures (``--detector-repeat``) after a warm-up
on 8 of them. mAP on the synthetic val split: ``coco_eval.evaluate_detector`` (raw detections,
threshold 0.0) for detector methods; for xycut and consensus their final panels (score 1.0 for
xycut, the pair IoU for consensus panels) through ``coco_eval.coco_map``. Caption splitting:
``captions.caption_agreement`` on ``tests/data/caption_splits.json`` (hand-split captions).
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable, Collection
from dataclasses import replace
from pathlib import Path

from PIL import Image

from benchmarks.record import write_results
from pipelines.core.panel_methods import XYCUT
from pipelines.images.boxes import Panel, scale_boxes
from pipelines.panels.evaluate import (
    label_reading,
    load_eval_figures,
    load_eval_set,
    match_at_iou,
    recall_precision,
    score_figures,
)
from pipelines.panels.inputs import prepare_image
from pipelines.panels.layout import split_panels
from pipelines.parse.nxml import parse_article
from pipelines.text.captions import caption_agreement, caption_of, phrase_agreement, split_caption
from pipelines.text.pairing import assign_captions
from testing.loopback.sample_mirror import SAMPLE_DIR, article_files

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results" / "panels.json"
BOXES = ROOT / "sample" / "panels" / "boxes.json"
EVAL_DIR = ROOT / "sample" / "panels" / "eval"
FIGURES_CSV = ROOT / "sample" / "articles" / "FIGURES.csv"
CAPTIONS = ROOT / "tests" / "data" / "caption_splits.json"
DETECTOR_WARMUP = 8
TRAIN_INPUT_SIZE = 480

METHODS: dict[str, Callable[[Image.Image], list[Panel]]] = {XYCUT: split_panels}
DETECTOR_METHODS = ("detr", "consensus", "trained_detr")
# figures annotated here whose images are not shipped (benchmarks/data/README.md): split -> boxes file
EXTERNAL_SETS = {
    "external": Path(__file__).parent / "data" / "figure-separator-imgs.json",
    "external2": Path(__file__).parent / "data" / "figure-separator-1830b10-imgs.json",
}
DECISION = "decision"  # the figure decision's evaluation (``figure_decision``), not a ``METHODS`` entry
# the evidence ladder: each rung adds one kind of evidence to the one before
LADDER = {
    "layout": None,
    "layout+labels": ("labels",),
    "layout+labels+caption": ("labels", "caption"),
    "decision": ("labels", "caption", "structure", "kind"),
}
OCR_ENGINES = ("tesseract", "rapidocr")


def speed_files() -> list[Path]:
    files = [Path(f["path"]) for f in load_eval_set(BOXES, ROOT)]
    with open(FIGURES_CSV, newline="") as fh:
        for row in csv.DictReader(fh):
            if row["context"] == "fig" and row["local_file"]:
                files.append(ROOT / "sample" / "articles" / row["id"] / row["local_file"])
    files += sorted((ROOT / "sample" / "images").rglob("*.jpg"))
    seen, out = set(), []
    for f in files:
        key = f.resolve()
        if key not in seen and f.exists():
            seen.add(key)
            out.append(f)
    return out


def run_one(method, data: bytes) -> list[Panel]:
    image, width, height = prepare_image(data)
    panels = method(image)
    scale_boxes([p.box for p in panels], image.size, width, height)
    return panels


def speed(method, blobs: list[bytes], repeat: int, warmup: int | None = None) -> dict:
    for data in blobs[:warmup]:  # warm-up (every figure unless ``warmup`` says how many)
        run_one(method, data)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    panels = 0
    for _ in range(repeat):
        for data in blobs:
            panels += len(run_one(method, data))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    n = len(blobs) * repeat
    return {
        "figures": len(blobs),
        "repeat": repeat,
        "cpu_seconds": round(cpu, 3),
        "wall_seconds": round(wall, 3),
        "figures_per_second_per_core": round(n / cpu, 1),
        "ms_per_figure_cpu": round(1000 * cpu / n, 2),
        "panels_per_figure": round(panels / n, 2),
    }


def quality(method) -> dict:
    per_subset: dict[str, list] = {"PMC7003341": [], "sample": [], "all": []}
    for fig in load_eval_set(BOXES, ROOT):
        panels = run_one(method, Path(fig["path"]).read_bytes())
        result = match_at_iou([p.box for p in panels], fig["boxes"], 0.5)
        per_subset["all"].append(result)
        per_subset["PMC7003341" if "PMC7003341" in fig["file"] else "sample"].append(result)
    return {name: recall_precision(results) for name, results in per_subset.items()}


# ---- detector-based methods ----------------------------------------------------------------


class DetrMethod:
    """The detector on one figure, its boxes through ``finalize`` as the panels stage does."""

    def __init__(self, detector):
        self.detector = detector

    def __call__(self, image: Image.Image) -> list[Panel]:
        from pipelines.images.boxes import finalize

        found = self.detector.detect([image], 1)[0]
        labels = [(b.box, b.label) for b in found.label_boxes if b.label]
        return finalize(found.panels, image.width, image.height, labels)


class ConsensusMethod:
    """What the panels stage keeps for a figure: xycut; the detector when ``needs_detector``
    says so (no concept label and no caption in this benchmark); then ``choose``."""

    def __init__(self, detector, prefer: str = XYCUT):
        from pipelines.panels.stages import PanelSettings

        self.detr = DetrMethod(detector)
        self.settings = PanelSettings(detector=detector.config, prefer=prefer)
        self.sent = self.figures = 0
        self.kept: dict[str, int] = {}

    def __call__(self, image: Image.Image) -> list[Panel]:
        from pipelines.panels.stages import choose, needs_detector

        xycut = split_panels(image)
        detr = self.detr(image) if needs_detector(None, len(xycut), 0) else None
        method, panels, _ = choose(xycut, detr, self.settings)
        self.figures += 1
        self.sent += detr is not None
        self.kept[method] = self.kept.get(method, 0) + 1
        return panels

    def counts(self) -> dict:
        """Over the quality pass only (reset before it)."""
        return {"figures": self.figures, "sent_to_detector": self.sent, "method_kept": dict(sorted(self.kept.items()))}


def synthetic_map(method, val_dir: Path) -> dict:
    """COCO mAP of a method's final panels (category panel) on a COCO folder."""
    from pipelines.panels.coco_eval import coco_map

    gt = json.loads((val_dir / "annotations.json").read_text())
    detections = []
    for info in gt["images"]:
        for p in run_one(method, (val_dir / "images" / info["file_name"]).read_bytes()):
            x1, y1, x2, y2 = p.box
            detections.append(
                {"image_id": info["id"], "category_id": 1, "bbox": [x1, y1, x2 - x1, y2 - y1], "score": p.score}
            )
    return {k: round(v, 6) for k, v in coco_map(gt, detections, [1]).items()}


def synthetic_sources() -> list:
    """The sample's figure images marked ``single`` in FIGURES.csv (figure contexts), none of
    them in the evaluation set, as ``SourcePanel``s."""
    from pipelines.panels.synthetic import SourcePanel

    evaluated = {Path(f["path"]).resolve() for f in load_eval_set(BOXES, ROOT)}
    out = []
    with open(FIGURES_CSV, newline="") as fh:
        for row in csv.DictReader(fh):
            if not (row["context"].startswith("fig") and row["layout_observed"] == "single" and row["local_file"]):
                continue
            path = ROOT / "sample" / "articles" / row["id"] / row["local_file"]
            if path.exists() and path.resolve() not in evaluated:
                out.append(SourcePanel(key=f"{row['id']}/{row['local_file']}", image=path.read_bytes()))
    return out


def synthetic_set(workdir: Path, n: int) -> tuple[dict, Path]:
    """(summary, val folder) of ``n`` synthetic figures (20% val) written under ``workdir/coco``."""
    from pipelines.panels.synthetic import write_coco_dataset

    sources = synthetic_sources()
    summary = write_coco_dataset(workdir / "coco", sources, n=n, seed=0, split=0.2)
    return {
        "sources": "sample/articles figure images marked 'single' in FIGURES.csv (figure contexts), "
        "none in the evaluation set",
        "source_images": len(sources),
        "seed": 0,
        "images": {k: v["images"] for k, v in summary["splits"].items()},
        "panels": {k: v["panels"] for k, v in summary["splits"].items()},
        "sources_per_split": {k: v["sources"] for k, v in summary["splits"].items()},
        "dedup": summary["dedup"],
        "seconds": summary["seconds"],
    }, workdir / "coco" / "val"


def train_tiny(workdir: Path, steps: int, batch_size: int) -> dict:
    """The training report: the tiny DAB-DETR from its seed-0 random weights (the ``detr``
    method's), ``steps`` steps on the CPU on ``workdir/coco/train``."""
    from pipelines.panels.detector import DetectorConfig
    from pipelines.panels.train import TrainConfig, train

    config = TrainConfig(
        train_dir=str(workdir / "coco" / "train"),
        val_dir=str(workdir / "coco" / "val"),
        output_dir=str(workdir / "run"),
        steps=steps,
        batch_size=batch_size,
        lr=2e-4,
        warmup_steps=10,
        log_every=10,
        checkpoint_every=steps,
        keep_checkpoints=1,
        seed=0,
        device="cpu",
        detector=DetectorConfig(synthetic=True, input_size=TRAIN_INPUT_SIZE),
    )
    report = train(config)
    metrics = [json.loads(line) for line in (workdir / "run" / "metrics.jsonl").read_text().splitlines()]
    report["loss_curve"] = [(m["step"], m["loss"]) for m in metrics if m.get("kind") == "train"]
    report["config"] = {k: v for k, v in config.to_dict().items() if k not in ("train_dir", "val_dir", "output_dir")}
    return report


def captions() -> dict:
    cases = json.loads(CAPTIONS.read_text("utf-8"))["cases"]
    out = {"file": str(CAPTIONS.relative_to(ROOT)), "all": caption_agreement(cases)}
    for source in sorted({c.get("source", "?") for c in cases}):
        out[source] = caption_agreement([c for c in cases if c.get("source", "?") == source])
    for result in out.values():
        if isinstance(result, dict):
            for key in ("exact_label", "text"):
                if isinstance(result.get(key), float):
                    result[key] = round(result[key], 4)
    return out


# ---- the figure decision -------------------------------------------------------------------


def pair_texts(panels: list[Panel], caption: str) -> list[str | None]:
    """Each panel's caption text as the panels stage pairs them (``pairing.assign_captions``)."""
    return [row["text"] for row in assign_captions(panels, split_caption(caption))]


def eval_figures(files: list[Path], split: str) -> list[dict]:
    """The evaluation figures of ``split`` whose images are here. The hand-boxed sample figures
    of ``boxes.json`` carry no caption there; those of a bundled article get the caption its XML
    gives them (``article_captions``), the one the panels stage decides with."""
    figures = [f for f in load_eval_figures(BOXES, files, ROOT, split=split) if Path(f["path"]).exists()]
    for fig in figures:
        if fig["caption"] is None and fig["file"].startswith("sample/articles/"):
            fig["caption"] = article_captions(fig["file"].split("/")[2]).get(Path(fig["file"]).name)
    return figures


@functools.cache
def article_captions(folder: str) -> dict[str, str]:
    """Image file name -> caption (``captions.caption_of``) of each figure of the bundled article
    in ``sample/articles/<folder>``, parsed as the parse stage parses it."""
    xml, others = article_files(SAMPLE_DIR, {"path": f"articles/{folder}"})
    parsed = parse_article(xml.read_bytes(), files=sorted(p.name for p in others))
    return {
        name: caption_of(fig)
        for fig in parsed.figures
        for name in [*(fig["image_files"] or []), *(fig["other_renditions"] or [])]
    }


def eval_images(figures: list[dict]) -> dict[str, Image.Image]:
    """Each evaluation figure's image as the panels stage prepares it, by its ``file``."""
    images = {}
    for fig in figures:
        with Image.open(fig["path"]) as im:
            images[fig["file"]] = prepare_image(im)[0]
    return images


def article_of(fig: dict) -> str:
    """The article a figure of the evaluation set comes from (its folder under sample/articles;
    the hand-boxed PMC7003341 figures under sample/images)."""
    if fig["file"].startswith("sample/articles/"):
        return fig["file"].split("/")[2]
    return "PMC7003341" if fig["file"].startswith("sample/images/") else Path(fig["file"]).name.split("-")[0]


def decision_quality(
    figures: list[dict], images: dict, by_article: bool = False, rungs: Collection[str] = tuple(LADDER)
) -> dict:
    """Each of ``rungs`` (every rung of ``LADDER``) scored on ``figures`` (``evaluate.score_figures``), the route
    each figure took, and milliseconds of CPU per figure (decode excluded). ``by_article``: the
    decision's scores per article too (``per_article``), to see whether one article's house
    style carries the totals (tune only: the holdout is reported as a whole)."""
    from pipelines.panels.split import decide

    out = {}
    for name, evidence in LADDER.items():
        if name not in rungs:
            continue
        predictions, routes = [], {}
        cpu0 = time.process_time()
        for fig in figures:
            image = images[fig["file"]]
            if evidence is None:
                predictions.append(split_panels(image))
                continue
            decision = decide(image, fig["caption"], evidence=evidence)
            predictions.append(decision.panels)
            routes[decision.route] = routes.get(decision.route, 0) + 1
        cpu = time.process_time() - cpu0
        entry = score_figures(figures, predictions, pair_texts)
        entry["ms_per_figure_cpu"] = round(1000 * cpu / max(1, len(figures)), 1)
        if routes:
            entry["routes"] = dict(sorted(routes.items()))
        if by_article and name == DECISION:
            keys = ("figures", "recall", "precision", "imageclef_accuracy", "single_whole", "labels_read", "panel_text")
            entry["per_article"] = {}
            for article in sorted({article_of(f) for f in figures}):
                idx = [i for i, f in enumerate(figures) if article_of(f) == article]
                scores = score_figures([figures[i] for i in idx], [predictions[i] for i in idx], pair_texts)
                entry["per_article"][article] = {k: scores[k] for k in keys}
        out[name] = entry
        print(name, json.dumps(entry)[:400], flush=True)
    return out


def ocr_comparison(figures: list[dict], images: dict) -> dict:
    """Each OCR engine reading the printed labels of the labelled figures: label recall and
    precision (``evaluate.label_reading``) and CPU milliseconds per figure for the reading
    (candidates, crops, engine, sequence)."""
    import numpy as np

    from pipelines.panels.labels import get_reader, read_labels
    from pipelines.panels.layout import work_copy
    from pipelines.panels.split import caption_evidence

    labelled = [f for f in figures if any(f["labels"])]
    out: dict = {
        "figures": len(labelled),
        "labelled_panels": sum(1 for f in labelled for x in f["labels"] if x),
        "chosen": "tesseract",
        "engines": {},
    }
    for engine in OCR_ENGINES:
        try:
            reader = get_reader(engine)
        except (ImportError, RuntimeError) as exc:
            out["engines"][engine] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        found = []
        read_labels(images[labelled[0]["file"]], np.asarray(work_copy(images[labelled[0]["file"]])), reader)  # warm-up
        cpu0 = time.process_time()
        crops = 0
        for fig in labelled:
            image = images[fig["file"]]
            caption = caption_evidence(fig["caption"])[0] if fig["caption"] is not None else None
            reading = read_labels(image, np.asarray(work_copy(image)), reader, caption)
            found.append(reading.labels)
            crops += reading.read
        cpu = time.process_time() - cpu0
        entry = label_reading(labelled, found)
        entry["ms_per_figure_cpu"] = round(1000 * cpu / len(labelled), 1)
        entry["crops_per_figure"] = round(crops / len(labelled), 1)
        out["engines"][engine] = entry
        print("ocr", engine, json.dumps(entry), flush=True)
    return out


def decision_speed(figures: list[dict], repeat: int) -> dict:
    """Figures per second per core of the figure decision (OCR included) against the layout
    splitter alone, in the same run on the same figures: CPU time of this process for reading
    the bytes, ``prepare_image`` and the method (``split.figure_decision`` for the decision,
    with the figure's caption). One untimed warm-up pass each; then the two methods take turns,
    one pass each per repeat, so that the shared machine's drift in speed falls on both."""
    from pipelines.panels.labels import get_reader
    from pipelines.panels.split import figure_decision

    reader = get_reader()
    blobs = [(Path(f["path"]).read_bytes(), f["caption"]) for f in figures]

    def decision(data: bytes, caption: str | None) -> int:
        return len(figure_decision(data, caption, reader=reader).panels)

    def layout(data: bytes, caption: str | None) -> int:
        return len(run_one(split_panels, data))

    out: dict = {"figures": len(blobs), "repeat": repeat}
    methods = {"xycut": layout, "decision": decision}
    spent = {name: [0.0, 0.0] for name in methods}
    for method in methods.values():
        for data, caption in blobs:
            method(data, caption)
    for _ in range(repeat):
        for name, method in methods.items():
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for data, caption in blobs:
                method(data, caption)
            spent[name][0] += time.process_time() - cpu0
            spent[name][1] += time.perf_counter() - wall0
    n = len(blobs) * repeat
    for name, (cpu, wall) in spent.items():
        out[name] = {
            "cpu_seconds": round(cpu, 3),
            "wall_seconds": round(wall, 3),
            "figures_per_second_per_core": round(n / cpu, 2),
            "ms_per_figure_cpu": round(1000 * cpu / n, 1),
        }
    out["decision_vs_xycut"] = round(
        out["decision"]["figures_per_second_per_core"] / out["xycut"]["figures_per_second_per_core"], 4
    )
    out["goal_figures_per_second_per_core"] = 10
    print("speed", json.dumps(out), flush=True)
    return out


def figure_decision(files: list[Path], splits: list[str], repeat: int, external: dict[str, Path] | None = None) -> dict:
    """The figure decision on the evaluation set (``sample/panels/eval``): the evidence ladder
    per split, the OCR engines on tune, and speed against the layout splitter. ``external``:
    split name (``EXTERNAL_SETS``) -> the folder holding its images, figures annotated here
    whose images are not shipped (``benchmarks/data/README.md``); where a set marks some figures
    ``check: held`` (kept unseen while its other figures were read for misses), the decision is
    also scored on each part."""
    out: dict = {
        "eval_files": [str(Path(f).relative_to(ROOT)) if Path(f).is_relative_to(ROOT) else str(f) for f in files],
        "boxes": str(BOXES.relative_to(ROOT)),
        "splits": {},
    }
    external = external or {}
    for split in [*splits, *external]:
        if split in external:
            figures = [
                f for f in load_eval_figures(None, [EXTERNAL_SETS[split]], external[split]) if Path(f["path"]).exists()
            ]
        else:
            figures = eval_figures(files, split)
        images = eval_images(figures)
        summary = {
            "figures": len(figures),
            "single": sum(f["kind"] == "single" for f in figures),
            "compound": sum(f["kind"] == "compound" for f in figures),
            "panels": sum(len(f["boxes"]) for f in figures),
            "labelled_panels": sum(1 for f in figures for x in f["labels"] if x),
            "with_caption": sum(f["caption"] is not None for f in figures),
            "articles": len({article_of(f) for f in figures}),
        }
        print(split, json.dumps(summary), flush=True)
        entry = {
            "set": summary,
            # a figure's "labels" are those printed on its panels, not the caption's: left out
            "captions": phrase_agreement(
                [{k: v for k, v in f.items() if k != "labels"} for f in figures if f["caption"] is not None]
            ).get(split),
            "methods": decision_quality(figures, images, by_article=split == "tune"),
        }
        if split == "tune":
            entry["ocr"] = ocr_comparison(figures, images)
        if split in external:
            checks = {f["file"]: f.get("check") for f in json.loads(EXTERNAL_SETS[split].read_text("utf-8"))}
            parts = sorted({c for c in checks.values() if c})
            if parts:
                entry["parts"] = {
                    part: decision_quality(
                        [f for f in figures if checks.get(f["file"]) == part], images, rungs=(DECISION,)
                    )[DECISION]
                    for part in parts
                }
        out["splits"][split] = entry
    speed_set = [f for split in splits for f in eval_figures(files, split)]
    out["speed"] = decision_speed(speed_set, repeat)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=[*METHODS, DECISION, *DETECTOR_METHODS])
    parser.add_argument(
        "--eval-files",
        nargs="+",
        type=Path,
        default=None,
        help="the annotators' figures-*.json (default: sample/panels/eval/figures-*.json)",
    )
    parser.add_argument(
        "--holdout", action="store_true", help="also score the holdout split (once, when the method is final)"
    )
    parser.add_argument(
        "--external-dir",
        type=Path,
        default=None,
        help="a folder holding apple2373/figure-separator's imgs/ (benchmarks/data/README.md): score them too",
    )
    parser.add_argument(
        "--external2-dir",
        type=Path,
        default=None,
        help="a folder holding the imgs/ of dainini/figure-separator at commit 1830b10 (benchmarks/data/README.md)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed passes for weight-free methods")
    parser.add_argument("--detector-repeat", type=int, default=1, help="timed passes for detector methods")
    parser.add_argument("--steps", type=int, default=150, help="training steps of trained_detr")
    parser.add_argument("--batch-size", type=int, default=4, help="training batch of trained_detr")
    parser.add_argument("--synthetic", type=int, default=240, help="synthetic figures (train + val, 20%% val)")
    args = parser.parse_args()
    import torch

    from pipelines.panels.coco_eval import evaluate_detector
    from pipelines.panels.detector import Detector, DetectorConfig

    torch.set_num_threads(os.cpu_count() or 1)
    began = time.perf_counter()
    files = speed_files()
    blobs = [f.read_bytes() for f in files]
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    result = {
        "benchmark": "panel splitting: figures/s per core (CPU time, decode included) and "
        "recall/precision at IoU >= 0.5 on the hand-boxed eval set; mAP on synthetic val; caption agreement",
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "pillow": Image.__version__,
        "torch": torch.__version__,
        "speed_figures": len(files),
        "speed_megapixels": round(sum(Image.open(f).size[0] * Image.open(f).size[1] for f in files) / 1e6, 1),
        "eval_set": str(BOXES.relative_to(ROOT)),
        "speed_baseline": XYCUT,
        "methods": dict(previous.get("methods", {})),
    }
    for key in ("synthetic_val", "trained_detector", "captions", "figure_decision"):
        if key in previous:
            result[key] = previous[key]
    if DECISION in args.methods:
        files = args.eval_files or sorted(EVAL_DIR.glob("figures-*.json"))
        splits = ["tune", "holdout"] if args.holdout else ["tune"]
        dirs = {"external": args.external_dir, "external2": args.external2_dir}
        external = {split: folder for split, folder in dirs.items() if folder is not None}
        decided = figure_decision(files, splits, args.repeat, external)
        kept = result.get("figure_decision", {}).get("splits", {})
        result["figure_decision"] = {**decided, "splits": {**kept, **decided["splits"]}}

    def record(name: str, method, repeat: int, warmup: int | None, **meta) -> dict:
        entry = {**meta, "speed": speed(method, blobs, repeat, warmup)}
        if isinstance(method, ConsensusMethod):
            method.sent = method.figures = 0
            method.kept = {}
        entry["iou_0.5"] = quality(method)
        if isinstance(method, ConsensusMethod):
            entry["eval_set_routing"] = method.counts()
        result["methods"][name] = entry
        print(name, json.dumps({k: v for k, v in entry.items() if k != "speed"})[:300], flush=True)
        return entry

    def detector_entries(prefix: str, config: DetectorConfig, **meta) -> list[tuple[str, Detector]]:
        """``prefix`` (threshold as configured) and, when that finds no panel on the eval set,
        ``prefix@0.0``, with their detectors."""
        detector = Detector(config)
        common = {"model": meta.pop("label", config.model_label), "input_size": config.input_size, **meta}
        entry = record(
            prefix, DetrMethod(detector), args.detector_repeat, DETECTOR_WARMUP, threshold=config.threshold, **common
        )
        out = [(prefix, detector)]
        if entry["iou_0.5"]["all"]["tp"] + entry["iou_0.5"]["all"]["fp"] == 0 and config.threshold > 0:
            zero = Detector(replace(config, threshold=0.0), model=detector.model)
            why = f"{prefix} at threshold {config.threshold} found no panel on the eval set"
            zero_meta = {**common, "note": f"{common['note']}; {why}" if common.get("note") else why}
            record(f"{prefix}@0.0", DetrMethod(zero), args.detector_repeat, DETECTOR_WARMUP, threshold=0.0, **zero_meta)
            out.append((f"{prefix}@0.0", zero))
        return out

    with tempfile.TemporaryDirectory() as tmp:
        val_dir = None
        if any(m in args.methods for m in DETECTOR_METHODS):
            result["synthetic_val"], val_dir = synthetic_set(Path(tmp), args.synthetic)
        maps: dict[str, dict] = {}
        if XYCUT in args.methods:
            record(XYCUT, METHODS[XYCUT], args.repeat, None)
        if val_dir is not None:
            maps[XYCUT] = synthetic_map(METHODS[XYCUT], val_dir)
        random_note = "tiny synthetic DAB-DETR, random weights (seed 0): not a quality claim"
        random_cfg = DetectorConfig(synthetic=True)
        zero_run = False
        if "detr" in args.methods:
            for name, detector in detector_entries("detr", random_cfg, random_weights=True, note=random_note):
                maps[name] = evaluate_detector(detector, str(val_dir))
                zero_run |= name.endswith("@0.0")
        if "consensus" in args.methods:
            for threshold in (random_cfg.threshold, 0.0) if zero_run else (random_cfg.threshold,):
                name = "consensus" if threshold == random_cfg.threshold else f"consensus@{threshold}"
                method = ConsensusMethod(Detector(replace(random_cfg, threshold=threshold)))
                meta = {
                    "random_weights": True,
                    "threshold": threshold,
                    "prefer": XYCUT,
                    "note": "xycut + " + random_note,
                }
                record(name, method, args.detector_repeat, DETECTOR_WARMUP, **meta)
                if val_dir is not None:
                    maps[name] = synthetic_map(method, val_dir)
        if "trained_detr" in args.methods:
            report = train_tiny(Path(tmp), args.steps, args.batch_size)
            trained_cfg = DetectorConfig(model=report["model_dir"], input_size=TRAIN_INPUT_SIZE)
            note = f"tiny model, {report['steps']} steps on CPU: not a quality claim"
            untrained = Detector(replace(random_cfg, input_size=TRAIN_INPUT_SIZE))
            report["untrained_map_synthetic_val"] = evaluate_detector(untrained, str(val_dir))
            for name, detector in detector_entries(
                "trained_detr",
                trained_cfg,
                label=f"synthetic-tiny-dab-detr trained {report['steps']} steps (this run)",
                random_weights=False,
                trained_steps=report["steps"],
                note=note,
            ):
                maps[name] = evaluate_detector(detector, str(val_dir))
            method = ConsensusMethod(Detector(trained_cfg), prefer="detr")
            meta = {
                "random_weights": False,
                "threshold": trained_cfg.threshold,
                "prefer": "detr",
                "trained_steps": report["steps"],
                "note": note + "; xycut + the trained detector, detr preferred on disagreement",
            }
            record("trained_consensus", method, args.detector_repeat, DETECTOR_WARMUP, **meta)
            maps["trained_consensus"] = synthetic_map(method, val_dir)
            report.pop("checkpoint", None)
            report.pop("model_dir", None)
            result["trained_detector"] = report
        for name, value in maps.items():
            result["methods"][name]["map_synthetic_val"] = value
    base = result["methods"].get(XYCUT, {}).get("speed", {}).get("figures_per_second_per_core")
    for entry in result["methods"].values():
        if base:
            entry["speed_vs_xycut"] = round(entry["speed"]["figures_per_second_per_core"] / base, 4)
    result["captions"] = captions()
    result["seconds_total"] = round(time.perf_counter() - began, 1)
    write_results(RESULTS, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
