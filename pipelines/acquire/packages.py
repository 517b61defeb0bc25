"""Safe reading of legacy ``PMC<id>.tar.gz`` packages.

Nothing in a package decides where bytes land: members are checked (no absolute paths, no
``..``, no links or devices, bounded size and count) and the kept ones are written under the
article's staging directory by their sanitized base name only.
"""

from __future__ import annotations

import gzip
import posixpath
import tarfile
import zlib
from pathlib import Path

from pipelines.acquire.files import classify, drop_gif_thumbnails
from pipelines.net.retry import PermanentError

MAX_MEMBER_BYTES = 1 << 30
MAX_MEMBERS = 20_000


class UnsafePackageError(PermanentError):
    """The package holds a member that could escape the target or exhaust resources."""


def _check_member(member: tarfile.TarInfo) -> None:
    name = member.name
    if name.startswith("/") or posixpath.isabs(name) or (len(name) > 1 and name[1] == ":"):
        raise UnsafePackageError(f"absolute path in package: {name!r}")
    if ".." in posixpath.normpath(name).split("/") or ".." in name.split("/"):
        raise UnsafePackageError(f"path traversal in package: {name!r}")
    if member.issym() or member.islnk():
        raise UnsafePackageError(f"link in package: {name!r} -> {member.linkname!r}")
    if member.isdev() or member.isfifo():
        raise UnsafePackageError(f"device or fifo in package: {name!r}")
    if member.size > MAX_MEMBER_BYTES:
        raise UnsafePackageError(f"member too large: {name!r} ({member.size} bytes)")


def extract_package(package: Path, target: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """Extract the article XML and figure images of ``package`` into ``target``.

    Returns ``(kept, dropped)`` where ``kept`` is a list of ``(file name, kind)``. Raises
    :class:`UnsafePackageError` for a dangerous member and :class:`PermanentError` for a truncated
    or corrupt archive; in both cases nothing of the package is left in ``target``.
    """
    target.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    kept: list[tuple[str, str]] = []
    dropped: list[str] = []
    try:
        with tarfile.open(package, "r:gz") as tar:
            count = 0
            for member in tar:
                count += 1
                if count > MAX_MEMBERS:
                    raise UnsafePackageError(f"package has more than {MAX_MEMBERS} members")
                _check_member(member)
                if member.isdir():
                    continue
                if not member.isfile():
                    raise UnsafePackageError(f"unsupported member type in package: {member.name!r}")
                name = posixpath.basename(member.name)
                src = tar.extractfile(member)
                head = src.read(4096)
                kind = classify(name, head)
                if kind is None:
                    dropped.append(name)
                    continue
                if any(name == k for k, _ in kept):
                    raise UnsafePackageError(f"two members named {name!r} in package")
                dest = target / name
                with open(dest, "wb") as out:
                    written.append(dest)
                    out.write(head)
                    while chunk := src.read(1 << 16):
                        out.write(chunk)
                kept.append((name, kind))
            while tar.fileobj.read(1 << 16):  # drain to the gzip trailer so its CRC is checked
                pass
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
        for path in written:
            path.unlink(missing_ok=True)
        raise PermanentError(f"corrupt or truncated package {package.name}: {type(exc).__name__}: {exc}") from exc
    except UnsafePackageError:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    images = [n for n, k in kept if k == "image"]
    _, thumbnails = drop_gif_thumbnails(images)
    for name in thumbnails:
        (target / name).unlink()
    kept = [(n, k) for n, k in kept if n not in thumbnails]
    return kept, dropped + thumbnails
