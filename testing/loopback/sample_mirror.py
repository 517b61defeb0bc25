"""Package the bundled sample (``sample/``) into the two PMC source layouts.

The loopback servers serve what this writes; tests pass edited rows and extra files to
build the situations they need (a new version, a retraction, a PDF in a package...).
Everything is deterministic: the same rows give byte-identical mirrors.
"""

from __future__ import annotations

import csv
import functools
import gzip
import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

from pipelines.acquire.files import is_article_xml

REPO = Path(__file__).resolve().parents[2]
SAMPLE_DIR = REPO / "sample"
LEGACY_HEADER = [
    "File",
    "Article Citation",
    "Accession ID",
    "Last Updated (YYYY-MM-DD HH:MM:SS)",
    "PMID",
    "License",
    "Retracted",
]


DELETE = object()  # a metadata override value that removes the field


def sample_rows(sample_dir: Path = SAMPLE_DIR) -> list[dict]:
    """Return the rows of ``sample/release.csv`` (one per article of the sample release)."""
    with open(sample_dir / "release.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def article_files(sample_dir: Path, row: dict) -> tuple[Path, list[Path]]:
    """Return (article XML, other files) of one sample article folder."""
    folder = sample_dir / row["path"]
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() != ".dtd")
    xmls = [p for p in files if p.suffix.lower() in (".xml", ".nxml") and is_article_xml(p.read_bytes()[:4096])]
    if len(xmls) != 1:
        raise ValueError(f"{folder}: expected one article XML, found {[p.name for p in xmls]}")
    return xmls[0], [p for p in files if p != xmls[0]]


def package_path(pmcid: str) -> str:
    digest = hashlib.md5(pmcid.encode(), usedforsecurity=False).hexdigest()
    return f"oa_package/{digest[:2]}/{digest[2:4]}/{pmcid}.tar.gz"


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def build_cloud_mirror(
    out: Path,
    rows: list[dict] | None = None,
    extra_files: dict[str, dict[str, bytes]] | None = None,
    metadata_overrides: dict[str, dict] | None = None,
    sample_dir: Path = SAMPLE_DIR,
) -> Path:
    """Write the PMC Cloud layout: ``PMC<id>.<v>/`` with the XML, media and a metadata JSON."""
    out.mkdir(parents=True, exist_ok=True)
    for row in rows if rows is not None else sample_rows(sample_dir):
        pmcid, version = row["pmcid"], int(row["version"])
        prefix = f"{pmcid}.{version}"
        folder = out / prefix
        folder.mkdir(parents=True, exist_ok=True)
        xml, others = article_files(sample_dir, row)
        payload = {f"{prefix}.xml": xml.read_bytes()}
        payload.update({p.name: p.read_bytes() for p in others})
        payload.update((extra_files or {}).get(pmcid, {}))
        for name, data in payload.items():
            (folder / name).write_bytes(data)
        media = [n for n in sorted(payload) if n != f"{prefix}.xml"]
        meta = {
            "pmcid": pmcid,
            "version": version,
            "pmid": row["pmid"] or None,
            "doi": row["doi"] or None,
            "citation": row["citation"] or None,
            "license_code": row["license"],
            "is_retracted": row["retracted"] == "yes",
            "last_updated": row["last_updated"].replace(" ", "T") + "Z",
            "xml_url": f"s3://pmc-oa-opendata/{prefix}/{prefix}.xml",
            "media_urls": [f"s3://pmc-oa-opendata/{prefix}/{n}" for n in media],
            "md5": {name: _md5(data) for name, data in payload.items()},
        }
        meta.update((metadata_overrides or {}).get(pmcid, {}))
        meta = {k: v for k, v in meta.items() if v is not DELETE}
        (folder / f"{prefix}.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    return out


def write_package(path: Path, pmcid: str, files: dict[str, bytes]) -> None:
    """Write a deterministic ``PMC<id>.tar.gz`` with members ``PMC<id>/<name>``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(f"{pmcid}/{name}")
            info.size, info.mode, info.mtime = len(files[name]), 0o644, 0
            tar.addfile(info, io.BytesIO(files[name]))
    path.write_bytes(_gzipped(path.name, raw.getvalue()))


@functools.lru_cache(maxsize=128)
def _gzipped(name: str, tar: bytes) -> bytes:
    """The gzip file ``name`` of ``tar`` (mtime 0: the same bytes every time). Kept for the process:
    the sample's packages are mostly JPEG, which deflate cannot shrink but spends seconds on, and
    the tests build the same 38 packages into a dozen mirrors."""
    out = io.BytesIO()
    with gzip.GzipFile(filename=name, fileobj=out, mode="wb", mtime=0) as gz:
        gz.write(tar)
    return out.getvalue()


def build_legacy_mirror(
    out: Path,
    rows: list[dict] | None = None,
    extra_files: dict[str, dict[str, bytes]] | None = None,
    extra_lines: list[str] | None = None,
    sample_dir: Path = SAMPLE_DIR,
) -> Path:
    """Write the legacy FTP layout: ``oa_file_list.csv`` and ``oa_package/xx/yy/PMC<id>.tar.gz``."""
    out.mkdir(parents=True, exist_ok=True)
    listing = io.StringIO()
    writer = csv.writer(listing, lineterminator="\n")
    writer.writerow(LEGACY_HEADER)
    for row in rows if rows is not None else sample_rows(sample_dir):
        pmcid = row["pmcid"]
        xml, others = article_files(sample_dir, row)
        files = {xml.name: xml.read_bytes(), **{p.name: p.read_bytes() for p in others}}
        files.update((extra_files or {}).get(pmcid, {}))
        path = package_path(pmcid)
        write_package(out / path, pmcid, files)
        writer.writerow(
            [
                path,
                row["citation"],
                pmcid,
                row["last_updated"],
                row["pmid"],
                row["license"],
                "yes" if row["retracted"] == "yes" else "no",
            ]
        )
    text = listing.getvalue() + "".join(line + "\n" for line in extra_lines or [])
    (out / "oa_file_list.csv").write_text(text)
    return out


def reset(out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
