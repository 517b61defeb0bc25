"""Hardened XML whatever the encoding, and one image per graphic whatever its renditions.

The attack documents are a real sample article (SciELO's Hoehnea paper, Portuguese, so its text
is not ASCII) whose DOCTYPE is replaced by one declaring entities, re-encoded in UTF-8 and UTF-16
(both byte orders, with and without a byte-order mark), the declaration placed right after the
XML declaration, after a comment or after a processing instruction. Every one must be refused
with the same reason. Graphic resolution is tested on file lists written here by hand.
"""

import codecs
import re

import pytest

from pipelines.parse.nxml import UnsafeXmlError, XmlParseError, parse_article, resolve_graphic
from testing.loopback.sample_mirror import SAMPLE_DIR, article_files, sample_rows

REFUSAL = "document declares entities in an internal DTD subset; refused (XXE / entity expansion)"
PMCID = "PMC900000017"  # sample/articles/scielo-hoehnea-49-e1112020
# read in the XML by hand: its <article-title>, and three <fig>s with one <graphic> each
TITLE_START = "Prospecção química, atividade antioxidante, anticolinesterásica e antifúngica"

# name -> (codec, byte-order mark, encoding named in the XML declaration)
ENCODINGS = {
    "utf-8": ("utf-8", b"", "UTF-8"),
    "utf-8 with BOM": ("utf-8", codecs.BOM_UTF8, "UTF-8"),
    "utf-16-le with BOM": ("utf-16-le", codecs.BOM_UTF16_LE, "UTF-16"),
    "utf-16-be with BOM": ("utf-16-be", codecs.BOM_UTF16_BE, "UTF-16"),
    "utf-16-le without BOM": ("utf-16-le", b"", "UTF-16"),
    "utf-16-be without BOM": ("utf-16-be", b"", "UTF-16"),
}
BEFORE_DOCTYPE = {
    "right after the XML declaration": "",
    "after a comment": "<!-- converted by hand -->\n",
    "after a processing instruction": '<?xml-stylesheet type="text/xsl" href="jats.xsl"?>\n',
}
LAUGHS = '<!ENTITY lol0 "lol">' + "".join(f'<!ENTITY lol{i} "{f"&lol{i - 1};" * 10}">' for i in range(1, 10))
# name -> (declarations in the internal subset, what the article title then holds)
DECLARATIONS = {
    "internal general entity": ('<!ENTITY e "injected">', "&e;"),
    "external general entity (file)": ('<!ENTITY e SYSTEM "file:///etc/passwd">', "&e;"),
    "external general entity (network)": ('<!ENTITY e PUBLIC "-//X//EN" "http://127.0.0.1:9/e.xml">', "&e;"),
    "internal parameter entity": ("<!ENTITY % p \"<!ENTITY e 'injected'>\"> %p;", "&e;"),
    "external parameter entity": ('<!ENTITY % p SYSTEM "http://127.0.0.1:9/evil.dtd"> %p;', ""),
    "parameter entity inside a declaration": ('<!ENTITY % p "x"><!ENTITY % q "%p;%p;">', ""),
    "billion laughs": (LAUGHS, "&lol9;"),
}


def _sample() -> tuple[str, list[str]]:
    """The article's text without its own XML declaration, and its image file names."""
    row = next(r for r in sample_rows() if r["pmcid"] == PMCID)
    xml, others = article_files(SAMPLE_DIR, row)
    text = xml.read_bytes().decode("utf-8")
    return re.sub(r"^\s*<\?xml[^>]*\?>\s*", "", text), sorted(p.name for p in others)


TEXT, FILES = _sample()


def encode(text: str, encoding: str) -> bytes:
    codec, bom, label = ENCODINGS[encoding]
    return bom + f'<?xml version="1.0" encoding="{label}"?>\n{text}'.encode(codec)


def attack(declarations: str, reference: str, before: str = "") -> str:
    """The sample article with a DOCTYPE declaring ``declarations``, ``reference`` in its title."""
    doctype = f"{before}<!DOCTYPE article [\n{declarations}\n]>\n"
    text = re.sub(r"<!DOCTYPE[^>]*>\s*", doctype, TEXT, count=1)
    return text.replace("<article-title>", f"<article-title>{reference}", 1)


