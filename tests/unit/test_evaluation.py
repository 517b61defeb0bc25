"""The evaluation harness. Everything here is SYNTHETIC: hand-written similarity matrices, made-up
PMCIDs, captions and class names, tiny OpenCLIP models with random weights; the only real inputs
are a few sample figure images (sample/images), used as pixels, not for their content."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipelines.core.heldout import (
    exclude_heldout,
    heldout_path,
    heldout_score,
    is_heldout,
    load_heldout,
    make_heldout_split,
    split_pmcids,
    webdataset_keep,
)
from pipelines.core.lake import Lake
from pipelines.evaluation import metrics
from pipelines.evaluation.datasets import (
    CLASSIFICATION,
    RETRIEVAL,
    VQA,
    EvalDataset,
    image_folder,
    longcap_retrieval,
    manifest,
    release_pairs,
)
from pipelines.training.tiny import TINY_CLIP

SAMPLE_IMAGES = sorted((Path(__file__).parents[2] / "sample" / "images").glob("*/*.jpg"))

# Image i (row) against text j (column); pair i is (image i, text i).
#   image 0: its text scores highest                      -> rank 0
#   image 1: text 0 (0.8) beats its text (0.5)            -> rank 1
#   image 2: all four tie at 0.2; pessimistic             -> rank 3
#   image 3: texts 1 (0.7) and 2 (0.6) beat its text 0.4  -> rank 2
S = np.array(
    [
        [0.9, 0.1, 0.2, 0.0],
        [0.8, 0.5, 0.3, 0.1],
        [0.2, 0.2, 0.2, 0.2],
        [0.1, 0.7, 0.6, 0.4],
    ]
)
# Text j against images = column j of S:
#   text 0: [0.9, 0.8, 0.2, 0.1], own 0.9               -> rank 0
#   text 1: [0.1, 0.5, 0.2, 0.7], 0.7 beats own 0.5     -> rank 1
#   text 2: [0.2, 0.3, 0.2, 0.6], own 0.2; 0.2 (tie), 0.3, 0.6 count -> rank 3
#   text 3: [0.0, 0.1, 0.2, 0.4], own 0.4               -> rank 0
I2T_RANKS = [0, 1, 3, 2]
T2I_RANKS = [0, 1, 3, 0]


# ---- metrics -----------------------------------------------------------------------------------


def test_retrieval_ranks_on_hand_matrix():
    identity = np.eye(4)  # gallery = unit vectors, so queries @ gallery.T is the matrix itself
    assert metrics.retrieval_ranks(S, identity).tolist() == I2T_RANKS
    assert metrics.retrieval_ranks(S.T, identity).tolist() == T2I_RANKS
    assert metrics.retrieval_ranks(S, identity, block=1).tolist() == I2T_RANKS  # blocking changes nothing


def test_recall_at_k_on_hand_matrix():
    out = metrics.retrieval_metrics(S, np.eye(4), ks=(1, 2, 3, 10))
    # i2t ranks 0,1,3,2: R@1 1/4, R@2 2/4, R@3 3/4, R@10 4/4
    assert out["image_to_text_R@1"].mean() == 0.25
    assert out["image_to_text_R@1"].tolist() == [1, 0, 0, 0]
    assert out["image_to_text_R@2"].mean() == 0.5
    assert out["image_to_text_R@3"].mean() == 0.75
    assert out["image_to_text_R@10"].mean() == 1.0
    # t2i ranks 0,1,3,0: R@1 2/4, R@2 3/4
    assert out["text_to_image_R@1"].tolist() == [1, 0, 0, 1]
    assert out["text_to_image_R@2"].mean() == 0.75


def test_all_tied_scores_get_no_credit():
    assert metrics.retrieval_metrics(np.ones((4, 2)), np.ones((4, 2)), ks=(1,))["image_to_text_R@1"].sum() == 0


def test_zero_shot_four_images_two_classes():
    logits = np.array(
        [
            [0.9, 0.1],  # label 0: right
            [0.3, 0.6],  # label 0: wrong
            [0.5, 0.5],  # label 1: tie, counted wrong
            [0.2, 0.8],  # label 1: right
        ]
    )
    out = metrics.classification_metrics(logits, np.array([0, 0, 1, 1]))
    assert out["accuracy"].tolist() == [1, 0, 0, 1]
    assert "top5_accuracy" not in out  # 2 classes: top-5 would always be 1


def test_top5_with_six_classes():
    logits = np.array([[6, 5, 4, 3, 2, 1], [6, 5, 4, 3, 2, 1]], dtype=float)
    out = metrics.classification_metrics(logits, np.array([4, 5]))  # ranks 4 and 5
    assert out["accuracy"].tolist() == [0, 0]
    assert out["top5_accuracy"].tolist() == [1, 0]


def test_vqa_each_question_its_own_choices():
    scores = [np.array([0.1, 0.9, 0.3]), np.array([0.4, 0.2]), np.array([0.5, 0.5])]
    assert metrics.vqa_metrics(scores, [1, 1, 0])["accuracy"].tolist() == [1, 0, 0]


def test_bootstrap_constant_has_zero_width():
    assert metrics.bootstrap_ci(np.ones(50), n_resamples=200, seed=3) == (1.0, 1.0)
    assert metrics.bootstrap_ci(np.full(7, 0.5), n_resamples=200, seed=3) == (0.5, 0.5)


def test_bootstrap_deterministic_by_seed_and_sane():
    values = np.array([1, 0, 0, 1, 1, 0, 1, 1, 0, 1] * 3, dtype=float)  # mean 0.6
    a = metrics.bootstrap_ci(values, n_resamples=500, seed=11)
    assert a == metrics.bootstrap_ci(values, n_resamples=500, seed=11)
    assert a == metrics.bootstrap_ci(values, n_resamples=500, seed=11, chunk=7)  # chunking keeps the draws
    assert a != metrics.bootstrap_ci(values, n_resamples=500, seed=12)
    assert 0.0 <= a[0] < 0.6 < a[1] <= 1.0


def test_paired_delta():
    ones, zeros = np.ones(20), np.zeros(20)
    assert metrics.paired_bootstrap_delta(ones, zeros, n_resamples=100) == (1.0, 1.0, 1.0)
    values = np.array([1, 0, 1, 1, 0, 1, 0, 0], dtype=float)
    assert metrics.paired_bootstrap_delta(values, values, n_resamples=100) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError):
        metrics.paired_bootstrap_delta(ones, np.ones(3))


# ---- split -------------------------------------------------------------------------------------

PMCIDS = [f"PMC{100000 + i}" for i in range(1000)]  # synthetic ids


def test_heldout_rule_is_the_documented_keyed_hash():
    digest = hashlib.blake2b(b"PMC123", key=b"k", digest_size=8).digest()
    assert heldout_score(" pmc123 ", key="k") == int.from_bytes(digest, "big") / 2**64


def test_split_deterministic_disjoint_and_sized():
    a = split_pmcids(PMCIDS, "2025", share=0.1, key="k")
    assert a == split_pmcids(reversed(PMCIDS), "2025", share=0.1, key="k")
    assert a.n_articles == 1000
    assert 50 < len(a.pmcids) < 150  # binomial(1000, 0.1): mean 100, sd 9.5
    assert a.pmcids != split_pmcids(PMCIDS, "2025", share=0.1, key="other").pmcids
    assert all(is_heldout(p, 0.1, "k") for p in a.pmcids)
    train = [r["pmcid"] for r in exclude_heldout(({"pmcid": p} for p in PMCIDS), a)]
    assert not set(train) & a.pmcids
    assert set(train) | a.pmcids == set(PMCIDS)
    assert a.excludes(next(iter(a.pmcids)).lower())


def test_split_recorded_and_reloaded(tmp_path):
    lake = Lake(tmp_path / "lake")
    split = make_heldout_split(lake, "2025", share=0.2, key="k", pmcids=PMCIDS[:50])
    path = Path(heldout_path(lake, "2025"))
    assert path == tmp_path / "lake" / "models" / "eval" / "2025" / "heldout.json"
    data = json.loads(path.read_text())
    assert data["rule"]["share"] == 0.2 and data["rule"]["key"] == "k"
    assert data["pmcids"] == sorted(split.pmcids) and data["n_articles"] == 50
    assert load_heldout(lake, "2025") == split
    held = sorted(split.pmcids)[0]
    keep = webdataset_keep(split)
    assert not keep({"json": json.dumps({"pmcid": held}).encode()})
    assert keep({"json": json.dumps({"pmcid": "PMC1"}).encode()}) == (not is_heldout("PMC1", 0.2, "k"))
    with pytest.raises(FileNotFoundError):
        load_heldout(lake, "2024")


# ---- datasets ----------------------------------------------------------------------------------


def _class_folders(root: Path) -> Path:
    for cls, images in {"chest_xray": SAMPLE_IMAGES[:2], "histology": SAMPLE_IMAGES[2:4]}.items():
        (root / cls).mkdir(parents=True)
        for image in images:
            shutil.copy(image, root / cls / image.name)
    (root / "histology" / "notes.txt").write_text("not an image")
    return root


def test_image_folder(tmp_path):
    ds = image_folder(_class_folders(tmp_path / "synthetic_cls"))
    assert ds.task == CLASSIFICATION and len(ds) == 4
    assert ds.classes == ["chest xray", "histology"]
    assert ds.labels == [0, 0, 1, 1]
    assert ds.class_prompts()[1] == ["a biomedical image of histology.", "a figure showing histology."]


def test_manifest_csv_records_bad_rows(tmp_path):
    shutil.copy(SAMPLE_IMAGES[0], tmp_path / "a.jpg")
    shutil.copy(SAMPLE_IMAGES[1], tmp_path / "b.jpg")
    with open(tmp_path / "m.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerows([["image", "label"], ["a.jpg", "tumor"], ["b.jpg", "normal"], ["gone.jpg", "tumor"]])
    ds = manifest(tmp_path / "m.csv")
    assert ds.classes == ["normal", "tumor"] and ds.labels == [1, 0]
    assert ds.errors == [("gone.jpg", "image not found: gone.jpg")]
    ds = manifest(tmp_path / "m.csv", classes=["tumor"])
    assert ds.labels == [0] and ("b.jpg", "unknown label 'normal'") in ds.errors


def test_manifest_jsonl_vqa(tmp_path):
    shutil.copy(SAMPLE_IMAGES[0], tmp_path / "a.jpg")
    rows = [
        {
            "id": "q1",
            "image": "a.jpg",
            "question": "Which modality?",
            "choices": ["CT", "MRI", "X-ray"],
            "answer": "MRI",
        },
        {"id": "q2", "image": "a.jpg", "question": "Is there a lesion?", "choices": "yes|no", "answer": "no"},
        {"id": "q3", "image": "a.jpg", "question": "Organ?", "choices": ["liver", "lung"], "answer": "heart"},
    ]
    (tmp_path / "vqa.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n{broken\n")
    ds = manifest(tmp_path / "vqa.jsonl")
    assert ds.task == VQA and ds.keys == ["q1", "q2"] and ds.labels == [1, 1]
    assert ds.item_prompts(1) == ["Question: Is there a lesion? Answer: yes", "Question: Is there a lesion? Answer: no"]
    assert [e[0] for e in ds.errors] == ["q3", "row 4"]


def _write_shard(path: Path, samples: list[tuple[str, str, bytes, str]]) -> None:
    import webdataset as wds

    path.parent.mkdir(parents=True, exist_ok=True)
    with wds.TarWriter(str(path)) as sink:
        for key, pmcid, image, text in samples:
            sink.write({"__key__": key, "jpg": image, "txt": text, "json": json.dumps({"pmcid": pmcid, "key": key})})


def _release_lake(tmp_path: Path) -> Lake:
    lake = Lake(tmp_path / "lake")
    img = [p.read_bytes() for p in SAMPLE_IMAGES[:4]]
    samples = [  # synthetic captions; PMC2 has two figures
        ("k03", "PMC2", img[2], "long caption two b"),
        ("k01", "PMC1", img[0], "long caption one"),
        ("k02", "PMC2", img[1], "long caption two a"),
        ("k04", "PMC3", img[3], "long caption three"),
    ]
    for release in ("2024", "2025"):
        _write_shard(tmp_path / "lake" / "dataset" / release / "longcap-commercial" / "panelforge-000000.tar", samples)
    _write_shard(tmp_path / "lake" / "dataset" / "2025" / "commercial" / "panelforge-000000.tar", samples[:2])
    _write_shard(
        tmp_path / "lake" / "dataset" / "2025" / "commercial" / "panelforge-000001.tar",
        [("k09", "PMC9", b"not a jpeg", "broken image")],
    )
    return lake


def test_release_pairs_filters_and_one_per_article(tmp_path):
    lake = _release_lake(tmp_path)
    ds = release_pairs(lake, "2025", "longcap-commercial", pmcids=["pmc2", "PMC3"])
    assert ds.task == RETRIEVAL and ds.keys == ["k02", "k03", "k04"]
    assert ds.texts == ["long caption two a", "long caption two b", "long caption three"]
    assert ds.images[0] == SAMPLE_IMAGES[1].read_bytes()
    long = longcap_retrieval(lake, ["PMC1", "PMC2"])
    assert long.name == "longcap/2025" and long.keys == ["k01", "k02"]  # PMC2: its smallest key
    assert release_pairs(lake, "2025", "commercial").keys == ["k01", "k03", "k09"]


# ---- harness end to end --------------------------------------------------------------------------

TINY = TINY_CLIP  # pipelines/training/tiny.py


def _tiny_clip(directory: Path, seed: int, name: str):
    import torch

    from pipelines.evaluation.harness import load_clip

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "open_clip_config.json").write_text(json.dumps(TINY))
    torch.manual_seed(seed)  # random init: the seed makes model and baseline differ
    return load_clip(f"local-dir:{directory}", name=name)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("clip")
    return _tiny_clip(root / "a", 0, "tiny-a"), _tiny_clip(root / "b", 1, "tiny-b")


def _datasets(tmp_path: Path) -> list[EvalDataset]:
    cls = image_folder(_class_folders(tmp_path / "synthetic_cls"))
    shutil.copy(SAMPLE_IMAGES[0], tmp_path / "a.jpg")
    rows = [
        {
            "id": "q1",
            "image": "a.jpg",
            "question": "Which modality?",
            "choices": ["CT", "MRI", "X-ray"],
            "answer": "MRI",
        },
        {"id": "q2", "image": "a.jpg", "question": "Lesion?", "choices": ["yes", "no"], "answer": "no"},
    ]
    (tmp_path / "vqa.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    vqa = manifest(tmp_path / "vqa.jsonl", name="synthetic_vqa")
    ret = release_pairs(_release_lake(tmp_path), "2025", "commercial")
    for ds in (cls, vqa, ret):
        ds.synthetic = True
    return [cls, vqa, ret]


def test_evaluate_end_to_end_with_baseline(tmp_path, tiny_models):
    from pipelines.evaluation.harness import embed_images, evaluate, write_report

    model, baseline = tiny_models
    datasets = _datasets(tmp_path)
    emb, ok = embed_images(model, datasets[0].images, batch_size=3)
    assert emb.shape == (4, 32) and ok.all()
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)

    report = evaluate(model, datasets, baseline=baseline, batch_size=2, n_resamples=200, seed=0)
    by_dataset = {d: [r.metric for r in report.rows if r.dataset == d] for d in report.datasets}
    assert by_dataset["synthetic_cls"] == ["accuracy"]
    assert by_dataset["synthetic_vqa"] == ["accuracy"]
    assert by_dataset["2025/commercial"] == [
        f"{d}_R@{k}" for d in ("image_to_text", "text_to_image") for k in (1, 10, 100)
    ]
    # the undecodable image (k09) is reported and left out: 2 retrieval items remain
    assert ("2025/commercial", "k09", "undecodable image") in report.errors
    assert report.value("2025/commercial", "image_to_text_R@1").n == 2
    assert report.value("synthetic_cls", "accuracy").n == 4
    # with 2 items in the gallery, R@10 is 1 for every model
    assert report.value("2025/commercial", "text_to_image_R@10").value == 1.0
    for r in report.rows:
        assert 0.0 <= r.lo <= r.value <= r.hi <= 1.0
        assert 0.0 <= r.baseline <= 1.0
        assert r.delta == pytest.approx(r.value - r.baseline)
        assert r.delta_lo <= r.delta <= r.delta_hi
    table = report.markdown()
    assert "baseline (95% CI)" in table and "synthetic_cls (synthetic)" in table and "k09" in table
    plots = report.plots()
    assert sorted(plots) == ["2025_commercial.png", "synthetic_cls.png", "synthetic_vqa.png"]
    assert all(png.startswith(b"\x89PNG") for png in plots.values())
    assert "data:image/png;base64," in report.markdown_with_plots()
    paths = write_report(Lake(tmp_path / "lake"), report, "2025", "run1")
    assert json.loads(Path(paths["report.json"]).read_text())["baseline"] == "tiny-b"


def test_evaluate_batch_size_and_self_baseline(tmp_path, tiny_models):
    from pipelines.evaluation.harness import evaluate

    model, _ = tiny_models
    datasets = _datasets(tmp_path)
    a = evaluate(model, datasets, baseline=model, batch_size=1, n_resamples=50)
    b = evaluate(model, datasets, batch_size=64, n_resamples=50)
    assert [r.value for r in a.rows] == pytest.approx([r.value for r in b.rows])
    assert all((r.delta, r.delta_lo, r.delta_hi) == (0.0, 0.0, 0.0) for r in a.rows)
    assert b.baseline is None and "delta" not in b.markdown()
    assert io.BytesIO(b.plots()["synthetic_cls.png"]).read(4) == b"\x89PNG"


def test_evaluate_release(tmp_path, tiny_models):
    from pipelines.evaluation.harness import evaluate_release

    model, baseline = tiny_models
    lake = _release_lake(tmp_path)
    # recorded first, with share 0.999999: every synthetic article is held out (a score >= 0.999999
    # has probability 1e-6 per article), so every pair written for them is evaluated
    make_heldout_split(lake, "2025", share=0.999999, pmcids=["PMC1", "PMC2", "PMC3", "PMC9"])
    report, paths = evaluate_release(lake, "2025", model, baseline, run_id="r1", n_resamples=50)
    assert report.datasets == ["2025/commercial", "longcap/2025"]
    assert report.value("2025/commercial", "image_to_text_R@1").n == 2  # k01, k03; k09 undecodable
    assert report.value("longcap/2025", "image_to_text_R@1").n == 3  # one pair per article: PMC1, PMC2, PMC3
    assert report.settings["heldout_articles"] == 4
    assert Path(paths["report.md"]).parent == tmp_path / "lake" / "models" / "eval" / "2025" / "r1"
