"""The raw layer: one uncompressed tar per partition run, indexed by the ``raw_files`` table.

Millions of small files are hard on every file system and object store, so each run of a
(release, shard) partition appends its newly fetched articles as one immutable
``raw/release=R/shard=S/part-NNNNN.tar``. The ``raw_files`` table records each member's byte
offset, size, md5 and sha256, so readers seek straight to a file (locally or with an HTTP
range request) without scanning the tar. Articles carried over from an earlier release keep
pointing at that release's tar.

Parts are numbered past the highest number ever seen in the partition (on disk or in its
``raw_files`` rows), so a deleted part's name is never reused for other bytes, and a part is
never overwritten. :func:`verify_raw` checks that the rows still point at the recorded bytes.
"""

from __future__ import annotations

import hashlib
import re
import tarfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from pipelines.core.lake import Lake


def _digests(path: Path) -> tuple[str, str]:
    md5, sha = hashlib.md5(usedforsecurity=False), hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            md5.update(chunk)
            sha.update(chunk)
    return md5.hexdigest(), sha.hexdigest()


def padded_size(size: int) -> int:
    """Bytes a member's data takes in a tar: whole 512-byte blocks."""
    return -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def add_member(tar: tarfile.TarFile, name: str, fileobj: BinaryIO, size: int) -> int:
    """Add ``size`` bytes from ``fileobj`` as ``name`` with fixed owner, mode and mtime, so the
    same inputs give the same archive bytes; return the offset of the member's data."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.uid, info.gid = size, 0o644, 0, 0, 0
    tar.addfile(info, fileobj)
    # tarfile sets offset_data only when reading; the data block ends where the
    # archive's write position is now, padded to whole 512-byte records.
    return tar.offset - padded_size(size)


PART_NAME = re.compile(r"part-(\d+)\.tar$")


def next_part_path(lake: Lake, release: str, shard: str, referenced: Iterable[str] = ()) -> str:
    """The next part of (``release``, ``shard``): one past the highest part number on disk or in
    ``referenced`` (``tar_path`` values of rows), so a name is never handed out twice even after
    a part was deleted while rows still point at it."""
    directory = lake.raw_dir(release, shard)
    existing = lake.fs.glob(f"{directory}/part-*.tar") if lake.fs.exists(directory) else []
    numbers = [
        int(match.group(1))
        for path in [*existing, *(lake.path(r) for r in referenced)]
        if path.rsplit("/", 1)[0] == directory and (match := PART_NAME.search(path.rsplit("/", 1)[1]))
    ]
    return f"{directory}/part-{max(numbers, default=-1) + 1:05d}.tar"


def write_part(
    lake: Lake, release: str, shard: str, articles: list[tuple[dict, object]], referenced: Iterable[str] = ()
) -> list[dict]:
    """Write the staged files of ``articles`` ([(inventory row, StagedArticle)]) as one new tar.

    Returns the ``raw_files`` rows. Members are named ``PMCID/file`` with fixed owner, mode
    and mtime so the same inputs give the same bytes. The tar's name comes from
    :func:`next_part_path` (``referenced``: tar paths the partition's rows use); an existing
    file is never overwritten (FileExistsError).
    """
    dest = next_part_path(lake, release, shard, referenced)
    relative = dest[len(lake.root) + 1 :]
    rows: list[dict] = []
    with (
        lake.atomic_local_file(dest, suffix=".tar", overwrite=False) as tmp,
        tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for record, staged in articles:
            for name, kind in staged.files:
                path = staged.directory / name
                size = path.stat().st_size
                with open(path, "rb") as fh:
                    offset = add_member(tar, f"{record['pmcid']}/{name}", fh, size)
                md5, sha256 = _digests(path)
                rows.append(
                    {
                        "pmcid": record["pmcid"],
                        "version": record["version"],
                        "name": name,
                        "kind": kind,
                        "tar_path": relative,
                        "offset": offset,
                        "size": size,
                        "md5": md5,
                        "sha256": sha256,
                    }
                )
    return rows


@dataclass
class RawVerification:
    """What :func:`verify_raw` found wrong; every list is sorted and empty when all is well.

    ``missing_xml``: ok/carried articles without an XML row; ``missing_files``: ``PMCID/name``
    listed in a manifest row without a ``raw_files`` row; ``missing_tars``: tar paths that do not
    exist; ``size_mismatches`` / ``checksum_mismatches``: ``tar_path:PMCID/name`` whose bytes
    lie beyond the end of the tar / do not hash to the recorded md5 and sha256.
    """

    missing_xml: list[str] = field(default_factory=list)
    missing_files: list[str] = field(default_factory=list)
    missing_tars: list[str] = field(default_factory=list)
    size_mismatches: list[str] = field(default_factory=list)
    checksum_mismatches: list[str] = field(default_factory=list)
    bad_pmcids: set[str] = field(default_factory=set)
    files_checked: int = 0
    bytes_checked: int = 0

    @property
    def ok(self) -> bool:
        return not self.bad_pmcids


def _member_digests(fh: BinaryIO, offset: int, size: int) -> tuple[str, str]:
    """md5 and sha256 of ``size`` bytes at ``offset``, read in 1 MiB chunks (bounded memory)."""
    md5, sha = hashlib.md5(usedforsecurity=False), hashlib.sha256()
    fh.seek(offset)
    left = size
    while left > 0:
        chunk = fh.read(min(left, 1 << 20))
        if not chunk:
            break
        md5.update(chunk)
        sha.update(chunk)
        left -= len(chunk)
    return md5.hexdigest(), sha.hexdigest()


def verify_raw(lake: Lake, manifest_rows: list[dict], file_rows: list[dict], checksums: bool = True) -> RawVerification:
    """Check that every ok/carried article of ``manifest_rows`` has its files and that every
    ``file_rows`` row still points at the bytes it recorded.

    Cost, cheapest first: the rows alone (XML present, manifest files indexed); one ``stat``
    per tar (exists, and each member's ``offset + size`` within the tar's size). With
    ``checksums`` every member is then read once more and hashed (md5 and sha256), in offset
    order through one handle per tar and 1 MiB chunks, so memory stays bounded and a remote
    lake sees sequential ranged reads. That read is the whole partition's bytes (plus the
    carried articles' bytes in earlier releases' tars): it is the price of catching flipped
    bytes or a tar replaced under the rows, which size checks cannot. ``checksums=False``
    keeps only the stat-level checks.
    """
    found = RawVerification()
    xml_of = Counter(f["pmcid"] for f in file_rows if f["kind"] == "xml")
    indexed = {(f["pmcid"], f["name"]) for f in file_rows}
    for row in manifest_rows:
        if row["status"] not in ("ok", "carried"):
            continue
        if not xml_of[row["pmcid"]]:
            found.missing_xml.append(row["pmcid"])
            found.bad_pmcids.add(row["pmcid"])
        for name in row["files"] or []:
            if (row["pmcid"], name) not in indexed:
                found.missing_files.append(f"{row['pmcid']}/{name}")
                found.bad_pmcids.add(row["pmcid"])
    by_tar: dict[str, list[dict]] = {}
    for row in file_rows:
        by_tar.setdefault(row["tar_path"], []).append(row)
    for tar_path in sorted(by_tar):
        path = lake.path(tar_path)
        if not lake.exists(path):
            found.missing_tars.append(tar_path)
            found.bad_pmcids.update(r["pmcid"] for r in by_tar[tar_path])
            continue
        tar_size = lake.fs.size(path)
        readable = []
        for row in sorted(by_tar[tar_path], key=lambda r: (r["offset"], r["pmcid"], r["name"])):
            if row["offset"] < 0 or row["size"] < 0 or row["offset"] + row["size"] > tar_size:
                found.size_mismatches.append(f"{tar_path}:{row['pmcid']}/{row['name']}")
                found.bad_pmcids.add(row["pmcid"])
            else:
                readable.append(row)
        if not checksums or not readable:
            continue
        with lake.fs.open(path, "rb") as fh:
            for row in readable:
                md5, sha256 = _member_digests(fh, row["offset"], row["size"])
                found.files_checked += 1
                found.bytes_checked += row["size"]
                if (md5, sha256) != (row["md5"], row["sha256"]):
                    found.checksum_mismatches.append(f"{tar_path}:{row['pmcid']}/{row['name']}")
                    found.bad_pmcids.add(row["pmcid"])
    for name in ("missing_xml", "missing_files", "size_mismatches", "checksum_mismatches"):
        getattr(found, name).sort()
    return found


def read_raw_file(lake: Lake, row: dict) -> bytes:
    """Return the bytes of one ``raw_files`` row by seeking into its tar."""
    with lake.fs.open(lake.path(row["tar_path"]), "rb") as fh:
        fh.seek(row["offset"])
        return fh.read(row["size"])


class RawReader:
    """Reads byte ranges of lake files, keeping one open handle per file.

    The release writer reads thousands of figures from each raw tar in shuffled order; reopening
    the tar (an object-store request on remote lakes) for each would dominate its time.
    """

    def __init__(self, lake: Lake, max_open: int = 64):
        self.lake, self.max_open = lake, max_open
        self._handles: dict[str, object] = {}

    def read(self, relative_path: str, offset: int, size: int) -> bytes:
        handle = self._handles.get(relative_path)
        if handle is None:
            if len(self._handles) >= self.max_open:
                self._handles.pop(next(iter(self._handles))).close()
            handle = self._handles[relative_path] = self.lake.fs.open(self.lake.path(relative_path), "rb")
        handle.seek(offset)
        return handle.read(size)

    def close(self) -> None:
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()

    def __enter__(self) -> RawReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