def test_the_attack_documents_are_what_they_claim():
    """The builder really puts the declaration and the reference where the tests say."""
    text = attack('<!ENTITY e "injected">', "&e;", BEFORE_DOCTYPE["after a comment"])
    assert text.startswith('<!-- converted by hand -->\n<!DOCTYPE article [\n<!ENTITY e "injected">\n]>')
    assert "<article-title>&e;Prospecção química" in text
    assert encode(text, "utf-16-be without BOM")[:4] == b"\x00<\x00?"
    assert encode(text, "utf-16-le with BOM")[:4] == b"\xff\xfe<\x00"


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_benign_article_reads_the_same_in_every_encoding(encoding):
    twin = parse_article(TEXT.encode("utf-8"), pmcid=PMCID, files=FILES)
    parsed = parse_article(encode(TEXT, encoding), pmcid=PMCID, files=FILES)
    assert parsed.article["title"].startswith(TITLE_START)
    assert parsed.article["language"] == "pt"
    assert [f["image_files"] for f in parsed.figures] == [
        [f"2236-8906-hoehnea-49-e1112020-gf{i}.jpg"] for i in (1, 2, 3)
    ]
    assert parsed.figures[1]["label"] == "Figura 2."
    assert parsed.article == twin.article
    assert parsed.figures == twin.figures
    assert parsed.mentions == twin.mentions
    assert parsed.other_graphics == twin.other_graphics


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("before", BEFORE_DOCTYPE)
@pytest.mark.parametrize("kind", DECLARATIONS)
def test_every_entity_declaration_is_refused_in_every_encoding(kind, before, encoding):
    declarations, reference = DECLARATIONS[kind]
    document = encode(attack(declarations, reference, BEFORE_DOCTYPE[before]), encoding)
    with pytest.raises(UnsafeXmlError) as refused:
        parse_article(document, pmcid=PMCID, files=FILES)
    assert str(refused.value) == REFUSAL


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_billion_laughs_in_a_root_attribute_is_refused(encoding):
    """The reference sits in the root's start tag, read together with the DOCTYPE."""
    text = attack(LAUGHS, "").replace("<article ", '<article data-x="&lol9;" ', 1)
    with pytest.raises(UnsafeXmlError) as refused:
        parse_article(encode(text, encoding))
    assert str(refused.value) == REFUSAL


def test_an_external_dtd_is_never_read(tmp_path):
    """A DOCTYPE naming a DTD file (no internal subset) is allowed, but the file is not read: its
    entity never reaches the text."""
    dtd = tmp_path / "evil.dtd"
    dtd.write_text('<!ENTITY e "LEAKED">')
    text = re.sub(r"<!DOCTYPE[^>]*>", f'<!DOCTYPE article SYSTEM "{dtd.as_uri()}">', TEXT, count=1)
    parsed = parse_article(encode(text.replace("<article-title>", "<article-title>&e;", 1), "utf-16-le with BOM"))
    assert parsed.article["title"].startswith(TITLE_START)
    assert "LEAKED" not in parsed.article["title"]


def test_an_empty_internal_subset_declares_nothing():
    parsed = parse_article(encode(attack("", ""), "utf-16-be without BOM"), pmcid=PMCID)
    assert parsed.article["title"].startswith(TITLE_START)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (b'<?xml version="1.0"?><!--' + b"x" * 70_000 + b"--><article/>", "no root element within the first"),
        (encode("<!-- never closed", "utf-16-le with BOM"), "not well-formed"),
        (b"", "not well-formed"),
    ],
)
def test_a_prolog_without_a_root_is_a_parse_error(document, message):
    with pytest.raises(XmlParseError, match=message):
        parse_article(document)


# ---- one image per graphic ----------------------------------------------------------------------
def test_the_jpeg_wins_over_its_gif_thumbnail():
    files = ["gr1_lrg.gif", "gr1_lrg.jpg"]
    assert resolve_graphic("gr1_lrg", files) == ("gr1_lrg.jpg", ["gr1_lrg.gif"])
    # even when the XML names the thumbnail itself
    assert resolve_graphic("gr1_lrg.gif", files) == ("gr1_lrg.jpg", ["gr1_lrg.gif"])


def test_format_preference_when_sizes_are_unknown():
    assert resolve_graphic("fig1", ["fig1.gif", "fig1.png", "fig1.tif"]) == ("fig1.png", ["fig1.tif", "fig1.gif"])
    assert resolve_graphic("fig1.tif", ["fig1.tif", "fig1.gif"]) == ("fig1.tif", ["fig1.gif"])
    assert resolve_graphic("fig1", ["fig1.eps", "fig1.gif"]) == ("fig1.gif", ["fig1.eps"])
    # PLOS's PNG renditions, large to inline, before the print TIFF
    plos = ["p.g001.PNG_I", "p.g001.PNG_M", "p.g001.PNG_L", "p.g001.tif"]
    assert resolve_graphic("info:doi/10.1371/journal.p.g001", plos) == (
        "p.g001.PNG_L",
        ["p.g001.PNG_M", "p.g001.PNG_I", "p.g001.tif"],
    )


