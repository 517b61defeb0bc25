"""Hard negatives for region pairs: expected negatives are written by hand from the texts."""

from __future__ import annotations

import json

import pytest

from pipelines.core.schemas import TABLES, Table
from pipelines.longcap.negatives import (
    COLOUR,
    COUNT,
    LATERALITY,
    LOCATION,
    MODALITY,
    NEGATIVES,
    RULE,
    SIZE,
    STAIN,
    VLM,
    Negative,
    is_contradiction,
    negative_rows,
    rejection,
    rule_negatives,
    vlm_negatives,
)
from pipelines.vlm.engine import VlmOutage
from testing.vlm import ScriptedEngine


def _by_kind(text: str, kind: str, max_per_type: int = 5, seed: int = 0) -> set[tuple[str, str, str]]:
    return {
        (n.original_span, n.replacement, n.text)
        for n in rule_negatives(text, max_per_type=max_per_type, seed=seed)
        if n.perturbation == kind
    }


# --- one attribute at a time ------------------------------------------------------------------


def test_laterality_swap_keeps_the_rest():
    assert _by_kind("arrows indicate the dilated left ventricle", LATERALITY) == {
        ("left", "right", "arrows indicate the dilated right ventricle")
    }


def test_ipsilateral_becomes_contralateral():
    assert _by_kind("streamlines project to the ipsilateral hippocampus", LATERALITY) == {
        ("ipsilateral", "contralateral", "streamlines project to the contralateral hippocampus")
    }


def test_location_swaps_each_axis():
    assert _by_kind("a nodule in the upper lobe, proximal to the hilum", LOCATION) == {
        ("upper", "lower", "a nodule in the lower lobe, proximal to the hilum"),
        ("proximal", "distal", "a nodule in the upper lobe, distal to the hilum"),
    }


def test_cortex_becomes_medulla():
    assert _by_kind("cysts in the renal cortex", LOCATION) == {("cortex", "medulla", "cysts in the renal medulla")}


def test_count_number_word_plural_unchanged():
    # two -> three only: two -> one would need the noun singular
    assert _by_kind("two arrows mark the nodules", COUNT) == {
        ("two arrows", "three arrows", "three arrows mark the nodules")
    }


def test_count_both_directions_above_two():
    assert _by_kind("four arrowheads", COUNT) == {
        ("four arrowheads", "five arrowheads", "five arrowheads"),
        ("four arrowheads", "three arrowheads", "three arrowheads"),
    }


def test_count_single_becomes_two_with_plural_noun_and_verb():
    assert _by_kind("a single nodule is visible", COUNT) == {
        ("a single nodule is", "two nodules are", "two nodules are visible")
    }


def test_count_one_becomes_two_with_agreement():
    assert _by_kind("One arrow indicates the lesion", COUNT) == {
        ("One arrow indicates", "Two arrows indicate", "Two arrows indicate the lesion")
    }


def test_count_skips_what_it_cannot_pluralise_and_numbers_that_are_not_counts():
    # "one of" is no count; an unknown noun after "single" is not guessed at; 293T, K650M, 48 hours,
    # n = 3 and Figure 2 are not counts of what the region shows
    text = "one of the single-ish gizmos; 293T cells at 48 hours (n = 3 mice, Figure 2 arrows) and K650M"
    assert _by_kind(text, COUNT) == set()


def test_count_digits_stay_digits():
    assert _by_kind("3 cysts (arrows)", COUNT) == {
        ("3 cysts", "4 cysts", "4 cysts (arrows)"),
        ("3 cysts", "2 cysts", "2 cysts (arrows)"),
    }


def test_colour_swaps_and_protected_colour_words():
    # "white matter" is anatomy and "Congo red" a dye: only the arrow's colour changes
    got = _by_kind("Congo red deposits in the white matter (black arrows)", COLOUR)
    assert got == {("black", "white", "Congo red deposits in the white matter (white arrows)")}


def test_stain_swaps():
    assert _by_kind("H&E staining of the lesion", STAIN) == {
        ("H&E", "Masson's trichrome", "Masson's trichrome staining of the lesion")
    }
    assert _by_kind("GFP-positive cells (arrowheads)", STAIN) == {
        ("positive", "negative", "GFP-negative cells (arrowheads)")
    }


def test_positive_control_is_not_a_stain():
    assert _by_kind("the positive control lane", STAIN) == set()


def test_modality_swaps_acronyms_verbatim():
    assert _by_kind("axial T1-weighted image", MODALITY) == {("T1-weighted", "T2-weighted", "axial T2-weighted image")}
    assert _by_kind("Computed tomography shows the mass", MODALITY) == {
        ("Computed tomography", "Magnetic resonance imaging", "Magnetic resonance imaging shows the mass")
    }


def test_size_swaps():
    assert _by_kind("the thickened wall of a dilated duct", SIZE) == {
        ("thickened", "thinned", "the thinned wall of a dilated duct"),
        ("dilated", "constricted", "the thickened wall of a constricted duct"),
    }


def test_small_intestine_is_not_a_size():
    assert _by_kind("the small intestine (arrow)", SIZE) == set()


