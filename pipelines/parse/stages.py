"""Parsing stages: the parse tables of each (release, shard), and image duplicates per release."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from pipelines.core.lake import Lake
from pipelines.core.schemas import Table
from pipelines.core.stage import RELEASE, Partition, Preview, Stage, StageResult
from pipelines.images.duplicates import find_duplicates
from pipelines.parse.shard import PARSE_TABLES, ParseLimits, parse_shard


@dataclass
class ParseStage(Stage):
    """Every article's metadata and text, its figures (image size, sha256, dHash), the
    paragraphs that mention them and other graphics; an article whose raw bytes, limits and
    parser version are unchanged keeps the rows an earlier run made (previous release or this
    partition). Rows stream to Parquet in batches, so memory is bounded by ``limits``, not by
    the shard. Its data version is a hash of the articles' fingerprints and outcomes."""

    limits: ParseLimits = field(default_factory=ParseLimits)

    name = "parsed_articles"
    reads = (Table.RAW_MANIFEST, Table.RAW_FILES, *PARSE_TABLES)
    writes = PARSE_TABLES

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        release, shard = partition.release, partition.shard
        parsed = parse_shard(lake, release, shard, self.limits)
        result = self.result(
            partition,
            ok=parsed.parsed,
            error=parsed.errors,
            skipped=parsed.carried,
            carried=parsed.carried,
            counts={
                "articles": parsed.articles,
                "parsed": parsed.parsed,
                "carried": parsed.carried,
                "parse_errors": parsed.errors,
                "figures": parsed.figures,
                "child_figures": parsed.child_figures,
                "images": parsed.images,
                "mentions": parsed.mentions,
                "other_graphics": parsed.other_graphics,
                **{f"flag_{k.replace(' ', '_')}": v for k, v in sorted(parsed.flags.items())},
            },
            paths={"path": lake.path("tables", Table.FIGURES, f"release={release}", f"shard={shard}")},
            previews={"preview": Preview(parsed.preview, ["pmcid", "fig_id", "label", "caption_text", "image_files"])},
            version=parsed.version,
        )
        result.errors = list(parsed.first_errors)
        return result


@dataclass
class DuplicatesStage(Stage):
    """Figure images shared across the release's articles: exact (sha256) and near (dHash)."""

    name = "image_duplicates"
    level = RELEASE
    reads = (Table.FIGURES,)
    writes = (Table.IMAGE_DUPLICATES,)

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        rows = find_duplicates(lake.require(Table.FIGURES, partition.release).to_pylist())
        lake.write_table(Table.IMAGE_DUPLICATES, partition.release, "all", rows)
        kinds = Counter(r["kind"] for r in rows)
        return self.result(
            partition,
            ok=len(rows),
            counts={"exact_pairs": kinds["exact"] // 2, "near_pairs": kinds["near"] // 2},
            previews={"preview": Preview(rows, ["pmcid", "fig_id", "kind", "other_pmcid", "other_fig_id", "distance"])},
        )
