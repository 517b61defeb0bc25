"""The concept model: PCA then k-means over a seeded sample of a release's embeddings.

The sample is chosen by a keyed hash of each image's sha256 (the ``sample_size`` smallest
hashes), so it is the same whatever the partition order and holds each distinct image once;
only ``sample_size`` vectors are ever in memory. k-means runs on faiss (on the GPU when faiss
sees one) and falls back to scikit-learn's KMeans when faiss is not installed or
``backend="sklearn"`` asks for it. Artifacts are versioned under
``models/concepts/<version>/`` in the lake; a later release can reuse them unchanged.
"""

from __future__ import annotations

import hashlib
import heapq
import io
import json
from dataclasses import asdict, dataclass

import numpy as np

from pipelines.lake import Lake

KMEANS_BACKENDS = ("auto", "faiss", "sklearn")


@dataclass(frozen=True)
class ConceptModelConfig:
    n_components: int = 25
    k: int = 2000
    sample_size: int = 200_000
    seed: int = 0
    niter: int = 25
    backend: str = "auto"  # "auto" (faiss when installed), "faiss" or "sklearn"

    def __post_init__(self) -> None:
        if self.backend not in KMEANS_BACKENDS:
            raise ValueError(f"k-means backend must be one of {', '.join(KMEANS_BACKENDS)}, got {self.backend!r}")

    def version(self, release: str, model_label: str) -> str:
        digest = hashlib.sha1(json.dumps([asdict(self), model_label], sort_keys=True).encode()).hexdigest()[:8]
        return f"{release}-{digest}"


