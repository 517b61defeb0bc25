"""The concept model: PCA then k-means over a seeded sample of a release's embeddings.

The sample is chosen by a keyed hash of each image's sha256 (the ``sample_size`` smallest
hashes), so it is the same whatever the partition order and holds each distinct image once;
only ``sample_size`` vectors are ever in memory. k-means runs on faiss (on the GPU when faiss
sees one) and falls back to scikit-learn's KMeans when faiss is not installed or
``backend="sklearn"`` asks for it. A sample smaller than faiss's minimum of 39 points per
centroid (the demo: 128 images, k = 8) is clustered by scikit-learn under ``auto``: exact, on
the CPU, the same on every machine; ``info["kmeans_note"]`` records it. Artifacts are versioned
under ``models/concepts/<version>/`` in the lake; a later release can reuse them unchanged.

Each cluster also gets a fingerprint, ``<members>:<hash>``: how many images of the model's
sample it holds and a hash of their sorted sha256s. Annotation templates carry it, so labels
written for one set of clusters are never silently applied to another (see annotations.py).
"""

from __future__ import annotations

import hashlib
import heapq
import io
import json
from dataclasses import asdict, dataclass

import numpy as np

from pipelines.core.fingerprints import fingerprint, model_identity
from pipelines.core.lake import Lake

KMEANS_BACKENDS = ("auto", "faiss", "sklearn")
# faiss's ClusteringParameters.min_points_per_centroid: below k * 39 points it warns on stderr
FAISS_MIN_POINTS_PER_CENTROID = 39


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

    def version(self, release: str, model: str) -> str:
        """``<release>-<fingerprint>`` of these settings and the embedder ``model`` (a hub id, a
        label, or a local directory: by its :func:`model_identity`, so a moved model keeps the version)."""
        return f"{release}-{fingerprint({'settings': asdict(self), 'model': model_identity(model)})}"


@dataclass
class ConceptModel:
    mean: np.ndarray
    components: np.ndarray  # (n_components, dim)
    centroids: np.ndarray  # (k, n_components)
    info: dict

    def fingerprints(self) -> dict[int, str]:
        """cluster id -> fingerprint; empty for models saved before fingerprints existed."""
        return {int(c): fp for c, fp in self.info.get("cluster_fingerprints", {}).items()}

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


def small_sample_note(n: int, k: int, backend: str) -> str | None:
    """Why a sample below faiss's 39 points per centroid was clustered the way it was (None when
    the sample is large enough)."""
    needed = FAISS_MIN_POINTS_PER_CENTROID * k
    if n >= needed:
        return None
    minimum = FAISS_MIN_POINTS_PER_CENTROID
    few = f"{n} sample points for k={k} is below faiss's minimum of {minimum} per centroid ({needed})"
    if backend == "faiss":
        return f"{few}: faiss ran as requested with its minimum lowered to 1 point per centroid"
    return f"{few}: clustered with scikit-learn's exact KMeans on the CPU (the same result on every machine)"


def _kmeans(points: np.ndarray, k: int, seed: int, niter: int, backend: str) -> tuple[np.ndarray, str, float]:
    small = len(points) < FAISS_MIN_POINTS_PER_CENTROID * k
    if backend == "faiss" or (backend == "auto" and not small):
        try:
            import faiss
        except ImportError:
            if backend == "faiss":
                raise RuntimeError("k-means backend 'faiss' requested but faiss is not installed") from None
        else:
            return _faiss_kmeans(
                faiss, points, k, seed, niter, min_points=1 if small else FAISS_MIN_POINTS_PER_CENTROID
            )
    from sklearn.cluster import KMeans

    km = KMeans(n_clusters=k, random_state=seed, n_init=1, max_iter=niter).fit(points)
    return km.cluster_centers_.astype(np.float32), "scikit-learn", float(km.inertia_)


def _faiss_kmeans(
    faiss, points: np.ndarray, k: int, seed: int, niter: int, min_points: int
) -> tuple[np.ndarray, str, float]:
    gpu = faiss.get_num_gpus() > 0
    points = np.ascontiguousarray(points, dtype=np.float32)
    km = faiss.Kmeans(
        points.shape[1], k, niter=niter, seed=seed, gpu=gpu, verbose=False, min_points_per_centroid=min_points
    )
    km.train(points, init_centroids=kmeans_plusplus_init(points, k, seed))
    _, labels = km.index.search(points, 1)
    inertia = float(((points - km.centroids[labels[:, 0]]) ** 2).sum())
    return km.centroids.astype(np.float32), "faiss-gpu" if gpu else "faiss-cpu", inertia


def cluster_fingerprint(keys: list[str]) -> str:
    """``<members>:<hash>``: the count and a hash of the sorted keys (sha256s) of a cluster's sample images."""
    digest = hashlib.blake2b("\n".join(sorted(keys)).encode(), digest_size=6).hexdigest()
    return f"{len(keys)}:{digest}"


def fit_concept_model(vectors: np.ndarray, config: ConceptModelConfig, keys: list[str] | None = None) -> ConceptModel:
    """PCA (SVD of the centred sample) to ``n_components``, then k-means with ``k`` clusters.

    ``keys`` (the sample's sha256s, in the order of ``vectors``) give each cluster its fingerprint."""
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
        "kmeans_note": small_sample_note(len(vectors), k, config.backend),
        "inertia": inertia,
    }
    model = ConceptModel(mean.astype(np.float32), components, centroids, info)
    if keys is not None:
        if len(keys) != len(vectors):
            raise ValueError(f"{len(keys)} keys for {len(vectors)} vectors")
        members: dict[int, list[str]] = {c: [] for c in range(k)}
        for key, cluster in zip(keys, model.assign(vectors)[0].tolist(), strict=True):
            members[cluster].append(key)
        info["cluster_fingerprints"] = {str(c): cluster_fingerprint(m) for c, m in members.items()}
    return model


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
