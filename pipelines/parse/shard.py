"""Parse every downloaded article of one (release, shard) into the parse tables.

An article is parsed once for the same input: its rows are reused, with no re-parse and no image
decode, from the previous release or an earlier run of this partition (the one reuse rule,
:func:`pipelines.core.stage.reuse_releases`) when its fingerprint is unchanged: the bytes of its
raw files, the :class:`ParseLimits` that change rows and :data:`PARSE_VERSION`.

One article's broken XML, an XML over the size limit or a raw file
that cannot be read (its tar deleted or cut short) is an ``articles`` row with
``parse_status = "error"`` and the reason; the rest of the shard is parsed. An image over the
size limit is not read: the figure's ``image_errors`` say why.

Rows stream to the four tables in batches of ``ParseLimits.batch_rows`` as articles are parsed,
and reused rows stream from the partitions they are in batch by batch, so memory is
bounded by the batch and the largest allowed input, not by the number of articles in the shard.
"""

from __future__ import annotations

import contextlib
import io
from collections import Counter
from dataclasses import asdict, dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.core.errors import UpstreamMissingError
from pipelines.core.fingerprints import fingerprint
from pipelines.core.lake import Lake, TableWriter, writer_of
from pipelines.core.schemas import ARTICLES
from pipelines.core.stage import Partition, reuse_releases
from pipelines.images.decode import MAX_PIXELS
from pipelines.images.info import image_info
from pipelines.parse.nxml import UnsafeXmlError, XmlParseError, parse_article

PARSE_TABLES = ("articles", "figures", "mentions", "other_graphics")
PREVIEW_ROWS = 10  # figure rows kept in the result for the asset's preview
ERROR_ROWS = 50  # (pmcid, reason) pairs kept in the result; ``errors`` counts them all

MB = 1 << 20
# The parser's version: bump it when a change to parsing (nxml.py, image measuring) changes the rows
# of the same article, so reruns and new releases parse every article again.
PARSE_VERSION = "1"


@dataclass(frozen=True)
class ParseLimits:
    """Caps on what one article may cost; inputs above them are recorded, never read."""

    max_xml_bytes: int = 100 * MB  # lxml's tree takes ~15x the file: a 200 MB nXML took 3.3 GB
    max_image_bytes: int = 256 * MB
    max_image_pixels: int = MAX_PIXELS  # decompression-bomb guard, checked before decoding
    batch_rows: int = 256  # rows buffered per table before a Parquet row group is written

    def hashed(self) -> dict:
        """The limits that change rows (an input over one is recorded, not read); ``batch_rows``
        only changes how rows are grouped in the file."""
        return {k: v for k, v in asdict(self).items() if k != "batch_rows"}


def article_fingerprint(pmcid: str, files: dict[str, dict], limits: ParseLimits) -> str:
    """What an article's parse rows are made from: its raw files' names and bytes (size and sha256
    as ``raw_files`` records them; not where they are stored, so an article carried over or
    fetched again with the same bytes keeps its rows), the limits and the parser's version."""
    package = sorted((name, f["kind"], f["size"], f["sha256"]) for name, f in files.items())
    return fingerprint({"pmcid": pmcid, "files": package, "limits": limits.hashed(), "version": PARSE_VERSION})


@dataclass
class ParsedShard:
    """Counters of one parsed partition (the rows themselves are in the lake)."""

    parsed: int = 0
    carried: int = 0  # reused: the previous release's or this partition's rows, same fingerprint
    errors: int = 0
    figures: int = 0
    child_figures: int = 0
    images: int = 0
    mentions: int = 0
    other_graphics: int = 0
    flags: Counter[str] = field(default_factory=Counter)  # figure flags by kind (text before ":")
    preview: list[dict] = field(default_factory=list, repr=False)  # the first PREVIEW_ROWS figure rows
    first_errors: list[tuple[str, str]] = field(default_factory=list)  # the first ERROR_ROWS errors
    fingerprints: list[tuple[str, str, str | None]] = field(default_factory=list, repr=False)  # article rows

    @property
    def version(self) -> str:
        """The data version: every article's fingerprint and outcome (the rows follow from them)."""
        return fingerprint(sorted(self.fingerprints, key=lambda f: f[0]))

    @property
    def articles(self) -> int:
        return self.parsed + self.carried + self.errors

    def count(self, table: str, rows: list[dict] | pa.Table) -> None:
        """Count rows written to ``table`` (a figures table is converted to count its fields)."""
        if isinstance(rows, pa.Table):
            rows = rows.to_pylist() if table == "figures" else [None] * rows.num_rows
        if table == "figures":
            self.figures += len(rows)
            self.child_figures += sum(1 for f in rows if f["is_child"])
            self.images += sum(len(f["image_files"] or []) for f in rows)
            self.flags.update(flag.split(":")[0] for f in rows for flag in f["flags"] or [])
            self.preview.extend(rows[: PREVIEW_ROWS - len(self.preview)])
        elif table == "mentions":
            self.mentions += len(rows)
        elif table == "other_graphics":
            self.other_graphics += len(rows)

    def error(self, pmcid: str, reason: str) -> None:
        self.errors += 1
        if len(self.first_errors) < ERROR_ROWS:
            self.first_errors.append((pmcid, reason))


