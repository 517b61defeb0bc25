"""Schwartz & Hearst abbreviation definitions, and their use in captions.

Every expected value was read off the quoted text by hand (right-to-left letter matching done on
paper), never pasted from a run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.longcap.acronyms import Definition, expand_inline, find_definitions, used_acronyms
from pipelines.parse.nxml import parse_article

SAMPLE = Path(__file__).resolve().parents[2] / "sample"


def longs(text: str) -> dict[str, str]:
    return {short: d.long for short, d in find_definitions(text).items()}


# ---- the algorithm on textbook pairs ------------------------------------------------------------
def test_classic_long_form_then_short_form_with_offsets():
    text = "Binding of heat shock transcription factor (HSF) to DNA requires trimerization."
    defs = find_definitions(text)
    assert set(defs) == {"HSF"}
    d = defs["HSF"]
    assert d == Definition("HSF", "heat shock transcription factor", 11, 42)
    assert text[d.start : d.end] == "heat shock transcription factor"


def test_short_form_then_long_form_in_parentheses():
    text = "Cells were sorted by HSF (heat shock factor) levels."
    d = find_definitions(text)["HSF"]
    assert (d.long, text[d.start : d.end]) == ("heat shock factor", "heat shock factor")


def test_greek_suffix_and_first_letter_must_start_a_word():
    assert longs("Levels of tumor necrosis factor alpha (TNF-alpha) rose.") == {
        "TNF-alpha": "tumor necrosis factor alpha"
    }
    # G only occurs inside "big": the first character must begin a word, so nothing is defined.
    assert longs("We asked the big user (GU) twice.") == {}


def test_long_form_window_is_min_of_len_plus_5_and_twice_len():
    # |AB| = 2 -> at most 4 words; "alpha one two three four beta" would need 6.
    assert longs("We saw alpha one two three four beta (AB) here.") == {}
    assert longs("We saw alpha two beta (AB) here.") == {"AB": "alpha two beta"}


def test_digits_hyphens_and_plurals():
    text = (
        "Serum interleukin-6 (IL-6) was high. Uptake of 5-hydroxytryptamine (5-HT) fell. "
        "We drew regions of interest (ROIs) by hand."
    )
    assert longs(text) == {"IL-6": "interleukin-6", "5-HT": "5-hydroxytryptamine", "ROIs": "regions of interest"}


@pytest.mark.parametrize(
    "text",
    [
        "Mice were treated (n = 5) for a week.",
        "Weight fell in Treated Animals (p < 0.05) overall.",
        # Without the reference filter these two would match letter by letter.
        "Fluorescence in group 2 grew (Fig. 2) steadily.",
        "The table of lab 1 (Table 1) was done.",
        "Samples were Kept (30 nM) cold.",
        # Real sentences: PMC3261204 (a lowercase two-word short form) and 10.1101/2020.04.07.030213
        # (a citation glued to a name).
        "Third, it is possible that the ErbB2/EphrinB1 complex is composed of additional components (in fact, "
        "we hypothesize this is true), the composition of",
        "registered to the template brain using ANTs(Avants et al., 2008), producing both",
    ],
)
def test_parentheticals_that_are_not_abbreviations(text):
    assert find_definitions(text) == {}


def test_nested_parentheses_inner_pair_is_found():
    text = "all areas (excluding medial temporal lobe (MTL) areas) were kept"
    d = find_definitions(text)
    assert {k: v.long for k, v in d.items()} == {"MTL": "medial temporal lobe"}
    assert d["MTL"].start == text.index("medial")


def test_clause_boundary_stops_the_long_form():
    # Without the comma rule the B of "BXD" would start a long form "BXD, C57BL/6J".
    assert longs("Strains: BXD, C57BL/6J (B6) were used.") == {}


def test_most_frequent_long_form_wins_and_keeps_its_first_offsets():
    text = (
        "A principal component analysis (PCA) was run. Later, a protein complex assay (PCA) was done. "
        "Finally, another principal component analysis (PCA) was run."
    )
    d = find_definitions(text)["PCA"]
    assert d.long == "principal component analysis"
    assert d.start == text.index("principal")


def test_a_tie_keeps_the_first_definition():
    text = "A protein complex assay (PCA) was done. Then a principal component analysis (PCA) was run."
    assert find_definitions(text)["PCA"].long == "protein complex assay"


# ---- real captions, verbatim from the sample articles -----------------------------------------
def test_real_caption_brain_regions():
    # 10.1101/2020.04.07.030213 (bioRxiv), fig8, excerpt.
    caption = (
        "(E, F) The nine layers of the fan-shaped body (FB), along with the asymmetrical bodies (AB) and the noduli "
        "(NO), displayed as an anterior-ventral view (E), and a lateral view (F). In (E), three FB tangential cells "
        "(FB1D (blue), FB3A (green), FB7L (purple)) are shown as markers of the corresponding layers (FBl1, FBl3, "
        "and FBl7, respectively). (G) Zones in the ellipsoid body (EB) defined by different types of ring neurons."
    )
    assert longs(caption) == {
        "FB": "fan-shaped body",
        "AB": "asymmetrical bodies",
        "NO": "noduli",
        "EB": "ellipsoid body",
    }


def test_real_caption_glued_parentheses():
    # 10.1101/2020.04.07.030213 (bioRxiv), fig25: "gall(GA)" and "body(EB)" have no space.
    caption = (
        "(a) The linear response to inputs in the gall(GA) for an EPG neuron, which also has arbors in the "
        "ellipsoid body(EB) and the protocerebral bridge (PB)."
    )
    assert longs(caption) == {"GA": "gall", "EB": "ellipsoid body", "PB": "protocerebral bridge"}


def test_real_caption_nested_and_supplementary_reference():
    # 10.1101/2021.11.17.469032 (bioRxiv), fig1.
    caption = (
        "a. Histogram plotting the mean structural connectivity (given by the sum of SIFT2 weighted values) "
        "associated with the twenty cortical areas most strongly connected with the whole hippocampus (excluding "
        "medial temporal lobe (MTL) areas; see Supplementary Figure S1 for MTL values)."
    )
    assert longs(caption) == {"MTL": "medial temporal lobe"}


def test_real_caption_knockout_drug_and_tag():
    # 10.1101/2022.04.13.488149 (bioRxiv), fig1, excerpts.
    caption = (
        "(a) Immunoblotting of total cell lysates from wild-type and FIP200 knockout (KO) HeLa cells stably "
        "expressing mGFP-LC3B or mRFP-LC3B that were in nutrient-rich medium (0 h) or incubated for 6 h in "
        "starvation medium. (c) Same cells and labeling procedure as in (b) except that the cells were collected "
        "or incubation in starvation medium with or without 100 nM bafilomycin A1 (BafA) for 2 h. (d) Same "
        "labeling procedure as in (b) except with HeLa cells stably expressing SNAP-tag (SNAP)-LC3B and "
        "TMR-conjugated ligand targeting SNAP."
    )
    assert longs(caption) == {"KO": "knockout", "BafA": "bafilomycin A1", "SNAP": "SNAP-tag"}


def test_real_caption_clinical():
    # 10.1590/1414-431X2021e11439 (SciELO), f02. qPCR has no "q" in its long form: not defined.
    caption = (
        "A, Relative expression of cathepsin Z (CTSZ) mRNA in the blood of patients with prostate cancer (PCa) "
        "before treatment compared with healthy subjects (control) determined by real-time polymerase chain "
        "reaction (qPCR). Data are reported as means±SD. *P=0.002 (t-test). B, Receiver operating characteristic "
        "(ROC) curve of CTSZ mRNA as a molecular marker of PCa, with an area under the curve (AUC) of "
        "0.832±0.062, P<0.001."
    )
    assert longs(caption) == {
        "CTSZ": "cathepsin Z",
        "PCa": "prostate cancer",
        "ROC": "Receiver operating characteristic",
        "AUC": "area under the curve",
    }


def test_real_caption_mouse_strains():
    # 10.7554/eLife.46472, fig3, excerpt. B6 cannot be matched (its B is inside "C57BL"); D2 is.
    caption = (
        "Repeated measures ANOVA, ###p<0.001 for the main effect of strain. BXD, C57BL/6J (B6) x DBA2/J (D2); "
        "MA, methamphetamine; Oprm1, mu opioid receptor gene;"
    )
    assert longs(caption) == {"D2": "DBA2/J"}


def test_real_caption_immunoprecipitation():
    # PMC1702562 (10.1371/journal.pbio.0050005), pbio-0050005-g002, panel D.
    caption = (
        "(D) Either mock αT3-1 or αT3-1–myrAKT1 cells were lysed and total extracts were immunoprecipitated (Ip) "
        "with either anti-AKT antibody or control IgG (cIgG). Pellets were incubated (20 min at 30 °C) with "
        "histone 2B (H2B) in kinase buffer in the presence of [γ-32P]ATP."
    )
    assert longs(caption) == {"Ip": "immunoprecipitated", "cIgG": "control IgG", "H2B": "histone 2B"}


def test_real_caption_plurals_and_formula():
    # PMC3166277 (10.1186/1471-2180-11-174), F3, excerpt. "CVs (coefficients of variation)": the
    # plural s has no match in the long form, so Schwartz & Hearst leave it undefined.
    caption = (
        "(A) Effect of allelic variation in holin proteins on mean lysis times (MLTs) and standard deviations (SDs). "
        "(B) Effect of λ's late promoter pR' activity [50] on MLTs, SDs and CVs (coefficients of variation). "
        "Solid curve is SD = 3.05 (72.73 + P)/P, where P was the pR' activity."
    )
    assert longs(caption) == {"MLTs": "mean lysis times", "SDs": "standard deviations"}


# ---- a whole article body ------------------------------------------------------------------------
def test_whole_article_body():
    # PMC3902907 (10.1093/nar/gkt903): each pair below was read in the article's text.
    body = parse_article(SAMPLE / "nxml" / "PMC3902907" / "PMC3902907.nxml").article["body_text"]
    defs = find_definitions(body)
    expected = {
        "RBPs": "RNA-binding proteins",
        "HuR": "human antigen R",
        "AUF1": "AU-binding factor 1",
        "AMPK": "AMP-activated protein kinase",
        "PCR": "polymerase chain reaction",
        "SGs": "stress granules",
        "WT": "wild-type",  # from "pFlag-HuR[wild-type (WT)]": the bracket bounds the long form
    }
    assert {k: defs[k].long for k in expected if k in defs} == expected
    for d in defs.values():
        assert body[d.start : d.end] == d.long
    # "(Cdk)1" after "cell cycle-dependent kinase": a word-like short form takes at most 2 words.
    assert "Cdk" not in defs


# ---- captions against an article's definitions -------------------------------------------------
def _defs(**pairs: str) -> dict[str, Definition]:
    return {short: Definition(short, long, 0, len(long)) for short, long in pairs.items()}


def test_used_acronyms_splits_defined_and_undefined():
    caption = "(A) GFP-tagged IL-6 in HeLa cells; ROI intensity (mg/ml) vs. PBS at 37 °C, complex II and 5 nM BSA."
    defined, undefined = used_acronyms(
        caption, _defs(**{"IL-6": "interleukin-6", "ROIs": "regions of interest", "PBS": "phosphate buffered saline"})
    )
    assert defined == {"IL-6": "interleukin-6", "ROI": "regions of interest", "PBS": "phosphate buffered saline"}
    # GFP (part of GFP-tagged), HeLa and BSA; not A, II, mg, ml, nM, 37, °C.
    assert undefined == ["GFP", "HeLa", "BSA"]


def test_used_acronyms_ignores_what_the_caption_defines_itself():
    caption = "FIP200 knockout (KO) HeLa cells and KO MEFs. BXD, C57BL/6J (B6); MA, methamphetamine; LOD, log odds."
    defined, undefined = used_acronyms(caption, {})
    assert defined == {}
    # KO (defined in parentheses), BXD, MA, LOD (a glossary) are the caption's own; "C57BL/6J"
    # is read as C57BL and 6J, and B6 or 6J have a single capital.
    assert undefined == ["FIP200", "HeLa", "MEFs", "C57BL"]


def test_lowercase_words_are_never_abbreviations():
    defined, undefined = used_acronyms("control cells", _defs(control="something"))
    assert (defined, undefined) == ({}, [])


def test_expand_inline_first_occurrence_only():
    caption = "IL-6 and IL-6R levels; IL-6 again."
    assert expand_inline(caption, {"IL-6": "interleukin-6"}) == "interleukin-6 (IL-6) and IL-6R levels; IL-6 again."


def test_expand_inline_word_boundaries_and_several():
    caption = "KOs and FIP200-KO cells; KO mice were stained with PBS."
    out = expand_inline(caption, {"KO": "knockout", "PBS": "phosphate buffered saline"})
    assert out == "KOs and FIP200-KO cells; knockout (KO) mice were stained with phosphate buffered saline (PBS)."


def test_expand_inline_never_doubles_a_definition():
    caption = (
        "FIP200 knockout (KO) HeLa cells; KO cells. BXD, C57BL/6J (B6); MA, methamphetamine. B6 mice (Halo) in PBS."
    )
    expansions = {"KO": "knockout", "MA": "methamphetamine", "B6": "C57BL/6J", "Halo": "HaloTag", "PBS": "saline"}
    # KO is defined by Schwartz & Hearst, MA by the glossary, B6 and Halo stand alone in
    # parentheses: only PBS is expanded.
    assert expand_inline(caption, expansions) == caption.replace("in PBS.", "in saline (PBS).")
