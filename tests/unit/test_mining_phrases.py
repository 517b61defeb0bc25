"""Marker phrases in captions: hand-written cases of each form, real caption sentences quoted
verbatim from the sample articles (expected phrases read off by hand), the statistics and plot
symbols that must not be proposed, and the extractive guarantee as a property."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.mining.phrases import MARKERS, MarkerPhrase, find_marker_phrases
from pipelines.text.captions import normalize_caption


def read(text: str) -> list[tuple[str, str | None, str, str]]:
    """(marker, colour, clause, target) of each phrase, after checking the offsets."""
    phrases = find_marker_phrases(text)
    for p in phrases:
        assert text[p.start : p.end] == p.clause
        assert p.target in p.clause
        assert p.marker in MARKERS
    return [(p.marker, p.colour, p.clause, p.target) for p in phrases]


# --- hand-written forms ---------------------------------------------------------------------

HAND = [
    ("Arrows indicate the lesion.", [("arrow", None, "Arrows indicate the lesion", "the lesion")]),
    (
        "Asterisks mark necrotic areas; arrowheads point to apoptotic nuclei.",
        [
            ("asterisk", None, "Asterisks mark necrotic areas", "necrotic areas"),
            ("arrowhead", None, "arrowheads point to apoptotic nuclei", "apoptotic nuclei"),
        ],
    ),
    (
        "Tumour cells infiltrate the dermis (arrow).",
        [("arrow", None, "the dermis (arrow)", "the dermis")],
    ),
    (
        "The boxed area in A is magnified in B.",
        [("box", None, "The boxed area in A is magnified in B", "The boxed area")],
    ),
    (
        "(B) Higher magnification of the region boxed in A.",
        [("box", None, "the region boxed in A", "the region")],
    ),
    (
        "A dashed circle outlines the infarct core.",
        [("circle", None, "A dashed circle outlines the infarct core", "the infarct core")],
    ),
    (
        "Red arrows: TUNEL-positive cells; yellow arrowheads: macrophages.",
        [
            ("arrow", "red", "Red arrows: TUNEL-positive cells", "TUNEL-positive cells"),
            ("arrowhead", "yellow", "yellow arrowheads: macrophages", "macrophages"),
        ],
    ),
    (
        "The lesion (B, red arrows) is larger than in controls.",
        [("arrow", "red", "The lesion (B, red arrows)", "The lesion")],
    ),
    (
        "Necrosis (*) and fibrosis (#) are seen in B.",
        [("asterisk", None, "Necrosis (*)", "Necrosis"), ("other", None, "fibrosis (#)", "fibrosis")],
    ),
    (
        "(C) The arrow in D marks the border; white asterisks (*) indicate the lumen.",
        [
            ("arrow", None, "The arrow in D marks the border", "the border"),
            ("asterisk", "white", "white asterisks (*) indicate the lumen", "the lumen"),
        ],
    ),
    (
        "Two black stars denote the injection sites.",
        [("other", "black", "Two black stars denote the injection sites", "the injection sites")],
    ),
    (
        "Scale bar, 50 µm. → marks the needle track.",
        [("arrow", None, "→ marks the needle track", "the needle track")],
    ),  # parenthetical passive, no subject: the clause before it is what the marker shows
    (
        "Dilated vessels are seen (marked by asterisks).",
        [("asterisk", None, "Dilated vessels are seen (marked by asterisks)", "Dilated vessels are seen")],
    ),
    (
        "The nuclei (shown by arrowheads) are enlarged.",
        [("arrowhead", None, "The nuclei (shown by arrowheads)", "The nuclei")],
    ),
    (
        "The lesion grew (as indicated by white arrows).",
        [("arrow", "white", "The lesion grew (as indicated by white arrows)", "The lesion grew")],
    ),
    (
        "Tumour cells infiltrate the dermis (see arrows).",
        [("arrow", None, "the dermis (see arrows)", "the dermis")],
    ),
    (
        "Tumour cells infiltrate the dermis (arrows).",
        [("arrow", None, "the dermis (arrows)", "the dermis")],
    ),
    (
        "The lesion (arrows in C) is larger.",
        [("arrow", None, "The lesion (arrows in C)", "The lesion")],
    ),
    # a leading panel label and a closed parenthesis are not the clause start of a passive
    (
        "(B) Nuclei are marked by arrows.",
        [("arrow", None, "Nuclei are marked by arrows", "Nuclei")],
    ),
    (
        "Cells (HeLa) are marked by arrows.",
        [("arrow", None, "Cells (HeLa) are marked by arrows", "Cells (HeLa)")],
    ),
]


@pytest.mark.parametrize("text, expected", HAND, ids=[t[:40] for t, _ in HAND])
def test_hand_written_forms(text, expected):
    assert read(text) == expected


# --- what is not a region marker ------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "Data are mean ± SEM. * p < 0.05, **P < 0.01; n.s., not significant.",
        "*p<0.05 versus control; #p<0.05 versus vehicle; †P = 0.01.",
        "Asterisks indicate significant differences between genotypes.",
        "Symbols: open circles, MLT; close circles, SD; closed triangles, CV.",
        "Box and whisker plots show the median and interquartile range.",
        "Boxes indicate the 25th and 75th percentiles.",
        "DDX42 is a DEAD-box helicase; a narrow band is seen at 40 kDa.",
        "The line across the boxes indicated the median.",
        "Filled circles indicate wild-type mice and open circles knockout mice.",
        "",
    ],
)
def test_statistics_plot_symbols_and_lookalike_words_are_not_proposed(text):
    assert read(text) == []


def test_none_is_no_phrases():
    assert find_marker_phrases(None) == []


# --- real captions, quoted verbatim from the sample articles --------------------------------


def test_real_coordinated_subjects_pmc3847091():
    # PMC3847091 (sample/nxml), Figure caption, sentence after "(A)".
    text = "Arrows indicate cell membrane and stars indicate cytosol."
    assert read(text) == [
        ("arrow", None, "Arrows indicate cell membrane", "cell membrane"),
        ("other", None, "stars indicate cytosol", "cytosol"),
    ]


def test_real_respectively_pmc2231364():
    # PMC2231364 (sample/nxml/europepmc): two markers, two targets, shared out by "respectively".
    text = (
        "In (A) \u2013 (I), an arrow and an asterisk indicate the probe (free) and the Fur-probe complex (bound), "
        "respectively."
    )
    clause = "an arrow and an asterisk indicate the probe (free) and the Fur-probe complex (bound), respectively"
    assert read(text) == [
        ("arrow", None, clause, "the probe (free)"),
        ("asterisk", None, clause, "the Fur-probe complex (bound)"),
    ]


def test_real_passive_pmc3460867():
    # PMC3460867 (pone.0046493.nxml)
    text = (
        "The proposed mechanism of action involves the opening of the cycle in each molecule. Nucleophilic sites "
        "attacked by catalytic serine are indicated by an arrow. Theoretical exact masses were calculated"
    )
    assert read(text) == [
        (
            "arrow",
            None,
            "Nucleophilic sites attacked by catalytic serine are indicated by an arrow",
            "Nucleophilic sites attacked by catalytic serine",
        )
    ]


def test_real_parenthetical_pmc3902907():
    # PMC3902907: the parenthesis follows the noun it marks, in the middle of a long sentence.
    text = (
        "(A) HeLa cells were treated with sodium arsenite (250 \u03bcM) with or without menadione (15 \u00b5M) for "
        "45 min, and SGs (arrowheads) were assessed by microscopy."
    )
    assert read(text) == [("arrowhead", None, "SGs (arrowheads)", "SGs")]


def test_real_semicolon_and_glued_panel_label_pmc1702562():
    # PMC1702562: "AKT2.(D)" - the next panel's text starts right after the period.
    text = (
        "Arrows point to the position of each phosphorylated protein; the asterisk marks the position of "
        "phosphorylated AKT2.(D) In vivo [32P]orthophosphate metabolic labeling of HeLa cells"
    )
    assert read(text) == [
        (
            "arrow",
            None,
            "Arrows point to the position of each phosphorylated protein",
            "the position of each phosphorylated protein",
        ),
        (
            "asterisk",
            None,
            "the asterisk marks the position of phosphorylated AKT2",
            "the position of phosphorylated AKT2",
        ),
    ]


def test_real_marker_with_no_article_pmc2597732():
    # PMC2597732
    text = "Arrow indicates P-STAT5(Y694) or STAT5 signal. FGFR3 and ACTIN western blottings serve as loading controls."
    assert read(text) == [
        ("arrow", None, "Arrow indicates P-STAT5(Y694) or STAT5 signal", "P-STAT5(Y694) or STAT5 signal")
    ]


def test_real_significance_asterisks_are_left_out_pmc3441633_pmc6385181():
    # PMC3441633: the asterisks mark significant samples on a bar graph, not a place in an image.
    assert read("Asterisks denote samples that were significantly different from Src alone (*p<0.05).") == []
    # PMC6385181, with the thin spaces of the original.
    text = (
        "Statistical analysis was performed using Kruskal Wallis test followed by a Holm-Bonferroni procedure: "
        "*p\u2009<\u20090.05, **p\u2009<\u20090.01, ***p\u2009<\u20090.001."
    )
    assert read(text) == []


def test_real_plot_legend_shapes_are_left_out_pmc534114():
    # PMC534114: shapes named in a graph legend.
    assert read("Diamonds = Gab1 -/-, squares = Gab1, triangles = Gab1F446/472/589.") == []


def test_real_colour_and_gerund_biorxiv_2020_04_07_030213():
    # biorxiv 2020.04.07.030213 (sample/articles): "with a red arrow indicating", ", and white triangles pointing to".
    text = (
        "Panel (a) shows polyadic synapses, with a red arrow indicating the presynaptic T-bar, and white triangles "
        "pointing to the postsynaptic densities."
    )
    assert read(text) == [
        ("arrow", "red", "a red arrow indicating the presynaptic T-bar", "the presynaptic T-bar"),
        ("other", "white", "white triangles pointing to the postsynaptic densities", "the postsynaptic densities"),
    ]


def test_real_red_box_elife_46472():
    # elife-46472 (sample/articles)
    text = "The red box indicates the single nucleotide targeted for replacement during the CRISPR-Cas9 process."
    assert read(text) == [
        (
            "box",
            "red",
            "The red box indicates the single nucleotide targeted for replacement during the CRISPR-Cas9 process",
            "the single nucleotide targeted for replacement during the CRISPR-Cas9 process",
        )
    ]


def test_real_parenthetical_passive_biorxiv_2021_11_17_469032():
    # biorxiv 2021.11.17.469032 (sample/articles), Fig. S7 (CC BY): "(indicated by red arrow)" with no
    # subject; the arrow shows the portions that lie outside the mask, so the clause runs back to "Note: ".
    text = (
        "Note: portions of detected gm-wm interface immediately inferior to the hippocampus lie outside of the "
        "hippocampus mask (indicated by red arrow)."
    )
    target = (
        "portions of detected gm-wm interface immediately inferior to the hippocampus lie outside of the "
        "hippocampus mask"
    )
    (phrase,) = find_marker_phrases(text)
    assert phrase == MarkerPhrase("arrow", "red", target + " (indicated by red arrow)", 6, len(text) - 1, target)


def test_real_passive_inside_a_parenthesis_biorxiv_2021_11_17_469032():
    # Same article, Fig. S7 panel a (and Fig. S6): the passive inside "(left; ...)" still reads.
    text = (
        "T1-weighted structural MRI scan showing the right medial temporal lobe (left; hippocampus indicated by *) "
        "in the coronal plane for a single participant and the manually segmented hippocampus mask (red) overlaid "
        "on the T1-weighted image (right)."
    )
    assert read(text) == [("asterisk", None, "hippocampus indicated by *", "hippocampus")]


def test_real_two_parenthetical_passives_biorxiv_2021_11_17_469032():
    # Same article, Fig. S6: closed "(a and b)" is inside the clause; the second clause starts after the
    # first marker's parenthesis and its "and".
    text = (
        "Note, in the anterior most slices (a and b) the automated mask does not cover the entire extent of the "
        "hippocampus (indicated by red arrows) and in more posterior slices (c and d) the automated mask often "
        "overextends across the lateral ventricle superior to the hippocampus and into the adjacent white matter "
        "(indicated by black arrows)."
    )
    first = (
        "in the anterior most slices (a and b) the automated mask does not cover the entire extent of the hippocampus"
    )
    second = (
        "in more posterior slices (c and d) the automated mask often overextends across the lateral ventricle "
        "superior to the hippocampus and into the adjacent white matter"
    )
    assert read(text) == [
        ("arrow", "red", first + " (indicated by red arrows)", first),
        ("arrow", "black", second + " (indicated by black arrows)", second),
    ]


def test_real_marker_in_panels_biorxiv_2021_11_17_469032():
    # Same article, Fig. S4: "(blue arrows in panels a-e)"; the noun phrase read back stops at "and".
    text = (
        "Note, the spatial distribution of endpoint density within the hippocampus associated with each of these "
        "temporal brain areas is primarily localised to portions of the lateral hippocampal head and body (blue "
        "arrows in panels a-e) and a circumscribed region in the anterior medial hippocampus (white arrows in "
        "panels a-d)."
    )
    assert read(text) == [
        ("arrow", "blue", "body (blue arrows in panels a-e)", "body"),
        (
            "arrow",
            "white",
            "the anterior medial hippocampus (white arrows in panels a-d)",
            "the anterior medial hippocampus",
        ),
    ]


def test_offsets_point_into_the_text_as_given():
    text = "Western blot of lysates. Arrowheads point to cleaved caspase-3."
    (phrase,) = find_marker_phrases(text)
    assert phrase == MarkerPhrase(
        "arrowhead", None, "Arrowheads point to cleaved caspase-3", 25, 62, "cleaved caspase-3"
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "Arrows indicate ",
                "the lesion",
                " (arrow)",
                " (*)",
                "*p < 0.05",
                "; ",
                ". ",
                ", and ",
                "red ",
                "boxed area ",
                "are marked by arrowheads",
                "respectively",
                ": ",
                "(B) ",
                "\u2009",
            ]
        )
        | st.text(max_size=8),
        max_size=12,
    ).map("".join)
)
def test_every_phrase_is_extractive(text):
    for p in find_marker_phrases(text):
        assert text[p.start : p.end] == p.clause and p.target in p.clause and p.marker in MARKERS


def test_works_on_normalized_captions_too():
    raw = "Arrows\u00a0indicate the\u2009lesion."
    text = normalize_caption(raw)
    assert read(text) == [("arrow", None, "Arrows indicate the lesion", "the lesion")]
