"""The synthetic training set on disk: one COCO dataset per split, streamed one image at a time.

COCO is what DAB-DETR's training (``pipelines.panels.train``) and the COCO evaluation read, so the
set is written in it: ``<split>/images/NNNNNNNN.jpg``, ``<split>/annotations.json`` (panels as
category 1 with their source, licence and label, insets with their host as ``parent_id``; panel
labels as category 2 with their ``panel_id``), ``<split>/sources.json`` (every source with its
licence and how often it was used) and ``summary.json``. Thousands of figures must not sit in
memory: annotations go to JSON-lines files first and are joined into the JSON file at the end,
which is replaced atomically.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipelines.images.duplicates import NEAR_DISTANCE
from pipelines.panels.synthetic.generate import GENERATOR_VERSION, GeneratorConfig, Sample, generate_sample
from pipelines.panels.synthetic.sources import SourceCache, SourcePanel
from pipelines.panels.synthetic.splits import CheckedSource, check_sources, split_sources

PANEL, PANEL_LABEL = 1, 2
CATEGORIES = [
    {"id": PANEL, "name": "panel", "supercategory": "figure"},
    {"id": PANEL_LABEL, "name": "panel_label", "supercategory": "figure"},
]


def write_coco_dataset(
    out_dir: str | os.PathLike[str],
    sources: Iterable[SourcePanel],
    n: int,
    seed: int,
    split: float = 0.1,
    config: GeneratorConfig = GeneratorConfig(),  # noqa: B008
    max_distance: int = NEAR_DISTANCE,
) -> dict:
    """Write ``n`` synthetic figures as COCO datasets ``out_dir/train`` and ``out_dir/val``
    (``round(n * split)`` val images made only from val sources), each with ``images/``,
    ``annotations.json`` and ``sources.json``, plus ``out_dir/summary.json``; return the
    summary. Sources are split by a hash of their key and de-duplicated across the splits
    (dHash within ``max_distance`` bits: the val copy is dropped). One image is held at a time;
    annotations go through JSON-lines files on disk."""
    if not 0 <= split < 1:
        raise ValueError(f"split is the val share, in [0, 1): {split}")
    started = time.perf_counter()
    out = Path(out_dir)
    checked, problems = check_sources(sources)
    dropped = split_sources(checked, seed, split, max_distance)
    n_val = round(n * split)
    plan = {"train": n - n_val, "val": n_val}
    summary: dict = {
        "version": GENERATOR_VERSION,
        "seed": seed,
        "val_share": split,
        "sources": len(checked),
        "undecodable_sources": problems,
        "dedup": {"hash": "dhash", "max_distance": max_distance, "dropped_near_duplicates": dropped},
        "splits": {},
    }
    for name, count in plan.items():
        pool = [c for c in checked if c.split == name]
        if count and not pool:
            raise ValueError(f"no source panels left for {name} ({len(checked)} sources, {dropped} dropped)")
        if count:
            summary["splits"][name] = _write_split(out / name, name, pool, count, seed, config, summary["dedup"])
    listing = [
        {"key": c.source.key, "license_code": c.source.license_code, "license_group": c.source.license_group}
        | {"dhash": c.phash, "split": c.split}
        for c in checked
    ]
    out.mkdir(parents=True, exist_ok=True)
    (out / "sources.json").write_text(json.dumps(listing, indent=1, ensure_ascii=False) + "\n")
    summary["seconds"] = round(time.perf_counter() - started, 3)
    total = sum(s["images"] for s in summary["splits"].values())
    summary["images_per_second"] = round(total / max(summary["seconds"], 1e-9), 2)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return summary


@dataclass
class _Tally:
    """What a split holds, for its ``info`` and the summary."""

    counts: dict[str, int] = field(default_factory=lambda: {"images": 0, "panels": 0, "insets": 0, "labels": 0})
    fonts: set[str] = field(default_factory=set)
    kinds: dict[str, int] = field(default_factory=dict)

    def add(self, sample: Sample) -> None:
        self.counts["images"] += 1
        self.counts["panels"] += len(sample.panels)
        self.counts["insets"] += sample.layout["insets"]
        self.counts["labels"] += len(sample.labels)
        self.fonts |= sample.fonts
        self.kinds[sample.layout["kind"]] = self.kinds.get(sample.layout["kind"], 0) + 1


def _write_split(
    folder: Path, split: str, pool: list[CheckedSource], count: int, seed: int, config: GeneratorConfig, dedup: dict
) -> dict:
    """Generate and write ``count`` samples of ``split`` from ``pool``; the split's counts."""
    (folder / "images").mkdir(parents=True, exist_ok=True)
    images_jsonl, annotations_jsonl = folder / "images.jsonl.tmp", folder / "annotations.jsonl.tmp"
    cache = SourceCache()
    sources = [c.source for c in pool]
    by_key = {c.source.key: c for c in pool}
    tally = _Tally()
    started = time.perf_counter()
    last_id = 0
    with open(images_jsonl, "w", encoding="utf-8") as im_out, open(annotations_jsonl, "w", encoding="utf-8") as an_out:
        for index in range(count):
            sample = generate_sample(sources, seed, index, split, config, cache)
            image_id = index + 1
            file_name = f"{image_id:08d}.jpg"  # COCO: the name within the split's images/ folder
            (folder / "images" / file_name).write_bytes(sample.jpeg)
            im_out.write(_json_line(image_record(sample, index, image_id, file_name)))
            records, last_id = annotation_records(sample, image_id, last_id)
            an_out.write("".join(_json_line(r) for r in records))
            for panel in sample.panels:
                if not panel["inset"]:
                    by_key[panel["source_key"]].uses += 1
            tally.add(sample)
    seconds = time.perf_counter() - started
    info = {
        "description": "PanelForge synthetic compound figures (panels and panel labels)",
        "version": GENERATOR_VERSION,
        "split": split,
        "seed": seed,
        "sample_seed": "blake2b-64 of '{seed}:{split}:{index}', big-endian; image id = index + 1",
        "counts": tally.counts | {"sources": len(pool), "layouts": dict(sorted(tally.kinds.items()))},
        "fonts": sorted(tally.fonts),
        "dedup": dedup,
        "config": asdict(config),
    }
    write_json_stream(
        folder / "annotations.json",
        {"info": info, "licenses": []},
        [("images", images_jsonl), ("annotations", annotations_jsonl), ("categories", CATEGORIES)],
    )
    images_jsonl.unlink()
    annotations_jsonl.unlink()
    (folder / "sources.json").write_text(json.dumps(_source_listing(pool), indent=1, ensure_ascii=False) + "\n")
    return tally.counts | {
        "sources": len(pool),
        "fonts": sorted(tally.fonts),
        "seconds": round(seconds, 3),
        "images_per_second": round(tally.counts["images"] / max(seconds, 1e-9), 2),
    }


