"""The sample plan of one (release, shard): one row per figure image, included or excluded.

Planning is the per-partition, embarrassingly parallel half of serialization. It joins a
partition's figures with their article, PubMed record, mentions and concept labels; decides
every exclusion (with a counted reason); converts the images that are not JPEG once, into a
per-partition tar; and writes the caption and the sample's JSON. The release writer then only
copies bytes, in one global shuffled order, so it is fast and its memory is flat.

The shuffle order is a keyed hash of each sample's key (``shuffle_key``); each partition's plan
is stored sorted by it, so the writer merges partitions as sorted runs.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from collections import defaultdict
from dataclasses import dataclass, field

from pipelines.core.lake import Commit, Lake
from pipelines.core.rawstore import RawReader, add_member
from pipelines.core.schemas import SAMPLES
from pipelines.images.jpeg import JPEG_MAGIC, to_jpeg
from pipelines.text.captions import caption_of

_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")

# The sample JSON: every field, always present, with a fixed type and never null ("" and -1 mean
# unknown). Readers that infer a schema from the first samples (Hugging Face datasets reads five)
# would otherwise type a field as null and fail at its first value. The dataset card declares it.
JSON_FIELDS = {
    "key": "string",
    "pmcid": "string",
    "pmid": "string",
    "doi": "string",
    "title": "string",
    "journal": "string",
    "pub_date": "string",
    "article_type": "string",
    "keywords": "list",
    "mesh_terms": "list",
    "mesh_major_terms": "list",
    "publication_types": "list",
    "cited_by_count": "int64",
    "fig_id": "string",
    "fig_label": "string",
    "image_file": "string",
    "parent_fig_id": "string",
    "license_code": "string",
    "license_group": "string",
    "license_url": "string",
    "global_concept": "string",
    "local_concepts": "list",
    "panel_type": "string",
    "cluster_id": "int64",
    "label_status": "string",
    "concept_model_version": "string",
    "labels_from_synthetic_model": "bool",
    "source_sha256": "string",
    "sha256": "string",
    "phash": "string",
    "width": "int64",
    "height": "int64",
    "converted_from": "string",
    "mentions": "list",
}
# "list" is a list of strings, "ints" a list of integers; a list of records is a list of their
# field dicts (``{"name": kind}``). Unknown values: "", -1, -1.0, False, [].
_UNKNOWN = {"string": "", "int64": -1, "float64": -1.0, "bool": False, "list": [], "ints": []}


def stable_json(meta: dict, fields: dict = JSON_FIELDS) -> dict:
    """``meta`` with every entry of ``fields`` present and typed (unknown: "" or -1)."""
    if meta.keys() != fields.keys():
        raise ValueError(f"sample JSON fields differ from JSON_FIELDS: {sorted(meta.keys() ^ fields.keys())}")
    return {name: (_UNKNOWN.get(kind, []) if meta[name] is None else meta[name]) for name, kind in fields.items()}


def json_text(meta: dict, fields: dict = JSON_FIELDS) -> str:
    """The sample's JSON member: typed, keys sorted, compact, so shards are reproducible."""
    return json.dumps(stable_json(meta, fields), sort_keys=True, ensure_ascii=False, separators=(",", ":"))


REASONS = ("no_graphic", "missing_image", "zero_byte_image", "undecodable_image", "empty_caption", "unknown_license")


@dataclass
class SamplePlan:
    rows: list[dict]  # rows of the ``samples`` table, sorted by shuffle_key
    converted: int = 0
    excluded: dict[str, int] = field(default_factory=dict)

    @property
    def included(self) -> int:
        return sum(1 for r in self.rows if r["status"] == "included")


def sample_key(pmcid: str, fig_id: str | None, index: int, n_images: int) -> str:
    """``PMC123_F1`` (``_2``... for a figure with several images); no dots, so WebDataset's
    "key up to the first dot" rule and Hugging Face's loader keep it whole."""
    base = f"{pmcid}_{fig_id or 'fig'}" + (f"_{index + 1}" if n_images > 1 else "")
    return _KEY_UNSAFE.sub("-", base)


def shuffle_key(seed: int, key: str) -> str:
    return hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).hexdigest()


