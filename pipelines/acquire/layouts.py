"""The two PMC-OA source layouts: the PMC Cloud Service and legacy FTP mirrors.

* **Cloud** (``s3://pmc-oa-opendata`` and S3-compatible mirrors): one prefix per article
  version, ``PMC<id>.<version>/``, holding the XML, media and supplementary files and a
  metadata JSON ``PMC<id>.<version>.json``. NCBI does not document the JSON's field names;
  they are taken from public client code and validated in :func:`parse_cloud_metadata`, the
  only function that reads them. A surprise there is a recorded error for that article.
* **Legacy** (FTP mirrors): ``oa_file_list.csv`` plus ``oa_package/xx/yy/PMC<id>.tar.gz``.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pipelines.acquire.files import (
    KNOWN_OTHER,
    classify,
    drop_gif_thumbnails,
    extension,
    is_article_xml,
    needs_content,
)
from pipelines.acquire.packages import extract_package
from pipelines.acquire.transports import Transport
from pipelines.core.licenses import normalize_license
from pipelines.core.schemas import InventoryFields
from pipelines.net.retry import PermanentError

PMCID = re.compile(r"^PMC\d{1,10}$")
ARTICLE_KEY = re.compile(r"^(PMC\d{1,10})\.(\d{1,4})/(.+)$")
PACKAGE_PATH = re.compile(r"^oa_package/[0-9a-f]{2}/[0-9a-f]{2}/(PMC\d{1,10})\.tar\.gz$")
LEGACY_COLUMNS = ["File", "Article Citation", "Accession ID", "Last Updated (YYYY-MM-DD HH:MM:SS)", "PMID", "License"]


class InventoryRecord(InventoryFields):
    """One article of a release as listed by its source, normalized (fields: the ``inventory``
    table's columns less ``change``, from its schema)."""

    def row(self, change: str) -> dict:
        return self.as_row(change=change)

    @classmethod
    def normalized(cls, *, pmid: object, license: str | None, **fields) -> InventoryRecord:
        """A record from a source's raw values; the PMID and license string are normalized here."""
        pmid_value, pmid_warning = _pmid(pmid)
        lic = normalize_license(license)
        return cls(
            pmid=pmid_value,
            license_raw=license,
            license_code=lic.code,
            license_group=lic.group,
            warning=_join_warnings(lic.warning, pmid_warning),
            **fields,
        )


@dataclass
class InventoryProblem:
    location: str
    raw: str
    error: str


@dataclass
class StagedArticle:
    """An article's kept files, complete and verified, in its staging directory."""

    directory: Path
    files: list[tuple[str, str]] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)

    MARKER = ".complete.json"

    def save(self) -> None:
        marker = self.directory / self.MARKER
        marker.write_text(json.dumps({"files": self.files, "dropped": self.dropped}))

    @classmethod
    def load(cls, directory: Path) -> StagedArticle | None:
        marker = directory / cls.MARKER
        if not marker.exists():
            return None
        data = json.loads(marker.read_text())
        return cls(directory, [tuple(f) for f in data["files"]], data["dropped"])


def _pmid(value) -> tuple[str | None, str | None]:
    """Return (pmid, warning); PMC lists an unknown PMID as empty or 0."""
    text = str(value).strip() if value is not None else ""
    if text in ("", "0", "None"):
        return None, None
    if not text.isdigit():
        return None, f"ignored malformed PMID {text!r}"
    return text, None


def _join_warnings(*warnings: str | None) -> str | None:
    kept = [w for w in warnings if w]
    return "; ".join(kept) if kept else None


# ---- legacy layout --------------------------------------------------------------------------
def parse_legacy_file_list(data: bytes, source: str = "ftp") -> tuple[list[InventoryRecord], list[InventoryProblem]]:
    """Parse ``oa_file_list.csv`` (with or without its header; optional ``Retracted`` column)."""
    records: list[InventoryRecord] = []
    problems: list[InventoryProblem] = []
    text = data.decode("utf-8", errors="replace")
    rows = csv.reader(io.StringIO(text))
    columns = LEGACY_COLUMNS
    for line_no, row in enumerate(rows, start=1):
        raw = ",".join(row)
        if line_no == 1 and row and row[0].strip() == "File":
            columns = [c.strip() for c in row]
            continue
        if not row or not any(c.strip() for c in row):
            continue
        if len(row) != len(columns):
            problems.append(
                InventoryProblem(f"oa_file_list.csv:{line_no}", raw, f"expected {len(columns)} fields, got {len(row)}")
            )
            continue
        fields = dict(zip(columns, (c.strip() for c in row), strict=False))
        path, pmcid = fields["File"], fields["Accession ID"]
        match = PACKAGE_PATH.match(path)
        if not PMCID.match(pmcid):
            problems.append(InventoryProblem(f"oa_file_list.csv:{line_no}", raw, f"malformed accession id {pmcid!r}"))
            continue
        if not match or match.group(1) != pmcid:
            problems.append(
                InventoryProblem(f"oa_file_list.csv:{line_no}", raw, f"package path {path!r} does not match {pmcid}")
            )
            continue
        try:
            updated = datetime.strptime(fields["Last Updated (YYYY-MM-DD HH:MM:SS)"], "%Y-%m-%d %H:%M:%S").replace(
                tzinfo=UTC
            )
        except ValueError:
            problems.append(InventoryProblem(f"oa_file_list.csv:{line_no}", raw, "malformed Last Updated timestamp"))
            continue
        records.append(
            InventoryRecord.normalized(
                pmid=fields["PMID"],
                license=fields["License"],
                pmcid=pmcid,
                version=None,
                doi=None,
                citation=fields["Article Citation"] or None,
                retracted=fields.get("Retracted", "no").strip().lower() in ("yes", "y", "true", "1"),
                last_updated=updated,
                source=source,
                source_paths=[path],
                source_md5=[None],
            )
        )
    return records, problems