@dataclass
class ConceptModel:
    mean: np.ndarray
    components: np.ndarray  # (n_components, dim)
    centroids: np.ndarray  # (k, n_components)
    info: dict

    def project(self, vectors: np.ndarray) -> np.ndarray:
        return ((vectors.astype(np.float32) - self.mean) @ self.components.T).astype(np.float32)

    def assign(self, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Nearest centroid and its Euclidean distance (in PCA space) for each vector."""
        if len(vectors) == 0:
            return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32)
        points = self.project(vectors)
        d2 = (points**2).sum(1)[:, None] - 2 * points @ self.centroids.T + (self.centroids**2).sum(1)[None, :]
        nearest = d2.argmin(1)
        return nearest.astype(np.int32), np.sqrt(np.maximum(d2[np.arange(len(points)), nearest], 0)).astype(np.float32)


def decode_vector(blob: bytes, dim: int) -> np.ndarray:
    return np.frombuffer(blob, dtype="<f2", count=dim).astype(np.float32)


def sample_vectors(lake: Lake, release: str, size: int, seed: int) -> tuple[np.ndarray, list[str]]:
    """The ``size`` distinct images (by sha256) with the smallest keyed hash, across all shards."""
    heap: list[tuple[int, str, bytes, int]] = []  # max-heap by negated score
    seen: set[str] = set()
    paths = sorted(lake.fs.glob(lake.path("tables", "embeddings", f"release={release}", "shard=*", "data.parquet")))
    for path in paths:
        shard = path.rsplit("shard=", 1)[1].split("/")[0]
        for row in lake.read_table("embeddings", release, shard).to_pylist():
            if not row["vector"] or row["sha256"] in seen:
                continue
            seen.add(row["sha256"])
            score = int.from_bytes(hashlib.blake2b(f"{seed}:{row['sha256']}".encode(), digest_size=8).digest(), "big")
            item = (-score, row["sha256"], row["vector"], row["dim"])
            if len(heap) < size:
                heapq.heappush(heap, item)
            elif -score > heap[0][0]:
                heapq.heapreplace(heap, item)
    chosen = sorted(heap, key=lambda item: item[1])
    if not chosen:
        return np.zeros((0, 0), dtype=np.float32), []
    return np.stack([decode_vector(v, d) for _, _, v, d in chosen]), [sha for _, sha, _, _ in chosen]


def kmeans_plusplus_init(points: np.ndarray, k: int, seed: int, per_centroid: int = 10) -> np.ndarray:
    """k-means++ seeds from a seeded subsample of ``per_centroid * k`` points.

    faiss starts Lloyd's iterations from random points; with K in the thousands that leaves a
    much worse optimum (2.6x the inertia in benchmarks/results/kmeans.json), so PanelForge seeds
    it the way scikit-learn does, on a subsample to keep seeding cheap.
    """
    from sklearn.cluster import kmeans_plusplus

    rng = np.random.default_rng(seed)
    size = min(len(points), per_centroid * k)
    subsample = points[rng.choice(len(points), size, replace=False)] if size < len(points) else points
    centres, _ = kmeans_plusplus(subsample, k, random_state=seed)
    return np.ascontiguousarray(centres, dtype=np.float32)


def _kmeans(points: np.ndarray, k: int, seed: int, niter: int, backend: str) -> tuple[np.ndarray, str, float]:
    if backend != "sklearn":
        try:
            import faiss
        except ImportError:
            if backend == "faiss":
                raise RuntimeError("k-means backend 'faiss' requested but faiss is not installed") from None
        else:
            return _faiss_kmeans(faiss, points, k, seed, niter)
    from sklearn.cluster import KMeans

    km = KMeans(n_clusters=k, random_state=seed, n_init=1, max_iter=niter).fit(points)
    return km.cluster_centers_.astype(np.float32), "scikit-learn", float(km.inertia_)


def _faiss_kmeans(faiss, points: np.ndarray, k: int, seed: int, niter: int) -> tuple[np.ndarray, str, float]:
    gpu = faiss.get_num_gpus() > 0
    points = np.ascontiguousarray(points, dtype=np.float32)
    km = faiss.Kmeans(points.shape[1], k, niter=niter, seed=seed, gpu=gpu, verbose=False)
    km.train(points, init_centroids=kmeans_plusplus_init(points, k, seed))
    _, labels = km.index.search(points, 1)
    inertia = float(((points - km.centroids[labels[:, 0]]) ** 2).sum())
    return km.centroids.astype(np.float32), "faiss-gpu" if gpu else "faiss-cpu", inertia


def fit_concept_model(vectors: np.ndarray, config: ConceptModelConfig) -> ConceptModel:
    """PCA (SVD of the centred sample) to ``n_components``, then k-means with ``k`` clusters."""
    if len(vectors) < 2:
        raise ValueError(f"need at least 2 embedded images to fit a concept model, got {len(vectors)}")
    mean = vectors.mean(0)
    centred = vectors - mean
    _, singular, vt = np.linalg.svd(centred, full_matrices=False)
    variance = singular**2 / max(len(vectors) - 1, 1)
    ratio = variance / variance.sum() if variance.sum() > 0 else variance
    n_components = min(config.n_components, vt.shape[0])
    components = vt[:n_components].astype(np.float32)
    k = min(config.k, len(vectors))
    points = (centred @ components.T).astype(np.float32)
    centroids, backend, inertia = _kmeans(points, k, config.seed, config.niter, config.backend)
    cumulative = np.cumsum(ratio)
    info = {
        **asdict(config),
        "k_used": int(k),
        "n_components_used": int(n_components),
        "samples": len(vectors),
        "dim": int(vectors.shape[1]),
        "explained_variance_ratio": [round(float(r), 6) for r in ratio[:n_components]],
        "components_for_99pct_variance": int(np.searchsorted(cumulative, 0.99) + 1),
        "variance_kept": round(float(cumulative[n_components - 1]), 6),
        "kmeans_backend": backend,
        "inertia": inertia,
    }
    return ConceptModel(mean.astype(np.float32), components, centroids, info)


def scree_png(model: ConceptModel) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = model.info["explained_variance_ratio"]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.bar(range(1, len(ratios) + 1), ratios, color="#4c72b0", label="per component")
    ax.plot(range(1, len(ratios) + 1), np.cumsum(ratios), color="#dd8452", marker=".", label="cumulative")
    ax.axhline(0.99, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlabel("principal component")
    ax.set_ylabel("explained variance ratio")
    ax.set_title(f"PCA scree ({model.info['components_for_99pct_variance']} components reach 99%)")
    ax.legend(loc="center right")
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    plt.close(fig)
    return out.getvalue()


def model_dir(lake: Lake, version: str) -> str:
    return lake.path("models", "concepts", version)


def save_model(lake: Lake, model: ConceptModel, version: str) -> str:
    directory = model_dir(lake, version)
    for name, payload in (
        ("arrays.npz", _npz(model)),
        ("model.json", json.dumps({**model.info, "version": version}, indent=1).encode()),
        ("scree.png", scree_png(model)),
    ):
        with lake.atomic_local_file(f"{directory}/{name}") as tmp, open(tmp, "wb") as fh:
            fh.write(payload)
    return directory


def _npz(model: ConceptModel) -> bytes:
    out = io.BytesIO()
    np.savez(out, mean=model.mean, components=model.components, centroids=model.centroids)
    return out.getvalue()


def load_model(lake: Lake, version: str) -> ConceptModel:
    directory = model_dir(lake, version)
    with lake.fs.open(f"{directory}/arrays.npz", "rb") as fh:
        arrays = np.load(io.BytesIO(fh.read()))
        mean, components, centroids = arrays["mean"], arrays["components"], arrays["centroids"]
    with lake.fs.open(f"{directory}/model.json", "rb") as fh:
        info = json.loads(fh.read())
    return ConceptModel(mean, components, centroids, info)


def latest_version(lake: Lake, before_release: str | None = None) -> str | None:
    """The newest saved model version (optionally of a release before ``before_release``)."""
    found = lake.fs.glob(lake.path("models", "concepts", "*", "model.json")) if lake.exists(lake.path("models")) else []
    versions = sorted(p.rsplit("/", 2)[1] for p in found)
    if before_release is not None:
        versions = [v for v in versions if v.split("-", 1)[0] < before_release]
    return versions[-1] if versions else None
