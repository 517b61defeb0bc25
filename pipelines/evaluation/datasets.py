"""Pluggable evaluation datasets: images plus what the text tower must score against them.

One shape for every task, so the harness has one embedding path:

* ``classification``: ``classes`` (names) x ``templates`` become the class prompts, ``labels`` the
  class index of each image;
* ``vqa`` (closed VQA as classification): each item's ``choices`` become that item's class prompts
  (through ``vqa_template`` with its ``question``), ``labels`` the index of the right answer;
* ``retrieval``: ``texts`` one per image (pair i is image i with text i).

Images are references (a path, or the bytes themselves), decoded batch by batch in the harness.
Adapters read the layouts biomedical benchmarks ship in (a folder per class; a CSV or JSONL
manifest) and PanelForge's own release shards. A bad row (missing image, unknown label, an answer
that is not among the choices) becomes an entry of ``errors`` and the rest loads.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.core.lake import Lake, dataset_dir
from pipelines.images.info import IMAGE_EXTENSIONS

CLASSIFICATION, VQA, RETRIEVAL = "classification", "vqa", "retrieval"
TASKS = (CLASSIFICATION, VQA, RETRIEVAL)
DEFAULT_TEMPLATES = ("a biomedical image of {}.", "a figure showing {}.")
DEFAULT_VQA_TEMPLATE = "Question: {question} Answer: {choice}"
FIGURE_SUBSETS = ("commercial", "noncommercial", "other")
PAIR_PREFIXES = ("panel", "region", "longcap")

ImageSource = str | bytes


@dataclass
class EvalDataset:
    name: str
    task: str
    images: list[ImageSource]
    keys: list[str]
    labels: list[int] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)
    templates: tuple[str, ...] = DEFAULT_TEMPLATES
    questions: list[str] = field(default_factory=list)
    choices: list[list[str]] = field(default_factory=list)
    vqa_template: str = DEFAULT_VQA_TEMPLATE
    texts: list[str] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)  # (item key, reason) of rows not loaded
    synthetic: bool = False  # made up for tests or demos: the report says so

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; one of {TASKS}")
        n = len(self.images)
        wanted = {
            CLASSIFICATION: {"keys": self.keys, "labels": self.labels},
            VQA: {"keys": self.keys, "labels": self.labels, "questions": self.questions, "choices": self.choices},
            RETRIEVAL: {"keys": self.keys, "texts": self.texts},
        }[self.task]
        for name, values in wanted.items():
            if len(values) != n:
                raise ValueError(f"dataset {self.name}: {len(values)} {name} for {n} images")
        if self.task == CLASSIFICATION and any(not 0 <= label < len(self.classes) for label in self.labels):
            raise ValueError(f"dataset {self.name}: a label outside the {len(self.classes)} classes")

    def __len__(self) -> int:
        return len(self.images)

    def class_prompts(self) -> list[list[str]]:
        """Classification: the prompts of each class (their embeddings are averaged)."""
        return [[t.format(c) for t in self.templates] for c in self.classes]

    def item_prompts(self, i: int) -> list[str]:
        """VQA: the prompts of item ``i``'s candidate answers, in the order of ``choices[i]``."""
        return [self.vqa_template.format(question=self.questions[i], choice=c) for c in self.choices[i]]


def _readable_name(folder: str) -> str:
    return folder.replace("_", " ").replace("-", " ").strip()


