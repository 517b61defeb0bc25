"""Which files of an article package are kept: the article XML and figure images only.

Images are recognised by extension (jpg, jpeg, png, gif, tif, tiff) or, for names without a
known extension (publisher packages often have ``fig1`` or ``g001.PNG_M``), by magic bytes.
When a figure exists as both a JPEG and a GIF thumbnail with the same stem, the JPEG wins.
PDFs, supplementary data, videos and anything else are dropped and listed in the manifest.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable

from pipelines.images.info import IMAGE_EXTENSIONS

# What a package keeps: bump it when a change to these rules keeps other files of the same package,
# so every stored article is fetched again (the whole OA subset: do it only when the rows must change).
KEEP_VERSION = "1"
XML_EXTENSIONS = {".nxml", ".xml"}
# Extensions we know are not figures: never fetched from sources that list files individually.
KNOWN_OTHER = {
    ".pdf",
    ".doc",
    ".docx",
    ".xls",
    ".xlsx",
    ".csv",
    ".txt",
    ".zip",
    ".gz",
    ".tar",
    ".mp4",
    ".avi",
    ".mov",
    ".mpg",
    ".mpeg",
    ".wmv",
    ".mp3",
    ".wav",
    ".ppt",
    ".pptx",
    ".rtf",
    ".dtd",
    ".json",
    ".html",
    ".htm",
    ".eps",
    ".ps",
    ".svg",
    ".r",
    ".py",
    ".fasta",
    ".pdb",
    ".sdf",
    ".mol",
}


def sniff_image(head: bytes) -> str | None:
    """Return the image format from the first bytes of a file, or None."""
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    return None


_PROLOG = re.compile(rb"<\?.*?\?>|<!--.*?-->|<!DOCTYPE[^>\[]*(?:\[.*?\])?\s*>", re.S)
_ROOT = re.compile(rb"<([A-Za-z_][\w.:-]*)")


def is_article_xml(head: bytes) -> bool:
    """True when the root element is a JATS/NLM ``article`` or ``pmc-articleset``.

    Looks at the root element's name only (past the prolog), so a publisher
    ``MANIFEST.xml`` that mentions ``<article`` inside is not mistaken for the article.
    """
    match = _ROOT.search(_PROLOG.sub(b"", head[:8192]))
    return match is not None and match.group(1).split(b":")[-1] in (b"article", b"pmc-articleset")


def extension(name: str) -> str:
    return posixpath.splitext(name)[1].lower()


def needs_content(name: str) -> bool:
    """True when the name alone cannot decide and the first bytes must be read."""
    ext = extension(name)
    return ext in XML_EXTENSIONS or (ext not in IMAGE_EXTENSIONS and ext not in KNOWN_OTHER)


def classify(name: str, head: bytes | None) -> str | None:
    """Return "xml", "image" or None (drop) for a package member or listed file."""
    ext = extension(name)
    if ext in XML_EXTENSIONS:
        return "xml" if head is not None and is_article_xml(head) else None
    if ext in IMAGE_EXTENSIONS:
        return "image"
    if ext in KNOWN_OTHER or head is None:
        return None
    return "image" if sniff_image(head) else None


def drop_gif_thumbnails(names: Iterable[str]) -> tuple[list[str], list[str]]:
    """Split image names into (kept, dropped): a GIF is dropped when a JPEG with its stem exists."""
    names = list(names)
    jpeg_stems = {posixpath.splitext(n)[0].lower() for n in names if extension(n) in (".jpg", ".jpeg")}
    kept, dropped = [], []
    for name in names:
        if extension(name) == ".gif" and posixpath.splitext(name)[0].lower() in jpeg_stems:
            dropped.append(name)
        else:
            kept.append(name)
    return kept, dropped
