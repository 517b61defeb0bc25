"""The concept model, annotation ingestion and resolution, review sheets and propagation."""

import io
import sys

import numpy as np
import pytest
from PIL import Image

from pipelines.concepts.annotations import (
    AnnotationError,
    read_annotations,
    resolve,
    template_csv,
)
from pipelines.concepts.model import (
    ConceptModelConfig,
    cluster_fingerprint,
    fit_concept_model,
    latest_version,
    load_model,
    sample_vectors,
    save_model,
)
from pipelines.concepts.propagate import propagate
from pipelines.concepts.review import seeded_sample
from pipelines.core.taxonomy import load_taxonomy, normalize_label

HEADER = "cluster_id,panel_type,global_concept,local_concepts,notes,model_version,fingerprint\n"
VERSION = "2026-abcd1234"


def rows(*lines: str, version: str = VERSION) -> str:
    """An annotation file for model ``version``: ``lines`` are ``cluster,panel,global,locals,notes``;
    no fingerprint is recorded (these tests' models have none to check against)."""
    return HEADER + "".join(f"{line},{version},\n" for line in lines)


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


def test_fingerprints_name_each_clusters_sample_members():
    points, truth = blobs()
    keys = [f"{i:04d}" for i in range(len(points))]
    model = fit_concept_model(points, ConceptModelConfig(n_components=5, k=3, seed=1), keys)
    clusters, _ = model.assign(points)
    fingerprints = model.fingerprints()
    for group in range(3):  # blobs() puts points 40 * group .. 40 * group + 39 in group ``group``
        members = keys[40 * group : 40 * group + 40]
        assert fingerprints[int(clusters[40 * group])] == cluster_fingerprint(members)
        assert fingerprints[int(clusters[40 * group])].startswith("40:")
    assert model.info["kmeans_note"] is None  # 120 points >= 39 * 3
    with pytest.raises(ValueError, match="3 keys for 120 vectors"):
        fit_concept_model(points, ConceptModelConfig(n_components=5, k=3), keys[:3])


def test_small_sample_is_handled_without_faiss_warning(capfd):
    """120 points for k = 4 is below faiss's 39 per centroid (156): ``auto`` clusters with
    scikit-learn; ``faiss`` asked for explicitly runs with its minimum lowered; both say so."""
    points, _ = blobs(4)
    auto = fit_concept_model(points, ConceptModelConfig(n_components=5, k=4, seed=1))
    assert auto.info["kmeans_backend"] == "scikit-learn"
    assert auto.info["kmeans_note"] == (
        "120 sample points for k=4 is below faiss's minimum of 39 per centroid (156): "
        "clustered with scikit-learn's exact KMeans on the CPU (the same result on every machine)"
    )
    again = fit_concept_model(points, ConceptModelConfig(n_components=5, k=4, seed=1))
    assert np.array_equal(auto.centroids, again.centroids)
    forced = fit_concept_model(points, ConceptModelConfig(n_components=5, k=4, seed=1, backend="faiss"))
    assert forced.info["kmeans_backend"].startswith("faiss")
    assert forced.info["kmeans_note"].endswith(
        "faiss ran as requested with its minimum lowered to 1 point per centroid"
    )
    captured = capfd.readouterr()
    assert "WARNING" not in captured.err + captured.out


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