def test_the_largest_file_wins_when_every_size_is_known():
    assert resolve_graphic("fig1", {"fig1.jpg": 30_000, "fig1.png": 250_000}) == ("fig1.png", ["fig1.jpg"])
    assert resolve_graphic("gr1.jpg", {"gr1.gif": 9_000, "gr1.jpg": 120_000}) == ("gr1.jpg", ["gr1.gif"])
    # one size unknown: the format decides
    assert resolve_graphic("fig1", {"fig1.jpg": 30_000, "fig1.png": None}) == ("fig1.jpg", ["fig1.png"])
    # a bigger vector file is still not a raster image
    assert resolve_graphic("fig1", {"fig1.eps": 900_000, "fig1.gif": 9_000}) == ("fig1.gif", ["fig1.eps"])


def test_an_html_or_print_href_finds_its_twin():
    assert resolve_graphic("fig1_Print.tif", ["fig1_HTML.jpg"]) == ("fig1_HTML.jpg", [])
    assert resolve_graphic("fig1_HTML.jpg", ["fig1_Print.tif"]) == ("fig1_Print.tif", [])
    both = ["fig1_Print.tif", "fig1_HTML.jpg"]
    for href in ("fig1_HTML.jpg", "fig1_Print.tif", "fig1"):
        assert resolve_graphic(href, both) == ("fig1_HTML.jpg", ["fig1_Print.tif"])
    assert resolve_graphic("fig1_HTML.jpg", ["fig10_HTML.jpg", "fig1a_HTML.jpg"]) == (None, [])


RENDITIONS = """<article xmlns:xlink="http://www.w3.org/1999/xlink"><front><article-meta>
<title-group><article-title>Renditions</article-title></title-group></article-meta></front><body>
<fig id="f1"><caption><p>Alternatives, only the web one ships.</p></caption><alternatives>
<graphic xlink:href="f1_HTML.jpg"/><graphic xlink:href="f1_Print.tif"/></alternatives></fig>
<fig id="f2"><caption><p>Two graphics, not in alternatives, both ship.</p></caption>
<graphic xlink:href="f2_HTML.jpg"/><graphic xlink:href="f2_Print.tif"/></fig>
<fig id="f3"><caption><p>The GIF named, its JPEG ships too.</p></caption><graphic xlink:href="gr3_lrg.gif"/></fig>
<fig id="f4"><caption><p>No rendition ships.</p></caption>
<graphic xlink:href="f4_HTML.jpg"/><graphic xlink:href="f4_Print.tif"/></fig>
<fig id="f5"><caption><p>Two panels are two images.</p></caption>
<graphic xlink:href="f5a.jpg"/><graphic xlink:href="f5b.jpg"/></fig>
<fig id="f6"><caption><p>Only the print rendition ships.</p></caption>
<graphic xlink:href="f6_HTML.jpg"/><graphic xlink:href="f6_Print.tif"/></fig>
</body></article>"""
SHIPPED = [
    *("f1_HTML.jpg", "f2_HTML.jpg", "f2_Print.tif", "gr3_lrg.gif", "gr3_lrg.jpg"),
    *("f5a.jpg", "f5b.jpg", "f6_Print.tif"),
]


def test_one_image_per_graphic_with_its_other_renditions_listed():
    figures = {f["fig_id"]: f for f in parse_article(RENDITIONS.encode(), pmcid="PMC1", files=SHIPPED).figures}
    found = {k: (f["image_files"], f["other_renditions"]) for k, f in figures.items()}
    assert found == {
        "f1": (["f1_HTML.jpg"], []),
        "f2": (["f2_HTML.jpg"], ["f2_Print.tif"]),
        "f3": (["gr3_lrg.jpg"], ["gr3_lrg.gif"]),
        "f4": ([], []),
        "f5": (["f5a.jpg", "f5b.jpg"], []),
        "f6": (["f6_Print.tif"], []),
    }
    flags = {k: f["flags"] for k, f in figures.items()}
    assert flags["f4"] == ["image missing from package: f4_HTML.jpg, f4_Print.tif"]
    assert all(flags[k] == [] for k in ("f1", "f2", "f3", "f5", "f6"))


def test_with_sizes_the_largest_rendition_is_the_image():
    sizes = dict.fromkeys(SHIPPED, 50_000) | {"f2_Print.tif": 2_000_000, "gr3_lrg.gif": 4_000}
    figures = {f["fig_id"]: f for f in parse_article(RENDITIONS.encode(), files=sizes).figures}
    assert (figures["f2"]["image_files"], figures["f2"]["other_renditions"]) == (["f2_Print.tif"], ["f2_HTML.jpg"])
    assert (figures["f3"]["image_files"], figures["f3"]["other_renditions"]) == (["gr3_lrg.jpg"], ["gr3_lrg.gif"])
