"""nXML parsing over every real article of the sample, plus the edge cases and attacks.

Expectations come from reading the XML (noted per case), and for graphic resolution from
``sample/articles/FIGURES.csv``, which a separate helper made from the files (see SOURCES.md).
"""

import csv
import re
from collections import defaultdict
from pathlib import Path

import pytest

from pipelines.parse.nxml import UnsafeXmlError, XmlParseError, parse_article, resolve_graphic
from testing.loopback.sample_mirror import SAMPLE_DIR, article_files, sample_rows

ROWS = {r["pmcid"]: r for r in sample_rows()}


def parse_sample(pmcid: str):
    row = ROWS[pmcid]
    xml, others = article_files(SAMPLE_DIR, row)
    return parse_article(xml.read_bytes(), pmcid=pmcid, files=sorted(p.name for p in others))


def _figures_csv() -> dict[str, list[dict]]:
    by_folder = defaultdict(list)
    with open(SAMPLE_DIR / "articles" / "FIGURES.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            if row["context"].startswith("fig"):
                by_folder[row["id"]].append(row)
    return by_folder


FIGURES_CSV = _figures_csv()
FOLDER_TO_PMCID = {r["path"].split("/", 1)[1]: p for p, r in ROWS.items() if r["path"].startswith("articles/")}


@pytest.mark.parametrize("folder", sorted(FOLDER_TO_PMCID))
def test_figures_and_their_images_match_the_helper_inventory(folder):
    """Every figure graphic the helper found resolves to the same file, with the same size."""
    parsed = parse_sample(FOLDER_TO_PMCID[folder])
    expected = FIGURES_CSV[folder]
    by_id = {f["fig_id"]: f for f in parsed.figures}
    assert set(by_id) == {r["fig_id"] or None for r in expected}
    for row in expected:
        fig = by_id[row["fig_id"] or None]
        if row["resolved_by"] == "missing":
            assert any("missing" in flag for flag in fig["flags"])
            continue
        assert row["local_file"] in fig["image_files"] + fig["other_renditions"]
    in_groups = {r["fig_id"] for r in expected if "fig-group" in r["context"]}
    assert {f["fig_id"] for f in parsed.figures if f["fig_group_id"]} == in_groups
    assert {f["fig_id"] for f in parsed.figures if f["in_sub_article"]} == {
        r["fig_id"] for r in expected if "sub-article" in r["context"]
    }


# (pmcid, figures, child figures, pmid, license code) — `grep -c '<fig '`, `grep -c child-fig`,
# the pmid article-id and the <license>/<permissions> text of each file.
ARTICLE_FACTS = [
    ("PMC900000001", 29, 0, None, "CC BY"),
    ("PMC900000002", 14, 0, None, "CC BY"),
    ("PMC900000004", 8, 0, None, "CC BY"),
    ("PMC900000005", 1, 0, None, "CC BY"),
    ("PMC900000007", 5, 2, None, "CC BY"),
    ("PMC900000009", 8, 0, None, "CC0"),
    ("PMC900000010", 19, 9, None, "CC BY"),
    ("PMC900000011", 12, 7, None, "CC BY"),
    ("PMC900000013", 3, 0, None, "CC BY"),  # licence stated only in prose
    ("PMC900000016", 2, 0, None, "CC BY"),
    ("PMC7302504", 4, 0, "32555654", "CC0"),
    ("PMC3441633", 9, 0, "23028960", "CC BY"),  # pmc-articleset wrapper, licence in prose
    ("PMC2599765", 3, 0, "19079722", "PDM"),
    ("PMC3902907", 7, 0, "24106086", "PDM"),  # "written by US Government employees ... public domain"
    ("PMC534114", 4, 0, "15550174", "CC BY"),  # NLM 2.x: <license> directly in <article-meta>
    ("PMC3261204", 4, 0, "22279592", "CC BY"),  # only a <copyright-statement>
    ("PMC6385181", 4, 0, None, "CC BY"),  # Europe PMC variant without PMID
    ("PMC3363814", 0, 0, None, "CC BY"),  # meeting abstract: no figures
    ("PMC2329613", 0, 0, "18405359", "CC BY"),
    ("PMC3585041", 1, 0, "23469300", "CC BY"),
    ("PMC3460867", 4, 0, "23029536", "CC BY"),
    ("PMC2597732", 5, 0, "19088846", "CC BY"),
    ("PMC7289444", 5, 0, "32479495", "CC0"),
    ("PMC3847091", 5, 0, "24312625", "CC BY"),
    ("PMC1240052", 5, 0, "16187797", "CC BY"),
    ("PMC7417471", 6, 0, "32776254", "CC BY"),
    ("PMC4234027", 6, 0, "24708867", "CC BY"),
    ("PMC1702562", 7, 0, "17177604", "CC BY"),
    ("PMC3166277", 4, 0, "21810267", "CC BY"),
    ("PMC2231364", 5, 0, "17963531", "CC BY"),
]


@pytest.mark.parametrize(("pmcid", "n_fig", "n_child", "pmid", "license_code"), ARTICLE_FACTS)
def test_article_facts(pmcid, n_fig, n_child, pmid, license_code):
    parsed = parse_sample(pmcid)
    assert len(parsed.figures) == n_fig
    assert sum(f["is_child"] for f in parsed.figures) == n_child
    assert parsed.article["pmid"] == pmid
    assert parsed.article["license_code"] == license_code


def _fig_xrefs_outside_figures(xml: bytes) -> int:
    """An oracle independent of the parser: figure xrefs in the raw text once every
    <fig>...</fig> and <caption>...</caption> is cut out."""
    text = xml.decode("utf-8")
    text = re.sub(r"<fig[ >].*?</fig>", "", text, flags=re.S)
    text = re.sub(r"<caption[ >].*?</caption>", "", text, flags=re.S)
    return len(re.findall(r"<xref[^>]*ref-type=\"fig\"", text))


@pytest.mark.parametrize("pmcid", sorted(ROWS))
def test_every_figure_xref_becomes_a_marked_mention(pmcid):
    xml, _ = article_files(SAMPLE_DIR, ROWS[pmcid])
    parsed = parse_sample(pmcid)
    paragraphs = {m["paragraph_index"]: m["text"] for m in parsed.mentions}
    markers = sum(text.count("](fig:") for text in paragraphs.values())
    assert markers == _fig_xrefs_outside_figures(xml.read_bytes())


def test_every_sample_article_parses():
    for pmcid in ROWS:
        parsed = parse_sample(pmcid)
        assert parsed.article["title"], pmcid
        assert parsed.article["pmcid"] == pmcid


def test_plos_nxml_metadata_captions_and_mentions():
    parsed = parse_sample("PMC7302504")
    a = parsed.article
    assert a["doi"] == "10.1371/journal.pone.0234687" and a["journal"] == "PLoS ONE"
    assert (a["pub_date"], a["pub_date_precision"], a["pub_date_type"]) == ("2020-06-18", "day", "epub")
    assert a["license_group"] == "commercial" and a["language"] == "en"
    fig1 = parsed.figures[0]
    assert (fig1["fig_id"], fig1["label"]) == ("pone.0234687.g001", "Fig 1")
    assert fig1["caption_title"].startswith("Overview of the milk production system boundary")
    # nXML without its package: every figure says its image is missing
    assert all(any("image missing" in flag for flag in f["flags"]) for f in parsed.figures)
    fig2 = [m for m in parsed.mentions if m["fig_id"] == "pone.0234687.g002"]
    assert fig2 and "[Fig 2A and 2B](fig:pone.0234687.g002)" in fig2[0]["text"]
    # table images are not figures: recorded as other graphics
    assert {g["context"] for g in parsed.other_graphics} == {"table-wrap"}


def test_child_figures_keep_their_own_caption():
    parsed = parse_sample("PMC900000010")  # elife-46793
    by_id = {f["fig_id"]: f for f in parsed.figures}
    child = by_id["fig2s1"]
    assert child["is_child"] and child["parent_fig_id"] == "fig2" and child["fig_group_id"] == "fig2"
    assert child["label"] == "Figure 2—figure supplement 1."
    assert child["caption_title"].startswith("Genome-wide shRNA screen parameter optim")
    assert child["image_files"] == ["fig2-figsupp1.jpg"]
    assert by_id["fig2"]["image_files"] == ["fig2.jpg"] and not by_id["fig2"]["is_child"]
    assert child["caption_title"] not in (by_id["fig2"]["caption_text"] or "")


def test_renditions_choose_the_web_image():
    scielo = {f["fig_id"]: f for f in parse_sample("PMC900000016").figures}
    assert scielo["f01"]["image_files"] == ["fd89fb6a2a0f973016f2de7ee2b64b51ca573999.jpg"]
    assert scielo["f01"]["other_renditions"] == ["0c10c88b56f3f9b4f4eccfe9ddbca3fd581aac1b.jpg"]
    plos = parse_sample("PMC900000013").figures[0]  # info:doi href, PNG_M web + TIFF print
    assert plos["image_files"] == ["pone.0056489.g001.PNG_M"] and plos["other_renditions"] == ["pone.0056489.g001.tif"]
    assert resolve_graphic("x/fig1", ["fig1_Print.tif", "fig1_HTML.jpg"]) == ("fig1_HTML.jpg", ["fig1_Print.tif"])
    assert resolve_graphic("elife-54296-fig1.tif", ["elife-54296-fig1.jpeg"]) == ("elife-54296-fig1.jpeg", [])


def test_portuguese_article_language():
    assert parse_sample("PMC900000017").article["language"] == "pt"


JATS = """<?xml version="1.0" encoding="UTF-8"?>
<article xmlns:xlink="http://www.w3.org/1999/xlink" article-type="research-article"><front><article-meta>
<article-id pub-id-type="pmc">123</article-id><title-group><article-title>T &#x2013; t</article-title></title-group>
<pub-date pub-type="collection"><year>2019</year><season>Spring</season></pub-date>
<pub-date pub-type="ppub"><month>3</month><year>2019</year></pub-date>
</article-meta></front><body><sec><title>Results</title>
<p>See <bold><xref ref-type="fig" rid="f1 f2">Figs 1 and 2</xref></bold>.</p>
<p>Figs <xref ref-type="fig" rid="f2">2</xref>&#x2013;<xref ref-type="fig" rid="f4">4</xref> show it.</p>
<p>Also <xref ref-type="fig" rid="f1">Figures 1-3</xref>.</p>
<list><list-item><p>In a list <italic><xref ref-type="fig" rid="f4">Fig 4</xref></italic></p></list-item></list>
<table-wrap id="t1"><table><tr><td>cell <xref ref-type="fig" rid="f3">Fig 3</xref></td></tr></table></table-wrap>
<fig id="f1"><label>Figure 1</label><caption><p>First block.</p><p>Second block.</p></caption>
<graphic xlink:href="f1"/></fig>
<fig id="f2"><label>Figure 2</label><caption><p>Two <xref ref-type="fig" rid="f1">Fig 1</xref></p></caption>
<graphic xlink:href="f2.jpg"/></fig>
<fig id="f3"><label>Figure 3</label><caption><p></p></caption><graphic xlink:href="f3"/></fig>
<fig id="f4"><label>Figure 4</label><graphic xlink:href="f4"/></fig>
<p><inline-formula><inline-graphic xlink:href="eq1.gif"/></inline-formula></p>
</sec></body></article>"""


def test_mentions_multi_ids_ranges_and_nesting():
    parsed = parse_article(JATS.encode(), files=["f1.jpg", "f2.jpg", "f3.png", "f4.gif", "eq1.gif"])
    by_paragraph = defaultdict(set)
    for m in parsed.mentions:
        by_paragraph[m["paragraph_index"]].add(m["fig_id"])
    assert [by_paragraph[i] for i in sorted(by_paragraph)] == [
        {"f1", "f2"},  # multi-id rid inside <bold>
        {"f2", "f3", "f4"},  # "Figs 2–4" as two xrefs around an en dash
        {"f1", "f2", "f3"},  # one xref whose text is a range
        {"f4"},  # inside a list item
        {"f3"},  # inside a table cell
    ]
    assert "[Figs 1 and 2](fig:f1 f2)" in parsed.mentions[0]["text"]
    assert parsed.mentions[0]["section"] == "Results"
    figs = {f["fig_id"]: f for f in parsed.figures}
    assert figs["f1"]["caption_text"] == "First block. Second block."  # blocks never glued
    assert figs["f1"]["image_files"] == ["f1.jpg"]
    assert "empty caption" in figs["f3"]["flags"] and "empty caption" in figs["f4"]["flags"]
    assert parsed.other_graphics == [
        {"pmcid": "PMC123", "context": "inline-formula", "element_id": None, "href": "eq1.gif", "file": "eq1.gif"}
    ]
    assert parsed.article["title"] == "T – t"
    assert (parsed.article["pub_date"], parsed.article["pub_date_precision"]) == ("2019-03", "month")


@pytest.mark.parametrize(
    ("document", "error", "message"),
    [
        (
            b'<?xml version="1.0"?><!DOCTYPE article [<!ENTITY x SYSTEM "file:///etc/passwd">]><article>&x;</article>',
            UnsafeXmlError,
            "declares entities",
        ),
        (
            b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY a "lol"><!ENTITY b "&a;&a;&a;&a;">]><article>&b;</article>',
            UnsafeXmlError,
            "entity expansion",
        ),
        (JATS.encode()[:400], XmlParseError, "not well-formed"),
        (
            b'<?xml version="1.0" encoding="UTF-8"?><article><front>\xff\xfe</front></article>',
            XmlParseError,
            "not well-formed",
        ),
        (b"<records><title>x</title></records>", XmlParseError, "unknown root element <records>"),
        (b"<book-part-wrapper><book-part/></book-part-wrapper>", XmlParseError, "a book chapter"),
        (b"<pmc-articleset></pmc-articleset>", XmlParseError, "holds no <article>"),
        (b"<article><body/></article>", XmlParseError, "no <front>"),
    ],
)
def test_bad_documents_fail_with_a_reason(document, error, message):
    with pytest.raises(error, match=message):
        parse_article(document)


def test_article_without_body_or_figures():
    parsed = parse_article(
        b'<article article-type="editorial" xml:lang="en"><front><article-meta>'
        b'<article-id pub-id-type="pmid">7</article-id><title-group><article-title>Only a title'
        b"</article-title></title-group></article-meta></front></article>"
    )
    assert parsed.article["has_body"] is False and parsed.article["body_text"] is None
    assert parsed.figures == [] and parsed.mentions == [] and parsed.article["pmid"] == "7"
    assert parsed.article["license_code"] is None and parsed.article["license_group"] == "other"


def test_a_path_works_like_bytes():
    row = ROWS["PMC534114"]
    xml, _ = article_files(SAMPLE_DIR, row)
    assert parse_article(Path(xml)).article == parse_article(xml.read_bytes()).article