def _is_image(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in IMAGE_EXTENSIONS


def image_folder(
    root: str | os.PathLike[str],
    name: str | None = None,
    templates: tuple[str, ...] = DEFAULT_TEMPLATES,
    classnames: dict[str, str] | None = None,
) -> EvalDataset:
    """``root/<class>/<image>`` (the torchvision ImageFolder layout most classification benchmarks
    ship in); classes in sorted folder order, named by ``classnames`` or the folder name."""
    root = Path(root)
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    classnames = classnames or {}
    images, keys, labels = [], [], []
    for index, folder in enumerate(folders):
        for path in sorted(p for p in folder.iterdir() if _is_image(p)):
            images.append(str(path))
            keys.append(f"{folder.name}/{path.name}")
            labels.append(index)
    classes = [classnames.get(f.name, _readable_name(f.name)) for f in folders]
    return EvalDataset(name or root.name, CLASSIFICATION, images, keys, labels, classes, templates)


def _manifest_rows(path: Path) -> Iterator[dict]:
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        with open(path) as fh:
            for number, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError as exc:
                        yield {"__error__": f"line {number}: bad JSON ({exc.msg})"}
    else:
        with open(path, newline="") as fh:
            yield from csv.DictReader(fh)


def _choices(value) -> list[str]:
    """JSONL: a list; CSV: a JSON list, or ``|``-separated text."""
    if isinstance(value, list):
        return [str(v) for v in value]
    text = str(value or "").strip()
    if text.startswith("["):
        return [str(v) for v in json.loads(text)]
    return [c.strip() for c in text.split("|") if c.strip()]


def manifest(
    path: str | os.PathLike[str],
    name: str | None = None,
    image_root: str | os.PathLike[str] | None = None,
    classes: list[str] | None = None,
    templates: tuple[str, ...] = DEFAULT_TEMPLATES,
    vqa_template: str = DEFAULT_VQA_TEMPLATE,
) -> EvalDataset:
    """A CSV or JSONL manifest with columns ``image`` (relative to ``image_root``, default the
    manifest's folder) and ``label``; rows with ``question`` and ``choices`` make a closed-VQA set,
    ``label`` then being the right answer's text. Classes are ``classes`` or the sorted labels."""
    path = Path(path)
    root = Path(image_root) if image_root is not None else path.parent
    rows = list(_manifest_rows(path))
    vqa = any(r.get("question") for r in rows)
    if classes is None and not vqa:
        classes = sorted({str(r["label"]) for r in rows if r.get("label") not in (None, "")})
    index = {c: i for i, c in enumerate(classes or [])}
    data: dict[str, list] = {"images": [], "keys": [], "labels": [], "questions": [], "choices": []}
    errors: list[tuple[str, str]] = []
    for number, row in enumerate(rows, 1):
        key = str(row.get("id") or row.get("image") or f"row {number}")
        reason, label, choices = _check_row(row, root, vqa, index)
        if reason:
            errors.append((key, reason))
            continue
        data["images"].append(str(root / row["image"]))
        data["keys"].append(key)
        data["labels"].append(label)
        if vqa:
            data["questions"].append(str(row["question"]))
            data["choices"].append(choices)
    task = VQA if vqa else CLASSIFICATION
    return EvalDataset(
        name or path.stem,
        task,
        data["images"],
        data["keys"],
        data["labels"],
        list(classes or []),
        templates,
        data["questions"],
        data["choices"],
        vqa_template,
        errors=errors,
    )


def _check_row(row: dict, root: Path, vqa: bool, index: dict[str, int]) -> tuple[str | None, int, list[str]]:
    """(reason the row is unusable or None, label index, choices)."""
    if "__error__" in row:
        return row["__error__"], -1, []
    if not row.get("image"):
        return "no image", -1, []
    if not (root / row["image"]).is_file():
        return f"image not found: {row['image']}", -1, []
    label = str(row.get("label") or row.get("answer") or "")
    if not vqa:
        return (None, index[label], []) if label in index else (f"unknown label {label!r}", -1, [])
    if not row.get("question"):
        return "no question", -1, []
    try:
        choices = _choices(row.get("choices"))
    except json.JSONDecodeError:
        return "choices are not a JSON list", -1, []
    if len(choices) < 2:
        return "fewer than two choices", -1, []
    if label not in choices:
        return f"answer {label!r} not among the choices", -1, []
    return None, choices.index(label), choices


def subset_shards(lake: Lake, release: str, subset: str) -> list[str]:
    """The shards of ``dataset/<release>/<subset>/`` in name order."""
    return sorted(lake.fs.glob(dataset_dir(lake, release, subset, "*.tar")))


def iter_release_samples(lake: Lake, shards: Iterable[str]) -> Iterator[dict]:
    """Samples (``__key__``, ``jpg``, ``txt``, ``json``...) of release shards, read with webdataset's
    tar iterators over the lake's filesystem (local or object store alike)."""
    from webdataset.tariterators import group_by_keys, tar_file_expander

    for shard in shards:
        with lake.fs.open(shard, "rb") as fh:
            yield from group_by_keys(tar_file_expander([{"url": shard, "stream": fh}]))


def release_pairs(
    lake: Lake,
    release: str,
    subset: str,
    pmcids: Iterable[str] | None = None,
    one_per_article: bool = False,
    limit: int | None = None,
    name: str | None = None,
) -> EvalDataset:
    """Retrieval pairs (image, caption) from a subset the release wrote: figure level
    (``commercial``...), or a pair level (``panel-*``, ``region-*``, ``longcap-*``). ``pmcids``
    keeps only those articles (the held-out split); ``one_per_article`` keeps each article's
    smallest key, so one article cannot crowd a gallery with near-identical captions (long-caption
    retrieval); ``limit`` bounds the items (and the image bytes held)."""
    wanted = None if pmcids is None else {p.strip().upper() for p in pmcids}
    chosen: dict[str, tuple[str, bytes, str]] = {}  # dedupe key -> (sample key, image, text)
    errors: list[tuple[str, str]] = []
    for sample in iter_release_samples(lake, subset_shards(lake, release, subset)):
        key = sample["__key__"]
        try:
            meta = json.loads(sample["json"])
            text = sample["txt"].decode("utf-8").strip()
            image = sample["jpg"]
        except (KeyError, ValueError) as exc:
            errors.append((key, f"incomplete sample: {exc}"))
            continue
        pmcid = str(meta.get("pmcid", "")).strip().upper()
        if wanted is not None and pmcid not in wanted:
            continue
        if not text:
            errors.append((key, "empty text"))
            continue
        slot = pmcid if one_per_article else key
        if slot not in chosen or key < chosen[slot][0]:
            chosen[slot] = (key, image, text)
        if limit is not None and not one_per_article and len(chosen) >= limit:
            break
    items = sorted(chosen.values())[:limit]
    return EvalDataset(
        name or f"{release}/{subset}",
        RETRIEVAL,
        [image for _, image, _ in items],
        [key for key, _, _ in items],
        texts=[text for _, _, text in items],
        errors=errors,
    )


def newest_release(lake: Lake) -> str:
    """The newest release with shards under ``dataset/`` (release names sort by year)."""
    found = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in lake.fs.glob(dataset_dir(lake, "*")) if lake.fs.isdir(p))
    if not found:
        raise FileNotFoundError(f"no release under {dataset_dir(lake)}")
    return found[-1]


def longcap_retrieval(
    lake: Lake, pmcids: Iterable[str], license_group: str = "commercial", release: str | None = None
) -> EvalDataset:
    """Long-caption retrieval: one pair per held-out article from the newest release."""
    release = release or newest_release(lake)
    return release_pairs(
        lake, release, f"longcap-{license_group}", pmcids, one_per_article=True, name=f"longcap/{release}"
    )
