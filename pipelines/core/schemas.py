"""The Arrow schema of every lake table, in one place.

Each table is stored as Parquet under ``tables/<name>/release=<R>/shard=<S>/data.parquet``;
``release`` and ``shard`` live in the Hive path, not in the files, so DuckDB and pyarrow
datasets add them as columns when reading the whole table.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from enum import StrEnum

import pyarrow as pa

INVENTORY = pa.schema(
    [
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("version", pa.int32()),
        pa.field("pmid", pa.string()),
        pa.field("doi", pa.string()),
        pa.field("citation", pa.string()),
        pa.field("license_raw", pa.string()),
        pa.field("license_code", pa.string()),
        pa.field("license_group", pa.string()),
        pa.field("retracted", pa.bool_()),
        pa.field("last_updated", pa.timestamp("s", tz="UTC")),
        pa.field("source", pa.string()),
        pa.field("source_paths", pa.list_(pa.string())),
        pa.field("source_md5", pa.list_(pa.string())),
        pa.field("source_etag", pa.string()),
        pa.field("change", pa.string()),
        pa.field("warning", pa.string()),
        pa.field("error", pa.string()),
    ]
)

INVENTORY_ERRORS = pa.schema(
    [
        pa.field("location", pa.string()),
        pa.field("raw", pa.string()),
        pa.field("error", pa.string()),
    ]
)

RELEASE_CHANGES = pa.schema(
    [
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("change", pa.string(), nullable=False),
        pa.field("previous_release", pa.string()),
        pa.field("previous_version", pa.int32()),
        pa.field("version", pa.int32()),
        pa.field("reason", pa.string()),
    ]
)

RAW_MANIFEST = pa.schema(
    [
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("version", pa.int32()),
        pa.field("source", pa.string()),
        pa.field("status", pa.string(), nullable=False),
        pa.field("error", pa.string()),
        pa.field("warning", pa.string()),
        pa.field("n_files", pa.int32()),
        pa.field("bytes", pa.int64()),
        pa.field("files", pa.list_(pa.string())),
        pa.field("md5", pa.list_(pa.string())),
        pa.field("dropped", pa.list_(pa.string())),
        pa.field("fetched_in_release", pa.string()),
        # the listing's key (version, last update, paths, keep rules): the stored files are reused when equal
        pa.field("fingerprint", pa.string()),
    ]
)

RAW_FILES = pa.schema(
    [
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("version", pa.int32()),
        pa.field("name", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("tar_path", pa.string(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("size", pa.int64(), nullable=False),
        pa.field("md5", pa.string(), nullable=False),
        pa.field("sha256", pa.string(), nullable=False),
    ]
)

_strings = pa.list_(pa.string())

ARTICLES = pa.schema(
    [
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("pmid", pa.string()),
        pa.field("doi", pa.string()),
        pa.field("title", pa.string()),
        pa.field("abstract", pa.string()),
        pa.field("keywords", _strings),
        pa.field("subjects", _strings),
        pa.field("article_type", pa.string()),
        pa.field("journal", pa.string()),
        pa.field("pub_date", pa.string()),
        pa.field("pub_date_precision", pa.string()),
        pa.field("pub_date_type", pa.string()),
        pa.field("license_url", pa.string()),
        pa.field("license_code", pa.string()),
        pa.field("license_group", pa.string()),
        pa.field("license_text", pa.string()),
        pa.field("citation", pa.string()),
        pa.field("body_text", pa.string()),
        pa.field("has_body", pa.bool_()),
        pa.field("ref_count", pa.int32()),
        pa.field("language", pa.string()),
        pa.field("n_figures", pa.int32()),
        pa.field("parse_status", pa.string(), nullable=False),
        pa.field("parse_error", pa.string()),
        # raw files' bytes + parse limits + parser version: the article's four tables' rows are reused when equal
        pa.field("fingerprint", pa.string()),
    ]
)

FIGURES = pa.schema(
    [
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("fig_id", pa.string()),
        pa.field("label", pa.string()),
        pa.field("caption_title", pa.string()),
        pa.field("caption_text", pa.string()),
        pa.field("parent_fig_id", pa.string()),
        pa.field("fig_group_id", pa.string()),
        pa.field("is_child", pa.bool_()),
        pa.field("in_sub_article", pa.bool_()),
        pa.field("graphic_hrefs", _strings),
        pa.field("image_files", _strings),
        pa.field("other_renditions", _strings),
        pa.field("flags", _strings),
        # one entry per image file, aligned with image_files
        pa.field("widths", pa.list_(pa.int32())),
        pa.field("heights", pa.list_(pa.int32())),
        pa.field("sha256", _strings),
        pa.field("phash", _strings),
        pa.field("image_errors", _strings),
    ]
)

MENTIONS = pa.schema(
    [
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("fig_id", pa.string(), nullable=False),
        pa.field("paragraph_index", pa.int32()),
        pa.field("section", pa.string()),
        pa.field("text", pa.string()),
        pa.field("fig_known", pa.bool_()),
    ]
)

OTHER_GRAPHICS = pa.schema(
    [
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("context", pa.string()),
        pa.field("element_id", pa.string()),
        pa.field("href", pa.string()),
        pa.field("file", pa.string()),
    ]
)

IMAGE_DUPLICATES = pa.schema(
    [
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("fig_id", pa.string()),
        pa.field("image_file", pa.string()),
        pa.field("kind", pa.string(), nullable=False),  # exact (same sha256) or near (dHash distance)
        pa.field("other_pmcid", pa.string(), nullable=False),
        pa.field("other_fig_id", pa.string()),
        pa.field("other_image_file", pa.string()),
        pa.field("distance", pa.int32()),
    ]
)

_qualifier = pa.struct([("ui", pa.string()), ("name", pa.string()), ("major", pa.bool_())])
MESH_HEADING = pa.struct(
    [("ui", pa.string()), ("name", pa.string()), ("major", pa.bool_()), ("qualifiers", pa.list_(_qualifier))]
)

PUBMED = pa.schema(
    [
        pa.field("pmid", pa.string(), nullable=False),
        pa.field("pmcid", pa.string()),
        pa.field("status", pa.string(), nullable=False),  # ok, not_found, book, error
        pa.field("problem", pa.string()),
        pa.field("title", pa.string()),
        pa.field("abstract", pa.string()),
        pa.field("journal", pa.string()),
        pa.field("journal_abbrev", pa.string()),
        pa.field("languages", _strings),
        pa.field("publication_types", _strings),
        pa.field("mesh", pa.list_(MESH_HEADING)),
        pa.field("keywords", _strings),
        pa.field("pubmed_date", pa.string()),
        pa.field("entrez_date", pa.string()),
        pa.field("medline_status", pa.string()),
        pa.field("citing_pmids", _strings),
        pa.field("cited_by_count", pa.int32()),
        pa.field("citations_problem", pa.string()),
    ]
)

EMBEDDINGS = pa.schema(
    [
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("fig_id", pa.string()),
        pa.field("image_file", pa.string(), nullable=False),
        pa.field("sha256", pa.string()),
        pa.field("model", pa.string(), nullable=False),
        pa.field("synthetic", pa.bool_(), nullable=False),  # made by a tiny random test model
        pa.field("pooling", pa.string()),
        pa.field("dim", pa.int32()),
        pa.field("vector", pa.binary()),  # float16, little-endian, dim values; null on error
        pa.field("error", pa.string()),
        pa.field("fingerprint", pa.string()),  # image + embedder (model identity, pooling, padding): reused when equal
    ]
)

FIGURE_CONCEPTS = pa.schema(
    [
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("fig_id", pa.string()),
        pa.field("image_file", pa.string(), nullable=False),
        pa.field("sha256", pa.string()),
        pa.field("model_version", pa.string()),
        pa.field("cluster_id", pa.int32()),
        pa.field("distance", pa.float32()),
        pa.field("panel_type", pa.string()),
        pa.field("global_concept", pa.string()),
        pa.field("local_concepts", _strings),
        pa.field("label_status", pa.string(), nullable=False),  # labeled, partly_labeled, stale_annotation, ...
        pa.field("synthetic", pa.bool_()),
    ]
)

PANEL_FIGURES = pa.schema(
    [
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("fig_id", pa.string()),
        pa.field("image_file", pa.string(), nullable=False),
        pa.field("sha256", pa.string()),
        pa.field("width", pa.int32()),
        pa.field("height", pa.int32()),
        pa.field("status", pa.string(), nullable=False),  # split, single, skipped, error
        pa.field("reason", pa.string()),  # why skipped / the error
        pa.field("method", pa.string()),  # the method whose panels are in `panels`
        pa.field("n_panels", pa.int32()),
        pa.field("n_xycut", pa.int32()),  # what each method found, for agreement
        pa.field("n_detr", pa.int32()),
        pa.field("agreement", pa.float32()),  # mean best IoU between the two methods' panels
        pa.field("caption_labels", pa.int32()),  # panel labels found in the caption (sub-labels such as a1 aside)
        pa.field("model", pa.string()),
        pa.field("model_revision", pa.string()),
        pa.field("threshold", pa.float32()),
        pa.field("synthetic", pa.bool_()),
        pa.field("settings", pa.string()),  # the stage's settings, JSON: results are reused only under the same
        # what the row was made from (image bytes, caption, figure kind, settings): its reuse key
        pa.field("fingerprint", pa.string()),
    ]
)

PANELS = pa.schema(
    [
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("fig_id", pa.string()),
        pa.field("image_file", pa.string(), nullable=False),
        pa.field("panel_index", pa.int32(), nullable=False),  # reading order: rows, then columns
        pa.field("x1", pa.int32(), nullable=False),  # original pixels, x2/y2 exclusive
        pa.field("y1", pa.int32(), nullable=False),
        pa.field("x2", pa.int32(), nullable=False),
        pa.field("y2", pa.int32(), nullable=False),
        pa.field("score", pa.float32()),
        pa.field("method", pa.string(), nullable=False),  # detr, xycut, consensus
        pa.field("label", pa.string()),  # the printed label, when known
        pa.field("agreement", pa.float32()),  # best IoU with the other method's panels
        pa.field("model", pa.string()),
        pa.field("model_revision", pa.string()),
        pa.field("threshold", pa.float32()),
    ]
)

PANEL_CAPTIONS = pa.schema(
    [
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("fig_id", pa.string()),
        pa.field("image_file", pa.string(), nullable=False),
        pa.field("panel_index", pa.int32(), nullable=False),
        pa.field("label", pa.string()),
        pa.field("text", pa.string()),  # the panel's own text, without the preface
        pa.field("preface", pa.string()),  # caption text shared by every panel
        pa.field("match", pa.string(), nullable=False),  # label, order, none (pipelines.text.pairing)
        pa.field("scheme", pa.string()),
        pa.field("confidence", pa.float32()),
        pa.field("count_mismatch", pa.bool_()),  # panels and caption labels differ in number
        # added with the pairing rules (issue 19 §3); absent (null) in tables written before them:
        pa.field("match_detail", pa.string()),  # the rule that paired the panel, or why none could
        pa.field("caption_labels", pa.int32()),  # panel labels the caption defines (sub-labels aside)
        pa.field("count_agreement", pa.string()),  # equal, more_panels, fewer_panels, no_caption_labels
    ]
)

PANEL_CROPS = pa.schema(
    [
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("fig_id", pa.string()),
        pa.field("image_file", pa.string(), nullable=False),
        pa.field("panel_index", pa.int32(), nullable=False),
        pa.field("method", pa.string()),
        pa.field("tar_path", pa.string(), nullable=False),  # panels/release=R/shard=S/crops.tar
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("size", pa.int64(), nullable=False),
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("width", pa.int32()),
        pa.field("height", pa.int32()),
        # the release gate (pipelines.images.gate), added with it; null in tables written before it:
        pa.field("gate", pa.string()),  # why the crop is not released as a panel; null: it passes
        pa.field("ink", pa.float32()),  # share of the crop's pixels that differ from its background
        pa.field("text_run", pa.float32()),  # the shorter longest run of inked rows/columns, in glyph heights
        # what the crop is reused by (image sha256, box, crop settings and version), added with
        # reuse; null in tables written before it: those crops are cut again
        pa.field("fingerprint", pa.string()),
    ]
)

# Panel2Patch mining: one row per image-text pair at each level (global, panel, region).
PAIRS = pa.schema(
    [
        pa.field("pair_id", pa.string(), nullable=False),  # PMCID/image_file[/pNNN[/rNN]]: traces to the figure
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("fig_id", pa.string()),
        pa.field("image_file", pa.string(), nullable=False),
        pa.field("level", pa.string(), nullable=False),  # global, panel, region
        pa.field("panel_index", pa.int32()),  # null for global pairs
        pa.field("region_index", pa.int32()),  # null unless region
        pa.field("label", pa.string()),  # panel pairs: the printed panel label, when known
        pa.field("x1", pa.int32(), nullable=False),  # original pixels of the figure image, x2/y2 exclusive
        pa.field("y1", pa.int32(), nullable=False),
        pa.field("x2", pa.int32(), nullable=False),
        pa.field("y2", pa.int32(), nullable=False),
        # the box as the model answered it, in its frame (resized pixels or a 0-1000 grid); null when no model box
        pa.field("frame_box", pa.list_(pa.float32())),
        pa.field("frame_width", pa.int32()),  # the model frame of the image the box was asked on
        pa.field("frame_height", pa.int32()),
        pa.field("text", pa.string()),  # caption-derived text (the caption, the panel's split, the anchored clause)
        pa.field("text_source", pa.string()),  # caption, caption_split, vlm, none
        pa.field("extractive", pa.bool_()),  # text occurs verbatim in the caption
        pa.field("description", pa.string()),  # the VLM's short description of the crop (second text path)
        pa.field("marker", pa.string()),  # region pairs: arrow, arrowhead, asterisk, box, circle
        pa.field("region_source", pa.string()),  # caption+marker, marker
        pa.field("score", pa.float32()),
        pa.field("distance", pa.float32()),  # region: normalised distance of caption box to marker
        pa.field("panel_source", pa.string()),  # panel pairs: detector/layout method, or vlm
        pa.field("model", pa.string()),
        pa.field("model_revision", pa.string()),
        pa.field("prompt_version", pa.string()),
        pa.field("sampling", pa.string()),  # JSON
        pa.field("backend", pa.string()),
        pa.field("backend_version", pa.string()),
        pa.field("synthetic", pa.bool_()),
        # panel pairs, added with the pairing rules (issue 19 §3); null in tables written before them:
        pa.field("text_match", pa.string()),  # how the text was matched: label, order, vlm, none
        pa.field("count_agreement", pa.string()),  # the figure's panels vs caption labels (as panel_captions)
        pa.field("label_source", pa.string()),  # who read `label`: image (the panels table), vlm; null: none
    ]
)

# Per figure image: what mining did, what it cost, why it stopped.
MINING_FIGURES = pa.schema(
    [
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("fig_id", pa.string()),
        pa.field("image_file", pa.string(), nullable=False),
        pa.field("sha256", pa.string()),
        pa.field("status", pa.string(), nullable=False),  # mined, carried, error
        pa.field("reasons", _strings),  # recorded model failures (unparseable answers), pre-filter decisions
        pa.field("prefilter", pa.string()),  # which costly prompts ran: som, regions, both, none
        pa.field("n_panels", pa.int32()),
        pa.field("n_regions", pa.int32()),
        pa.field("vlm_requests", pa.int32()),
        pa.field("parse_failures", pa.int32()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("completion_tokens", pa.int64()),
        pa.field("seconds", pa.float32()),  # model time attributed to this figure
        pa.field("disagreement", pa.string()),  # JSON: VLM vs detector panels
        pa.field("fingerprint", pa.string()),  # engine + prompts + settings + inputs: reused only when equal
    ]
)

# LongCAP: one row per figure image, the caption enriched with its article's context and
# verified against the image; the original caption is always kept.
LONG_CAPTIONS = pa.schema(
    [
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("fig_id", pa.string()),
        pa.field("image_file", pa.string(), nullable=False),
        pa.field("caption", pa.string()),  # the original caption (normalised), always kept
        pa.field("long_caption", pa.string()),  # the refined caption, or the original when rejected
        pa.field("status", pa.string(), nullable=False),  # refined, fallback, no_context, error
        pa.field("reason", pa.string()),  # why a refinement fell back (guard, verdict, budget); a caption over budget
        pa.field("verdict", pa.string()),  # FEASIBLE, NOT_FEASIBLE (the model's), null when not asked
        pa.field("features", pa.string()),  # JSON: atomic features with source, visual, status
        pa.field("acronyms", pa.string()),  # JSON: {short: {long, source: article|model}}
        pa.field("context_sources", _strings),  # caption, mentions, title, abstract, sections
        pa.field("context_tokens", pa.int32()),  # the context sent, in the target tokenizer's tokens
        pa.field("tokens_before", pa.int32()),  # caption tokens (target tokenizer)
        pa.field("tokens_after", pa.int32()),  # long caption tokens (target tokenizer)
        pa.field("cut", pa.bool_()),  # added context dropped (whole sentences) to fit the budget; never the caption
        pa.field("gained_context", pa.bool_()),  # the long caption adds verified context to the caption
        pa.field("guard_failures", _strings),
        pa.field("tokenizer", pa.string()),
        pa.field("model", pa.string()),
        pa.field("model_revision", pa.string()),
        pa.field("prompt_version", pa.string()),
        pa.field("sampling", pa.string()),
        pa.field("backend", pa.string()),
        pa.field("backend_version", pa.string()),
        pa.field("synthetic", pa.bool_()),
        pa.field("fingerprint", pa.string()),  # engine + prompts + settings + inputs: reused only when equal
    ]
)

# RegionMed-CLIP hard negatives: captions of region pairs with one attribute changed.
PAIR_NEGATIVES = pa.schema(
    [
        pa.field("pair_id", pa.string(), nullable=False),  # the region pair it negates
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("negative_index", pa.int32(), nullable=False),
        pa.field("text", pa.string(), nullable=False),  # the perturbed caption
        # laterality, location, count, colour, stain, modality, size
        pa.field("perturbation", pa.string(), nullable=False),
        pa.field("original_span", pa.string()),  # what was changed ...
        pa.field("replacement", pa.string()),  # ... into what
        pa.field("source", pa.string(), nullable=False),  # rule, vlm
    ]
)

# Per region pair with text: what the negatives stage did for it (rules, the VLM's answer), so a
# rerun or the next release reuses the pair's negatives when its text and settings are unchanged.
NEGATIVE_ITEMS = pa.schema(
    [
        pa.field("pair_id", pa.string(), nullable=False),
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("status", pa.string(), nullable=False),  # rules, rules+vlm
        pa.field("negatives", pa.int32(), nullable=False),  # rows in pair_negatives
        pa.field("vlm_requests", pa.int32()),
        pa.field("reasons", _strings),  # why VLM negatives were dropped (unreadable answer, restates the positive)
        pa.field("fingerprint", pa.string()),  # text + settings + engine + version: reused only when equal
    ]
)

CLUSTER_LABELS = pa.schema(
    [
        pa.field("model_version", pa.string(), nullable=False),
        pa.field("cluster_id", pa.int32(), nullable=False),
        pa.field("panel_type", pa.string()),
        pa.field("global_concept", pa.string()),
        pa.field("local_concepts", _strings),
        pa.field("annotators", pa.int32()),
        pa.field("ties", _strings),
        # null, or why the annotated cluster is not the model's (fingerprint: size or members differ)
        pa.field("fingerprint_mismatch", pa.string()),
    ]
)

# The serialization plan: one row per figure image of a partition, sorted by shuffle_key.
SAMPLES = pa.schema(
    [
        pa.field("key", pa.string(), nullable=False),
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("fig_id", pa.string()),
        pa.field("image_file", pa.string()),
        pa.field("status", pa.string(), nullable=False),  # included or excluded
        pa.field("reason", pa.string()),  # why excluded: one of pipelines.release.samples.REASONS
        pa.field("detail", pa.string()),
        pa.field("shuffle_seed", pa.int64(), nullable=False),
        pa.field("shuffle_key", pa.string(), nullable=False),
        pa.field("license_group", pa.string()),
        pa.field("license_code", pa.string()),
        pa.field("global_concept", pa.string()),
        pa.field("panel_type", pa.string()),
        pa.field("cluster_id", pa.int32()),
        pa.field("width", pa.int32()),
        pa.field("height", pa.int32()),
        pa.field("converted_from", pa.string()),  # source format when the .jpg is a conversion
        pa.field("image_tar", pa.string()),  # lake-relative tar holding the bytes to write
        pa.field("image_offset", pa.int64()),
        pa.field("image_size", pa.int64()),
        pa.field("image_sha256", pa.string()),  # of the bytes written as .jpg
        pa.field("caption", pa.string()),
        pa.field("meta_json", pa.string()),
    ]
)

# The Parquet file beside each WebDataset shard: its samples' keys and the columns people filter on.
SHARD_SIDECAR = pa.schema(
    [
        *(
            SAMPLES.field(name)
            for name in (
                "key",
                "pmcid",
                "fig_id",
                "image_file",
                "license_group",
                "license_code",
                "global_concept",
                "panel_type",
                "cluster_id",
                "width",
                "height",
                "image_sha256",
                "converted_from",
            )
        ),
        pa.field("shard", pa.string(), nullable=False),
    ]
)


# The serialization plan of the pair levels (panel, region, longcap) of one partition: like
# ``samples``, one row per candidate sample, included or excluded, sorted by shuffle_key.
PAIR_SAMPLES = pa.schema(
    [
        pa.field("key", pa.string(), nullable=False),  # the figure's sample key, + _pNNN[_rNN] for pairs
        pa.field("level", pa.string(), nullable=False),  # panel, region, longcap
        pa.field("figure_key", pa.string(), nullable=False),  # the figure-level sample it comes from
        pa.field("pair_id", pa.string()),  # the pairs row (null for longcap)
        *(SAMPLES.field(n) for n in ("pmcid", "fig_id", "image_file", "status", "reason", "detail")),
        *(SAMPLES.field(n) for n in ("shuffle_seed", "shuffle_key", "license_group", "license_code")),
        *(SAMPLES.field(n) for n in ("global_concept", "panel_type", "cluster_id", "width", "height")),
        pa.field("crop_source", pa.string()),  # panel_crops (reused), cut (from the raw image), figure
        *(SAMPLES.field(n) for n in ("image_tar", "image_offset", "image_size", "image_sha256", "caption")),
        pa.field("neg_txt", pa.string()),  # region samples: the hard negatives, one per line
        SAMPLES.field("meta_json"),
    ]
)

# The Parquet file beside each shard of a pair-level subset: the keys, the figure's columns, and
# what a user filters pairs on: the box (original pixels of the figure, x2/y2 exclusive; null for
# a long caption, which is the whole figure), the sample's text (its .txt), where that text came
# from, the model's description of the crop, and whether a synthetic model made any of it. The
# writer takes these from the sample's JSON (see ``webdataset.sidecar_values``).
PAIR_SIDECAR = pa.schema(
    [
        *(PAIR_SAMPLES.field(n) for n in ("key", "level", "figure_key", "pair_id", "crop_source")),
        *(f for f in SHARD_SIDECAR if f.name not in ("key", "converted_from", "shard")),
        *(pa.field(n, pa.int32()) for n in ("x1", "y1", "x2", "y2")),
        pa.field("text", pa.string()),  # the sample's .txt: the pair's text, or the long caption
        pa.field("text_source", pa.string()),  # pairs: caption_split, caption, vlm...; null for long captions
        pa.field("description", pa.string()),  # pairs: the VLM's description of the crop ("" when none)
        pa.field("synthetic", pa.bool_()),
        pa.field("shard", pa.string(), nullable=False),
    ]
)


class Table(StrEnum):
    """Every lake table by name; a member compares equal to its string."""

    INVENTORY = "inventory"
    INVENTORY_ERRORS = "inventory_errors"
    RELEASE_CHANGES = "release_changes"
    RAW_MANIFEST = "raw_manifest"
    RAW_FILES = "raw_files"
    ARTICLES = "articles"
    FIGURES = "figures"
    MENTIONS = "mentions"
    OTHER_GRAPHICS = "other_graphics"
    IMAGE_DUPLICATES = "image_duplicates"
    PUBMED = "pubmed"
    EMBEDDINGS = "embeddings"
    FIGURE_CONCEPTS = "figure_concepts"
    CLUSTER_LABELS = "cluster_labels"
    SAMPLES = "samples"
    PANEL_FIGURES = "panel_figures"
    PANELS = "panels"
    PANEL_CAPTIONS = "panel_captions"
    PANEL_CROPS = "panel_crops"
    PAIRS = "pairs"
    MINING_FIGURES = "mining_figures"
    LONG_CAPTIONS = "long_captions"
    PAIR_NEGATIVES = "pair_negatives"
    NEGATIVE_ITEMS = "negative_items"
    PAIR_SAMPLES = "pair_samples"


TABLES: dict[str, pa.Schema] = {
    Table.INVENTORY: INVENTORY,
    Table.INVENTORY_ERRORS: INVENTORY_ERRORS,
    Table.RELEASE_CHANGES: RELEASE_CHANGES,
    Table.RAW_MANIFEST: RAW_MANIFEST,
    Table.RAW_FILES: RAW_FILES,
    Table.ARTICLES: ARTICLES,
    Table.FIGURES: FIGURES,
    Table.MENTIONS: MENTIONS,
    Table.OTHER_GRAPHICS: OTHER_GRAPHICS,
    Table.IMAGE_DUPLICATES: IMAGE_DUPLICATES,
    Table.PUBMED: PUBMED,
    Table.EMBEDDINGS: EMBEDDINGS,
    Table.FIGURE_CONCEPTS: FIGURE_CONCEPTS,
    Table.CLUSTER_LABELS: CLUSTER_LABELS,
    Table.SAMPLES: SAMPLES,
    Table.PANEL_FIGURES: PANEL_FIGURES,
    Table.PANELS: PANELS,
    Table.PANEL_CAPTIONS: PANEL_CAPTIONS,
    Table.PANEL_CROPS: PANEL_CROPS,
    Table.PAIRS: PAIRS,
    Table.MINING_FIGURES: MINING_FIGURES,
    Table.LONG_CAPTIONS: LONG_CAPTIONS,
    Table.PAIR_NEGATIVES: PAIR_NEGATIVES,
    Table.NEGATIVE_ITEMS: NEGATIVE_ITEMS,
    Table.PAIR_SAMPLES: PAIR_SAMPLES,
}


def _python_type(dtype: pa.DataType) -> type:
    if pa.types.is_boolean(dtype):
        return bool
    if pa.types.is_integer(dtype):
        return int
    if pa.types.is_floating(dtype):
        return float
    if pa.types.is_timestamp(dtype):
        return datetime
    if pa.types.is_list(dtype):
        return list
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype):
        return bytes
    if pa.types.is_struct(dtype):
        return dict
    return str


def record_type(name: str, schema: pa.Schema, exclude: tuple[str, ...] = (), doc: str = "") -> type:
    """A keyword-only dataclass with one field per column of ``schema`` (less ``exclude``), so
    a table's Arrow schema and its Python record type have one definition. Nullable columns
    default to None, list columns to an empty list; ``as_row`` returns the table row."""
    fields = []
    for column in schema:
        if column.name in exclude:
            continue
        kind = _python_type(column.type)
        if pa.types.is_list(column.type):
            fields.append((column.name, kind, dataclasses.field(default_factory=list)))
        elif column.nullable:
            fields.append((column.name, kind | None, dataclasses.field(default=None)))
        else:
            fields.append((column.name, kind))

    def as_row(self, **extra) -> dict:
        return {**dataclasses.asdict(self), **extra}

    cls = dataclasses.make_dataclass(name, fields, kw_only=True, namespace={"as_row": as_row})
    cls.__doc__ = doc or f"A row of {name} (from its Arrow schema in pipelines/core/schemas.py)."
    return cls


InventoryFields = record_type(
    "InventoryFields",
    INVENTORY,
    exclude=("change",),
    doc="One article of a release as its source lists it: an ``inventory`` row less ``change``.",
)

MANIFEST_STATUSES = ("ok", "carried", "error", "retracted")