def test_a_model_version_survives_moving_the_embedder_directory(tmp_path):
    """The version hashes the embedder by what its directory holds, not where it is: a lake built
    with DINOv2 at one absolute path keeps its concept-model versions when the weights move."""
    import shutil

    here = tmp_path / "here" / "dinov2"
    here.mkdir(parents=True)
    (here / "config.json").write_text('{"model_type": "dinov2", "hidden_size": 32}')
    (here / "model.safetensors").write_bytes(b"\0" * 64)
    there = tmp_path / "elsewhere" / "weights" / "dinov2"
    shutil.copytree(here, there)
    settings = ConceptModelConfig(n_components=4, k=3)
    version = settings.version("2026", str(here))
    assert version.startswith("2026-") and str(tmp_path) not in version
    assert settings.version("2026", str(there)) == version
    assert ConceptModelConfig(n_components=4, k=4).version("2026", str(there)) != version  # settings count
    (there / "config.json").write_text('{"model_type": "dinov2", "hidden_size": 64}')
    assert settings.version("2026", str(there)) != version  # another model in the same place is not the same
    assert settings.version("2026", "facebook/dinov2-large") != settings.version("2026", "facebook/dinov2-base")


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
        "fingerprint": None,  # written by hand: no embedder made it
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
        "ann.csv": rows(
            "0,single panel,Microscopy,fluorescence microscopy,",
            "x,single panel,Microscopy,,",
            "1,single panel,Astrology,,",
            "2,two panels,Microscopy,,",
            "3,single panel,Microscopy,unicorn imaging,",
            "9,single panel,Microscopy,,",
            "0,single panel,Microscopy,,",
        ),
        "other.csv": "cluster,label\n1,x\n",
    }
    with pytest.raises(AnnotationError) as error:
        read_annotations(files, taxonomy, 5, VERSION)
    assert str(error.value).splitlines()[1:] == [
        "ann.csv:3: cluster_id 'x' is not a number",
        "ann.csv:4: unknown global concept 'Astrology'",
        "ann.csv:5: unknown panel type 'two panels'",
        "ann.csv:6: unknown local concepts ['unicorn imaging']",
        "ann.csv:7: cluster_id 9 is outside 0..4",
        "ann.csv:8: cluster 0 annotated twice",
        "other.csv: missing columns ['cluster_id', 'global_concept', 'local_concepts', 'panel_type']",
    ]


def test_annotations_for_another_model_version_are_refused():
    taxonomy = load_taxonomy()
    files = {
        "old.csv": rows("0,single panel,Microscopy,,", "1,,Tables,table,", version="2025-0f0f0f0f"),
        "current.csv": rows("0,single panel,Microscopy,,"),
    }
    with pytest.raises(AnnotationError) as error:
        read_annotations(files, taxonomy, 2, VERSION)
    (problem,) = str(error.value).splitlines()[1:]
    assert problem.startswith(
        "old.csv: made for concept model '2025-0f0f0f0f', but the current model is '2026-abcd1234'"
    )
    assert "review/2026-abcd1234/annotations_template.csv" in problem
    # a file with one row of another version (say, pasted from an older file) is refused whole
    mixed = {"mixed.csv": rows("0,single panel,Microscopy,,") + "1,,Tables,table,,2025-0f0f0f0f,\n"}
    with pytest.raises(AnnotationError, match="mixed.csv: made for concept model '2025-0f0f0f0f'"):
        read_annotations(mixed, taxonomy, 2, VERSION)


def test_annotations_without_version_are_refused_with_the_fix():
    taxonomy = load_taxonomy()
    old_style = {
        "panelforge_dev.csv": "cluster_id,n_images,panel_type,global_concept,local_concepts,notes\n"
        "1,9,,Clinical Imaging,magnetic resonance imaging,brain MRI\n"
    }
    with pytest.raises(AnnotationError) as error:
        read_annotations(old_style, taxonomy, 8, VERSION)
    (problem,) = str(error.value).splitlines()[1:]
    assert problem.startswith("panelforge_dev.csv: no fingerprint or model_version column")
    assert (
        "fill the template concept_review writes for the current model, review/2026-abcd1234/annotations_template.csv"
        in problem
    )


