"""The sample plan of the pair levels of one (release, shard): panel pairs, region pairs with their
hard negatives, and long captions, each traced to its figure-level sample.

The figure-level plan (``samples``) decides everything about a figure: whether it is released,
its key, its license group and its shuffle seed. A pair inherits all of it, so a pair of an
excluded figure is excluded with the figure's reason, a subset never mixes license groups, and
keys read ``<figure key>_p003`` (panel) and ``<figure key>_p003_r01`` (region): WebDataset and
Hugging Face take a sample's key up to the first dot of the member name, so the suffix joins
with an underscore; its fixed width keeps keys unique within a level. A long caption is the
figure itself with another text, so its key is the figure's key.

A panel sample ships only a caption-matched text by default (matched by printed label or by
reading order, ``pipelines.text.pairing``; texts the VLM associated on request) and only a crop
that passes the release gate (``pipelines.images.gate``); the others are excluded with a reason.

Images are derived once, here: a panel pair reuses its crop from ``panel_crops`` (the bytes, not
re-encoded) when its box is that panel's box; a panel the model proposed and every region are
cut from the raw figure image with the panel crops' JPEG settings (``jpeg_bytes``) into one tar
per partition; a long caption carries the figure sample's own bytes. The release writer then
only copies bytes, exactly as for the figure level.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from PIL import Image

from pipelines.core.lake import Commit, Lake
from pipelines.core.provenance import public_model_name
from pipelines.core.rawstore import RawReader
from pipelines.core.schemas import PAIR_SAMPLES, Table
from pipelines.images.boxes import crop_panel
from pipelines.images.decode import decode_image
from pipelines.images.gate import GateSettings, crop_gate
from pipelines.images.jpeg import jpeg_bytes
from pipelines.release.samples import _KEY_UNSAFE, json_text, shuffle_key, write_images
from pipelines.text.pairing import CAPTION_MATCHES, VLM

PANEL, REGION, LONGCAP = "panel", "region", "longcap"
PAIR_LEVELS = (PANEL, REGION, LONGCAP)
REASONS = (
    "figure_not_planned",  # no figure-level sample for the pair's image
    "figure_excluded",  # the figure-level sample is excluded (its reason is the detail)
    "no_text",  # a pair without caption-derived text, or an empty long caption
    "long_caption_error",  # the long-caption stage recorded an error for the figure
    "bad_box",  # a box empty or outside the image
    "undecodable_image",  # the raw image could not be decoded to cut a crop
    "vlm_text",  # a panel whose text the VLM associated (match "vlm"): shipped only when asked for
    "crop_gate",  # a panel crop that fails the release gate (pipelines.images.gate; the detail says why)
)
PANEL_CROPS, CUT, FIGURE = "panel_crops", "cut", "figure"

# The JSON of each level: every field always present and typed (see samples.JSON_FIELDS).
FIGURE_REF_FIELDS = {
    "key": "string",
    "figure_key": "string",
    "level": "string",
    "pmcid": "string",
    "pmid": "string",
    "doi": "string",
    "title": "string",
    "journal": "string",
    "pub_date": "string",
    "fig_id": "string",
    "fig_label": "string",
    "image_file": "string",
    "license_code": "string",
    "license_group": "string",
    "license_url": "string",
    "global_concept": "string",
    "panel_type": "string",
    "width": "int64",
    "height": "int64",
    "sha256": "string",
}
PROVENANCE_FIELDS = {
    "model": "string",
    "model_revision": "string",
    "prompt_version": "string",
    "backend": "string",
    "backend_version": "string",
    "synthetic": "bool",
}
NEGATIVE_FIELDS = {
    "index": "int64",
    "text": "string",
    "perturbation": "string",
    "original_span": "string",
    "replacement": "string",
    "source": "string",
}
_PAIR_FIELDS = {
    "pair_id": "string",
    "panel_index": "int64",
    "box": "ints",  # [x1, y1, x2, y2] in original pixels of the figure image, x2/y2 exclusive
    "text_source": "string",
    "extractive": "bool",
    "description": "string",  # the VLM's description of the crop (a second text)
    "score": "float64",
    "crop_source": "string",
}
PANEL_JSON_FIELDS = {**FIGURE_REF_FIELDS, **_PAIR_FIELDS, "label": "string", "panel_source": "string"}
PANEL_JSON_FIELDS |= {"text_match": "string", "count_agreement": "string", "label_source": "string"}
PANEL_JSON_FIELDS |= PROVENANCE_FIELDS
REGION_JSON_FIELDS = {**FIGURE_REF_FIELDS, **_PAIR_FIELDS, "region_index": "int64", "marker": "string"}
REGION_JSON_FIELDS |= {"region_source": "string", "distance": "float64", "negatives": NEGATIVE_FIELDS}
REGION_JSON_FIELDS |= PROVENANCE_FIELDS
LONGCAP_JSON_FIELDS = {**FIGURE_REF_FIELDS, "converted_from": "string", "caption": "string", "status": "string"}
LONGCAP_JSON_FIELDS |= {"reason": "string", "verdict": "string", "tokens_before": "int64", "tokens_after": "int64"}
LONGCAP_JSON_FIELDS |= {"tokenizer": "string", "cut": "bool", "gained_context": "bool", "context_sources": "list"}
LONGCAP_JSON_FIELDS |= PROVENANCE_FIELDS
JSON_FIELDS_OF = {PANEL: PANEL_JSON_FIELDS, REGION: REGION_JSON_FIELDS, LONGCAP: LONGCAP_JSON_FIELDS}


def pair_key(figure_key: str, panel_index: int, region_index: int | None = None) -> str:
    """``<figure key>_p003`` or ``<figure key>_p003_r01``: no dot (see the module docstring)."""
    key = f"{figure_key}_p{panel_index:03d}"
    return key if region_index is None else f"{key}_r{region_index:02d}"


@dataclass
class PairPlan:
    rows: list[dict]  # rows of ``pair_samples``, sorted by shuffle_key
    excluded: dict[str, int] = field(default_factory=dict)
    crop_sources: dict[str, int] = field(default_factory=dict)
    inputs_absent: list[str] = field(default_factory=list)
    panel_matches: dict[str, int] = field(default_factory=dict)  # included panel samples by text match
    gate: dict[str, int] = field(default_factory=dict)  # panel samples left out by the gate, by its reason

    def included(self, level: str | None = None) -> int:
        return sum(1 for r in self.rows if r["status"] == "included" and level in (None, r["level"]))


@dataclass
class _Figure:
    """What a pair needs of its figure: the figure-level sample row and its JSON."""

    sample: dict
    meta: dict

    @property
    def included(self) -> bool:
        return self.sample["status"] == "included"


def _rows(lake: Lake, table: str, release: str, shard: str, absent: list[str]) -> list[dict]:
    found = lake.read_table(table, release, shard)
    if found is None:
        absent.append(str(table))
        return []
    return found.to_pylist()


def plan_pair_shard(
    lake: Lake,
    release: str,
    shard: str,
    crops_tar: str,
    panel_matches: tuple[str, ...] = CAPTION_MATCHES,
    gate: GateSettings | None = None,
    *,
    commit: Commit,
) -> PairPlan:
    """Plan every panel pair, region pair and long caption of one partition; crops that must be
    cut go into ``crops_tar`` (a lake path, written into ``commit`` only when there is something
    to cut, so it is published with the plan that points into it).

    A panel sample ships when its text was matched in one of ``panel_matches`` (by default the
    caption-matched ones, ``label`` and ``order``; add ``vlm`` for the texts the VLM associated)
    and its crop passes the release gate: ``panel_crops.gate`` for a crop reused from there,
    ``gate`` (its settings) measured here for a crop cut from the raw image."""
    samples = lake.require(Table.SAMPLES, release, shard)
    absent: list[str] = []
    figures = {
        (r["pmcid"], r["image_file"]): _Figure(r, json.loads(r["meta_json"]) if r["meta_json"] else {})
        for r in samples.to_pylist()
        if r["image_file"] is not None
    }
    seed = samples.column("shuffle_seed")[0].as_py() if samples.num_rows else 0
    pairs = _rows(lake, Table.PAIRS, release, shard, absent)
    panel_boxes = {
        (p["pmcid"], p["image_file"], p["panel_index"]): (p["x1"], p["y1"], p["x2"], p["y2"])
        for p in _rows(lake, Table.PANELS, release, shard, absent)
    }
    crops = {
        (c["pmcid"], c["image_file"], c["panel_index"]): c
        for c in _rows(lake, Table.PANEL_CROPS, release, shard, absent)
    }
    negatives: dict[str, list[dict]] = defaultdict(list)
    for n in _rows(lake, Table.PAIR_NEGATIVES, release, shard, absent):
        negatives[n["pair_id"]].append(n)
    longcaps = _rows(lake, Table.LONG_CAPTIONS, release, shard, absent)
    raw = {(r["pmcid"], r["name"]): r for r in _rows(lake, Table.RAW_FILES, release, shard, absent)}

    planner = _Planner(figures, seed, panel_boxes, crops, negatives, raw, RawReader(lake))
    planner.panel_matches, planner.gate = tuple(panel_matches), gate or GateSettings()
    try:
        by_image: dict[tuple[str, str], list[dict]] = defaultdict(list)
        for pair in pairs:
            if pair["level"] in (PANEL, REGION):
                by_image[(pair["pmcid"], pair["image_file"])].append(pair)
        rows = [
            row for image, image_pairs in sorted(by_image.items()) for row in planner.image_pairs(image, image_pairs)
        ]
        rows += [planner.longcap(row) for row in longcaps]
    finally:
        planner.reader.close()
    if planner.cuts:
        write_images(commit, crops_tar, planner.cuts)
    rows = sorted((_finish(row) for row in rows), key=lambda r: r["shuffle_key"])
    excluded = Counter(r["reason"] for r in rows if r["status"] == "excluded")
    sources = Counter(r["crop_source"] for r in rows if r["status"] == "included")
    matches = Counter(
        json.loads(r["meta_json"])["text_match"] or "unknown"
        for r in rows
        if r["status"] == "included" and r["level"] == PANEL
    )
    gated = Counter(r["detail"] for r in rows if r["reason"] == "crop_gate")
    return PairPlan(rows, dict(excluded), dict(sources), absent, dict(matches), dict(gated))


def _finish(row: dict) -> dict:
    """The row as stored: its JSON completed with the sha256 of the bytes written, serialized once."""
    row = dict(row)
    meta, fields = row.pop("meta"), row.pop("fields")
    if row["status"] == "included":
        meta["sha256"] = row["image_sha256"]
        row["meta_json"] = json_text(meta, fields)
    return {name: row.get(name) for name in PAIR_SAMPLES.names}


class _Planner:
    def __init__(self, figures, seed, panel_boxes, crops, negatives, raw, reader: RawReader):
        self.figures, self.seed, self.panel_boxes, self.crops = figures, seed, panel_boxes, crops
        self.negatives, self.raw, self.reader = negatives, raw, reader
        self.cuts: list[tuple[dict, bytes]] = []

    def _base(self, level: str, key: str, figure: _Figure | None, source: dict) -> dict:
        sample = figure.sample if figure else {}
        seed = sample.get("shuffle_seed", self.seed)
        return {
            "key": key,
            "level": level,
            "figure_key": sample.get("key") or key,
            "pair_id": source.get("pair_id"),
            "pmcid": source["pmcid"],
            "fig_id": source["fig_id"],
            "image_file": source["image_file"],
            "status": "included",
            "shuffle_seed": seed,
            "shuffle_key": shuffle_key(seed, key),
            **{k: sample.get(k) for k in ("license_group", "license_code", "global_concept", "panel_type")},
            "cluster_id": sample.get("cluster_id"),
            "meta": None,
            "fields": JSON_FIELDS_OF[level],
        }

    @staticmethod
    def _exclude(row: dict, reason: str, detail: str | None = None) -> dict:
        return row | {"status": "excluded", "reason": reason, "detail": detail}

    def _figure_gate(self, row: dict, figure: _Figure | None) -> dict | None:
        """The row excluded for its figure's sake, or None when the figure is released."""
        if figure is None:
            return self._exclude(row, "figure_not_planned", "no figure-level sample for this image")
        if not figure.included:
            return self._exclude(row, "figure_excluded", figure.sample["reason"])
        return None

    def image_pairs(self, image: tuple[str, str], pairs: list[dict]) -> list[dict]:
        """The panel and region pairs of one figure image (decoded at most once, for its cuts)."""
        figure = self.figures.get(image)
        decoded: list = []  # [image or None, reason], filled on the first cut
        rows = []
        for pair in sorted(pairs, key=lambda p: p["pair_id"]):
            region = pair["level"] == REGION
            key = (
                pair_key(figure.sample["key"], pair["panel_index"], pair["region_index"] if region else None)
                if figure is not None
                else _KEY_UNSAFE.sub("-", pair["pair_id"])
            )
            row = self._base(pair["level"], key, figure, pair)
            gated = self._figure_gate(row, figure)
            if gated is not None:
                rows.append(gated)
                continue
            if not (pair["text"] or "").strip():
                rows.append(self._exclude(row, "no_text", f"text_source {pair['text_source']}"))
                continue
            match = text_match(pair)
            if pair["level"] == PANEL and match == VLM and VLM not in self.panel_matches:
                rows.append(self._exclude(row, "vlm_text", "the VLM associated this text with the panel"))
                continue
            rows.append(self._pair_image(row, pair, figure, decoded))
        return rows

    def _pair_image(self, row: dict, pair: dict, figure: _Figure, decoded: list) -> dict:
        box = (pair["x1"], pair["y1"], pair["x2"], pair["y2"])
        where = (pair["pmcid"], pair["image_file"], pair["panel_index"])
        crop = self.crops.get(where) if pair["level"] == PANEL and self.panel_boxes.get(where) == box else None
        if crop is not None and not self._intact(crop):
            crop = None  # its bytes are not the ones indexed (a lake written before commits): cut it again
        row.update(caption=pair["text"].strip(), width=box[2] - box[0], height=box[3] - box[1])
        if crop is not None:
            if crop["gate"]:
                return self._exclude(row, "crop_gate", crop["gate"])
            row.update(crop_source=PANEL_CROPS, image_tar=crop["tar_path"], image_offset=crop["offset"])
            row.update(image_size=crop["size"], image_sha256=crop["sha256"])
        else:
            if not decoded:
                decoded.extend(self._decode(pair))
            image, reason = decoded
            if image is None:
                return self._exclude(row, "undecodable_image", reason)
            if not (0 <= box[0] < box[2] <= image.width and 0 <= box[1] < box[3] <= image.height):
                return self._exclude(row, "bad_box", f"{list(box)} in a {image.width}x{image.height} image")
            cut = crop_panel(image, box)
            if pair["level"] == PANEL:
                gated, _ = crop_gate(cut, self.gate)
                if gated:
                    return self._exclude(row, "crop_gate", gated)
            row["crop_source"] = CUT
            self.cuts.append((row, jpeg_bytes(cut)))
        row["meta"] = self._pair_meta(row, pair, figure, box)
        if pair["level"] == REGION:
            # one per line, in negative_index order ("" when none: every region sample has the member)
            row["neg_txt"] = "\n".join(" ".join(n["text"].split()) for n in row["meta"]["negatives"])
        return row

    def _intact(self, crop: dict) -> bool:
        """A reused crop's bytes are the ones its index row names (their sha256): a reader checks
        what it was given before a sample points at it."""
        try:
            data = self.reader.read(crop["tar_path"], crop["offset"], crop["size"])
        except (OSError, ValueError):
            return False
        return hashlib.sha256(data).hexdigest() == crop["sha256"]

    def _decode(self, pair: dict) -> tuple[Image.Image | None, str | None]:
        source = self.raw.get((pair["pmcid"], pair["image_file"]))
        if source is None:
            return None, "the image is not in raw_files"
        return decode_image(self.reader.read(source["tar_path"], source["offset"], source["size"]))

    def _pair_meta(self, row: dict, pair: dict, figure: _Figure, box: tuple) -> dict:
        fields = JSON_FIELDS_OF[row["level"]]
        meta = {**_own_fields(pair, fields), **_figure_ref(row, figure)}
        meta.update(box=list(box), crop_source=row["crop_source"], synthetic=bool(pair["synthetic"]))
        if row["level"] == PANEL:
            meta["text_match"] = text_match(pair)
        if row["level"] == REGION:
            own = sorted(self.negatives.get(pair["pair_id"], []), key=lambda n: n["negative_index"])
            meta["negatives"] = [_negative(n) for n in own]
        return {name: meta.get(name) for name in fields}

    def longcap(self, source: dict) -> dict:
        figure = self.figures.get((source["pmcid"], source["image_file"]))
        key = figure.sample["key"] if figure else _KEY_UNSAFE.sub("-", f"{source['pmcid']}_{source['image_file']}")
        row = self._base(LONGCAP, key, figure, source)
        gated = self._figure_gate(row, figure)
        if gated is not None:
            return gated
        if source["status"] == "error":
            return self._exclude(row, "long_caption_error", source["reason"])
        text = (source["long_caption"] or "").strip()
        if not text:
            return self._exclude(row, "no_text", f"status {source['status']}")
        sample = figure.sample
        row.update(caption=text, crop_source=FIGURE, width=sample["width"], height=sample["height"])
        row.update({k: sample[k] for k in ("image_tar", "image_offset", "image_size", "image_sha256")})
        meta = {**_own_fields(source, LONGCAP_JSON_FIELDS), **_figure_ref(row, figure)}
        meta.update(caption=source["caption"] or sample["caption"], converted_from=figure.meta.get("converted_from"))
        meta["synthetic"] = bool(source["synthetic"])
        row["meta"] = {name: meta.get(name) for name in LONGCAP_JSON_FIELDS}
        return row


def text_match(pair: dict) -> str | None:
    """How a pair's text was matched (``pairs.text_match``); for a pair written before the
    column existed, "vlm" when the VLM gave the text, else unknown (None)."""
    return pair.get("text_match") or (VLM if pair.get("text_source") == VLM else None)


def _figure_ref(row: dict, figure: _Figure) -> dict:
    """The figure's facts every pair-level JSON carries, so a sample is usable on its own."""
    meta = {k: figure.meta.get(k) for k in FIGURE_REF_FIELDS}
    return meta | {k: row[k] for k in ("key", "figure_key", "level", "width", "height")}


def _own_fields(source: dict, fields: dict) -> dict:
    """The JSON fields a pair or long-caption row gives itself; the figure's facts come from the
    figure-level sample (one source for them, whatever the upstream row repeats). The model is
    named by its id, also for rows written before provenance stopped holding local paths."""
    own = {k: source[k] for k in fields if k in source and k not in FIGURE_REF_FIELDS}
    if "model" in own:
        own["model"] = public_model_name(own["model"])
    return own


def _negative(row: dict) -> dict:
    return {
        "index": row["negative_index"],
        **{k: row[k] or "" for k in ("text", "perturbation", "original_span", "replacement", "source")},
    }
