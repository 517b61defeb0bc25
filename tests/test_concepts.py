"""The concept model, annotation ingestion and resolution, review sheets and propagation."""

import io
import sys

import numpy as np
import pytest
from PIL import Image

from pipelines.concepts.annotations import (
    AnnotationError,
    load_taxonomy,
    normalize_label,
    read_annotations,
    resolve,
    template_csv,
)
from pipelines.concepts.model import (
    ConceptModelConfig,
    fit_concept_model,
    latest_version,
    load_model,
    sample_vectors,
    save_model,
)
from pipelines.concepts.propagate import propagate
from pipelines.concepts.review import seeded_sample

HEADER = "cluster_id,panel_type,global_concept,local_concepts,notes\n"


def blobs(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Three well separated groups of 40 points in 32 dimensions."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 10, size=(3, 32))
    truth = np.repeat(np.arange(3), 40)
    return (centres[truth] + rng.normal(0, 0.2, size=(120, 32))).astype(np.float32), truth


def _same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    return len(set(zip(a.tolist(), b.tolist(), strict=True))) == len(set(a.tolist())) == len(set(b.tolist()))


def test_pca_and_kmeans_recover_separated_groups():
    points, truth = blobs()
    model = fit_concept_model(points, ConceptModelConfig(n_components=5, k=3, seed=1))
    clusters, distances = model.assign(points)
    assert _same_partition(clusters, truth)
    assert model.info["kmeans_backend"].startswith("faiss") and model.info["k_used"] == 3
    assert model.info["components_for_99pct_variance"] <= 3  # three centres span at most a plane
    assert float(distances.max()) < 3.0
    again = fit_concept_model(points, ConceptModelConfig(n_components=5, k=3, seed=1))
    assert np.array_equal(model.centroids, again.centroids)  # seeded: reproducible


def test_scikit_learn_fallback(monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss -> ImportError
    points, truth = blobs(2)
    model = fit_concept_model(points, ConceptModelConfig(n_components=5, k=3))
    assert model.info["kmeans_backend"] == "scikit-learn"
    assert _same_partition(model.assign(points)[0], truth)
    with pytest.raises(RuntimeError, match="faiss is not installed"):
        fit_concept_model(points, ConceptModelConfig(n_components=5, k=3, backend="faiss"))


def test_scikit_learn_chosen_by_configuration():
    points, truth = blobs(3)
    model = fit_concept_model(points, ConceptModelConfig(n_components=5, k=3, backend="sklearn"))
    assert model.info["kmeans_backend"] == "scikit-learn" and model.info["backend"] == "sklearn"
    assert _same_partition(model.assign(points)[0], truth)
    with pytest.raises(ValueError, match="k-means backend must be one of"):
        ConceptModelConfig(backend="cuml")


def test_artifacts_round_trip_and_versions(lake):
    points, _ = blobs()
    model = fit_concept_model(points, ConceptModelConfig(n_components=4, k=3))
    version = ConceptModelConfig(n_components=4, k=3).version("2025", "synthetic-tiny-dinov2")
    save_model(lake, model, version)
    loaded = load_model(lake, version)
    assert np.array_equal(loaded.centroids, model.centroids) and loaded.info["k_used"] == 3
    png = lake.fs.cat(f"{lake.path('models', 'concepts', version)}/scree.png")
    assert Image.open(io.BytesIO(png)).format == "PNG"
    assert latest_version(lake) == version and latest_version(lake, before_release="2026") == version
    assert latest_version(lake, before_release="2025") is None


def _embedding_row(sha: str, vector: np.ndarray) -> dict:
    return {
        "pmcid": f"PMC{sha}",
        "fig_id": "F1",
        "image_file": f"{sha}.jpg",
        "sha256": sha,
        "model": "m",
        "synthetic": True,
        "pooling": "cls",
        "dim": len(vector),
        "vector": vector.astype("<f2").tobytes(),
        "error": None,
    }


def test_sample_is_seeded_bounded_and_distinct(lake):
    points, _ = blobs()
    rows = [_embedding_row(f"{i:04d}", p) for i, p in enumerate(points)]
    lake.write_table("embeddings", "2026", "000", rows[:60] + rows[:5])  # five images twice
    lake.write_table("embeddings", "2026", "001", rows[60:])
    vectors, shas = sample_vectors(lake, "2026", 30, seed=7)
    assert vectors.shape == (30, 32) and len(set(shas)) == 30
    assert sample_vectors(lake, "2026", 30, seed=7)[1] == shas
    assert sample_vectors(lake, "2026", 30, seed=8)[1] != shas
    all_vectors, all_shas = sample_vectors(lake, "2026", 1000, seed=7)
    assert len(all_shas) == 120  # every distinct image once


def test_annotations_are_validated_with_file_and_line():
    taxonomy = load_taxonomy()
    files = {
        "ann.csv": HEADER
        + "0,single panel,Microscopy,fluorescence microscopy,\n"
        + "x,single panel,Microscopy,,\n"
        + "1,single panel,Astrology,,\n"
        + "2,two panels,Microscopy,,\n"
        + "3,single panel,Microscopy,unicorn imaging,\n"
        + "9,single panel,Microscopy,,\n"
        + "0,single panel,Microscopy,,\n",
        "other.csv": "cluster,label\n1,x\n",
    }
    with pytest.raises(AnnotationError) as error:
        read_annotations(files, taxonomy, k=5)
    assert str(error.value).splitlines()[1:] == [
        "ann.csv:3: cluster_id 'x' is not a number",
        "ann.csv:4: unknown global concept 'Astrology'",
        "ann.csv:5: unknown panel type 'two panels'",
        "ann.csv:6: unknown local concepts ['unicorn imaging']",
        "ann.csv:7: cluster_id 9 is outside 0..4",
        "ann.csv:8: cluster 0 annotated twice",
        "other.csv: missing columns ['cluster_id', 'global_concept', 'local_concepts', 'panel_type']",
    ]


def test_majority_vote_normalisation_ties_and_disagreement():
    taxonomy = load_taxonomy()
    assert normalize_label(" Fluorescence-Microscopy ") == normalize_label("fluorescence microscopy")
    files = {
        "a.csv": HEADER
        + "0,single panel,Microscopy,Fluorescence-Microscopy;histology,\n1,single panel,Tables,table,\n",
        "b.csv": HEADER + "0,single panel,Microscopy,fluorescence microscopy,\n1,single panel,Plots and Charts,,\n",
        "c.csv": HEADER + "0,single panel,Clinical Imaging,FLUORESCENCE MICROSCOPY,\n2,,,,\n",
    }
    resolution = resolve(read_annotations(files, taxonomy, k=3), taxonomy)
    zero, one = resolution.labels[0], resolution.labels[1]
    assert (zero["panel_type"], zero["global_concept"], zero["annotators"]) == ("single panel", "Microscopy", 3)
    assert zero["local_concepts"] == ["fluorescence microscopy"] and zero["ties"] == []  # histology: 1 of 3
    assert one["global_concept"] is None and one["ties"] == ["global_concept", "local_concepts"]  # 1 vs 1
    assert 2 not in resolution.labels  # an empty row is "not annotated", not a vote
    # global concept disagreement: cluster 0 = 1 - 2/3, cluster 1 = 1 - 1/2
    assert resolution.stats["global_concept"] == {
        "min": 0.3333,
        "max": 0.5,
        "mean": 0.4167,
        "median": 0.4167,
        "iqr": 0.0833,
    }


def test_template_lists_every_cluster():
    text = template_csv({1: 5, 0: 3})
    assert text.splitlines() == [
        "cluster_id,n_images,panel_type,global_concept,local_concepts,notes",
        "0,3,,,,",
        "1,5,,,,",
    ]


def test_seeded_sample_is_stable_and_bounded():
    members = [{"sha256": f"{i:04d}", "image_file": f"{i}.jpg"} for i in range(100)]
    first = seeded_sample(members, 30, seed=0)
    assert len(first) == 30 and first == seeded_sample(list(reversed(members)), 30, seed=0)
    assert first != seeded_sample(members, 30, seed=1)


def test_propagation_labels_flags_and_marks():
    points, truth = blobs()
    model = fit_concept_model(points, ConceptModelConfig(n_components=5, k=3, seed=1))
    clusters, _ = model.assign(points)
    one_per_group = (0, 40, 80)  # blobs() puts 40 points in each group, in order
    rows = [_embedding_row(f"{i:04d}", points[i]) for i in one_per_group] + [
        {**_embedding_row("bad", points[0]), "vector": None, "error": "undecodable image"}
    ]
    labels = {
        int(clusters[0]): {
            "panel_type": "single panel",
            "global_concept": "Microscopy",
            "local_concepts": ["histology"],
            "ties": [],
        },
        int(clusters[40]): {
            "panel_type": None,
            "global_concept": None,
            "local_concepts": [],
            "ties": ["global_concept"],
        },
    }
    out = propagate(rows, model, "v1", labels)
    assert [r["label_status"] for r in out] == ["labeled", "partly_labeled", "unannotated_cluster", "no_embedding"]
    assert out[0]["global_concept"] == "Microscopy" and out[0]["cluster_id"] == int(clusters[0])
    assert all(r["synthetic"] for r in out) and out[3]["cluster_id"] is None
