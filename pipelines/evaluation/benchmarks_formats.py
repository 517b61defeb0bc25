"""Named adapters for the formats biomedical benchmarks ship in, and the registry the evaluation job
loads them through (``load_benchmark(kind, path, **options)``).

BIOMEDICA, RegionMed-CLIP and Panel2Patch report zero-shot classification and closed VQA on public
benchmarks distributed as-is: VQA-RAD (one OSF JSON plus an image folder), SLAKE (per-split JSON
with English and Chinese questions plus ``imgs/``), MedMNIST (one ``.npz`` of arrays per dataset)
and Hugging Face datasets (``save_to_disk`` folders or parquet files with image bytes). Reading
them as shipped, rather than asking users to convert them to our CSV/JSONL manifest first, keeps
the numbers comparable with the papers' (same rows, same splits) and removes a conversion step
where rows could silently go missing.

Closed VQA is scored as classification over each question's candidate answers: ``yes``/``no`` for
yes/no questions, the two alternatives of an "A or B" question, or (``choices="pool"``) every
distinct closed answer of the file. A row that cannot be scored (its image missing, no candidate
answers, a label outside the classes) becomes an entry of the dataset's ``errors`` and the rest
loads; a file that cannot be read at all raises (``load_benchmarks`` turns that into a recorded
error of that benchmark, so one bad benchmark does not stop the others).

PCam's HDF5 files are not read: ``h5py`` is not a dependency (convert them to an image folder or
a Hugging Face dataset).
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from pipelines.evaluation.datasets import (
    CLASSIFICATION,
    DEFAULT_VQA_TEMPLATE,
    VQA,
    EvalDataset,
    ImageSource,
    image_folder,
    manifest,
)

DEFAULT_CLASS_TEMPLATES = ("a {modality} image of {label}.",)
DEFAULT_MODALITY = "biomedical"
YES_NO = ["yes", "no"]
CHOICE_MODES = ("question", "pool")
_ARTICLES = {"a", "an", "the"}

# MedMNIST's own label names (medmnist's INFO), for the datasets whose names we could check.
MEDMNIST_INFO: dict[str, dict] = {
    "pathmnist": {
        "modality": "histopathology",
        "labels": [
            "adipose",
            "background",
            "debris",
            "lymphocytes",
            "mucus",
            "smooth muscle",
            "normal colon mucosa",
            "cancer-associated stroma",
            "colorectal adenocarcinoma epithelium",
        ],
    },
}


def class_templates(templates: Sequence[str], modality: str) -> tuple[str, ...]:
    """Fill ``{modality}`` now and turn ``{label}`` into the ``{}`` that ``EvalDataset`` formats per
    class, so a benchmark's prompts name its modality ("a dermatoscopy image of nevus") while the
    harness keeps one prompt path for every dataset."""
    return tuple(t.format("{}", modality=modality, label="{}") for t in templates)


def normalize_answer(value: object) -> str:
    """VQA answers differ in case, surrounding space and a final full stop between rows of the same
    benchmark ("Yes", "yes "); none of that is part of the answer."""
    return re.sub(r"\s+", " ", str(value if value is not None else "")).strip().rstrip(".").strip().lower()


def question_alternatives(question: str, answer: str) -> list[str]:
    """The two alternatives of an "A or B" question, each as many words long as ``answer``
    ("Is the lesion in the left or right lung?" with answer "right" gives ``["left", "right"]``);
    empty when the question offers none. Articles after "or" are skipped ("an MRI or a CT")."""
    text = normalize_answer(question).rstrip("?").strip()
    if " or " not in text or not answer:
        return []
    left, right = text.rsplit(" or ", 1)
    k = len(answer.split())
    left_words = left.replace(",", " ").split()
    right_words = [w for w in right.replace(",", " ").split()]
    while right_words and right_words[0] in _ARTICLES:
        right_words = right_words[1:]
    if len(left_words) < k or len(right_words) < k:
        return []
    first, second = " ".join(left_words[-k:]), " ".join(right_words[:k])
    return [first, second] if first != second else []


def closed_choices(question: str, answer: str, pool: Sequence[str] | None = None) -> list[str] | None:
    """The candidate answers of one closed question, or None when it has none containing
    ``answer`` (a recorded error: scoring it against made-up candidates would inflate accuracy)."""
    if pool is not None:
        return list(pool) if answer in pool else None
    if answer in YES_NO:
        return list(YES_NO)
    alternatives = question_alternatives(question, answer)
    return alternatives if answer in alternatives else None


def _closed_vqa(
    name: str,
    rows: Iterable[tuple[str, dict]],
    image_root: Path,
    image_field: str,
    choices: str,
    vqa_template: str,
) -> EvalDataset:
    """Closed questions (already filtered) -> a VQA dataset; ``rows`` are (key, row) pairs."""
    if choices not in CHOICE_MODES:
        raise ValueError(f"choices must be one of {CHOICE_MODES}, got {choices!r}")
    rows = list(rows)
    pool = sorted({normalize_answer(r.get("answer")) for _, r in rows} - {""}) if choices == "pool" else None
    images: list[ImageSource] = []
    keys, labels, questions, options = [], [], [], []
    errors: list[tuple[str, str]] = []
    for key, row in rows:
        question, answer = str(row.get("question") or "").strip(), normalize_answer(row.get("answer"))
        image_name = str(row.get(image_field) or "").strip()
        image = image_root / image_name
        reason = _vqa_row_problem(question, answer, image_name, image)
        candidates = None if reason else closed_choices(question, answer, pool)
        if reason or candidates is None:
            errors.append((key, reason or f"no candidate answers containing {answer!r}"))
            continue
        images.append(str(image))
        keys.append(key)
        labels.append(candidates.index(answer))
        questions.append(question)
        options.append(candidates)
    return EvalDataset(
        name, VQA, images, keys, labels, questions=questions, choices=options, vqa_template=vqa_template, errors=errors
    )


def _vqa_row_problem(question: str, answer: str, image_name: str, image: Path) -> str | None:
    if not image_name:
        return "no image name"
    if not image.is_file():
        return f"image not found: {image_name}"
    if not question:
        return "no question"
    if not answer:
        return "no answer"
    return None


def _json_rows(path: Path) -> list[dict]:
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of questions, got {type(data).__name__}")
    return data


def _row_key(row: object, number: int) -> str:
    qid = row.get("qid") if isinstance(row, dict) else None
    return str(qid) if qid not in (None, "") else f"row {number}"


def _split_rows(rows: list, keep: Callable[[dict], bool]) -> tuple[list[tuple[str, dict]], list[tuple[str, str]]]:
    """(key, row) of the rows ``keep`` accepts; non-object rows are recorded errors."""
    kept, errors = [], []
    for number, row in enumerate(rows, 1):
        key = _row_key(row, number)
        if not isinstance(row, dict):
            errors.append((key, "not a JSON object"))
        elif keep(row):
            kept.append((key, row))
    return kept, errors


def vqa_rad(
    path: str | os.PathLike[str],
    images: str | os.PathLike[str] | None = None,
    split: str | None = None,
    choices: str = "question",
    vqa_template: str = DEFAULT_VQA_TEMPLATE,
    name: str = "vqa-rad",
) -> EvalDataset:
    """VQA-RAD as published on OSF: ``path`` is the JSON (a list of {qid, image_name, question,
    answer, answer_type CLOSED/OPEN, phrase_type, ...}) or the folder holding it; images are in
    ``images``, default ``VQA_RAD Image Folder`` beside the JSON (else the JSON's folder). Only
    CLOSED questions are kept. ``split="test"`` keeps the ``test_*`` phrase types (the usual 451
    test questions), ``"train"`` the others, None all."""
    file = _single_json(Path(path))
    folder = Path(images) if images is not None else _vqa_rad_images(file.parent)

    def keep(row: dict) -> bool:
        closed = normalize_answer(row.get("answer_type")) == "closed"
        test = str(row.get("phrase_type") or "").startswith("test")
        return closed and (split is None or test == (split == "test"))

    kept, errors = _split_rows(_json_rows(file), keep)
    ds = _closed_vqa(name, kept, folder, "image_name", choices, vqa_template)
    ds.errors = errors + ds.errors
    return ds


def _single_json(path: Path) -> Path:
    if path.is_file():
        return path
    found = sorted(path.glob("*.json"))
    if len(found) != 1:
        raise FileNotFoundError(f"{path}: expected one JSON file, found {len(found)}")
    return found[0]


def _vqa_rad_images(folder: Path) -> Path:
    default = folder / "VQA_RAD Image Folder"
    return default if default.is_dir() else folder


def slake(
    path: str | os.PathLike[str],
    split: str = "test",
    choices: str = "question",
    vqa_template: str = DEFAULT_VQA_TEMPLATE,
    name: str | None = None,
) -> EvalDataset:
    """SLAKE as released: ``path`` is the folder with ``train.json`` / ``validate.json`` (or
    ``validation.json``) / ``test.json`` and ``imgs/<img_name>``, or one of those JSON files. Keeps
    English (``q_lang == "en"``) closed questions: the Chinese ones repeat them in another language,
    which an English text tower would score as noise."""
    root = Path(path)
    file = root if root.is_file() else _slake_split_file(root, split)
    images = file.parent / "imgs"

    def keep(row: dict) -> bool:
        english = str(row.get("q_lang") or "").strip().lower() == "en"
        return english and normalize_answer(row.get("answer_type")) == "closed"

    kept, errors = _split_rows(_json_rows(file), keep)
    ds = _closed_vqa(name or f"slake/{file.stem}", kept, images, "img_name", choices, vqa_template)
    ds.errors = errors + ds.errors
    return ds


def _slake_split_file(root: Path, split: str) -> Path:
    names = ("validate", "validation") if split in ("val", "validate", "validation") else (split,)
    for candidate in names:
        if (root / f"{candidate}.json").is_file():
            return root / f"{candidate}.json"
    raise FileNotFoundError(f"{root}: no {' or '.join(n + '.json' for n in names)}")


def _png(array: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def _names(label_names: Sequence[str] | dict | None) -> list[str] | None:
    """A list, or medmnist's INFO form ``{"0": "adipose", ...}``."""
    if label_names is None:
        return None
    if isinstance(label_names, dict):
        return [str(label_names[k]) for k in sorted(label_names, key=int)]
    return [str(n) for n in label_names]


def medmnist(
    path: str | os.PathLike[str],
    split: str = "test",
    label_names: Sequence[str] | dict | None = None,
    modality: str | None = None,
    templates: Sequence[str] = DEFAULT_CLASS_TEMPLATES,
    limit: int | None = None,
    name: str | None = None,
) -> EvalDataset:
    """A MedMNIST ``.npz`` (``<split>_images`` uint8 N×H×W or N×H×W×3, ``<split>_labels`` N×1) as
    zero-shot classification. Label names are ``label_names`` or, for the datasets in
    ``MEDMNIST_INFO``, MedMNIST's own (the file carries none). Multi-label files (ChestMNIST)
    are refused: single-label accuracy would misread them. Images become PNG bytes."""
    file = Path(path)
    dataset = file.stem.split("_")[0].lower()
    info = MEDMNIST_INFO.get(dataset, {})
    classes = _names(label_names) or info.get("labels")
    if not classes:
        raise ValueError(f"{file.name}: no label names (give label_names; known: {sorted(MEDMNIST_INFO)})")
    with np.load(file, allow_pickle=False) as npz:
        if f"{split}_images" not in npz or f"{split}_labels" not in npz:
            raise ValueError(f"{file.name}: no {split}_images / {split}_labels arrays (has {sorted(npz.files)})")
        images, labels = npz[f"{split}_images"], npz[f"{split}_labels"]
    if labels.ndim == 2 and labels.shape[1] > 1:
        raise ValueError(f"{file.name}: {labels.shape[1]} labels per image (multi-label), not single-label")
    labels = labels.reshape(len(labels), -1)[:, 0] if labels.size else labels.reshape(-1)
    ds = EvalDataset(
        name or f"{dataset}/{split}",
        CLASSIFICATION,
        [],
        [],
        classes=classes,
        templates=class_templates(templates, modality or info.get("modality", DEFAULT_MODALITY)),
    )
    for i in range(min(len(images), len(labels), limit if limit is not None else len(images))):
        _add_array_item(ds, f"{split}/{i}", images[i], labels[i])
    if len(images) != len(labels):
        ds.errors.append((f"{split}/*", f"{len(images)} images but {len(labels)} labels: extra rows left out"))
    return ds


def _add_array_item(ds: EvalDataset, key: str, image: np.ndarray, label: object) -> None:
    if image.dtype != np.uint8 or not (image.ndim == 2 or (image.ndim == 3 and image.shape[2] in (1, 3))):
        ds.errors.append((key, f"not a uint8 H×W or H×W×3 image (dtype {image.dtype}, shape {image.shape})"))
        return
    if not 0 <= int(label) < len(ds.classes):
        ds.errors.append((key, f"label {int(label)} outside the {len(ds.classes)} classes"))
        return
    ds.images.append(_png(image[:, :, 0] if image.ndim == 3 and image.shape[2] == 1 else image))
    ds.keys.append(key)
    ds.labels.append(int(label))


def hf_dataset(
    path: str | os.PathLike[str],
    split: str = "test",
    image_column: str = "image",
    label_column: str = "label",
    label_names: Sequence[str] | dict | None = None,
    modality: str = DEFAULT_MODALITY,
    templates: Sequence[str] = DEFAULT_CLASS_TEMPLATES,
    name: str | None = None,
) -> EvalDataset:
    """A Hugging Face image-classification dataset as files: a ``save_to_disk`` folder (Arrow files
    listed in ``state.json``; a ``DatasetDict`` folder picks ``split``), a parquet file, or a folder
    of parquet files (``<split>-*.parquet`` preferred). The image column holds ``{bytes, path}``;
    class names come from ``label_names``, else the column's ``ClassLabel`` names in the dataset's
    features, else the sorted distinct labels when they are strings."""
    table, features, base = _hf_table(Path(path), split)
    for column in (image_column, label_column):
        if column not in table.column_names:
            raise ValueError(f"{path}: no column {column!r} (has {table.column_names})")
    raw_labels = table.column(label_column).to_pylist()
    classes = _names(label_names) or (features.get(label_column) or {}).get("names")
    if not classes:
        if any(isinstance(v, (int, np.integer)) for v in raw_labels):
            raise ValueError(f"{path}: integer labels but no class names (give label_names)")
        classes = sorted({str(v) for v in raw_labels if v not in (None, "")})
    ds = EvalDataset(
        name or f"{Path(path).name}/{split}",
        CLASSIFICATION,
        [],
        [],
        classes=list(classes),
        templates=class_templates(templates, modality),
    )
    index = {c: i for i, c in enumerate(ds.classes)}
    for number, (cell, label) in enumerate(zip(table.column(image_column).to_pylist(), raw_labels, strict=True)):
        _add_hf_item(ds, f"{split}/{number}", cell, label, index, base)
    return ds


def _add_hf_item(ds: EvalDataset, key: str, cell: object, label: object, index: dict[str, int], base: Path) -> None:
    image = _hf_image(cell, base)
    if image is None:
        ds.errors.append((key, "no image bytes or readable path"))
        return
    if isinstance(label, (int, np.integer)) and not isinstance(label, bool):
        position = int(label) if 0 <= int(label) < len(ds.classes) else None
    else:
        position = index.get(str(label)) if label not in (None, "") else None
    if position is None:
        ds.errors.append((key, f"unknown label {label!r}"))
        return
    ds.images.append(image)
    ds.keys.append(key)
    ds.labels.append(position)


def _hf_image(cell: object, base: Path) -> ImageSource | None:
    """``datasets``' Image feature stores ``{"bytes": ..., "path": ...}``; bytes win, a path is
    relative to the dataset's folder."""
    if isinstance(cell, dict):
        if cell.get("bytes"):
            return bytes(cell["bytes"])
        if cell.get("path"):
            candidate = Path(cell["path"])
            candidate = candidate if candidate.is_absolute() else base / candidate
            return str(candidate) if candidate.is_file() else None
    if isinstance(cell, (bytes, bytearray)) and cell:
        return bytes(cell)
    return None


def _hf_table(path: Path, split: str):
    """(Arrow table, features dict, folder relative image paths start from)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.is_dir() and (path / "dataset_dict.json").is_file():
        path = path / split
    if path.is_dir() and (path / "state.json").is_file():
        state = json.loads((path / "state.json").read_text())
        tables = []
        for entry in state.get("_data_files", []):
            with pa.memory_map(str(path / entry["filename"])) as source:
                tables.append(pa.ipc.open_stream(source).read_all())
        if not tables:
            raise ValueError(f"{path}: state.json lists no data files")
        info = json.loads((path / "dataset_info.json").read_text()) if (path / "dataset_info.json").is_file() else {}
        return pa.concat_tables(tables), info.get("features") or {}, path
    files = [path] if path.is_file() else _parquet_files(path, split)
    table = pa.concat_tables([pq.read_table(f) for f in files])
    meta = (pq.read_schema(files[0]).metadata or {}).get(b"huggingface")
    features = (json.loads(meta).get("info") or {}).get("features") or {} if meta else {}
    return table, features, files[0].parent


def _parquet_files(folder: Path, split: str) -> list[Path]:
    for pattern in (f"{split}-*.parquet", f"{split}/*.parquet", f"data/{split}-*.parquet", "*.parquet"):
        found = sorted(folder.glob(pattern))
        if found:
            return found
    raise FileNotFoundError(f"{folder}: no parquet files")


BENCHMARKS: dict[str, Callable[..., EvalDataset]] = {
    "image-folder": image_folder,
    "manifest": manifest,
    "vqa-rad": vqa_rad,
    "slake": slake,
    "medmnist": medmnist,
    "hf": hf_dataset,
}


def load_benchmark(kind: str, path: str | os.PathLike[str], **options) -> EvalDataset:
    """Load a benchmark by format name (``BENCHMARKS``); unknown kinds and options are refused
    with the accepted ones named, since a typo would otherwise silently use a default."""
    try:
        loader = BENCHMARKS[kind]
    except KeyError:
        raise ValueError(f"unknown benchmark kind {kind!r}; one of {sorted(BENCHMARKS)}") from None
    try:
        return loader(path, **options)
    except TypeError as exc:
        raise ValueError(f"benchmark {kind!r}: bad options {sorted(options)} ({exc})") from exc


def load_benchmarks(specs: Iterable[dict], synthetic: bool = False) -> list[EvalDataset]:
    """The job's ``benchmarks`` list (``{kind, path, ...options}`` each). A benchmark that cannot be
    read is an empty dataset carrying the reason, so the report shows it and the others still run;
    ``synthetic`` marks every dataset (tests and demos)."""
    out = []
    for number, spec in enumerate(specs, 1):
        spec = dict(spec)
        kind, path = spec.pop("kind", ""), spec.pop("path", "")
        label = spec.get("name") or f"{kind or 'benchmark'} #{number}"
        try:
            if not path:
                raise ValueError("no path")
            ds = load_benchmark(kind, path, **spec)
        except (OSError, ValueError, KeyError) as exc:
            ds = EvalDataset(str(label), CLASSIFICATION, [], [], errors=[("*", f"benchmark not loaded: {exc}")])
        ds.synthetic = ds.synthetic or synthetic
        out.append(ds)
    return out