def _json_line(record: dict) -> str:
    return json.dumps(record, ensure_ascii=False) + "\n"


def image_record(sample: Sample, index: int, image_id: int, file_name: str) -> dict:
    """The COCO image entry, with what makes the sample again (seed, layout, degradation)."""
    return {
        "id": image_id,
        "index": index,
        "file_name": file_name,
        "width": sample.width,
        "height": sample.height,
        "seed": sample.seed,
        "layout": sample.layout,
        "degradation": sample.degradation,
    }


def annotation_records(sample: Sample, image_id: int, last_id: int) -> tuple[list[dict], int]:
    """The sample's COCO annotations, numbered after ``last_id``: its panels (insets pointing at
    their host's id) and then its labels (pointing at their panel's id); and the last id used."""
    panel_ids = list(range(last_id + 1, last_id + 1 + len(sample.panels)))
    records = []
    for k, panel in enumerate(sample.panels):
        _, _, w, h = panel["bbox"]
        records.append(
            {
                "id": panel_ids[k],
                "image_id": image_id,
                "category_id": PANEL,
                "bbox": panel["bbox"],
                "area": round(w * h, 2),
                "iscrowd": 0,
                "label_text": panel["label_text"],
                "label": panel["label"],
                "inset": panel["inset"],
                "parent_id": panel_ids[panel["parent"]] if panel["parent"] is not None else None,
                "source_key": panel["source_key"],
                "license_code": panel["license_code"],
                "license_group": panel["license_group"],
            }
        )
    next_id = last_id + len(sample.panels)
    for label in sample.labels:
        next_id += 1
        _, _, w, h = label["bbox"]
        records.append(
            {
                "id": next_id,
                "image_id": image_id,
                "category_id": PANEL_LABEL,
                "bbox": label["bbox"],
                "area": round(w * h, 2),
                "iscrowd": 0,
                "label_text": label["label_text"],
                "label": label["label"],
                "panel_id": panel_ids[label["panel"]],
                "style": label["style"],
            }
        )
    return records, next_id


def _source_listing(pool: list[CheckedSource]) -> list[dict]:
    return [
        {
            "key": c.source.key,
            "license_code": c.source.license_code,
            "license_group": c.source.license_group,
            "dhash": c.phash,
            "width": c.width,
            "height": c.height,
            "uses": c.uses,
        }
        for c in pool
    ]


def write_json_stream(path: Path, head: dict, parts: list[tuple[str, Path | list]]) -> None:
    """Write ``head`` plus one JSON array per part (a JSON-lines file or a list) as one JSON
    object, without loading the JSON-lines files; atomically."""
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        out.write(json.dumps(head, ensure_ascii=False)[:-1])
        for name, part in parts:
            out.write(f', "{name}": [')
            if isinstance(part, list):
                out.write(", ".join(json.dumps(p, ensure_ascii=False) for p in part))
            else:
                with open(part, encoding="utf-8") as lines:
                    for k, line in enumerate(lines):
                        out.write((", " if k else "") + line.rstrip("\n"))
            out.write("]")
        out.write("}\n")
    os.replace(tmp, path)
