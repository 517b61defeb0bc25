"""Caption splitting by panel label: the tricky cases one by one, the extractive guarantee as a
property, and agreement with hand-split real captions (the join to panels: test_pairing.py)."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.captions import EVAL_DIR, baseline_splitter, load_cases
from pipelines.text.captions import (
    CaptionSplit,
    caption_agreement,
    is_extractive,
    normalize_caption,
    panels_mentioned,
    phrase_agreement,
    split_caption,
    subcaption_agreement,
)

CASES = json.loads((Path(__file__).parents[1] / "data" / "caption_splits.json").read_text("utf-8"))["cases"]
SCHEMES = {"upper", "lower", "digit", "roman", "alnum", "fignum", "position", "none"}


def assert_extractive(caption: str | None, split: CaptionSplit) -> None:
    """Every text made of pieces of the normalised caption (the preface too: a credit line
    inside it is cut out), labels as printed (position words may hold a space: "Lower left"),
    sub-labels under labels of the split, and the same split again."""
    text = normalize_caption(caption)
    assert is_extractive(split.preface, text)
    for label, panel_text in split.panels.items():
        assert is_extractive(panel_text, text), label
        assert label and all(c.isalnum() or (c == " " and split.scheme == "position") for c in label), label
    assert split.scheme in SCHEMES
    assert 0.0 <= split.confidence <= 1.0
    assert set(split.parents) <= set(split.panels) and set(split.parents.values()) <= set(split.panels)
    assert split_caption(caption) == split


# --- normalisation -------------------------------------------------------------------------


def test_normalize_folds_dashes_spaces_and_invisible_characters():
    assert (
        normalize_caption("(A\u2013C)\u00a0Western\u2009blot \u2014 p\u200b53\n\n(D)") == "(A-C) Western blot - p53 (D)"
    )


def test_normalize_of_nothing_is_empty():
    assert normalize_caption(None) == ""
    assert normalize_caption("  \u00a0 ") == ""


# --- no split --------------------------------------------------------------------------------


@pytest.mark.parametrize("caption", ["", None, "   "])
def test_empty_input_gives_an_empty_split(caption):
    assert split_caption(caption) == CaptionSplit(preface="", panels={}, scheme="none", confidence=0.0)


def test_caption_without_labels_is_all_preface():
    split = split_caption("Western blot of HeLa lysates. Error bars show SEM.")
    assert (split.scheme, split.panels, split.preface) == (
        "none",
        {},
        "Western blot of HeLa lysates. Error bars show SEM.",
    )


@pytest.mark.parametrize(
    "caption",
    [
        "Cell counts as shown in Fig. 3B and Fig. 3C.",
        "Same staining as in Figure 2A, compare panel C and panel D of Fig. 4.",
        "Mice (n = 5) were injected (i.v.) and kept at 37 (C) or 4 °C.",
        "Levels of p53, IL-6 and CD4 in serum.",
    ],
)
def test_references_alone_do_not_split(caption):
    split = split_caption(caption)
    assert split.scheme == "none" and split.panels == {}


# --- delimiters ------------------------------------------------------------------------------


def test_parenthesised_labels_with_a_shared_preface():
    split = split_caption("Drug X blocks growth. (A) Western blot of lysates. (B) Quantification of bands.")
    assert split.preface == "Drug X blocks growth."
    assert split.panels == {"A": "Western blot of lysates.", "B": "Quantification of bands."}
    assert (split.scheme, split.confidence) == ("upper", 1.0)


@pytest.mark.parametrize(
    "caption",
    [
        "Overview. (A-C) Sections at day 1. (D) Control.",
        "Overview. (A\u2013C) Sections at day 1. (D) Control.",
        "Overview. (A to C) Sections at day 1. (D) Control.",
    ],
)
def test_a_range_belongs_to_every_label_in_it(caption):
    split = split_caption(caption)
    assert split.panels == {
        "A": "Sections at day 1.",
        "B": "Sections at day 1.",
        "C": "Sections at day 1.",
        "D": "Control.",
    }
    assert split.preface == "Overview."


@pytest.mark.parametrize(
    "caption",
    [
        "(A,B) Maps of the site. (C and D) Plots of counts.",
        "Panels A & B: Maps of the site. Panels C and D: Plots of counts.",
    ],
)
def test_label_lists(caption):
    split = split_caption(caption)
    assert split.panels == {
        "A": "Maps of the site.",
        "B": "Maps of the site.",
        "C": "Plots of counts.",
        "D": "Plots of counts.",
    }


@pytest.mark.parametrize("punct", [".", ":", ","])
def test_bare_labels_at_a_clause_start(punct):
    split = split_caption(f"Study site. A{punct} Map of the site. B{punct} Plot of counts.")
    assert split.preface == "Study site."
    assert split.panels == {"A": "Map of the site.", "B": "Plot of counts."}


def test_species_abbreviation_is_not_a_bare_label():
    split = split_caption("P. berghei in placenta. (A) Adhered cells. (B) Blocked cells.")
    assert split.preface == "P. berghei in placenta."
    assert list(split.panels) == ["A", "B"]


@pytest.mark.parametrize(
    "caption, scheme, labels",
    [
        ("(a) Top view. (b) Side view.", "lower", ["a", "b"]),
        ("(1) Top view. (2) Side view. (3) Bottom view.", "digit", ["1", "2", "3"]),
        ("(i) Top view. (ii) Side view. (iii) Bottom view.", "roman", ["i", "ii", "iii"]),
        ("(A1) Top view. (A2) Side view. (B1) Bottom view.", "alnum", ["A1", "A2", "B1"]),
        (
            "(a) Top. (b) Side. (c) Back. (d) Front. (e) Left. (f) Right. (g) Up. (h) Down. (i) Inset.",
            "lower",
            list("abcdefghi"),
        ),
    ],
)
def test_schemes(caption, scheme, labels):
    split = split_caption(caption)
    assert (split.scheme, list(split.panels)) == (scheme, labels)


def test_references_inside_texts_stay_there():
    split = split_caption("(A) Western blot, quantified as in (B). (B) Band intensities of (A), see Fig. 2A.")
    assert split.panels == {"A": "Western blot, quantified as in (B).", "B": "Band intensities of (A), see Fig. 2A."}


def test_celsius_carbon_and_gene_names_are_not_labels():
    split = split_caption(
        "(A) Cells kept at 37 (C) with p53 and IL-6 in CD4 cells (i.v.), n = 5. "
        "(B) Model with carbon (C) atoms. (C) Cells at 4 °C."
    )
    assert split.panels == {
        "A": "Cells kept at 37 (C) with p53 and IL-6 in CD4 cells (i.v.), n = 5.",
        "B": "Model with carbon (C) atoms.",
        "C": "Cells at 4 °C.",
    }


def test_a_word_printed_like_a_label_before_the_next_label_is_not_one():
    split = split_caption("(A) Model with carbon (C) atoms in grey. (B) Close-up.")
    assert split.panels == {"A": "Model with carbon (C) atoms in grey.", "B": "Close-up."}


def test_a_range_in_the_preface_is_a_reference():
    split = split_caption("Three states are shown in (A-C). (A) Inactive. (B) Intermediate. (C) Active.")
    assert split.preface == "Three states are shown in (A-C)."
    assert split.panels == {"A": "Inactive.", "B": "Intermediate.", "C": "Active."}


def test_text_before_label_style():
    split = split_caption("Effects of drug X. Western blot of lysates (A) and quantification of bands (B).")
    assert split.preface == "Effects of drug X."
    assert split.panels == {"A": "Western blot of lysates (A)", "B": "quantification of bands (B)"}
    assert split.confidence < 1.0


def test_gaps_and_disorder_lower_the_confidence():
    gap = split_caption("(A) One. (B) Two. (D) Four.")
    assert list(gap.panels) == ["A", "B", "D"] and gap.confidence < 1.0
    disorder = split_caption("(B) Two. (A) One.")
    assert disorder.panels == {"A": "One.", "B": "Two."} and disorder.confidence < 1.0


def test_thirty_and_sixty_labels():
    for n in (30, 60):
        caption = "Many panels. " + " ".join(f"({i}) Item {i}." for i in range(1, n + 1))
        split = split_caption(caption)
        assert split.scheme == "digit"
        assert split.panels == {str(i): f"Item {i}." for i in range(1, n + 1)}


def test_twenty_six_letters():
    letters = string.ascii_uppercase
    split = split_caption(" ".join(f"({c}) Panel text {c}." for c in letters))
    assert list(split.panels) == list(letters) and split.confidence == 1.0


# --- house styles (issue 19 §4): expected texts read off each caption by hand ------------------


def test_labels_trailing_their_text_get_their_own_item_and_leave_the_head_to_the_preface():
    split = split_caption(
        "Figure 2. Chest CT images showing the lungs of patient 1 (A), patient 2 (B), patient 3 (C), "
        "and patient 5 (D). Arrows mark ground-glass opacities."
    )
    assert split.preface == "Figure 2. Chest CT images showing the lungs of"
    assert split.panels == {
        "A": "patient 1 (A)",
        "B": "patient 2 (B)",
        "C": "patient 3 (C)",  # a label: nothing here speaks of temperature
        "D": "patient 5 (D)",
    }
    assert split.scheme == "upper"


def test_a_trailing_list_of_single_words_after_a_long_head():
    split = split_caption(
        "Dietary exposure altered transcript levels for TSHb (A) and GPHa (B) in the pituitary gland."
    )
    assert split.preface == "Dietary exposure altered transcript levels for"
    assert split.panels == {"A": "TSHb (A)", "B": "GPHa (B)"}


def test_trailing_clauses_of_similar_length_keep_their_subject():
    split = split_caption("Exposure depressed total T4 in males and females (A), but had no effect on total T3 (B).")
    assert split.preface == ""
    assert split.panels == {
        "A": "Exposure depressed total T4 in males and females (A)",
        "B": "but had no effect on total T3 (B)",
    }


def test_labels_that_close_their_descriptions_take_every_sentence_since_the_last():
    # each "(panel X)" ends the description it closes: the sentences after panel A's are B's
    caption = (
        "Figure 3. Sleep was recorded in the lab (panel A). Spindles were detected on each night. "
        "Their density rose with age (panel B). Coupling did not change (panel C). Error bars, SEM."
    )
    split = split_caption(caption)
    assert split.panels == {
        "A": "Sleep was recorded in the lab (panel A)",
        "B": "Spindles were detected on each night. Their density rose with age (panel B)",
        "C": "Coupling did not change (panel C)",
    }
    assert_extractive(caption, split)


@pytest.mark.parametrize(
    "caption, expected",
    [
        (
            "Immunostaining for ghrelin (A-C), GHSR-1a (D, E) and PCNA (F and G) in fetal testis.",
            {"A": "(A-C)", "B": "(A-C)", "C": "(A-C)", "D": "GHSR-1a (D, E)", "E": "GHSR-1a (D, E)"},
        ),
        (
            "Immunostaining for ghrelin (A\u2013C), GHSR-1a (D, E) and PCNA (F and G) in fetal testis.",
            {"A": "(A-C)", "F": "PCNA (F and G)", "G": "PCNA (F and G)"},
        ),
    ],
)
def test_ranges_and_groups_inside_trailing_lists(caption, expected):
    split = split_caption(caption)
    assert list(split.panels) == list("ABCDEFG")
    for label, text in expected.items():
        assert split.panels[label].endswith(text), (label, split.panels[label])
    assert split.panels["A"] == split.panels["B"] == split.panels["C"] == "Immunostaining for ghrelin (A-C)"


def test_labels_with_a_figure_number():
    split = split_caption(
        "Figure 1. Growth of two strains. (1A) Strain 1 at day 1. (1B) Strain 1 at day 3. (2A) Strain 2 at day 1."
    )
    assert split.scheme == "fignum"
    assert split.preface == "Figure 1. Growth of two strains."
    assert split.panels == {"1A": "Strain 1 at day 1.", "1B": "Strain 1 at day 3.", "2A": "Strain 2 at day 1."}


def test_sub_labels_beside_their_panels():
    split = split_caption(
        "Brain sections. (a) Overview of the brain. (a1) Hippocampus. (a2) Cortex. (b) Counts per area."
    )
    assert split.scheme == "lower"
    assert split.panels == {
        "a": "Overview of the brain. (a1) Hippocampus. (a2) Cortex.",
        "a1": "Hippocampus.",
        "a2": "Cortex.",
        "b": "Counts per area.",
    }
    assert split.parents == {"a1": "a", "a2": "a"}


def test_sub_labels_without_their_panels_are_one_level():
    split = split_caption("(a1) Day 1. (a2) Day 7. (b1) Counts. (b2) Areas.")
    assert split.scheme == "alnum"
    assert split.panels == {"a1": "Day 1.", "a2": "Day 7.", "b1": "Counts.", "b2": "Areas."}
    assert split.parents == {}


def test_letters_inside_one_numbered_part_are_its_sub_panels():
    split = split_caption(
        "Fig. 2 (1) Schematic of the device and (2) SEM images of (a) raw fibres, (b, c) annealed fibres "
        "and (d) coated fibres."
    )
    assert split.scheme == "digit"
    assert split.panels == {
        "1": "Schematic of the device",
        "2": "SEM images of (a) raw fibres, (b, c) annealed fibres and (d) coated fibres.",
        "a": "raw fibres",
        "b": "annealed fibres",
        "c": "annealed fibres",
        "d": "coated fibres.",
    }
    assert split.parents == {"a": "2", "b": "2", "c": "2", "d": "2"}


def test_upper_and_lower_case_of_one_scheme():
    split = split_caption(
        "Sensors. a Schematic of the sensor. b Voltammetry of the electrode. (C) Response to glucose."
    )
    assert split.panels == {
        "a": "Schematic of the sensor.",
        "b": "Voltammetry of the electrode.",
        "C": "Response to glucose.",
    }
    assert split.scheme == "lower"


@pytest.mark.parametrize(
    "caption, preface, panels",
    [
        (
            "Study area. Upper left (A): map of the region. Upper right (B): satellite image. "
            "Lower left (C): elevation.",
            "Study area.",
            {"A": "map of the region.", "B": "satellite image.", "C": "elevation."},
        ),
        (
            "Cell morphology. Left: untreated cells. Right: cells treated with drug X for 24 h.",
            "Cell morphology.",
            {"Left": "untreated cells.", "Right": "cells treated with drug X for 24 h."},
        ),
        (
            "Cell morphology. Top panel: untreated cells. Bottom panel: treated cells.",
            "Cell morphology.",
            {"Top": "untreated cells.", "Bottom": "treated cells."},
        ),
    ],
)
def test_position_words(caption, preface, panels):
    split = split_caption(caption)
    assert (split.preface, split.panels) == (preface, panels)


def test_position_words_inside_a_panel_text_are_not_labels():
    split = split_caption(
        "(A) Sites. (B) Phosphorylation by MAPK1 (left panel), quantified (middle panel). (C) Total protein."
    )
    assert split.panels == {
        "A": "Sites.",
        "B": "Phosphorylation by MAPK1 (left panel), quantified (middle panel).",
        "C": "Total protein.",
    }


def test_elife_source_data_and_figure_supplement_blocks_belong_to_no_panel():
    caption = (
        "Figure 1. Effect of drug X. (A) Growth curves. (B) Death rates. The raw data are available in "
        "Figure 1\u2014source data 1. 10.7554/eLife.12345.004 Figure 1\u2014source data 1. Raw counts for all "
        "panels. Figure 1\u2014figure supplement 1. Dose response of drug X."
    )
    split = split_caption(caption)
    assert split.preface == "Figure 1. Effect of drug X."
    assert split.panels == {"A": "Growth curves.", "B": "Death rates."}


def test_an_elife_doi_line_belongs_to_no_panel():
    split = split_caption(
        "Figure 2. (A, B) Images of the two strains. (C) Counts at 37 °C. DOI: http://dx.doi.org/10.7554/eLife.00013.003"
    )
    assert split.panels == {
        "A": "Images of the two strains.",
        "B": "Images of the two strains.",
        "C": "Counts at 37 °C.",
    }


def test_a_caption_without_labels_leaves_its_no_panel_tail_out_of_the_preface():
    split = split_caption(
        "Figure 3. Rosette colonies at day 2. Scale bar, 2 um. DOI: http://dx.doi.org/10.7554/eLife.1.2"
    )
    assert (split.scheme, split.panels, split.preface) == (
        "none",
        {},
        "Figure 3. Rosette colonies at day 2. Scale bar, 2 um.",
    )


def test_credit_lines_belong_to_no_panel():
    split = split_caption(
        "Fig. 4 a Fabrication of graphene. Reproduced with permission from [12] Copyright 2017 Nature. "
        "b TGA curves of the mats (Reproduced with permission from [13], Copyright 2019 Elsevier)"
    )
    assert split.panels == {"a": "Fabrication of graphene.", "b": "TGA curves of the mats"}


def test_a_credit_inside_a_bracket_takes_the_bracket_and_leaves_the_sentence():
    # after Fig. 5 of bioRxiv 2021.11.17.469032: the credit sits in a bracket mid-sentence, the
    # sentence goes on after it, and a credit mid-text leaves the text after it with its panel
    split = split_caption(
        "Figure 5. Tracer studies. (a) Slices of the human hippocampus. Reproduced from [2]. Scale bar, 1 mm. "
        "(b) Schematic of the macaque hippocampus (right; Images reproduced with permission from (22)) "
        "shows the labelled cells."
    )
    assert split.panels == {
        "a": "Slices of the human hippocampus. Scale bar, 1 mm.",
        "b": "Schematic of the macaque hippocampus shows the labelled cells.",
    }
    assert split_caption("Figure 1. Reproduced with permission from [3] Copyright 2019 Wiley. Cells.").preface == (
        "Figure 1. Cells."
    )
    # "et al." does not end the credit
    holin = "Figure 2. Holin holes. This figure is adapted from Wang et al. [28] and White et al. [40]."
    assert split_caption(holin).preface == "Figure 2. Holin holes."


@pytest.mark.parametrize(
    ("caption", "panels"),
    [
        # a stop after an abbreviation ends the credit unless the credit goes on after it
        (
            "Fig. 2. (a) SEM image of the film. Reprinted with permission from [5], Copyright 2018 Elsevier B.V. "
            "(b) XRD patterns of the film.",
            {"a": "SEM image of the film.", "b": "XRD patterns of the film."},
        ),
        (
            "Figure 3. (A) Growth curves. Adapted from Smith et al. (B) Survival of the mutants.",
            {"A": "Growth curves.", "B": "Survival of the mutants."},
        ),
        (
            "Figure 6. (a) TEM image. Reproduced with permission from [7], Copyright 2016 Wiley-VCH Verlag GmbH & "
            "Co. KGaA. (b) Size distribution.",
            {"a": "TEM image.", "b": "Size distribution."},
        ),
        # ... and a letter alone after the stop is the next label, not the credit's
        (
            "Fig. 4 a Fabrication of graphene. Adapted from Wang et al. b TGA curves of the mats. c Raman spectra.",
            {"a": "Fabrication of graphene.", "b": "TGA curves of the mats.", "c": "Raman spectra."},
        ),
        (
            "Figure 1. A. Growth. Reprinted with permission from Elsevier Ltd. B. Western blot. C. Survival.",
            {"A": "Growth.", "B": "Western blot.", "C": "Survival."},
        ),
        (
            "Figure 3. (a) Map. Adapted from Smith et al. with permission. (b) Counts.",
            {"a": "Map.", "b": "Counts."},
        ),
        # a lower-case credit after a comma is a clause of its own: the words before it stay
        (
            "Figure 1. A, Schematic of the pathway, reprinted with permission from Lee et al. B, Western blot of "
            "the lysates.",
            {"A": "Schematic of the pathway", "B": "Western blot of the lysates."},
        ),
        # a bracket the credit never closes is not the credit's
        (
            "Figure 4. (A) Weight of the mice (n = 5, Reproduced from [3]. (B) Food intake.",
            {"A": "Weight of the mice (n = 5", "B": "Food intake."},
        ),
        # in a label's own bracket the credit leaves the label (its text stays pieces of the
        # caption, so the bracket stays open)
        (
            "Figure 2. Density maps of EC (a), PeEc (b; adapted from Smith 2010) and PHA1 (c).",
            {"a": "Density maps of EC (a)", "b": "PeEc (b", "c": "PHA1 (c)"},
        ),
    ],
)
def test_where_a_credit_line_ends(caption, panels):
    assert split_caption(caption).panels == panels


def test_a_group_s_closing_list_of_trailing_labels_gives_each_label_its_item():
    split = split_caption(
        "Figure 5. Tracts. a. Slices. b-d. Masks overlaid with density maps associated with RSC (b), PeEc (c) "
        "and TE2a (d). "
        "Schematics show the cells labelled after tracer injection into the RSC (b; red), PeEc (c; black) "
        "and TE2a (d; black). Note the similar regions."
    )
    # the closing sentence's head goes with every item; "Note ..." names none: the group's
    maps, head = (
        "Masks overlaid with density maps associated with",
        "Schematics show the cells labelled after tracer injection into the",
    )
    assert split.panels == {
        "a": "Slices.",
        "b": f"{maps} RSC (b) {head} RSC (b; red) Note the similar regions.",
        "c": f"{maps} PeEc (c) {head} PeEc (c; black) Note the similar regions.",
        "d": f"{maps} TE2a (d) {head} TE2a (d; black) Note the similar regions.",
    }


def test_after_a_list_of_trailing_labels_a_sentence_naming_one_is_its_own():
    # after Fig. S2 of bioRxiv 2021.11.17.469032; "a 3D rendered" is the article, not label a,
    # and a sentence naming two labels is neither's
    split = split_caption(
        "Fig. S2. Endpoint density associated with EC (a), PeEc (b) and PHA1 (c). In each panel, a 3D rendered "
        "mask is shown. EC displayed high density throughout (a). PeEc (b) and PHA1 (c) displayed less."
    )
    assert split.panels == {"a": "EC (a) EC displayed high density throughout (a).", "b": "PeEc (b)", "c": "PHA1 (c)"}


@pytest.mark.parametrize(
    "caption, labels",
    [
        ("Cells kept at 37 (C) and 4 (C) overnight. (A) Growth. (B) Survival.", ["A", "B"]),
        ("Strains grown at 30 (C) or 37 (C), as noted at 4 °C. (A) Growth. (B) Survival.", ["A", "B"]),
        ("Growth of strain 1 (A), strain 2 (B) and strain 3 (C) in rich medium.", ["A", "B", "C"]),
    ],
)
def test_celsius_only_where_the_context_says_temperature(caption, labels):
    assert list(split_caption(caption).panels) == labels


def test_references_to_other_figures_are_not_labels():
    split = split_caption(
        "(A) Western blot of lysates (Fig. 2B). (B) Quantification (see panel A in Figure 3). "
        "(C) Controls (Supplementary Fig. S1C), as in Figure 4 (D)."
    )
    assert split.panels == {
        "A": "Western blot of lysates (Fig. 2B).",
        "B": "Quantification (see panel A in Figure 3).",
        "C": "Controls (Supplementary Fig. S1C), as in Figure 4 (D).",
    }


@pytest.mark.parametrize(
    "caption, panels",
    [
        (
            "Figure 3 | Title. a, Western blot of lysates. b, Quantification. c-e, Images at 1, 2 and 3 days.",
            {"a": "Western blot of lysates.", "b": "Quantification.", "c": "Images at 1, 2 and 3 days."},
        ),
        ("Figure 3. A-C, Images of sections. D, Quantification.", {"A": "Images of sections.", "D": "Quantification."}),
        (
            "Fig. 2 a Schematic of the construct b Western blot of lysates c Quantification of bands",
            {"a": "Schematic of the construct", "b": "Western blot of lysates", "c": "Quantification of bands"},
        ),
        (
            "Figure 4. Panel A shows the map of sites; panel B shows counts per site.",
            {"A": "shows the map of sites", "B": "shows counts per site."},
        ),
        (
            "Figure 5. (A) and (B) Western blots of two lines. (C) Quantification.",
            {"A": "Western blots of two lines.", "B": "Western blots of two lines.", "C": "Quantification."},
        ),
        (
            "Expression of the genes (A: YPO0421; B: YPO1001; C: YPO2848). Median values are shown.",
            {"A": "YPO0421", "B": "YPO1001", "C": "YPO2848"},
        ),
        (
            "Spectra of RIF-1. In panel A (1.1-1.6 ppm), H-3 correlates to H-4. Panel B (2.4-4.0 ppm) shows H-2.",
            {"A": "(1.1-1.6 ppm), H-3 correlates to H-4.", "B": "(2.4-4.0 ppm) shows H-2."},
        ),
    ],
)
def test_bold_and_worded_label_styles(caption, panels):
    split = split_caption(caption)
    for label, text in panels.items():
        assert split.panels[label] == text, label


def test_a_group_whose_text_names_each_label_gives_each_its_description():
    split = split_caption(
        "Brain regions. (A, B) Dorsal views of the neurons. Uniglomerular neurons are shown in (A), and "
        "multiglomerular neurons in (B). (C) Columnar neurons."
    )
    # what the group says of both ("Dorsal views of the neurons.") stays with each
    assert split.panels == {
        "A": "Dorsal views of the neurons. Uniglomerular neurons are shown in (A)",
        "B": "Dorsal views of the neurons. multiglomerular neurons in (B)",
        "C": "Columnar neurons.",
    }


def test_a_group_whose_text_then_prints_each_label_before_its_description():
    split = split_caption(
        "Screens. (A-C) Venn diagrams for: (A) genes up; (B) genes down and (C) genes unchanged. "
        "All at FDR 0.05. (D) Heat map."
    )
    # the group's head and its closing sentence stay with every label of it
    assert split.panels == {
        "A": "Venn diagrams for: (A) genes up All at FDR 0.05.",
        "B": "Venn diagrams for genes down All at FDR 0.05.",
        "C": "Venn diagrams for genes unchanged. All at FDR 0.05.",
        "D": "Heat map.",
    }


def test_a_group_listing_its_labels_in_one_clause_gives_each_the_list_head():
    split = split_caption(
        "Dysregulation. (a) The network. (b, c and d) Enrichment of genes in ceRNA interactions for PTEN (b), "
        "CDC42 (c) and AKT3 (d). Only significant genes were considered. In (d), two genes are marked. "
        "(e) Expression changes."
    )
    # the first item as long as the others ("PTEN"); "In (d), ..." names d alone: d's only
    assert split.panels == {
        "a": "The network.",
        "b": "Enrichment of genes in ceRNA interactions for PTEN (b) Only significant genes were considered.",
        "c": "Enrichment of genes in ceRNA interactions for CDC42 (c) Only significant genes were considered.",
        "d": "Enrichment of genes in ceRNA interactions for AKT3 (d) Only significant genes were considered. "
        "In (d), two genes are marked.",
        "e": "Expression changes.",
    }
    assert all(
        is_extractive(
            text,
            "Dysregulation. (a) The network. (b, c and d) Enrichment of genes in ceRNA "
            "interactions for PTEN (b), CDC42 (c) and AKT3 (d). Only significant genes were considered. In (d), two "
            "genes are marked. (e) Expression changes.",
        )
        for text in split.panels.values()
    )
    assert not is_extractive("AKT3 (d) Enrichment of genes", "Enrichment of genes for AKT3 (d).")  # order kept


def test_a_trailing_item_never_starts_inside_brackets():
    split = split_caption("Interaction between Flag-HuR (WT, Y68F, Y200F) and SIRT1 mRNA (A) and VHL mRNA (B).")
    assert split.preface == "Interaction between Flag-HuR (WT, Y68F, Y200F)"  # edges lose a dangling "and"
    assert split.panels == {"A": "SIRT1 mRNA (A)", "B": "VHL mRNA (B)"}


def test_a_source_data_block_of_a_figure_supplement_belongs_to_no_panel():
    split = split_caption(
        "Figure 8-figure supplement 3. Knockdowns. (A) Blots of lysates. (B) Protein levels. "
        "Figure 8-figure supplement 3-source data 1. Source files. (A) Full length blots and (B) traces."
    )
    assert split.panels == {"A": "Blots of lysates.", "B": "Protein levels."}


def test_a_range_mid_sentence_then_single_labels():
    split = split_caption(
        "Serous adenocarcinoma, stage II (a-c). Staining with antibodies against CK8 (a); COX-1 (b); COX-2 (c)."
    )
    assert split.panels == {
        "a": "Staining with antibodies against CK8 (a)",
        "b": "COX-1 (b)",
        "c": "COX-2 (c)",
    }


def test_a_single_range_mid_sentence_splits_nothing():
    split = split_caption("Bands (1-12) as well as regions between bands (A-F) were tested. Region F was active.")
    assert (split.scheme, split.panels) == ("none", {})


def test_another_figures_panels_named_inside_a_panel_text_are_references():
    split = split_caption(
        "Fig. 1 a Fabrication methods of graphene. b SEM (a, c, e) and TEM (b, d, f) images of fibres (a, b) "
        "and coated fibres (c, d)"
    )
    assert list(split.panels) == ["a", "b"]
    assert split.panels["b"] == "SEM (a, c, e) and TEM (b, d, f) images of fibres (a, b) and coated fibres (c, d)"


def test_curve_labels_inside_a_panel_text_are_references():
    split = split_caption(
        "Fig. 6 a Scheme. b Voltammetry. c Nyquist plots for (a) FTO, (b) fibres, (c) coated fibres and (d) "
        "fibres with enzyme. d Amperometric response."
    )
    assert list(split.panels) == ["a", "b", "c", "d"]
    assert split.panels["d"] == "Amperometric response."


def test_a_glossary_of_abbreviations_is_not_labels():
    split = split_caption(
        "(a) Closed channel. (b) Open channel. Membrane, grey bars; E, extracellular; I, intracellular."
    )
    assert list(split.panels) == ["a", "b"]


def test_an_orientation_key_after_the_labels_is_not_a_label():
    # "D, dorsal" is a key to the arrows (D abbreviates "dorsal"), not a fourth panel
    split = split_caption("(A) Side view. (B) Top view. (C) Front view. D, dorsal; V, ventral.")
    assert list(split.panels) == ["A", "B", "C"]


# Styles seen in a hand-split caption set the rules had not been written on (the NLM prostate
# subset of CompFigSep, docs/panels.md "Captions measured elsewhere"); the captions are shortened.


def test_labels_followed_by_a_comma_and_a_lowercase_description():
    split = split_caption(
        "Cytoplasmic GLUT1 expression in adenocarcinomas. A, prostate tumor; B, papillary thyroid tumor; "
        "C, gastric tumor."
    )
    assert split.preface == "Cytoplasmic GLUT1 expression in adenocarcinomas."
    assert split.panels == {"A": "prostate tumor", "B": "papillary thyroid tumor", "C": "gastric tumor."}
    # "B, breast carcinoma": the label is the word's initial, but a two-word description is no key
    split = split_caption("Periostin in tissues. A, normal breast tissue. B, breast carcinoma.")
    assert split.panels == {"A": "normal breast tissue.", "B": "breast carcinoma."}


def test_groups_of_labels_printed_out_of_order():
    split = split_caption(
        "Proliferation near disrupted capsules (circles). A and C: 100X. B and D: a higher (300X) "
        "magnification of A and C, respectively."
    )
    assert split.panels == {
        "A": "100X.",
        "B": "a higher (300X) magnification of A and C, respectively.",
        "C": "100X.",
        "D": "a higher (300X) magnification of A and C, respectively.",
    }


def test_a_label_glued_to_the_title_as_web_pages_print_it():
    split = split_caption(
        "Mdm2 mutation reduces prostate size.A. Photographs of prostates. B. Average prostate mass. "
        "C. H&E staining of prostate sections."
    )
    assert split.preface == "Mdm2 mutation reduces prostate size."
    assert split.panels == {
        "A": "Photographs of prostates.",
        "B": "Average prostate mass.",
        "C": "H&E staining of prostate sections.",
    }


def test_a_stain_abbreviation_is_not_a_backwards_range_of_labels():
    # "(H-E, 50x)" is haematoxylin and eosin; read as labels it named E before "(c, d, and e)"
    split = split_caption(
        "Microscopic finding. (a) Ductal adenocarcinoma. (b) Stroma with giant cells. (H-E, 50x-100x). "
        "(c, d, and e) Pleomorphic sarcoma (H&E, 200x). (f) Malignant stroma."
    )
    assert list(split.panels) == ["a", "b", "c", "d", "e", "f"]
    assert split.panels["c"] == split.panels["e"] == "Pleomorphic sarcoma (H&E, 200x)."
    assert split.panels["b"] == "Stroma with giant cells. (H-E, 50x-100x)."


def test_scale_bar_lengths_name_no_panel_text():
    split = split_caption(
        "PIN lesions.(i) High grade PIN in many glands, (ii) with abnormal nuclei (arrows). (iii) Ki67 "
        "staining. Scale bars: (i), 100 um; (ii-iii), 25 um."
    )
    assert list(split.panels) == ["i", "ii", "iii"]
    assert split.panels["ii"] == "with abnormal nuclei (arrows)."


def test_a_remark_after_a_trailing_label_keeps_it_trailing():
    split = split_caption(
        "Cytokeratin staining was present in normal glands (a) (black arrows), and absent from the "
        "carcinoma (b) (red arrows)."
    )
    assert split.panels == {
        "a": "Cytokeratin staining was present in normal glands (a) (black arrows)",
        "b": "absent from the carcinoma (b) (red arrows)",
    }


# --- extractive guarantee: property tests -----------------------------------------------------

WORDS = st.sampled_from(
    [
        "cells",
        "blot",
        "and",
        "of",
        "in",
        "as",
        "see",
        "Fig.",
        "2A",
        "p53",
        "IL-6",
        "37",
        "°C",
        "n",
        "=",
        "5",
        "(n = 5)",
        "(i.v.)",
        "panel",
        "Panels",
        ".",
        ",",
        ";",
        ":",
        "\u2013",
        "\u00a0",
        "\u200b",
        "(",
        ")",
    ]
)
MARKERS = st.sampled_from(
    [
        "(A)",
        "(B)",
        "(C)",
        "(D)",
        "A.",
        "B:",
        "C,",
        "(A-C)",
        "(A\u2013C)",
        "(A,B)",
        "(C and D)",
        "Panels A & B",
        "(a)",
        "(b)",
        "a)",
        "b)",
        "(1)",
        "(2)",
        "(i)",
        "(ii)",
        "(A1)",
        "(A2)",
        "(B1)",
        "(panel B)",
        "(D, upper graph)",
        "a",
        "b",
        "c,",
        "A-C,",
        "(a1)",
        "(a2)",
        "(b1)",
        "(1A)",
        "(1B)",
        "(2A)",
        "(a; TF, TGd)",
        "(A: X; B: Y)",
        "Left:",
        "Right:",
        "Top panel:",
        "Lower left (A):",
        "In panel A",
        "Panel B",
        "Figure 1-source data 1.",
        "Figure 2-figure supplement 1.",
        "DOI: http://dx.doi.org/10.7554/eLife.00013.003",
        "10.7554/eLife.46472.004",
        "Reproduced with permission from [3] Copyright 2019 Wiley.",
        "(reproduced with permission from [4])",
        "37 (C)",
        "at 4 °C",
        "(Fig. 2B)",
        "(see panel A in Figure 3)",
        "(Supplementary Fig. S1C)",
    ]
)
CAPTIONS = st.lists(st.one_of(WORDS, MARKERS), max_size=60).map(" ".join)
FIGURE_LABELS = st.sampled_from(["", "Figure 1. ", "Fig. 2 ", "Figure 3-figure supplement 1. ", "Fig. S4. "])


@settings(max_examples=500, deadline=None)
@given(FIGURE_LABELS, CAPTIONS)
def test_generated_captions_split_extractively(figure_label, caption):
    assert_extractive(figure_label + caption, split_caption(figure_label + caption))


def test_extractive_pieces_need_not_be_the_longest_first():
    # "et al." at the start, then "et al. et al." at the end: the longest piece first ("et al.
    # et al." at the end) leaves nothing after it for the last "et al."
    caption = "et al. Reproduced from [3]. et al. et al."
    assert is_extractive("et al. et al. et al.", caption)
    assert not is_extractive("et al. et al. et al. et al.", caption)  # the caption has three
    assert not is_extractive("et al. Reproduced", "Reproduced from [3]. et al.")  # out of order


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from([c["caption"] for c in CASES]),
    st.lists(st.tuples(st.integers(0, 5000), st.sampled_from(["\u00a0", "\u2013", "\u200b", "  "])), max_size=5),
)
def test_real_captions_with_unicode_noise_split_extractively(caption, insertions):
    for position, character in insertions:
        caption = caption[:position] + character + caption[position:]
    assert_extractive(caption, split_caption(caption))


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_normalize_is_idempotent_and_split_never_crashes(text):
    assert normalize_caption(normalize_caption(text)) == normalize_caption(text)
    assert_extractive(text, split_caption(text))


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_real_captions_split_extractively(case):
    assert_extractive(case["caption"], split_caption(case["caption"]))


# --- agreement with hand-split real captions --------------------------------------------------


def test_evaluation_set_is_large_enough_and_real():
    assert len(CASES) >= 40
    assert sum(1 for c in CASES if c["labels"]) >= 30 and sum(1 for c in CASES if not c["labels"]) >= 5


def test_agreement_with_hand_split_captions():
    """79 of 81 captions agree. The two known misses: a caption that names one label only, b1
    (never split: one label is too weak a signal), and "7A Body ... 7G" labels printed with the
    figure number. 0.95 fails as soon as two more captions regress."""
    result = caption_agreement(CASES)
    assert result["captions"] == len(CASES)
    assert result["exact_label"] >= 0.95, result["misses"]
    assert result["texts"] >= 40 and result["text"] >= 0.9


def test_agreement_counts_misses():
    cases = [
        {"id": "ok", "caption": "(A) One. (B) Two.", "labels": ["A", "B"], "texts": {"A": "One.", "preface": ""}},
        {"id": "wrong", "caption": "(A) One. (B) Two.", "labels": ["A"], "texts": {"B": "Three."}},
    ]
    assert caption_agreement(cases) == {
        "captions": 2,
        "exact_label": 0.5,
        "texts": 3,
        "text": 2 / 3,
        "misses": ["wrong"],
    }


# --- agreement with the hand-chosen phrases of the panel evaluation set (tune split only) -------


def test_phrase_agreement_on_the_tune_split():
    """The ``tune`` captions of ``sample/panels/eval`` (the holdout is scored once, by
    ``benchmarks/captions.py``, never here). Measured when written: 113 captions, 329 phrases,
    94.8% found under their label, 0.9% leaked into another label, 0 of 32 no-panel phrases
    leaked, 42 of 42 label sets exact (the caption-only cases list their labels); 69.9% found
    and 7.3% leaked before the rules of issue 19 §4. The thresholds sit a little below: about
    ten more phrases lost fail it."""
    cases, _ = load_cases(EVAL_DIR, ["tune"])
    result = phrase_agreement(cases)["tune"]
    assert result["captions"] >= 100 and result["phrases"] >= 300 and result["label_sets"] >= 40
    assert result["found_share"] >= 0.92, result["misses"]
    assert result["leaked_share"] <= 0.02, result["misses"]
    assert result["no_panel_leaked"] <= 1
    assert result["label_set_exact"] >= 0.95


def test_phrase_agreement_counts_found_leaked_and_no_panel_text():
    cases = [
        {
            "split": "tune",
            "caption": "Title. (A) Blot of cells. (B) Counts of cells. Reproduced with permission from [1].",
            "labels": ["A", "B"],
            "phrases": {"a": ["Blot of cells"], "B": ["Counts of cells", "Blot of"], "C": ["Title"]},
            "shared": ["Title"],
            "no_panel": ["Reproduced with permission from [1]"],
        },
        {
            "caption": "(a) Raw fibres. (b, c) Pristine fibres. (d) Coated fibres.",
            "phrases": {"b": ["Pristine"], "c": ["Pristine"]},
        },
    ]
    result = phrase_agreement(cases)
    tune = result["tune"]
    # "Blot of cells" is found under "a" (labels match whatever their case); "Blot of" is not found
    # under B and leaks from A; "Title" is under no label C; the credit line leaks into no text
    assert (tune["phrases"], tune["found"], tune["leaked"]) == (4, 2, 1)
    assert (tune["no_panel"], tune["no_panel_leaked"], tune["label_sets"], tune["label_sets_exact"]) == (1, 0, 1, 1)
    assert (tune["shared"], tune["shared_in_preface"]) == (1, 1)
    assert tune["misses"] == ["0: B: Blot of (leaked)", "0: C: Title"]
    # a phrase listed under both labels of a group does not leak between them
    assert (result["all"]["found"], result["all"]["leaked"]) == (2, 0)


def test_subcaption_agreement_scores_each_label_by_its_own_words():
    case = {
        "caption": "Tumour sections. (A) Normal prostate gland. (B) Carcinoma with invasion.",
        # shared sentences repeated under every label, as the NLM subset writes them
        "subcaptions": {
            "A": "Tumour sections. Normal prostate gland.",
            "B": "Tumour sections. Carcinoma with invasion.",
        },
    }
    # own words: A normal, prostate, gland; B carcinoma, invasion ("tumour", "sections" are shared)
    assert subcaption_agreement([case])["right_share"] == 1.0

    def whole(caption):  # every panel given the whole caption: its own words, and the other's
        return CaptionSplit(preface=caption, panels={"A": caption, "B": caption}, scheme="upper")

    scores = subcaption_agreement([case], splitter=whole)
    assert (scores["found_share"], scores["leaked_share"], scores["right_share"]) == (1.0, 1.0, 0.0)

    def only_a(caption):  # B not split off: A's text runs on into B's
        return CaptionSplit(panels={"A": "Normal prostate gland. Carcinoma with invasion."}, scheme="upper")

    scores = subcaption_agreement([case], splitter=only_a)
    assert (scores["labels"], scores["right"], scores["missing"]) == (2, 0, 1)


def test_the_benchmark_baseline_runs_the_splitter_of_a_revision_beside_todays():
    # the revision's own package under another name: its modules, not today's
    old = baseline_splitter("HEAD")
    assert old is not split_caption and old.__module__ == "pipelines_at_HEAD.text.captions"
    split = old("Figure 1. Growth. (A) Day one. (B) Day two.")
    assert dict(split.panels) == {"A": "Day one.", "B": "Day two."}


@pytest.mark.parametrize(
    ("caption", "count"),
    [
        # two places named: a figure of two panels without printed labels
        ("Results of the simulation. The left panel shows the observed odds ratio. The right panel shows the bias.", 2),
        ("Vulnerability for all attributes (left panel) and catchability (right-hand panel) only.", 2),
        ("Coronal (top panel), sagittal (middle panel) and axial (bottom panel) views.", 3),
        ("Top and bottom panels: two fields of one section.", 2),
        ("Upper panel: raw trace; lower panel: the same trace filtered.", 2),  # upper is top, lower bottom
        # places without the word "panel": two opposite sides
        ("Precision and recall, on the left for T-bars, and on the right for synapses as a whole.", 2),
        ("Images of control (left) and knock-down (right) cells.", 2),
        ("Control at the top, treated at the bottom.", 2),
        ("On the left, controls; on the right, treated cells.", 2),
        # panels spoken of without a count
        ("Test results are given in the panel titles.", None),
        ("In each panel, the location of the slice is shown.", None),
        ("The top panel shows the mean.", None),  # one place: two or more panels, how many is not said
        # no panel of this figure: a single figure's caption, or "panel" in another sense
        ("Growth of two strains in rich medium.", 0),
        ("Expression of a panel of 50 genes measured with a sequencing panel.", 0),
        ("The left ventricle is enlarged (arrow).", 0),
        ("A lesion on the left lung and one at the top of the liver (arrows).", 0),  # parts of one picture
        ("The nucleus (top) is stained.", 0),  # one place alone
        # sides that name parts of one picture: a blot's markers and lanes, bones, marks
        ("Western blot; molecular weight markers are on the left and lane numbers at the top.", 0),
        ("The femur is at the top and the tibia at the bottom.", 0),
        ("The arrow (top) marks the lesion and the asterisk (bottom) the necrosis.", 0),
        (None, 0),
    ],
)
def test_panels_mentioned_without_labels(caption, count):
    assert panels_mentioned(caption) == count


def test_a_label_after_a_closing_bracket_without_its_stop():
    # copied as printed: no stop between "microglia)" and "B:"
    split = split_caption(
        "Staining of a tissue array. A: Brain cortex (neurons and microglia) B: Colon mucosa with "
        "neuroendocrine cells; C: Liver (hepatocytes and bile duct); D: Lung (alveoli)."
    )
    assert split.panels == {
        "A": "Brain cortex (neurons and microglia)",
        "B": "Colon mucosa with neuroendocrine cells",
        "C": "Liver (hepatocytes and bile duct)",
        "D": "Lung (alveoli).",
    }
    # an abbreviation key after a bracket is still not a label
    assert split_caption("Cells per field (see Methods) N: number of cells; A: area.").panels == {}


def test_the_first_label_glued_to_the_title_without_a_stop():
    split = split_caption(
        "Calmodulin in prostate tumor and non-tumor tissuesA) Evaluation of CaM expression in benign "
        "tissues. B) Evaluation of CaM expression in serial sections."
    )
    assert split.preface == "Calmodulin in prostate tumor and non-tumor tissues"
    assert split.panels == {
        "A": "Evaluation of CaM expression in benign tissues.",
        "B": "Evaluation of CaM expression in serial sections.",
    }
    # an antibody class is not a label: one lower-case letter before the capital
    assert split_caption("Secretory IgA) levels in saliva. B) Serum levels.").panels == {}


def test_a_panel_named_only_by_its_sub_labels():
    caption = (
        "(A) Immunoreactivity score of the probe in a tissue microarray. (B1) Normal prostate tissue; "
        "(B2) BPH case with strong nuclear staining; (B3) PCa case; (C) Lymphoma; (D) Gastric cancer."
    )
    split = split_caption(caption)
    assert split.panels == {
        "A": "Immunoreactivity score of the probe in a tissue microarray.",
        "B": "Normal prostate tissue; (B2) BPH case with strong nuclear staining; (B3) PCa case",
        "B1": "Normal prostate tissue",
        "B2": "BPH case with strong nuclear staining",
        "B3": "PCa case",
        "C": "Lymphoma",
        "D": "Gastric cancer.",
    }
    assert split.parents == {"B1": "B", "B2": "B", "B3": "B"}
    assert_extractive(caption, split)


def test_a_number_before_a_closing_label_ends_the_text_before_it():
    split = split_caption("Tumours: A) benign hyperplasia, B) gleason 6, C) gleason 7, D) gleason 8.")
    assert split.panels == {"A": "benign hyperplasia", "B": "gleason 6", "C": "gleason 7", "D": "gleason 8."}