class LegacyLayout:
    """``oa_file_list.csv`` + ``oa_package/xx/yy/PMC<id>.tar.gz`` (FTP mirrors, local copies)."""

    name = "legacy"

    def inventory(
        self, transport: Transport, previous: dict[str, dict], concurrency: int = 1
    ) -> tuple[list[InventoryRecord], list[InventoryProblem]]:
        del previous, concurrency  # one file list carries every field; nothing to reuse or spread
        return parse_legacy_file_list(transport.read_bytes("oa_file_list.csv"), source=transport.scheme)

    def fetch(self, transport: Transport, record: dict, staging: Path) -> StagedArticle:
        package = staging / f"{record['pmcid']}.tar.gz"
        transport.download(record["source_paths"][0], package)
        target = staging / record["pmcid"]
        if target.exists():
            shutil.rmtree(target)
        try:
            kept, dropped = extract_package(package, target)
        except PermanentError:
            package.unlink()  # a rerun fetches the package again rather than reusing a bad copy
            raise
        article = StagedArticle(target, sorted(kept), sorted(dropped))
        article.save()
        package.unlink()
        return article


# ---- cloud layout ---------------------------------------------------------------------------
_CLOUD_FIELDS = {
    "pmcid": str,
    "version": int,
    "license_code": str,
    "is_retracted": bool,
    "xml_url": str,
    "media_urls": list,
}


def _key_from_url(url: str, prefix: str) -> str:
    """``s3://bucket/PMC1.1/a.jpg`` or ``https://host/PMC1.1/a.jpg`` -> ``PMC1.1/a.jpg``."""
    at = url.find(prefix)
    if at < 0:
        raise ValueError(f"file URL {url!r} is outside the article prefix {prefix!r}")
    return url[at:]


def parse_cloud_metadata(data: bytes, pmcid: str, version: int, source: str = "cloud") -> InventoryRecord:
    """Validate one ``PMC<id>.<version>.json`` and return its inventory record.

    Raises ``ValueError`` with a readable reason on a missing or mistyped field, or when the
    JSON describes another article than the prefix it lives under.
    """
    try:
        meta = json.loads(data)
    except json.JSONDecodeError as exc:
        raise ValueError(f"metadata JSON is not valid JSON: {exc}") from exc
    if not isinstance(meta, dict):
        raise ValueError("metadata JSON is not an object")
    for name, kind in _CLOUD_FIELDS.items():
        if name not in meta:
            raise ValueError(f"metadata JSON missing field {name!r}")
        if not isinstance(meta[name], kind) or (kind is int and isinstance(meta[name], bool)):
            raise ValueError(f"metadata JSON field {name!r} should be {kind.__name__}, got {type(meta[name]).__name__}")
    if meta["pmcid"] != pmcid or meta["version"] != version:
        raise ValueError(f"metadata JSON describes {meta['pmcid']}.{meta['version']} but lives under {pmcid}.{version}")
    prefix = f"{pmcid}.{version}/"
    paths = [_key_from_url(meta["xml_url"], prefix)] + [_key_from_url(str(u), prefix) for u in meta["media_urls"]]
    md5s = meta.get("md5") or {}
    if not isinstance(md5s, dict):
        raise ValueError("metadata JSON field 'md5' should be an object of file name -> md5")
    updated = meta.get("last_updated")
    try:
        last_updated = datetime.fromisoformat(updated.replace("Z", "+00:00")) if updated else None
    except (AttributeError, ValueError) as exc:
        raise ValueError(f"metadata JSON field 'last_updated' is not an ISO timestamp: {updated!r}") from exc
    if last_updated is not None and last_updated.tzinfo is None:
        last_updated = last_updated.replace(tzinfo=UTC)
    return InventoryRecord.normalized(
        pmid=meta.get("pmid"),
        license=meta["license_code"],
        pmcid=pmcid,
        version=version,
        doi=meta.get("doi") or None,
        citation=meta.get("citation") or None,
        retracted=meta["is_retracted"],
        last_updated=last_updated,
        source=source,
        source_paths=paths,
        source_md5=[md5s.get(p.rsplit("/", 1)[1]) for p in paths],
    )


