"""The figure decision on other renditions of its evaluation figures: smaller, larger, recompressed.

A figure reaches PanelForge at whatever size and compression its publisher chose: PMC's renditions
run from a few hundred pixels to several thousand, many as JPEG. The decision's rules are written
in proportions where they can be, but OCR, glyph sizes and gutters are still measured in pixels,
so its scores on the evaluation set (mostly 600 px figures in the holdout split, 1,280 px in the
tune split) say little about a figure drawn at another size. This benchmark scores
``split.decide`` (the panels stage's decision, caption evidence included) on each figure of the
tune and holdout splits of ``sample/panels/eval`` as given (prepared as the panels stage prepares
them: ``benchmarks.panels.eval_images``; the baseline, same run) and re-rendered: resized to 0.5x,
0.75x and 1.5x (Lanczos, the hand-drawn boxes scaled with it) and re-encoded as JPEG at quality
75 (the one encoder, ``pipelines/images/jpeg.py``, 4:4:4). It also counts the figures whose number
of panels changes from the one found on the figure as given. No threshold is fitted to it: it
measures how far the decision's quality depends on the rendition.

    python -m benchmarks.panel_scales

Writes ``benchmarks/results/panel_scales.json``.
"""

from __future__ import annotations

import argparse
import io
import time

from PIL import Image

from benchmarks.panels import EVAL_DIR, eval_figures, eval_images, pair_texts
from benchmarks.record import write_results
from pipelines.images.jpeg import jpeg_bytes
from pipelines.panels.evaluate import score_figures
from pipelines.panels.split import decide

RENDITIONS = ("as given", "0.5x", "0.75x", "1.5x", "JPEG q75")
KEYS = ("recall", "precision", "imageclef_accuracy", "single_whole", "count_exact", "labels_read", "panel_text")


def render(image: Image.Image, rendition: str) -> Image.Image:
    """``image`` as ``rendition`` names it."""
    if rendition.endswith("x"):
        scale = float(rendition[:-1])
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        return image.resize(size, Image.Resampling.LANCZOS)
    if rendition.startswith("JPEG q"):
        data = jpeg_bytes(image.convert("RGB"), quality=int(rendition.removeprefix("JPEG q")))
        return Image.open(io.BytesIO(data)).convert("RGB")
    return image


def scaled_truth(figure: dict, width: int, height: int) -> dict:
    """The figure's annotation in the frame of a rendition ``width`` x ``height``."""
    sx, sy = width / figure["width"], height / figure["height"]
    return {
        **figure,
        "width": width,
        "height": height,
        "boxes": [(b[0] * sx, b[1] * sy, b[2] * sx, b[3] * sy) for b in figure["boxes"]],
    }


def score_split(figures: list[dict]) -> dict:
    images = eval_images(figures)
    out, counts = {}, {}
    for rendition in RENDITIONS:
        truths, predictions = [], []
        cpu = time.process_time()
        for figure in figures:
            image = render(images[figure["file"]], rendition)
            truths.append(scaled_truth(figure, image.width, image.height))
            predictions.append(decide(image, figure["caption"]).panels)
        seconds = time.process_time() - cpu
        scores = score_figures(truths, predictions, pair_texts)
        counts[rendition] = [len(p) for p in predictions]
        out[rendition] = {
            **{key: scores.get(key) for key in KEYS},
            "figures_whose_panel_count_changes": sum(
                a != b for a, b in zip(counts[rendition], counts["as given"], strict=True)
            ),
            "ms_per_figure_cpu": round(1000 * seconds / max(1, len(figures)), 1),
        }
    sizes = sorted(max(images[f["file"]].size) for f in figures)
    return {"figures": len(figures), "median_longest_side_px": sizes[len(sizes) // 2], "renditions": out}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="panel_scales.json", help="a name under benchmarks/results, or a path")
    args = parser.parse_args(argv)
    files = sorted(EVAL_DIR.glob("figures-*.json"))
    splits = {split: score_split(eval_figures(files, split)) for split in ("tune", "holdout")}
    result = {
        "baseline": "the same figures as given (their published rendition), scored in the same run",
        "renditions": list(RENDITIONS),
        "splits": splits,
    }
    path = write_results(args.out, result)
    for split, found in splits.items():
        for rendition, scores in found["renditions"].items():
            print(split, rendition, {k: scores[k] for k in ("recall", "precision", "labels_read")})
    print("->", path)
    return result


if __name__ == "__main__":
    main()