def _article_fields(article: dict, pubmed: dict | None) -> dict:
    mesh = (pubmed or {}).get("mesh") or []
    return {
        "pmcid": article["pmcid"],
        "pmid": article["pmid"],
        "doi": article["doi"],
        "title": article["title"],
        "journal": article["journal"],
        "pub_date": article["pub_date"],
        "article_type": article["article_type"],
        "keywords": list(article["keywords"] or []),
        "mesh_terms": [m["name"] for m in mesh],
        "mesh_major_terms": [m["name"] for m in mesh if m["major"]],
        "publication_types": list((pubmed or {}).get("publication_types") or []),
        "cited_by_count": (pubmed or {}).get("cited_by_count"),
    }


def _by(rows, *fields) -> dict:
    return {tuple(r[f] for f in fields): r for r in rows}


def plan_shard(lake: Lake, release: str, shard: str, seed: int, converted_tar: str, commit: Commit) -> SamplePlan:
    """Plan every figure image of one partition; non-JPEG images are converted into
    ``converted_tar`` (a lake path, written into ``commit`` only when there is something to write,
    so it is published with the plan that points into it)."""

    def table(name: str) -> list[dict]:
        if name in ("figures", "articles", "raw_files"):
            return lake.require(name, release, shard).to_pylist()
        found = lake.read_table(name, release, shard)
        return found.to_pylist() if found is not None else []

    articles = _by(table("articles"), "pmcid")
    raw = _by(table("raw_files"), "pmcid", "name")
    pubmed = {r["pmcid"]: r for r in table("pubmed") if r["pmcid"] and r["status"] == "ok"}
    concepts = _by(table("figure_concepts"), "pmcid", "fig_id", "image_file")
    embedding_errors = {(r["pmcid"], r["image_file"]): r["error"] for r in table("embeddings") if r["error"]}
    mentions: dict[tuple, list[str]] = defaultdict(list)
    for m in table("mentions"):
        mentions[(m["pmcid"], m["fig_id"])].append(m["text"])

    rows: list[dict] = []
    conversions: list[tuple[dict, bytes]] = []
    keys_seen: set[str] = set()
    reader = RawReader(lake)
    for fig in table("figures"):
        article = articles.get((fig["pmcid"],))
        if article is None:
            continue
        files = list(fig["image_files"] or [])
        if not files:  # a figure without a graphic (its images are in child figures), or one not in the package
            reason = "missing_image" if fig["graphic_hrefs"] else "no_graphic"
            detail = "; ".join(fig["flags"] or []) or None
            key = sample_key(fig["pmcid"], fig["fig_id"], 0, 1)
            rows.append(_excluded(fig, None, key, reason, seed, detail))
            keys_seen.add(key)
            continue
        for index, name in enumerate(files):
            key = sample_key(fig["pmcid"], fig["fig_id"], index, len(files))
            while key in keys_seen:  # two fig ids that differ only in unsafe characters
                key += "_"
            keys_seen.add(key)
            source = raw.get((fig["pmcid"], name))
            head = reader.read(source["tar_path"], source["offset"], min(3, source["size"])) if source else b""
            context = (article, concepts, embedding_errors, mentions, pubmed.get(fig["pmcid"]))
            row = _plan_image(fig, index, name, key, source, head == JPEG_MAGIC, context, seed)
            if row["status"] == "included" and row["converted_from"]:
                data, reason = to_jpeg(reader.read(source["tar_path"], source["offset"], source["size"]))
                if data is None:
                    row.update(_exclusion("undecodable_image", reason))
                else:
                    conversions.append((row, data))
            rows.append(row)
    reader.close()
    if conversions:
        write_images(commit, converted_tar, conversions)
    rows = sorted(_finish_rows(rows), key=lambda r: r["shuffle_key"])
    excluded: dict[str, int] = defaultdict(int)
    for row in rows:
        if row["status"] == "excluded":
            excluded[row["reason"]] += 1
    return SamplePlan(rows, converted=len(conversions), excluded=dict(excluded))


def _exclusion(reason: str, detail: str | None = None) -> dict:
    return {"status": "excluded", "reason": reason, "detail": detail}


def _excluded(fig: dict, name: str | None, key: str, reason: str, seed: int, detail: str | None = None) -> dict:
    row = {column: None for column in SAMPLES.names if column != "meta_json"} | {"meta": None}
    row.update(
        key=key,
        pmcid=fig["pmcid"],
        fig_id=fig["fig_id"],
        image_file=name,
        shuffle_seed=seed,
        shuffle_key=shuffle_key(seed, key),
        **_exclusion(reason, detail),
    )
    return row