def test_changed_clusters_are_flagged_not_refused():
    taxonomy = load_taxonomy()
    # the model's clusters: 0 holds images a, b, c; 1 holds d; 2 holds e, f
    model = {0: cluster_fingerprint(["c", "a", "b"]), 1: cluster_fingerprint(["d"]), 2: cluster_fingerprint(["e", "f"])}
    assert model[0] == cluster_fingerprint(["a", "b", "c"]) and model[0].startswith("3:")
    annotated = {
        0: model[0],  # unchanged
        1: cluster_fingerprint(["d", "x", "y"]),  # the annotator saw 3 images, the model has 1
        2: cluster_fingerprint(["e", "g"]),  # same size, another member
    }
    text = HEADER + "".join(f"{c},single panel,Microscopy,histology,,{VERSION},{annotated[c]}\n" for c in (0, 1, 2))
    labels = resolve(read_annotations({"ann.csv": text}, taxonomy, 3, VERSION, model), taxonomy).labels
    assert labels[0]["fingerprint_mismatch"] is None
    assert labels[1]["fingerprint_mismatch"] == (
        f"ann: annotated a cluster of 3 sample images ({annotated[1]}), the model's has 1 ({model[1]})"
    )
    assert labels[2]["fingerprint_mismatch"] == (
        f"ann: annotated other images ({annotated[2]}) than the model's cluster of the same size ({model[2]})"
    )
    assert all(labels[c]["global_concept"] == "Microscopy" for c in (0, 1, 2))  # kept, but flagged
    # a row with labels but without its fingerprint cannot be checked: flagged too
    blank = HEADER + f"0,single panel,Microscopy,,,{VERSION},\n"
    (vote,) = read_annotations({"ann.csv": blank}, taxonomy, 3, VERSION, model)
    assert vote.mismatch == f"no fingerprint recorded; the model's cluster is {model[0]}"


def test_majority_vote_normalisation_ties_and_disagreement():
    taxonomy = load_taxonomy()
    assert normalize_label(" Fluorescence-Microscopy ") == normalize_label("fluorescence microscopy")
    files = {
        "a.csv": rows("0,single panel,Microscopy,Fluorescence-Microscopy;histology,", "1,single panel,Tables,table,"),
        "b.csv": rows("0,single panel,Microscopy,fluorescence microscopy,", "1,single panel,Plots and Charts,,"),
        "c.csv": rows("0,single panel,Clinical Imaging,FLUORESCENCE MICROSCOPY,", "2,,,,"),
    }
    resolution = resolve(read_annotations(files, taxonomy, 3, VERSION), taxonomy)
    zero, one = resolution.labels[0], resolution.labels[1]
    assert (zero["panel_type"], zero["global_concept"], zero["annotators"]) == ("single panel", "Microscopy", 3)
    assert zero["local_concepts"] == ["fluorescence microscopy"] and zero["ties"] == []  # histology: 1 of 3
    assert one["global_concept"] is None and one["ties"] == ["global_concept", "local_concepts"]  # 1 vs 1
    assert zero["fingerprint_mismatch"] is None  # no model fingerprints given: nothing to check
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
    text = template_csv({1: 5, 0: 3}, "2026-abcd1234", {0: "3:aaaaaaaaaaaa", 1: "4:bbbbbbbbbbbb"})
    assert text.splitlines() == [
        "cluster_id,n_images,panel_type,global_concept,local_concepts,notes,model_version,fingerprint",
        "0,3,,,,,2026-abcd1234,3:aaaaaaaaaaaa",
        "1,5,,,,,2026-abcd1234,4:bbbbbbbbbbbb",
    ]
    # a filled template is accepted as is
    filled = text.replace("0,3,,,,,", "0,3,single panel,Tables,table,,")
    model = {0: "3:aaaaaaaaaaaa", 1: "4:bbbbbbbbbbbb"}
    (vote,) = read_annotations({"a.csv": filled}, load_taxonomy(), 2, "2026-abcd1234", model)
    assert (vote.cluster_id, vote.global_concept, vote.mismatch) == (0, "Tables", None)


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
    # labels made for a cluster that has changed since are kept but marked
    stale = {int(clusters[0]): {**labels[int(clusters[0])], "fingerprint_mismatch": "ann: annotated 9, has 91"}}
    (row,) = propagate(rows[:1], model, "v1", stale)
    assert (row["global_concept"], row["label_status"]) == ("Microscopy", "stale_annotation")
