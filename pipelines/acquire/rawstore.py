"""The raw layer: one uncompressed tar per partition run, indexed by the ``raw_files`` table.

Millions of small files are hard on every file system and object store, so each run of a
(release, shard) partition appends its newly fetched articles as one immutable
``raw/release=R/shard=S/part-NNNNN.tar``. The ``raw_files`` table records each member's byte
offset, size, md5 and sha256, so readers seek straight to a file (locally or with an HTTP
range request) without scanning the tar. Articles carried over from an earlier release keep
pointing at that release's tar.
"""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path
from typing import BinaryIO

from pipelines.lake import Lake


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


def next_part_path(lake: Lake, release: str, shard: str) -> str:
    directory = lake.raw_dir(release, shard)
    existing = lake.fs.glob(f"{directory}/part-*.tar") if lake.fs.exists(directory) else []
    return f"{directory}/part-{len(existing):05d}.tar"


def write_part(lake: Lake, release: str, shard: str, articles: list[tuple[dict, object]]) -> list[dict]:
    """Write the staged files of ``articles`` ([(inventory row, StagedArticle)]) as one tar.

    Returns the ``raw_files`` rows. Members are named ``PMCID/file`` with fixed owner, mode
    and mtime so the same inputs give the same bytes.
    """
    dest = next_part_path(lake, release, shard)
    relative = dest[len(lake.root) + 1 :]
    rows: list[dict] = []
    with lake.atomic_local_file(dest) as tmp, tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
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