def _plan_image(fig, index, name, key, source, is_jpeg, context, seed) -> dict:
    article, concepts, embedding_errors, mentions, pubmed = context
    errors = list(fig["image_errors"] or [])
    image_error = (errors[index] if index < len(errors) else None) or embedding_errors.get((fig["pmcid"], name))
    caption = caption_of(fig)
    if source is None:
        return _excluded(fig, name, key, "missing_image", seed, "listed in the figure but not in the package")
    if source["size"] == 0:
        return _excluded(fig, name, key, "zero_byte_image", seed)
    if image_error:
        return _excluded(fig, name, key, "undecodable_image", seed, image_error)
    if not caption:
        return _excluded(fig, name, key, "empty_caption", seed)
    if not article["license_code"]:
        return _excluded(fig, name, key, "unknown_license", seed, article["license_url"] or article["license_text"])
    label = concepts.get((fig["pmcid"], fig["fig_id"], name)) or {}
    widths, heights, hashes = fig["widths"] or [], fig["heights"] or [], fig["phash"] or []
    meta = {
        "key": key,
        "fig_id": fig["fig_id"],
        "fig_label": fig["label"],
        "image_file": name,
        "parent_fig_id": fig["parent_fig_id"],
        "license_code": article["license_code"],
        "license_group": article["license_group"],
        "license_url": article["license_url"],
        "global_concept": label.get("global_concept"),
        "local_concepts": list(label.get("local_concepts") or []),
        "panel_type": label.get("panel_type"),
        "cluster_id": label.get("cluster_id"),
        "label_status": label.get("label_status", "not_labeled"),
        "concept_model_version": label.get("model_version"),
        "labels_from_synthetic_model": bool(label.get("synthetic", False)),
        "source_sha256": source["sha256"],
        "phash": hashes[index] if index < len(hashes) else None,
        "width": widths[index] if index < len(widths) else None,
        "height": heights[index] if index < len(heights) else None,
        "converted_from": None if is_jpeg else _extension(name),
        "mentions": mentions.get((fig["pmcid"], fig["fig_id"]), []),
        **_article_fields(article, pubmed),
    }
    return {
        "key": key,
        "pmcid": fig["pmcid"],
        "fig_id": fig["fig_id"],
        "image_file": name,
        "status": "included",
        "reason": None,
        "detail": None,
        "shuffle_seed": seed,
        "shuffle_key": shuffle_key(seed, key),
        "license_group": article["license_group"],
        "license_code": article["license_code"],
        "global_concept": meta["global_concept"],
        "panel_type": meta["panel_type"],
        "cluster_id": meta["cluster_id"],
        "width": meta["width"],
        "height": meta["height"],
        "converted_from": meta["converted_from"],
        "image_tar": source["tar_path"],
        "image_offset": source["offset"],
        "image_size": source["size"],
        "image_sha256": source["sha256"] if is_jpeg else None,
        "caption": caption,
        "meta": meta,
    }


def _extension(name: str) -> str:
    return name.rsplit(".", 1)[1].lower() if "." in name else "unknown"


def write_images(commit: Commit, dest: str, conversions: list[tuple[dict, bytes]]) -> None:
    """JPEG bytes derived once (conversions, crops) into one tar at ``dest``, in key order so the
    tar is reproducible; each row learns where its bytes are and their sha256. The tar is part of
    ``commit``: it appears with the table whose rows point into it."""
    relative = commit.lake.relative(dest)
    with commit.file(dest) as tmp, tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT) as tar:
        for row, data in sorted(conversions, key=lambda item: item[0]["key"]):
            offset = add_member(tar, f"{row['key']}.jpg", io.BytesIO(data), len(data))
            row.update(image_tar=relative, image_offset=offset, image_size=len(data))
            row["image_sha256"] = hashlib.sha256(data).hexdigest()


def _finish_rows(rows: list[dict]) -> list[dict]:
    """Rows as stored in the ``samples`` table: the JSON is completed (with the sha256 of the bytes
    that will be written) and serialized once, with sorted keys, so shards are reproducible."""
    out = []
    for row in rows:
        row = dict(row)
        meta = row.pop("meta", None)
        if meta is not None:
            meta["sha256"] = row["image_sha256"]
            row["meta_json"] = json_text(meta)
        else:
            row["meta_json"] = None
        out.append(row)
    return out