class CloudLayout:
    """The PMC Cloud Service layout: ``PMC<id>.<version>/`` prefixes with a metadata JSON each."""

    name = "cloud"

    def inventory(
        self, transport: Transport, previous: dict[str, dict], concurrency: int = 1
    ) -> tuple[list[InventoryRecord], list[InventoryProblem]]:
        """List every object with its ETag; read a metadata JSON only when it is new or its ETag
        changed since ``previous``. A retraction or license fix rewrites the JSON without a new
        version, so the ETag, not the version, decides what is re-read.

        The JSONs are read by ``concurrency`` threads: a first inventory reads one per article
        (6.4M for PMC-OA), which one request at a time would take days at S3's latency.
        """
        latest: dict[str, int] = {}
        etags: dict[tuple[str, int], str] = {}
        problems: list[InventoryProblem] = []
        for key, etag in transport.walk():
            match = ARTICLE_KEY.match(key)
            if not match:
                if key.startswith("PMC"):
                    problems.append(InventoryProblem("listing", key, "unrecognised article prefix"))
                continue
            pmcid, version, name = match.group(1), int(match.group(2)), match.group(3)
            latest[pmcid] = max(version, latest.get(pmcid, 0))
            if name == f"{pmcid}.{version}.json":
                etags[(pmcid, version)] = etag

        def record_of(pmcid: str) -> InventoryRecord:
            version = latest[pmcid]
            return _cloud_record(transport, pmcid, version, etags.get((pmcid, version)), previous.get(pmcid))

        pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="inventory")
        try:
            records = list(pool.map(record_of, sorted(latest)))
        finally:  # an outage raised by one read: do not wait for the queued ones
            pool.shutdown(wait=True, cancel_futures=True)
        return records, problems

    def fetch(self, transport: Transport, record: dict, staging: Path) -> StagedArticle:
        target = staging / f"{record['pmcid']}.{record['version']}"
        target.mkdir(parents=True, exist_ok=True)
        xml_path, *media = record["source_paths"]
        md5_of = dict(zip(record["source_paths"], record["source_md5"], strict=False))
        article = StagedArticle(target)
        names = [p.rsplit("/", 1)[1] for p in media]
        _, thumbnails = drop_gif_thumbnails(n for n in names if extension(n) in (".jpg", ".jpeg", ".gif"))
        for path in [xml_path, *media]:
            name = path.rsplit("/", 1)[1]
            if path != xml_path and (name in thumbnails or extension(name) in KNOWN_OTHER):
                article.dropped.append(name)
                continue
            dest = _fetch_verified(transport, path, target / name, md5_of.get(path))
            head = dest.open("rb").read(4096) if (path == xml_path or needs_content(name)) else b""
            if path == xml_path and not is_article_xml(head):
                raise PermanentError(f"{name} is not a JATS article XML")
            kind = "xml" if path == xml_path else classify(name, head)
            if kind is None:
                dest.unlink()
                article.dropped.append(name)
                continue
            article.files.append((name, kind))
        article.files.sort()
        article.dropped.sort()
        article.save()
        return article


def _cloud_record(
    transport: Transport, pmcid: str, version: int, etag: str | None, old: dict | None
) -> InventoryRecord:
    """One article's inventory record: reused from ``old`` when its version and metadata ETag
    are unchanged, else read from its metadata JSON; a bad JSON is the record's error."""
    if old is not None and etag and (old["version"], old["source_etag"]) == (version, etag) and not old["error"]:
        return InventoryRecord(**{k: old[k] for k in InventoryRecord.__dataclass_fields__})
    try:
        if etag is None:
            raise ValueError(f"no metadata JSON {pmcid}.{version}.json under {pmcid}.{version}/")
        data = transport.read_bytes(f"{pmcid}.{version}/{pmcid}.{version}.json")
        record = parse_cloud_metadata(data, pmcid, version, source=transport.scheme)
        record.source_etag = etag
        return record
    except (PermanentError, ValueError) as exc:
        return InventoryRecord(
            pmcid=pmcid,
            version=version,
            pmid=None,
            doi=None,
            citation=None,
            license_raw=None,
            license_code=None,
            license_group="other",
            retracted=False,
            last_updated=None,
            source=transport.scheme,
            source_paths=[],
            source_md5=[],
            source_etag=etag,
            error=str(exc),
        )


def file_md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _fetch_verified(transport: Transport, path: str, dest: Path, md5: str | None) -> Path:
    """Download ``path``; when an md5 is known, a mismatch is fetched once more, then fails."""
    for _ in range(2):
        transport.download(path, dest)
        if md5 is None or file_md5(dest) == md5.lower():
            return dest
        dest.unlink()
    raise PermanentError(f"md5 mismatch for {path} (expected {md5}) after 2 downloads")