class RawFileError(Exception):
    """A raw file that cannot be read: its tar is missing or shorter than ``raw_files`` says."""


class _Member(io.RawIOBase):
    """One tar member as a read-only stream: bytes ``[offset, offset + size)`` of an open file."""

    def __init__(self, fh, offset: int, size: int):
        super().__init__()
        self._fh, self._offset, self._size, self._pos = fh, offset, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self._size - self._pos)
        if n <= 0:
            return 0
        self._fh.seek(self._offset + self._pos)
        data = self._fh.read(n)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


class _RawFiles:
    """Reads ``raw_files`` rows from their tars, one open handle per tar (at most ``max_open``)."""

    def __init__(self, lake: Lake, max_open: int = 16):
        self.lake, self.max_open = lake, max_open
        self._tars: dict[str, tuple[object, int]] = {}

    def _tar(self, tar_path: str) -> tuple[object, int]:
        if tar_path not in self._tars:
            if len(self._tars) >= self.max_open:
                self._tars.pop(next(iter(self._tars)))[0].close()
            path = self.lake.path(tar_path)
            try:
                size = self.lake.fs.size(path)
                self._tars[tar_path] = (self.lake.fs.open(path, "rb"), size)
            except FileNotFoundError:
                raise RawFileError(f"raw file missing: {tar_path}") from None
        return self._tars[tar_path]

    def check(self, row: dict) -> None:
        """Raise :class:`RawFileError` unless the row's bytes are all in its tar."""
        _, size = self._tar(row["tar_path"])
        if row["offset"] + row["size"] > size:
            raise RawFileError(
                f"raw file short: {row['name']} needs bytes {row['offset']}-{row['offset'] + row['size']} "
                f"of {row['tar_path']}, which has {size}"
            )

    def read(self, row: dict) -> bytes:
        self.check(row)
        fh = self._tar(row["tar_path"])[0]
        fh.seek(row["offset"])
        data = fh.read(row["size"])
        if len(data) != row["size"]:
            raise RawFileError(f"raw file short: read {len(data)} of {row['size']} bytes of {row['name']}")
        return data

    def open(self, row: dict) -> io.BufferedReader:
        """The row's bytes as a stream, read only as far as the reader goes."""
        self.check(row)
        return io.BufferedReader(_Member(self._tar(row["tar_path"])[0], row["offset"], row["size"]), 1 << 16)

    def close(self) -> None:
        for fh, _ in self._tars.values():
            fh.close()
        self._tars.clear()


def _error_row(pmcid: str, error: str, key: str) -> dict:
    row = {name: None for name in ARTICLES.names}
    row.update(pmcid=pmcid, keywords=[], subjects=[], parse_status="error", parse_error=error, fingerprint=key)
    return row


def _measure(raw: _RawFiles, figures: list[dict], files: dict[str, dict], limits: ParseLimits) -> None:
    """Add width, height, sha256 and dHash for every resolved image of the article's figures."""
    for fig in figures:
        widths, heights, shas, hashes, errors = [], [], [], [], []
        for name in fig["image_files"]:
            row = files[name]
            if row["size"] > limits.max_image_bytes:
                info = {"width": None, "height": None, "phash": None}
                info["error"] = f"image not read: {row['size']} bytes, over the {limits.max_image_bytes}-byte limit"
            else:
                with raw.open(row) as stream:
                    info = image_info(stream, limits.max_image_pixels)
            widths.append(info["width"])
            heights.append(info["height"])
            shas.append(row["sha256"])
            hashes.append(info["phash"])
            errors.append(info["error"])
        fig.update(widths=widths, heights=heights, sha256=shas, phash=hashes, image_errors=errors)


def _parse_one(raw: _RawFiles, pmcid: str, files: dict[str, dict], limits: ParseLimits):
    """The article's parsed rows, or the reason it has none."""
    xml_rows = [f for f in files.values() if f["kind"] == "xml"]
    # with their sizes, so that the largest rendition of a graphic is the one kept
    images = {n: f["size"] for n, f in sorted(files.items()) if f["kind"] == "image"}
    if not xml_rows:
        return "no article XML in the raw files"
    xml = xml_rows[0]
    if xml["size"] > limits.max_xml_bytes:
        return f"article XML not read: {xml['size']} bytes, over the {limits.max_xml_bytes}-byte limit"
    try:
        for row in files.values():
            raw.check(row)
        parsed = parse_article(raw.read(xml), pmcid=pmcid, files=images)
        _measure(raw, parsed.figures, files, limits)
    except (RawFileError, UnsafeXmlError, XmlParseError) as exc:
        return str(exc)
    return parsed


