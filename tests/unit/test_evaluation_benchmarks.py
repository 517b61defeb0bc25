"""Named benchmark adapters: tiny files written here by hand in each benchmark's published layout
(VQA-RAD's OSF JSON + image folder, SLAKE's split JSON + ``imgs/``, MedMNIST's ``.npz``, Hugging
Face ``save_to_disk`` and parquet), loaded and compared with what was written. Questions, answers,
labels and pixels are SYNTHETIC; the images are a few sample figures used as pixels."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipelines.evaluation.benchmarks_formats import (
    BENCHMARKS,
    class_templates,
    load_benchmark,
    load_benchmarks,
    question_alternatives,
)
from pipelines.evaluation.datasets import CLASSIFICATION, VQA

SAMPLE_IMAGES = sorted((Path(__file__).parents[2] / "sample" / "images").glob("*/*.jpg"))


def _vqa_rad_row(qid, image, question, answer, answer_type, phrase_type="freeform") -> dict:
    return {
        "qid": qid,
        "image_name": image,
        "image_organ": "CHEST",
        "answer": answer,
        "answer_type": answer_type,
        "question_type": "PRES",
        "question": question,
        "phrase_type": phrase_type,
    }


def write_vqa_rad(root: Path) -> Path:
    """The OSF layout: ``VQA_RAD Dataset Public.json`` beside ``VQA_RAD Image Folder/``."""
    images = root / "VQA_RAD Image Folder"
    images.mkdir(parents=True)
    shutil.copy(SAMPLE_IMAGES[0], images / "synpic100.jpg")
    shutil.copy(SAMPLE_IMAGES[1], images / "synpic200.jpg")
    rows = [
        _vqa_rad_row(1, "synpic100.jpg", "Is there evidence of an aortic aneurysm?", "yes", "CLOSED"),
        _vqa_rad_row(
            2, "synpic100.jpg", "Is the lesion in the left or right lung?", "Right", "CLOSED", "test_freeform"
        ),
        _vqa_rad_row(3, "synpic200.jpg", "What organ is shown?", "liver", "OPEN"),
        _vqa_rad_row(4, "synpic999.jpg", "Is this a CT?", "no", "CLOSED"),
        _vqa_rad_row(5, "synpic200.jpg", "Which organ is abnormal?", "kidney", "CLOSED"),
        _vqa_rad_row(6, "synpic200.jpg", "Is this an MRI or a CT scan?", "CT", "CLOSED", "test_para"),
    ]
    (root / "VQA_RAD Dataset Public.json").write_text(json.dumps(rows, indent=1))
    return root


def test_question_alternatives():
    assert question_alternatives("Is the lesion in the left or right lung?", "right") == ["left", "right"]
    assert question_alternatives("Is this an MRI or a CT scan?", "ct") == ["mri", "ct"]
    assert question_alternatives("Is it in the left lung or the right lung?", "right lung") == [
        "left lung",
        "right lung",
    ]
    assert question_alternatives("Is there a mass?", "yes") == []


def test_class_templates_fill_modality_and_keep_the_label_slot():
    assert class_templates(("a {modality} image of {label}.", "{} seen on {modality}"), "CT") == (
        "a CT image of {}.",
        "{} seen on CT",
    )


def test_vqa_rad_closed_questions(tmp_path):
    root = write_vqa_rad(tmp_path / "vqarad")
    ds = load_benchmark("vqa-rad", root)
    assert ds.name == "vqa-rad" and ds.task == VQA
    # qid 3 is OPEN (left out, not an error); 4's image is missing; 5 is neither yes/no nor "A or B"
    assert ds.keys == ["1", "2", "6"]
    assert ds.choices == [["yes", "no"], ["left", "right"], ["mri", "ct"]]
    assert ds.labels == [0, 1, 1]
    assert ds.images == [str(root / "VQA_RAD Image Folder" / n) for n in ("synpic100.jpg",) * 2 + ("synpic200.jpg",)]
    assert ds.errors == [("4", "image not found: synpic999.jpg"), ("5", "no candidate answers containing 'kidney'")]
    assert ds.item_prompts(0) == [
        "Question: Is there evidence of an aortic aneurysm? Answer: yes",
        "Question: Is there evidence of an aortic aneurysm? Answer: no",
    ]


def test_vqa_rad_test_split_and_answer_pool(tmp_path):
    root = write_vqa_rad(tmp_path / "vqarad")
    assert load_benchmark("vqa-rad", root, split="test").keys == ["2", "6"]  # the test_* phrase types
    assert load_benchmark("vqa-rad", root, split="train").keys == ["1"]
    pooled = load_benchmark("vqa-rad", root / "VQA_RAD Dataset Public.json", choices="pool")
    # every closed answer of the file, normalized and sorted: ct, kidney, no, right, yes
    assert pooled.choices[0] == ["ct", "kidney", "no", "right", "yes"]
    assert pooled.keys == ["1", "2", "5", "6"] and pooled.labels == [4, 3, 1, 0]
    assert [key for key, _ in pooled.errors] == ["4"]


def _slake_row(qid, img_name, question, answer, lang, answer_type) -> dict:
    return {
        "img_id": int(img_name[5]),
        "img_name": img_name,
        "question": question,
        "answer": answer,
        "q_lang": lang,
        "location": "Abdomen",
        "modality": "CT",
        "answer_type": answer_type,
        "base_type": "vqa",
        "content_type": "Organ",
        "triple": ["vhead", "_", "_"],
        "qid": qid,
    }


def write_slake(root: Path) -> Path:
    for n, image in ((0, SAMPLE_IMAGES[0]), (1, SAMPLE_IMAGES[1])):
        (root / "imgs" / f"xmlab{n}").mkdir(parents=True)
        shutil.copy(image, root / "imgs" / f"xmlab{n}" / "source.jpg")
    rows = [
        _slake_row(10, "xmlab0/source.jpg", "Does the picture contain liver?", "Yes", "en", "CLOSED"),
        _slake_row(11, "xmlab0/source.jpg", "图片中包含肝脏吗?", "是", "zh", "CLOSED"),
        _slake_row(12, "xmlab1/source.jpg", "What modality is used?", "MRI", "en", "OPEN"),
        _slake_row(13, "xmlab1/source.jpg", "Which is bigger in this image, kidney or liver?", "Liver", "en", "CLOSED"),
        _slake_row(14, "xmlab9/source.jpg", "Is this a CT image?", "No", "en", "CLOSED"),
    ]
    (root / "test.json").write_text(json.dumps(rows, ensure_ascii=False))
    (root / "validate.json").write_text(json.dumps(rows[:1] + ["not a question"]))
    return root


def test_slake_english_closed_questions(tmp_path):
    root = write_slake(tmp_path / "Slake1.0")
    ds = load_benchmark("slake", root)
    assert ds.name == "slake/test" and ds.task == VQA
    assert ds.keys == ["10", "13"]  # 11 is Chinese, 12 is open
    assert ds.questions == ["Does the picture contain liver?", "Which is bigger in this image, kidney or liver?"]
    assert ds.choices == [["yes", "no"], ["kidney", "liver"]] and ds.labels == [0, 1]
    assert ds.images == [str(root / "imgs" / "xmlab0" / "source.jpg"), str(root / "imgs" / "xmlab1" / "source.jpg")]
    assert ds.errors == [("14", "image not found: xmlab9/source.jpg")]
    val = load_benchmark("slake", root, split="validation")  # shipped as validate.json
    assert val.keys == ["10"] and val.errors == [("row 2", "not a JSON object")]


def _pixels(value: tuple[int, int, int]) -> np.ndarray:
    image = np.zeros((28, 28, 3), dtype=np.uint8)
    image[5, 7] = value
    return image


def test_medmnist_npz_with_known_label_names(tmp_path):
    path = tmp_path / "pathmnist.npz"
    test_images = np.stack([_pixels((200, 10, 30)), _pixels((1, 2, 3)), _pixels((9, 9, 9))])
    np.savez(
        path,
        train_images=np.zeros((2, 28, 28, 3), np.uint8),
        train_labels=np.array([[1], [1]]),
        val_images=np.zeros((1, 28, 28, 3), np.uint8),
        val_labels=np.array([[0]]),
        test_images=test_images,
        test_labels=np.array([[2], [0], [11]]),
    )
    ds = load_benchmark("medmnist", path)
    assert ds.name == "pathmnist/test" and ds.task == CLASSIFICATION
    assert len(ds.classes) == 9 and ds.classes[2] == "debris"
    assert ds.keys == ["test/0", "test/1"] and ds.labels == [2, 0]
    assert ds.errors == [("test/2", "label 11 outside the 9 classes")]
    assert ds.class_prompts()[0] == ["a histopathology image of adipose."]
    first = Image.open(io.BytesIO(ds.images[0]))
    assert first.size == (28, 28) and first.getpixel((7, 5)) == (200, 10, 30)
    assert load_benchmark("medmnist", path, split="train").labels == [1, 1]


def test_medmnist_grayscale_given_names_and_refusals(tmp_path):
    path = tmp_path / "breastmnist.npz"
    gray = np.zeros((2, 28, 28), np.uint8)
    gray[1, 0, 0] = 77
    np.savez(path, test_images=gray, test_labels=np.array([[1], [0]]))
    ds = load_benchmark(
        "medmnist",
        path,
        label_names={"0": "malignant", "1": "normal, benign"},
        modality="breast ultrasound",
        templates=["a {modality} image of {label}.", "{label}"],
    )
    assert ds.classes == ["malignant", "normal, benign"] and ds.labels == [1, 0]
    assert ds.class_prompts()[1] == ["a breast ultrasound image of normal, benign.", "normal, benign"]
    assert Image.open(io.BytesIO(ds.images[1])).getpixel((0, 0)) == 77
    with pytest.raises(ValueError, match="no label names"):
        load_benchmark("medmnist", path)
    multi = tmp_path / "chestmnist.npz"
    np.savez(multi, test_images=gray, test_labels=np.array([[0, 1, 0], [1, 0, 0]]))
    with pytest.raises(ValueError, match="multi-label"):
        load_benchmark("medmnist", multi, label_names=["a", "b", "c"])


def _png_bytes(color: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), color).save(buffer, format="PNG")
    return buffer.getvalue()


def test_hf_save_to_disk_dataset_dict(tmp_path):
    import datasets

    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=["benign", "malignant"])}
    )
    red, blue = _png_bytes((255, 0, 0)), _png_bytes((0, 0, 255))
    test = datasets.Dataset.from_dict(
        {"image": [{"bytes": red, "path": None}, {"bytes": blue, "path": None}], "label": [1, 0]}, features=features
    )
    train = datasets.Dataset.from_dict({"image": [{"bytes": red, "path": None}], "label": [0]}, features=features)
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path / "bench"))
    ds = load_benchmark("hf", tmp_path / "bench", modality="dermatoscopy")
    assert ds.name == "bench/test" and ds.classes == ["benign", "malignant"]
    assert ds.labels == [1, 0] and ds.keys == ["test/0", "test/1"]
    assert Image.open(io.BytesIO(ds.images[0])).getpixel((3, 3)) == (255, 0, 0)
    assert ds.class_prompts()[1] == ["a dermatoscopy image of malignant."]
    assert load_benchmark("hf", tmp_path / "bench" / "train").labels == [0]  # one split's folder


def test_hf_parquet_string_labels_and_bad_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.copy(SAMPLE_IMAGES[0], tmp_path / "on_disk.jpg")
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table(
        {
            "img": pa.array(
                [
                    {"bytes": _png_bytes((0, 255, 0)), "path": None},
                    {"bytes": None, "path": "on_disk.jpg"},
                    None,
                    {"bytes": None, "path": "gone.jpg"},
                    {"bytes": _png_bytes((0, 0, 0)), "path": None},
                ],
                type=image_type,
            ),
            "finding": ["tumor", "normal", "tumor", "normal", None],
        }
    )
    pq.write_table(table, tmp_path / "test-00000-of-00001.parquet")
    ds = load_benchmark("hf", tmp_path, image_column="img", label_column="finding")
    assert ds.classes == ["normal", "tumor"] and ds.labels == [1, 0]
    assert ds.images[1] == str(tmp_path / "on_disk.jpg")
    assert ds.errors == [
        ("test/2", "no image bytes or readable path"),
        ("test/3", "no image bytes or readable path"),
        ("test/4", "unknown label None"),
    ]


def test_registry_and_unreadable_benchmarks_are_recorded(tmp_path):
    assert {"vqa-rad", "slake", "medmnist", "hf", "image-folder", "manifest"} <= set(BENCHMARKS)
    with pytest.raises(ValueError, match="unknown benchmark kind 'pcam'"):
        load_benchmark("pcam", tmp_path)
    with pytest.raises(ValueError, match="bad options"):
        load_benchmark("slake", tmp_path, langauge="en")
    root = write_vqa_rad(tmp_path / "vqarad")
    loaded = load_benchmarks(
        [
            {"kind": "vqa-rad", "path": str(root), "name": "rad"},
            {"kind": "medmnist", "path": str(tmp_path / "absent.npz"), "label_names": ["a", "b"]},
            {"kind": "slake"},
        ],
        synthetic=True,
    )
    assert [d.name for d in loaded] == ["rad", "medmnist #2", "slake #3"]
    assert [len(d) for d in loaded] == [3, 0, 0] and all(d.synthetic for d in loaded)
    assert loaded[1].errors[0][1].startswith("benchmark not loaded: ") and "absent.npz" in loaded[1].errors[0][1]
    assert loaded[2].errors == [("*", "benchmark not loaded: no path")]