# --- must reject ------------------------------------------------------------------------------


def test_both_values_mentioned_gives_no_negative_of_that_pair():
    negs = rule_negatives("the left and right ventricles are enlarged", max_per_type=5)
    assert [n.perturbation for n in negs] == [SIZE]
    assert _by_kind("the anterior-posterior extent of the hippocampus", LOCATION) == set()


def test_is_contradiction_rejects_restatements():
    pos = "the left and right ventricles"
    assert not is_contradiction(pos, "the right and right ventricles", LATERALITY)
    assert not is_contradiction(pos, "the right and left ventricles", LATERALITY)
    assert not is_contradiction("the superior lobe", "the upper lobe", LOCATION)  # same value, other word
    assert not is_contradiction("the left lobe.", "The  left lobe", LATERALITY)  # identical once normalised
    assert is_contradiction("the left lobe", "the right lobe", LATERALITY)


def test_is_contradiction_rejects_other_attributes_and_rewrites():
    pos = "arrows indicate the dilated left ventricle"
    assert rejection(pos, "arrows indicate the right ventricle", LATERALITY) == "also changes size"
    assert rejection(pos, "arrows indicate the dilated left ventricle", LATERALITY) == "identical to the positive"
    assert rejection(pos, "a dilated right chamber compresses the heart on this film", LATERALITY).startswith(
        "rewrites the sentence"
    )
    assert rejection(pos, "arrows indicate the dilated left ventricle", "texture") == "unknown perturbation 'texture'"
    assert rejection(pos, "arrows indicate the ballooned left ventricle", SIZE) == "no size recognised in the negative"


def test_no_swap_inside_a_word():
    # "bright" holds "right", "bilateral" holds "lateral", "Upperton" holds "upper": none is touched
    assert rule_negatives("bright bilateral signal near Upperton", max_per_type=5) == [
        Negative("bright unilateral signal near Upperton", LATERALITY, "bilateral", "unilateral", RULE)
    ]


def test_verb_left_is_not_laterality():
    assert rule_negatives("If left unchanged, the band remains", max_per_type=5) == []


def test_case_is_kept():
    assert _by_kind("Left atrium", LATERALITY) == {("Left", "Right", "Right atrium")}
    assert _by_kind("LEFT atrium", LATERALITY) == {("LEFT", "RIGHT", "RIGHT atrium")}
    # every occurrence changes, each in its own case, so the negative is consistent
    assert _by_kind("Left atrium and left ventricle", LATERALITY) == {
        ("Left", "Right", "Right atrium and right ventricle")
    }


def test_seed_decides_among_candidates_and_is_deterministic():
    text = "red and yellow arrows"  # red -> green/blue, yellow -> blue/red(taken): 3 candidates
    first = rule_negatives(text, max_per_type=1, seed=1)
    assert first == rule_negatives(text, max_per_type=1, seed=1)
    chosen = {rule_negatives(text, max_per_type=1, seed=s)[0].text for s in range(20)}
    assert chosen == {"green and yellow arrows", "blue and yellow arrows", "red and blue arrows"}
    assert len(rule_negatives(text, max_per_type=5)) == 3


def test_every_rule_negative_passes_the_gate():
    for text in ("two dilated left ducts (red arrows) on T2-weighted MRI", "a single enlarged node in the upper lobe"):
        for n in rule_negatives(text, max_per_type=5):
            assert is_contradiction(text, n.text, n.perturbation), n


# --- real caption clauses with markers (the sample) ---------------------------------------------


def test_real_clause_gm_wm_interface():
    # bioRxiv 2021.11.17.469032, Fig. S7 (adjustment of the gm-wm interface)
    text = (
        "portions of detected gm-wm interface immediately inferior to the hippocampus lie outside of the "
        "hippocampus mask (indicated by red arrow)"
    )
    got = {(n.perturbation, n.original_span, n.replacement) for n in rule_negatives(text, max_per_type=5)}
    assert got == {(LOCATION, "inferior", "superior"), (COLOUR, "red", "green"), (COLOUR, "red", "blue")}
    swapped = [n for n in rule_negatives(text, max_per_type=5) if n.perturbation == LOCATION][0]
    assert swapped.text == text.replace("immediately inferior", "immediately superior")


def test_real_clause_white_matter_is_anatomy():
    # bioRxiv 2021.11.17.469032, Fig. S6 (automated vs manual hippocampus segmentation)
    text = (
        "the automated mask often overextends across the lateral ventricle superior to the hippocampus "
        "and into the adjacent white matter (indicated by black arrows)"
    )
    got = {(n.perturbation, n.original_span, n.replacement) for n in rule_negatives(text, max_per_type=5)}
    # "lateral ventricle" is a structure's name and "white matter" anatomy: neither changes
    assert got == {(LOCATION, "superior", "inferior"), (COLOUR, "black", "white")}


def test_real_clause_identifiers_are_not_counts():
    # PMC2597732: FGFR3 western blots
    text = "HeLa and RCS cells but not 293T cells express mostly immature forms (lower arrow) of K650M and K650E-FGFR3"
    assert rule_negatives(text, max_per_type=5) == [
        Negative(text.replace("(lower arrow)", "(upper arrow)"), LOCATION, "lower", "upper", RULE)
    ]