def _manifest(lake: Lake, release: str, shard: str) -> list[tuple[str, str]]:
    """(pmcid, status) of the partition's articles, in manifest order."""
    if not lake.exists(lake.table_path("raw_manifest", release, shard)):
        raise UpstreamMissingError("raw_manifest", release, shard, writer_of("raw_manifest"))
    out = []
    for batch in lake.iter_batches("raw_manifest", release, shard, columns=["pmcid", "status"]):
        out.extend(zip(batch.column("pmcid").to_pylist(), batch.column("status").to_pylist(), strict=True))
    return out


class _FileIndex:
    """The partition's ``raw_files`` rows by article, kept as one Arrow table sorted by pmcid
    (compact columns, not a dict per file); an article's rows become dicts only when parsed."""

    def __init__(self, lake: Lake, release: str, shard: str):
        table = lake.read_table("raw_files", release, shard)
        self.table = table.sort_by("pmcid") if table is not None else None  # stable: tar order kept
        self.spans: dict[str, list[int]] = {}  # pmcid: [first row, number of rows]
        for i, pmcid in enumerate(self.table.column("pmcid").to_pylist() if self.table is not None else []):
            self.spans.setdefault(pmcid, [i, 0])[1] += 1

    def files(self, pmcid: str) -> dict[str, dict]:
        if pmcid not in self.spans:
            return {}
        return {row["name"]: row for row in self.table.slice(*self.spans[pmcid]).to_pylist()}


def _reusable(lake: Lake, release: str, shard: str) -> dict[str, tuple[str, str]]:
    """fingerprint: (release, pmcid) of every article an earlier run parsed without error, looked
    up where every stage looks (the previous release, then this partition; a later one wins). Only
    the key columns are read; error rows and rows from before fingerprints were stored are parsed
    again."""
    found: dict[str, tuple[str, str]] = {}
    for source in reuse_releases(lake, PARSE_TABLES, Partition(release, shard)):
        for batch in lake.iter_batches("articles", source, shard, columns=["pmcid", "parse_status", "fingerprint"]):
            ok = batch.filter(pc.and_(pc.equal(batch.column("parse_status"), "ok"), pc.is_valid(batch["fingerprint"])))
            found.update(
                (r["fingerprint"], (source, r["pmcid"])) for r in ok.select(["pmcid", "fingerprint"]).to_pylist()
            )
    return found


def _carry(
    lake: Lake, release: str, shard: str, pmcids: set[str], writers: dict[str, TableWriter], result: ParsedShard
) -> None:
    """Copy the rows of ``pmcids`` in (``release``, ``shard``) into ``writers``, batch by batch."""
    keep = pa.array(sorted(pmcids), pa.string())
    for table, writer in writers.items():
        for batch in lake.iter_batches(table, release, shard, writer.batch_rows):
            rows = batch.filter(pc.is_in(batch.column("pmcid"), value_set=keep))
            if rows.num_rows:
                writer.write(rows)
                result.count(table, rows)
                if table == "articles":
                    keys = rows.select(["pmcid", "fingerprint", "parse_status"]).to_pylist()
                    result.fingerprints.extend((r["pmcid"], r["fingerprint"], r["parse_status"]) for r in keys)


PARSE_STAGE = "parsed_articles"


def parse_shard(lake: Lake, release: str, shard: str, limits: ParseLimits = ParseLimits()) -> ParsedShard:
    """Parse the partition and write its four tables; return the counters.

    Newly parsed articles come first, in manifest order, then the reused articles' rows in the
    order of the partitions they come from. The four tables are published together (one commit
    of ``parsed_articles``): if anything raises, or the process dies, no table of the partition
    is replaced.
    """
    manifest = _manifest(lake, release, shard)
    index = _FileIndex(lake, release, shard)
    reusable = _reusable(lake, release, shard)
    result, carried = ParsedShard(), {}  # carried: release -> pmcids reused from it
    with lake.commit(PARSE_STAGE, release, shard) as commit, contextlib.ExitStack() as stack:
        raw = _RawFiles(lake)
        stack.callback(raw.close)
        writers = {
            table: stack.enter_context(commit.table_writer(table, batch_rows=limits.batch_rows))
            for table in PARSE_TABLES
        }
        for pmcid, status in manifest:
            if status not in ("ok", "carried"):
                continue
            files = index.files(pmcid)
            key = article_fingerprint(pmcid, files, limits)
            if key in reusable:
                carried.setdefault(reusable[key][0], set()).add(pmcid)
                continue
            parsed = _parse_one(raw, pmcid, files, limits)
            if isinstance(parsed, str):
                writers["articles"].write([_error_row(pmcid, parsed, key)])
                result.error(pmcid, parsed)
                result.fingerprints.append((pmcid, key, "error"))
                continue
            writers["articles"].write(
                [{**parsed.article, "parse_status": "ok", "parse_error": None, "fingerprint": key}]
            )
            result.fingerprints.append((pmcid, key, "ok"))
            for table, rows in (
                ("figures", parsed.figures),
                ("mentions", parsed.mentions),
                ("other_graphics", parsed.other_graphics),
            ):
                writers[table].write(rows)
                result.count(table, rows)
            result.parsed += 1
        for source, pmcids in sorted(carried.items()):
            _carry(lake, source, shard, pmcids, writers, result)
            result.carried += len(pmcids)
    return result
