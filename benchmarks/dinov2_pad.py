"""What padding to a square (``dinov2_pad``) changes against DINOv2's centre crop, on the sample's figures.

For every decodable figure image of ``sample/articles`` (142, aspect ratios 1.0 to 7.7):

* **coverage** (exact, no model): the share of the figure the crop keeps. DINOv2's processor
  resizes the short side to 256 and crops 224 x 224, so it keeps (224/256)² x short/long of the
  area; the letterbox keeps all of it, at 224/long of its linear resolution (the rest is white).
* **clustering** (a model): embeddings with each preprocessing, then k-means as the concept
  stage runs it on the demo (PCA 16, k = 8, seed 0): the agreement of the two assignments
  (adjusted Rand index), the overlap of each figure's 5 nearest neighbours (cosine) under both,
  by aspect group, and how much each clustering follows the figure's shape rather than its
  content: the normalised mutual information between cluster and aspect-ratio bin (< 1.25,
  1.25-2, >= 2).

The model is the demo's tiny DINOv2 and DINOv2-S's architecture, both with random weights: no
trained weights can be fetched here. What this can show: how much of each figure the crop
drops, and how strongly each preprocessing's low-level image statistics (a white letterbox is
one) drive the clusters of an untrained encoder. What it cannot show: which preprocessing a
trained DINOv2 clusters better by modality; that needs the real weights (run it with
``--model facebook/dinov2-large`` where they are).

    python -m benchmarks.dinov2_pad [--model facebook/dinov2-large]

Writes ``benchmarks/results/dinov2_pad.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from benchmarks.embeddings import sample_images
from benchmarks.record import write_results
from pipelines.concepts.dinov2 import Embedder, EmbedderConfig, prepare
from pipelines.images.decode import decode_image

RESULTS = Path(__file__).parent / "results" / "dinov2_pad.json"
BINS = ((0.0, 1.25, "near-square (< 1.25)"), (1.25, 2.0, "1.25 to 2"), (2.0, float("inf"), "elongated (>= 2)"))
DEMO_CLUSTERING = {"n_components": 16, "k": 8, "seed": 0}  # jobs/demo.py's concept model
KNN = 5


def aspect_bin(ratio: float) -> int:
    return next(i for i, (lo, hi, _) in enumerate(BINS) if lo <= ratio < hi)


def coverage(width: int, height: int) -> tuple[float, float]:
    """(share of the area the 224 crop of the 256-short-side resize keeps, linear scale of the letterbox)."""
    short, long = min(width, height), max(width, height)
    return min(1.0, (224 / 256) ** 2 * short / long), 224 / long


def by_bin(values: np.ndarray, bins: np.ndarray) -> dict[str, float]:
    return {
        label: round(float(values[bins == i].mean()), 3) for i, (_, _, label) in enumerate(BINS) if (bins == i).any()
    }


def cluster(vectors: np.ndarray) -> np.ndarray:
    from sklearn.cluster import KMeans
    from sklearn.decomposition import PCA

    x = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    n = min(DEMO_CLUSTERING["n_components"], x.shape[0] - 1, x.shape[1])
    reduced = PCA(n, random_state=DEMO_CLUSTERING["seed"]).fit_transform(x)
    return KMeans(DEMO_CLUSTERING["k"], n_init=10, random_state=DEMO_CLUSTERING["seed"]).fit_predict(reduced)


def neighbours(vectors: np.ndarray, k: int = KNN) -> np.ndarray:
    x = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    sims = x @ x.T
    np.fill_diagonal(sims, -np.inf)
    return np.argsort(-sims, axis=1, kind="stable")[:, :k]


def compare(config_kwargs: dict, images: list, bins: np.ndarray) -> dict:
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    embedder = Embedder(EmbedderConfig(**config_kwargs, device="cpu"))
    started = time.perf_counter()
    crop = embedder.embed(np.stack([prepare(im, embedder.resize, False) for im in images])).astype(np.float32)
    pad = embedder.embed(np.stack([prepare(im, embedder.resize, True) for im in images])).astype(np.float32)
    seconds = time.perf_counter() - started
    crop_clusters, pad_clusters = cluster(crop), cluster(pad)
    crop_nn, pad_nn = neighbours(crop), neighbours(pad)
    overlap = np.array([len(set(a) & set(b)) / KNN for a, b in zip(crop_nn, pad_nn, strict=True)])
    return {
        "model": embedder.config.model_label,
        "dim": embedder.dim,
        "embed_seconds": round(seconds, 1),
        "cluster_agreement_ari": round(float(adjusted_rand_score(crop_clusters, pad_clusters)), 3),
        "knn5_overlap": by_bin(overlap, bins) | {"all": round(float(overlap.mean()), 3)},
        "clusters_follow_aspect_nmi": {
            "crop": round(float(normalized_mutual_info_score(bins, crop_clusters)), 3),
            "pad": round(float(normalized_mutual_info_score(bins, pad_clusters)), 3),
        },
    }


def small_dinov2(folder: Path) -> str:
    """DINOv2-S's architecture (12 layers, width 384, 6 heads) with seeded random weights, as a folder."""
    import shutil

    import torch
    from transformers import Dinov2Config, Dinov2Model

    published = Path(__file__).resolve().parents[1] / "tests" / "data" / "published"
    config = json.loads((published / "dinov2-large.config.json").read_text())
    config.update(hidden_size=384, num_attention_heads=6, num_hidden_layers=12)
    torch.manual_seed(0)
    Dinov2Model(Dinov2Config.from_dict(config)).save_pretrained(str(folder))
    shutil.copy(published / "dinov2-large.preprocessor_config.json", folder / "preprocessor_config.json")
    return str(folder)


def main(argv: list[str] | None = None) -> dict:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="real DINOv2 weights (hub id or folder) to measure as well")
    parser.add_argument("--out", default=RESULTS.name, help="a name under benchmarks/results, or a path")
    args = parser.parse_args(argv)

    images = []
    for data in sample_images():
        image, _ = decode_image(data)
        if image is not None:
            images.append(image)
    ratios = np.array([max(im.size) / min(im.size) for im in images])
    bins = np.array([aspect_bin(r) for r in ratios])
    kept = np.array([coverage(*im.size)[0] for im in images])
    result = {
        "benchmark": "what padding DINOv2's input to a square changes against its centre crop, on the sample's figures",
        "baseline": "the centre crop (DINOv2's own preprocessing), on the same figures and encoders",
        "figures": len(images),
        "figures_by_aspect": {label: int((bins == i).sum()) for i, (_, _, label) in enumerate(BINS)},
        "crop_keeps_area": by_bin(kept, bins)
        | {"4:1 strip": round(coverage(400, 100)[0], 3), "all": round(float(kept.mean()), 3)},
        "models": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        runs = [
            ("the demo's tiny DINOv2, random weights", {"synthetic": True}),
            ("DINOv2-S architecture, random weights", {"model": small_dinov2(Path(tmp) / "dinov2-small-random")}),
        ]
        if args.model:
            runs.append((f"{args.model} (trained weights)", {"model": args.model}))
        for label, kwargs in runs:
            result["models"].append({**compare(kwargs, images, bins), "model": label})
    write_results(args.out, result, indent=1)
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
