"""Panel splitting: speed (figures per second per core, decode included) and recall/precision at
IoU >= 0.5 on the hand-boxed real evaluation set, one entry per method.

Figures: the 20 hand-boxed figures of ``sample/panels/boxes.json`` (10 from PMC7003341,
10 from the bundled sample) for quality; for speed those plus every figure image of the sample
(``sample/articles/FIGURES.csv`` rows in a ``fig`` context, and ``sample/images``), each file
once. Speed is CPU time of this process (``time.process_time``) for reading the bytes,
``prepare_image`` (decode, mode conversion) and the method, so figures/s per core =
figures / CPU seconds; wall time is reported too. One warm-up pass is not timed.

    python -m benchmarks.panels [--methods xycut] [--repeat 3]

Methods are entries of ``METHODS`` (name -> function taking a PIL image, returning panels);
another method (``detr``) adds itself there. Results go to ``benchmarks/results/panels.json``
under ``methods.<name>``; entries of methods not run this time are kept.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

from PIL import Image

from pipelines.panels.evaluate import load_eval_set, match_at_iou, recall_precision
from pipelines.panels.inputs import prepare_image, scale_boxes
from pipelines.panels.layout import split_panels
from pipelines.panels.types import XYCUT, Panel

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results" / "panels.json"
BOXES = ROOT / "sample" / "panels" / "boxes.json"

METHODS: dict[str, Callable[[Image.Image], list[Panel]]] = {XYCUT: split_panels}


def speed_files() -> list[Path]:
    files = [Path(f["path"]) for f in load_eval_set(BOXES, ROOT)]
    with open(ROOT / "sample" / "articles" / "FIGURES.csv", newline="") as fh:
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


def speed(method, blobs: list[bytes], repeat: int) -> dict:
    for data in blobs:  # warm-up
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    files = speed_files()
    blobs = [f.read_bytes() for f in files]
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    result = {
        "benchmark": "panel splitting: figures/s per core (CPU time, decode included) and "
        "recall/precision at IoU >= 0.5 on the hand-boxed eval set",
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "pillow": Image.__version__,
        "speed_figures": len(files),
        "speed_megapixels": round(sum(Image.open(f).size[0] * Image.open(f).size[1] for f in files) / 1e6, 1),
        "eval_set": str(BOXES.relative_to(ROOT)),
        "methods": dict(previous.get("methods", {})),
    }
    for name in args.methods:
        method = METHODS[name]
        result["methods"][name] = {"speed": speed(method, blobs, args.repeat), "iou_0.5": quality(method)}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
