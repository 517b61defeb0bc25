"""The release gate's cost per crop (``pipelines/images/gate.py``), against its distance transform.

The gate measures every crop of every released panel (``panel_crops``, ``pair_samples``). Its
filled-area test asks which ink pixels lie more than ``thick_px`` inside the ink: once a Euclidean
distance transform of the whole work copy (``scipy.ndimage.distance_transform_edt``), now an
erosion by the disc of that radius (``gate.farther_than``, OpenCV), which marks the same pixels.
The crops are the hand-boxed panels of the tune and holdout splits of ``sample/panels/eval`` (real
figures, decoded once, outside the clock). Both ways are timed in turns, ``--rounds`` times each
(CPU time of this process; the best round of each is kept, the others only add the machine's
noise), and their measures are compared crop by crop.

    python -m benchmarks.crop_gate [--rounds 3]

Writes ``benchmarks/results/crop_gate.json``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from PIL import Image

from benchmarks.panels import EVAL_DIR, eval_figures
from benchmarks.record import write_results
from pipelines.images import gate


def _distance_transform(mask: np.ndarray, radius: float) -> np.ndarray:
    """The gate's filled-area pixels as measured before ``farther_than`` (the baseline)."""
    from scipy import ndimage

    return ndimage.distance_transform_edt(mask) > radius


def hand_boxed_crops() -> list[Image.Image]:
    """Every hand-boxed panel of the tune and holdout splits, cut from its decoded figure."""
    files = sorted(EVAL_DIR.glob("figures-*.json"))
    crops = []
    for figure in eval_figures(files, "tune") + eval_figures(files, "holdout"):
        with Image.open(figure["path"]) as image:
            image = image.convert("RGB")
            crops += [image.crop(tuple(int(v) for v in box)) for box in figure["boxes"]]
    return crops


def measure_all(crops: list[Image.Image], interior) -> tuple[float, list]:
    """CPU seconds to measure every crop with ``interior`` as the filled-area test, and the measures."""
    saved, gate.farther_than = gate.farther_than, interior
    try:
        start = time.process_time()
        measures = [gate.measure(crop) for crop in crops]
        return time.process_time() - start, measures
    finally:
        gate.farther_than = saved


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed passes of each way, in turns (default 3)")
    parser.add_argument("--out", default="crop_gate.json", help="a name under benchmarks/results, or a path")
    args = parser.parse_args(argv)

    crops = hand_boxed_crops()
    ways = {"erosion": gate.farther_than, "distance_transform": _distance_transform}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    measures: dict[str, list] = {}
    for _ in range(args.rounds):
        for name, interior in ways.items():
            took, measures[name] = measure_all(crops, interior)
            seconds[name].append(took)
    per_crop = {name: 1000 * min(times) / len(crops) for name, times in seconds.items()}
    verdicts = {name: [gate.gate_reason(m) for m in found] for name, found in measures.items()}
    result = {
        "baseline": "the same gate with its filled area from scipy's Euclidean distance transform "
        "(the code before gate.farther_than), timed in turns in the same process",
        "crops": len(crops),
        "rounds": args.rounds,
        "methods": {
            name: {
                "ms_per_crop": round(per_crop[name], 2),
                "ms_per_crop_each_round": [round(1000 * t / len(crops), 2) for t in seconds[name]],
            }
            for name in ways
        },
        "speed_vs_distance_transform": round(per_crop["distance_transform"] / per_crop["erosion"], 2),
        "identical_measures": measures["erosion"] == measures["distance_transform"],
        "identical_verdicts": verdicts["erosion"] == verdicts["distance_transform"],
        "released": sum(v is None for v in verdicts["erosion"]),
    }
    path = write_results(args.out, result)
    print(
        f"{len(crops)} crops: {per_crop['erosion']:.2f} ms each with the erosion, "
        f"{per_crop['distance_transform']:.2f} ms with the distance transform; "
        f"identical measures: {result['identical_measures']} -> {path}"
    )
    return result


if __name__ == "__main__":
    main()
