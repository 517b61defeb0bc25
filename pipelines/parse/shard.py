"""Parse every downloaded article of one (release, shard) into the parse tables.

Articles carried over unchanged from the previous release keep their previous rows (no
re-parse, no image decode). One article's broken XML is an ``articles`` row with
``parse_status = "error"`` and the reason; the rest of the shard is parsed.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from pipelines.acquire.rawstore import read_raw_file
from pipelines.lake import Lake
from pipelines.parse.images import image_info
from pipelines.parse.nxml import UnsafeXmlError, XmlParseError, parse_article
from pipelines.schemas import ARTICLES

PARSE_TABLES = ("articles", "figures", "mentions", "other_graphics")


@dataclass
class ParsedShard:
    tables: dict[str, list[dict]] = field(default_factory=lambda: {t: [] for t in PARSE_TABLES})
    parsed: int = 0
    carried: int = 0
    errors: int = 0


def _error_row(pmcid: str, error: str) -> dict:
    row = {name: None for name in ARTICLES.names}
    row.update(pmcid=pmcid, keywords=[], subjects=[], parse_status="error", parse_error=error)
    return row


def _measure(lake: Lake, figures: list[dict], files: dict[str, dict]) -> None:
    """Add width, height, sha256 and dHash for every resolved image of the article's figures."""
    for fig in figures:
        widths, heights, shas, hashes, errors = [], [], [], [], []
        for name in fig["image_files"]:
            row = files[name]
            info = image_info(read_raw_file(lake, row))
            widths.append(info["width"])
            heights.append(info["height"])
            shas.append(row["sha256"])
            hashes.append(info["phash"])
            errors.append(info["error"])
        fig.update(widths=widths, heights=heights, sha256=shas, phash=hashes, image_errors=errors)


def parse_shard(lake: Lake, release: str, shard: str, previous_release: str | None) -> ParsedShard:
    manifest = lake.read_table("raw_manifest", release, shard)
    if manifest is None:
        raise FileNotFoundError(f"no raw_manifest for release {release} shard {shard}")
    files_by_article: dict[str, dict[str, dict]] = defaultdict(dict)
    for row in lake.read_table("raw_files", release, shard).to_pylist():
        files_by_article[row["pmcid"]][row["name"]] = row
    previous: dict[str, dict[str, list[dict]]] = {t: defaultdict(list) for t in PARSE_TABLES}
    if previous_release:
        for table in PARSE_TABLES:
            old = lake.read_table(table, previous_release, shard)
            for row in old.to_pylist() if old is not None else []:
                previous[table][row["pmcid"]].append(row)

    result = ParsedShard()
    for article in manifest.to_pylist():
        pmcid = article["pmcid"]
        if article["status"] not in ("ok", "carried"):
            continue
        old_article = previous["articles"].get(pmcid)
        if article["status"] == "carried" and old_article and old_article[0]["parse_status"] == "ok":
            for table in PARSE_TABLES:
                result.tables[table].extend(previous[table].get(pmcid, []))
            result.carried += 1
            continue
        files = files_by_article[pmcid]
        xml_rows = [f for f in files.values() if f["kind"] == "xml"]
        # with their sizes, so that the largest rendition of a graphic is the one kept
        images = {n: f["size"] for n, f in sorted(files.items()) if f["kind"] == "image"}
        try:
            parsed = parse_article(read_raw_file(lake, xml_rows[0]), pmcid=pmcid, files=images)
        except (UnsafeXmlError, XmlParseError, IndexError) as exc:
            reason = "no article XML in the raw files" if isinstance(exc, IndexError) else str(exc)
            result.tables["articles"].append(_error_row(pmcid, reason))
            result.errors += 1
            continue
        _measure(lake, parsed.figures, files)
        result.tables["articles"].append({**parsed.article, "parse_status": "ok", "parse_error": None})
        result.tables["figures"].extend(parsed.figures)
        result.tables["mentions"].extend(parsed.mentions)
        result.tables["other_graphics"].extend(parsed.other_graphics)
        result.parsed += 1
    return result
