"""k-means on 1M x 25 float32 points with K = 2000: faiss against scikit-learn's MiniBatchKMeans.

All in one run on the same points (a seeded mixture of 2,000 Gaussian blobs with unit noise,
like PCA-reduced image embeddings; the ideal inertia is about n x dim = 25M): faiss as it
comes (random initial centroids), faiss seeded with k-means++ as PanelForge runs it
(``pipelines.concepts.model``), and MiniBatchKMeans (k-means++ init, batches of 8,192).
Reports wall time and inertia (sum of squared distances to the nearest centroid, computed the
same way for all three).

    python -m benchmarks.kmeans [--n 1000000] [--k 2000]

Writes ``benchmarks/results/kmeans.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from benchmarks.record import write_results

RESULTS = Path(__file__).parent / "results" / "kmeans.json"


def inertia(points: np.ndarray, centroids: np.ndarray) -> float:
    import faiss

    index = faiss.IndexFlatL2(points.shape[1])
    index.add(np.ascontiguousarray(centroids, dtype=np.float32))
    distances, _ = index.search(points, 1)
    return float(distances.sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--k", type=int, default=2000)
    parser.add_argument("--dim", type=int, default=25)
    parser.add_argument("--niter", type=int, default=20)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 5, size=(args.k, args.dim)).astype(np.float32)
    points = (centres[rng.integers(0, args.k, args.n)] + rng.normal(0, 1, (args.n, args.dim))).astype(np.float32)

    import faiss
    from sklearn.cluster import MiniBatchKMeans

    from pipelines.concepts.model import kmeans_plusplus_init

    start = time.perf_counter()
    km = faiss.Kmeans(args.dim, args.k, niter=args.niter, seed=0, verbose=False)
    km.train(points)
    faiss_s = time.perf_counter() - start
    faiss_inertia = inertia(points, km.centroids)

    start = time.perf_counter()
    seeded = faiss.Kmeans(args.dim, args.k, niter=args.niter, seed=0, verbose=False)
    seeded.train(points, init_centroids=kmeans_plusplus_init(points, args.k, 0))
    seeded_s = time.perf_counter() - start
    seeded_inertia = inertia(points, seeded.centroids)

    start = time.perf_counter()
    mbk = MiniBatchKMeans(n_clusters=args.k, batch_size=8192, max_iter=args.niter, n_init=1, random_state=0)
    mbk.fit(points)
    sklearn_s = time.perf_counter() - start
    sklearn_inertia = inertia(points, mbk.cluster_centers_)

    result = {
        "benchmark": f"k-means, {args.n:,} x {args.dim} float32, K = {args.k}, {args.niter} iterations",
        "baseline": "scikit-learn MiniBatchKMeans (batch 8192)",
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "faiss_version": faiss.__version__,
        "gpu": faiss.get_num_gpus() > 0,
        "faiss_random_init": {"seconds": round(faiss_s, 1), "inertia": faiss_inertia},
        "faiss_kmeanspp_init_panelforge": {"seconds": round(seeded_s, 1), "inertia": seeded_inertia},
        "minibatch_kmeans": {"seconds": round(sklearn_s, 1), "inertia": sklearn_inertia},
        "time_ratio_minibatch_over_panelforge": round(sklearn_s / seeded_s, 2),
        "inertia_ratio_minibatch_over_panelforge": round(sklearn_inertia / seeded_inertia, 3),
        "inertia_ratio_faiss_random_over_panelforge": round(faiss_inertia / seeded_inertia, 3),
    }
    write_results(RESULTS, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
