"""Safe extraction of legacy packages and the keep/drop rules for article files."""

import io
import tarfile
from pathlib import Path

import pytest

from pipelines.acquire import packages
from pipelines.acquire.files import classify, drop_gif_thumbnails, is_article_xml
from pipelines.acquire.packages import UnsafePackageError, extract_package
from pipelines.net.retry import PermanentError
from testing.loopback.sample_mirror import write_package

XML = b'<?xml version="1.0"?>\n<!DOCTYPE article PUBLIC "x" "y">\n<article><front/></article>'
JPEG = b"\xff\xd8\xff\xe0" + b"\0" * 64
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 64
GIF = b"GIF89a" + b"\0" * 64


def _raw_package(path: Path, members: list[tarfile.TarInfo], data: dict[str, bytes] | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info in members:
            payload = (data or {}).get(info.name)
            tar.addfile(info, io.BytesIO(payload) if payload is not None else None)
    return path


def _member(name: str, kind=tarfile.REGTYPE, size: int = 0, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, size, linkname
    return info


def test_keeps_xml_and_images_drops_the_rest(tmp_path):
    pkg = tmp_path / "PMC1.tar.gz"
    write_package(
        pkg,
        "PMC1",
        {
            "a.nxml": XML,
            "a.pdf": b"%PDF-1.4",
            "fig1.jpg": JPEG,
            "fig1.gif": GIF,
            "fig2.gif": GIF,
            "fig3": PNG,
            "movie.mp4": b"\0\0\0 ftyp",
            "table.PNG_M": PNG,
            "data.xlsx": b"PK",
            "MANIFEST.xml": b"<manifest/>",
        },
    )
    kept, dropped = extract_package(pkg, tmp_path / "out")
    assert sorted(kept) == [
        ("a.nxml", "xml"),
        ("fig1.jpg", "image"),
        ("fig2.gif", "image"),
        ("fig3", "image"),
        ("table.PNG_M", "image"),
    ]
    assert sorted(dropped) == ["MANIFEST.xml", "a.pdf", "data.xlsx", "fig1.gif", "movie.mp4"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(n for n, _ in kept)
    assert (tmp_path / "out" / "fig3").read_bytes() == PNG


@pytest.mark.parametrize(
    ("member", "message"),
    [
        (_member("/etc/passwd", size=0), "absolute path"),
        (_member("PMC1/../../evil.jpg"), "path traversal"),
        (_member("..", kind=tarfile.DIRTYPE), "path traversal"),
        (_member("PMC1/link.jpg", kind=tarfile.SYMTYPE, linkname="/etc/passwd"), "link in package"),
        (_member("PMC1/hard.jpg", kind=tarfile.LNKTYPE, linkname="PMC1/a.nxml"), "link in package"),
        (_member("PMC1/dev", kind=tarfile.CHRTYPE), "device or fifo"),
        (_member("PMC1/fifo", kind=tarfile.FIFOTYPE), "device or fifo"),
    ],
)
def test_unsafe_members_reject_the_package_and_write_nothing_outside(tmp_path, member, message):
    pkg = _raw_package(tmp_path / "PMC1.tar.gz", [_member("PMC1/a.nxml", size=len(XML)), member], {"PMC1/a.nxml": XML})
    target = tmp_path / "deep" / "out"
    with pytest.raises(UnsafePackageError, match=message):
        extract_package(pkg, target)
    assert list(target.iterdir()) == []  # the XML extracted before the bad member was removed again
    assert not (tmp_path / "evil.jpg").exists() and not (tmp_path / "deep" / "evil.jpg").exists()


def test_member_size_and_count_caps(tmp_path, monkeypatch):
    pkg = tmp_path / "PMC1.tar.gz"
    write_package(pkg, "PMC1", {"a.nxml": XML, "big.jpg": JPEG * 10})
    monkeypatch.setattr(packages, "MAX_MEMBER_BYTES", 100)
    with pytest.raises(UnsafePackageError, match="member too large"):
        extract_package(pkg, tmp_path / "out")
    monkeypatch.setattr(packages, "MAX_MEMBER_BYTES", 1 << 30)
    monkeypatch.setattr(packages, "MAX_MEMBERS", 1)
    with pytest.raises(UnsafePackageError, match="more than 1 members"):
        extract_package(pkg, tmp_path / "out2")


def test_truncated_and_corrupt_packages_are_permanent_errors(tmp_path):
    good = tmp_path / "good.tar.gz"
    write_package(good, "PMC1", {"a.nxml": XML, "fig.jpg": JPEG * 1000})
    data = good.read_bytes()
    truncated = tmp_path / "truncated.tar.gz"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(PermanentError, match="corrupt or truncated package truncated.tar.gz"):
        extract_package(truncated, tmp_path / "t")
    assert not any((tmp_path / "t").iterdir())
    flipped = bytearray(data)
    flipped[-6] ^= 0xFF  # inside the gzip CRC32 trailer: only a full read notices
    corrupt = tmp_path / "corrupt.tar.gz"
    corrupt.write_bytes(bytes(flipped))
    with pytest.raises(PermanentError, match="corrupt or truncated"):
        extract_package(corrupt, tmp_path / "c")
    not_gzip = tmp_path / "html.tar.gz"
    not_gzip.write_bytes(b"<html>404</html>")
    with pytest.raises(PermanentError):
        extract_package(not_gzip, tmp_path / "h")


def test_article_xml_is_recognised_by_its_root_element():
    assert is_article_xml(XML)
    assert is_article_xml(b'<?xml version="1.0"?><!-- c --><pmc-articleset><article/></pmc-articleset>')
    assert is_article_xml(b'<j:article xmlns:j="x"/>')
    manifest = Path(__file__).parents[2] / "sample" / "articles" / "pone.0056489" / "MANIFEST.xml"
    assert not is_article_xml(manifest.read_bytes())  # mentions <article uri=...> inside <manifest>
    assert classify("MANIFEST.xml", manifest.read_bytes()) is None


def test_gif_thumbnail_rule_is_per_stem():
    kept, dropped = drop_gif_thumbnails(["f1.jpg", "f1.gif", "f2.gif", "F3.JPG", "f3.gif", "f4.png"])
    assert kept == ["f1.jpg", "f2.gif", "F3.JPG", "f4.png"] and dropped == ["f1.gif", "f3.gif"]