def test_real_clause_presynaptic_t_bar():
    # bioRxiv 2020.04.07.030213, hemibrain Fig. 1
    text = "a red arrow indicating the presynaptic T-bar"
    assert _by_kind(text, COLOUR) == {
        ("red", "green", "a green arrow indicating the presynaptic T-bar"),
        ("red", "blue", "a blue arrow indicating the presynaptic T-bar"),
    }
    assert _by_kind(text, COUNT) == set()  # "a red arrow": the article is not a count we rewrite


# --- the VLM path -----------------------------------------------------------------------------


def _engine(answers: dict[str, str | Exception]) -> ScriptedEngine:
    return ScriptedEngine(lambda request: answers[request.id])


def test_vlm_negatives_are_gated_and_tagged():
    pos = "arrows indicate the dilated left ventricle"
    answer = json.dumps(
        {
            "negatives": [
                {"text": "arrows indicate the dilated right ventricle", "perturbation": "laterality"},
                {"text": "arrows indicate the dilated left ventricle", "perturbation": "size"},  # the positive
                {"text": "arrows indicate the widened left ventricle", "perturbation": "size"},  # same value
                {"text": "arrows indicate the narrowed left ventricle", "perturbation": "size"},
            ]
        }
    )
    engine = _engine({"p1": answer})
    got = vlm_negatives(engine, [("p1", pos)], n=3)
    assert got.negatives["p1"] == [
        Negative("arrows indicate the dilated right ventricle", LATERALITY, "left", "right", VLM),
        Negative("arrows indicate the narrowed left ventricle", SIZE, "dilated", "narrowed", VLM),
    ]
    assert got.reasons["p1"] == [
        "negative 1: identical to the positive",
        "negative 2: claims no size the positive does not (wide)",
    ]
    request = engine.requests[0]
    assert request.images == [] and request.schema == NEGATIVES.schema and pos in request.prompt


def test_vlm_garbage_and_failed_requests_give_reasons_not_crashes():
    engine = _engine(
        {
            "a": "I cannot help with that.",
            "b": '```json\n{"negatives": [{"text": "the right lobe", "perturbation": "laterality"}]}\n```',
            "c": RuntimeError("400 bad request"),
            "d": '{"negatives": "none"}',
        }
    )
    items = [("a", "the left lobe"), ("b", "the left lobe"), ("c", "the left lobe"), ("d", "the left lobe")]
    got = vlm_negatives(engine, items, n=2)
    assert got.negatives == {
        "a": [],
        "b": [Negative("the right lobe", LATERALITY, "left", "right", VLM)],
        "c": [],
        "d": [],
    }
    assert got.reasons["a"] == ["no JSON in answer"]
    assert got.reasons["c"] == ["request failed: 400 bad request"]
    assert got.reasons["d"] == ["answer has no list of negatives"]
    assert "b" not in got.reasons


def test_vlm_outage_propagates():
    def down(request):
        raise VlmOutage("connection refused")

    with pytest.raises(VlmOutage):
        vlm_negatives(ScriptedEngine(down), [("a", "the left lobe")], n=1)


# --- rows -------------------------------------------------------------------------------------


def test_negative_rows_match_the_schema_and_skip_non_region_pairs():
    pairs = [
        {"pair_id": "PMC1/f.jpg/p000/r00", "pmcid": "PMC1", "level": "region", "text": "the left lobe (arrow)"},
        {"pair_id": "PMC1/f.jpg/p000", "pmcid": "PMC1", "level": "panel", "text": "the left lobe"},
        {"pair_id": "PMC1/f.jpg/p000/r01", "pmcid": "PMC1", "level": "region", "text": None},
    ]
    vlm = {
        "PMC1/f.jpg/p000/r00": [
            Negative("the left lobe (green arrow)", COLOUR, "arrow", "green arrow", VLM),
            Negative("the right lobe (arrow)", LATERALITY, "left", "right", VLM),  # the rule's, again
            Negative("the left lobe (arrowhead)", COUNT, "arrow", "arrowhead", VLM),  # no count: fails the gate
        ]
    }
    rows = negative_rows(pairs, vlm=vlm)
    assert rows == [
        {
            "pair_id": "PMC1/f.jpg/p000/r00",
            "pmcid": "PMC1",
            "negative_index": 0,
            "text": "the right lobe (arrow)",
            "perturbation": LATERALITY,
            "original_span": "left",
            "replacement": "right",
            "source": RULE,
        },
        {
            "pair_id": "PMC1/f.jpg/p000/r00",
            "pmcid": "PMC1",
            "negative_index": 1,
            "text": "the left lobe (green arrow)",
            "perturbation": COLOUR,
            "original_span": "arrow",
            "replacement": "green arrow",
            "source": VLM,
        },
    ]  # the VLM's duplicate of the rule negative and its false count are dropped
    assert set(rows[0]) == set(TABLES[Table.PAIR_NEGATIVES].names)
