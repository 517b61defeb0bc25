"""LongCAP context: the target tokenizer, sentence cuts, context assembly and the guards.

Counts with the tiny tokenizer are done by hand: every word and every punctuation mark is one
token, plus [CLS] and [SEP]. Real captions and paragraphs come from the bundled sample nXML.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from pipelines.longcap.context import assemble_context, strip_markers
from pipelines.longcap.guards import check_refinement, entities, fit_long_caption, numbers
from pipelines.longcap.tokens import (
    TokenizerUnavailableError,
    load_tokenizer,
    split_sentences,
    tiny_backend,
    tiny_tokenizer,
)
from pipelines.parse.nxml import parse_article

SAMPLE = Path(__file__).resolve().parents[1] / "sample"
TINY = tiny_tokenizer(512)


# --- sentences and the tokenizers ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "See Fig. 2 for details. Values differ (p < 0.05). Done.",
            ["See Fig. 2 for details.", "Values differ (p < 0.05).", "Done."],
        ),
        ("As in Smith et al. (2017) the data hold. Next.", ["As in Smith et al. (2017) the data hold.", "Next."]),
        (
            "Some drugs, e.g. Tamoxifen, work. Others, i.e. The rest, fail.",
            ["Some drugs, e.g. Tamoxifen, work.", "Others, i.e. The rest, fail."],
        ),
        ("Treated vs. Untreated mice. Figs. 3 and 4 agree.", ["Treated vs. Untreated mice.", "Figs. 3 and 4 agree."]),
        (
            "Grown in Y. pestis cultures by J. K. Smith. Then lysed.",
            ["Grown in Y. pestis cultures by J. K. Smith.", "Then lysed."],
        ),
        (
            "(A). Western blot. (B) Quantification. C. Scale bar.",
            ["(A). Western blot.", "(B) Quantification.", "C. Scale bar."],
        ),
        (
            "Figure 1. Study sites. A value of 0.5 mm. 12 mice died!",
            ["Figure 1. Study sites.", "A value of 0.5 mm.", "12 mice died!"],
        ),
        ("Cells were stained (A). Nuclei are blue.", ["Cells were stained (A).", "Nuclei are blue."]),
        ("Shown in [Fig. 2](fig:F2). Next one?  Yes.", ["Shown in [Fig. 2](fig:F2).", "Next one?", "Yes."]),
    ],
)
def test_sentences_do_not_split_at_abbreviations(text, expected):
    assert split_sentences(text) == expected


def test_tiny_tokenizer_counts_words_and_punctuation():
    assert TINY.count("The cell, stained.") == 7  # the cell , stained . + 2
    assert TINY.count("") == 2
    assert TINY.count("1,839 m") == 6  # 1 , 839 m + 2
    assert load_tokenizer("tiny", 77).context_length == 77


def test_cut_keeps_whole_sentences_and_says_when_it_cuts_one():
    text = "The cell is stained. The mouse is treated. Representative image of tissue."  # 5 + 5 + 5 tokens
    assert TINY.cut(text, 17) == (text, False)
    assert TINY.cut(text, 16) == ("The cell is stained. The mouse is treated.", True)
    assert TINY.cut(text, 12) == ("The cell is stained. The mouse is treated.", True)
    first = TINY.cut_at(text, 11)
    assert (first.text, first.cut, first.mid_sentence) == ("The cell is stained.", True, False)
    # the first sentence alone is 7: cut at white space; "stained." carries its period (2 tokens)
    words = TINY.cut_at(text, 6)
    assert (words.text, words.cut, words.mid_sentence) == ("The cell is", True, True)
    assert TINY.cut_at(text, 1).text == ""


def test_padding_share_is_the_empty_part_of_the_window():
    short = "a b c"  # 5 tokens
    long = " ".join(["word"] * 20)  # 22 tokens, 10 of them in a 10-token window
    assert TINY.padding_share([short, long], context_length=10) == pytest.approx(5 / 20)
    assert tiny_tokenizer(10).padding_share([short]) == pytest.approx(5 / 10)
    assert TINY.padding_share([]) == 0.0


def test_openclip_tokenizer_works_offline(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    clip = load_tokenizer("openclip", 77)
    assert clip.count("") == 2  # <start_of_text> <end_of_text>
    assert clip.count("a photo of a cat") == 7
    assert clip.count("A PHOTO of a cat.") == 8  # lowercased like the encoder; "." is a token
    assert clip.padding_share(["a photo of a cat"]) == pytest.approx(70 / 77)
    assert clip.cut("A photo of a cat. A photo of a dog.", 8) == ("A photo of a cat.", True)
    assert clip.name == "openclip-bpe@77"


def test_hf_tokenizer_from_a_local_directory_and_a_clear_error(tmp_path, monkeypatch):
    import huggingface_hub.constants
    from transformers import PreTrainedTokenizerFast

    PreTrainedTokenizerFast(tokenizer_object=tiny_backend()).save_pretrained(tmp_path / "tok")
    hf = load_tokenizer(f"hf:{tmp_path / 'tok'}", 512)
    assert hf.count("The cell, stained.") == 7
    assert hf.context_length == 512
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(TokenizerUnavailableError, match="not-a-real/tokenizer"):
        load_tokenizer("hf:not-a-real/tokenizer", 512)
    with pytest.raises(ValueError, match="unknown tokenizer"):
        load_tokenizer("clip", 77)


# --- context assembly ---------------------------------------------------------------------

CAPTION = "Mouse tissue."  # "Caption: Mouse tissue." = 5 tokens
MENTIONS = [
    # reading order is paragraph_index, not list order; the repeated paragraph is dropped
    {
        "paragraph_index": 3,
        "section": "Results",
        "text": "Tissue is shown in [Fig. 2](fig:f2). Cells grew in [Fig. 1](fig:f1).",
    },
    {"paragraph_index": 1, "section": "Intro", "text": "Background is long here. Mice were used ([Figure 1](fig:f1))."},
    {
        "paragraph_index": 9,
        "section": "Results",
        "text": "Tissue is shown in [Fig. 2](fig:f2). Cells grew in [Fig. 1](fig:f1).",
    },
]
# Tokens: header "Text citing the figure:" 5; each paragraph's "- (Section) " 4;
# Intro: "Background is long here." 5, "Mice were used (Figure 1)." 8 (cites f1);
# Results: "Tissue is shown in Fig. 2." 8 (cites f2), "Cells grew in Fig. 1." 7 (cites f1);
# "Article title: Mouse study" 5; "Abstract:" 2 + 4 + 3; "Sections:" 2 + "Intro" 1 + "; Results" 2.
FULL = (
    "Caption: Mouse tissue.\n\n"
    "Text citing the figure:\n"
    "- (Intro) Background is long here. Mice were used (Figure 1).\n"
    "- (Results) Tissue is shown in Fig. 2. Cells grew in Fig. 1.\n\n"
    "Article title: Mouse study\n\n"
    "Abstract: We study mice. It works.\n\n"
    "Sections: Intro; Results"
)


def _context(budget: int):
    return assemble_context(
        CAPTION, "Mouse study", "We study mice. It works.", MENTIONS, ["Intro", "Results"], TINY, budget, fig_id="f1"
    )


def test_everything_fits_in_reading_order_without_repeats():
    context = _context(100)
    assert context.text == FULL
    assert context.tokens == 67  # 5 + 5 + 17 + 19 + 5 + 9 + 5 + 2
    assert context.sources == ["caption", "mentions", "title", "abstract", "sections"]
    assert context.dropped == []


def test_citing_sentences_come_first_and_whole_units_are_dropped():
    # caption 7; + Intro citing 5+4+8 = 24; + Results citing 4+7 = 35; + Intro rest 5 = 40;
    # Results rest +8 = 48, title +5, abstract +6, sections +3: none fits 40
    context = _context(40)
    assert context.text == (
        "Caption: Mouse tissue.\n\nText citing the figure:\n"
        "- (Intro) Background is long here. Mice were used (Figure 1).\n"
        "- (Results) Cells grew in Fig. 1."
    )
    assert context.tokens == 40
    assert context.sources == ["caption", "mentions"]
    assert context.dropped == ["mentions (1 of 4 sentences)", "title", "abstract", "sections"]
    # 45: the title (+5) fits after the mentions; the abstract's first sentence (+6) does not
    assert _context(45).sources == ["caption", "mentions", "title"]
    assert _context(45).tokens == 45


def test_a_smaller_unit_fills_the_room_a_larger_one_left():
    # 30: Intro citing (24); Results citing +11 = 35 does not fit; Intro rest +5 = 29 does
    context = _context(30)
    assert context.text == (
        "Caption: Mouse tissue.\n\nText citing the figure:\n"
        "- (Intro) Background is long here. Mice were used (Figure 1)."
    )
    assert context.tokens == 29


def test_the_caption_is_kept_even_over_budget():
    context = _context(5)  # the caption alone is 7
    assert context.text == "Caption: Mouse tissue."
    assert context.tokens == 7
    assert context.sources == ["caption"]
    assert context.dropped == ["mentions", "title", "abstract", "sections"]


def test_sentences_repeating_the_caption_and_empty_sources_are_skipped():
    mentions = [{"paragraph_index": 0, "section": None, "text": "Mouse tissue. It is in [Fig. 1](fig:f1)."}]
    context = assemble_context(CAPTION, None, "", mentions, None, TINY, 100, fig_id="f1")
    assert context.text == "Caption: Mouse tissue.\n\nText citing the figure:\n- It is in Fig. 1."
    assert context.sources == ["caption", "mentions"]
    assert context.dropped == []


def _figure(path: str, fig_id: str):
    parsed = parse_article(SAMPLE / path)
    figure = next(f for f in parsed.figures if f["fig_id"] == fig_id)
    mentions = [m for m in parsed.mentions if m["fig_id"] == fig_id]
    return parsed.article, figure, mentions


def test_real_figure_one_citing_sentence_at_its_exact_budget():
    """PLOS ONE 0091296, Figure 1. Hand counts: caption block 24 (+2), header 5, "- (Study
    locations and communities) " 7, the citing sentence 29: 67. Sentence 3 ("Karkar is a large,
    elevated (1,839 m) volcanic island ...") is 23."""
    article, figure, mentions = _figure("articles/pone.0091296/main.jats.xml", "pone-0091296-g001")
    caption = figure["caption_text"]
    head = f"Caption: {caption}\n\nText citing the figure:\n- (Study locations and communities) "
    citing = (
        "Studies focused on the communities of Ahus Island (Manus Province) and Muluk and Wadau villages, "
        "Karkar Island (Madang Province) (Figure 1)."
    )
    context = assemble_context(
        caption, article["title"], article["abstract"], mentions, None, TINY, 67, "pone-0091296-g001"
    )
    assert context.text == head + citing
    assert context.tokens == 67
    assert context.dropped == ["mentions (5 of 6 sentences)", "title", "abstract"]
    # one token less: the citing sentence no longer fits, the shorter third sentence (61) does
    smaller = assemble_context(
        caption, article["title"], article["abstract"], mentions, None, TINY, 66, "pone-0091296-g001"
    )
    karkar = (
        "Karkar is a large, elevated (1,839 m) volcanic island and fishing is a secondary occupation to agriculture."
    )
    assert smaller.text == head + karkar
    assert smaller.tokens == 61


def test_real_figure_three_paragraphs_citing_sentences_only():
    """BMC Genomics (PMC2231364), Figure 3: three paragraphs cite it, one sentence each; the
    budget is the size of exactly those three (chosen by hand), so nothing else fits."""
    article, figure, mentions = _figure("nxml/europepmc/PMC2231364/PMC2231364.xml", "F3")
    section = "Clustering analysis and functional classification of co-expressed gene clusters"
    expected = (
        f"Caption: {figure['caption_text']}\n\nText citing the figure:\n"
        "- (Functional inference of clustering, uncharacterized genes) Clustering microarray expression data can be "
        "viewed as a data reduction process, in that observations of gene expression in each cluster can be "
        "over-represented (Figure 3).\n"
        f"- ({section}) Clustering analysis of the whole microarray dataset was analyzed and four distinct clusters "
        "of co-expressed genes, cluster I, II, III, and IV, were identified (Figure 3).\n"
        f"- ({section}) As shown in cluster IV in Figure 3, sdhCDAB and sucABCD involved in tricarboxylic acid cycle "
        "had an expressional pattern similar to that of nuoA-N and cyoABCDE involved in aerobic respiration."
    )
    budget = TINY.count(expected)
    context = assemble_context(
        figure["caption_text"], article["title"], article["abstract"], mentions, None, TINY, budget, "F3"
    )
    assert context.text == expected
    assert context.dropped == ["mentions (6 of 9 sentences)", "title", "abstract"]  # 5 + 1 + 3 sentences
    everything = assemble_context(
        figure["caption_text"], article["title"], article["abstract"], mentions, None, TINY, 5000, "F3"
    )
    assert everything.sources == ["caption", "mentions", "title", "abstract"]
    assert "These results indicated a general retardation of energy generation in Y. pestis" in everything.text
    assert "](fig:" not in everything.text


ELIFE_P0 = [  # paragraph 0 citing eLife 43154 Figure 1, split by hand
    "By excluding patients with both SMA and CM (approximately 12% of those with either SMA or CM in the pooled "
    "data), the number of G6PDd patients in the CM category is artificially reduced and we would expect there to be "
    "fewer G6PDd patients than in the control group.",
    "[Figure 1](fig:fig1) proposes a simple causal diagram which posits plausible inter-dependencies limited to the "
    "variables of interest.",
    "A simple simulation study based on the assumptions shown in [Figure 1](fig:fig1) can be used to estimate the "
    "relationship between G6PDd and SMA which would result in the observed odds ratio for G6PDd in CM cases versus "
    "controls reported in Clarke et al. (2017).",
    "We assessed the null model in which there is no direct causal link between G6PDd and CM in severe falciparum "
    "malaria (i.e. no arrow from G6PD deficiency to CM).",
    "We also assume that there is no direct link between SMA and CM.",
]


def test_real_figure_sentences_with_et_al_and_ie():
    """eLife 43154, Figure 1: "Clarke et al. (2017)", "(i.e. no arrow ...)" and a marker that
    opens a sentence; the budget holds the caption and the four sentences citing Figure 1."""
    article, figure, mentions = _figure("articles/elife-43154/main.jats.xml", "fig1")
    paragraph = next(m["text"] for m in mentions if m["paragraph_index"] == 0)
    assert split_sentences(paragraph)[:5] == ELIFE_P0
    assert len(split_sentences(paragraph)) == 7
    caption = f"{figure['caption_title']} {figure['caption_text']}"
    as_seen = (
        "As can be seen from the causal diagram in Figure 1, there is no bias in the estimated odds ratio for G6PDd "
        "in SMA cases versus controls (in Figure 2 the thick blue line approximates the identity line)."
    )
    expected = (
        f"Caption: {caption}\n\nText citing the figure:\n"
        f"- (Results) {strip_markers(ELIFE_P0[1])} {strip_markers(ELIFE_P0[2])}\n"
        f"- (Results) {as_seen}\n"
        "- (Sensitivity analysis) The causal diagram which corresponds to exclusion operating in Step two is shown in "
        "Figure 1."
    )
    context = assemble_context(
        caption, article["title"], article["abstract"], mentions, None, TINY, TINY.count(expected), "fig1"
    )
    assert context.text == expected
    assert context.sources == ["caption", "mentions"]


# --- guards -------------------------------------------------------------------------------


def test_numbers_are_normalised_with_their_units():
    assert numbers("5 mg/kg, 5mg/kg, −3 °C, 37ºC, 1,839 m, 50 µm, 50 um, 95 %, IL-6, 1.2–1.8") == [
        ("5", "mg/kg"),
        ("5", "mg/kg"),
        ("-3", "°C"),
        ("37", "°C"),
        ("1839", "m"),
        ("50", "μm"),
        ("50", "μm"),
        ("95", "%"),
        ("1.2", ""),
        ("1.8", ""),
    ]


@pytest.mark.parametrize(
    ("refined", "reasons"),
    [
        ("Mice got 5mg/kg at −3 °C; scale bar, 50 μm.", []),
        (
            "Mice got 50 mg/kg at -3 °C; scale bar, 50 µm.",
            ["number not in sources: 50 mg/kg", "caption number dropped: 5"],
        ),
        ("Mice got 5 mg at -3 °C; scale bar, 50 µm.", ["number not in sources: 5 mg"]),
        ("Mice got 5 mg/kg at -3 °C; scale bar, 50 µm; lesions of 12.5 mm.", ["number not in sources: 12.5 mm"]),
        ("Mice got 5 mg/kg at -3 °C; scale bar, 50 µm; 12 mice.", []),  # bare 12: "12 h" is in the context
    ],
)
def test_numbers_must_occur_with_their_units(refined, reasons):
    original = "Mice got 5 mg/kg at -3 °C. Scale bar, 50 µm."
    longer = refined + " Cells glow bright green."  # not shorter than the caption
    assert check_refinement(original, longer, "Sampled after 12 h.") == reasons


def test_entities_by_shape_and_their_matching():
    text = "(A) Representative IL-6 and p53 staining in CD4+ cells of Y. pestis infected mice with Parkinson's disease."
    assert entities(text) == ["Y. pestis", "IL-6", "p53", "CD4+", "Parkinson"]
    assert entities("Treated with streptomycin and mRNA of G6PD-deficient SMA cells.") == [
        "streptomycin",
        "mRNA",
        "G6PD-deficient",
        "SMA",
    ]
    original = "Staining of IL6 in CD4+ T cells."
    context = "Yersinia pestis infected mice. Western blots."
    ok = "Staining of IL-6 in CD4+ T cells of Yersinia pestis infected mice, with bright green nuclei; Western blot."
    assert check_refinement(original, ok, context) == []
    bad = "Staining of IL-6 in CD4+ T cells of mice with Parkinson's disease treated with imatinib."
    assert check_refinement(original, bad, context) == [
        "entity not in sources: Parkinson",
        "entity not in sources: imatinib",
    ]


def test_the_caption_must_survive_and_lengths_are_sane():
    original = "Western blot of p53 (A) and quantification (B); n = 5."
    dropped = "(A) Western blot of p53 in HeLa cells, with quantification of p53 shown in the second panel."
    assert check_refinement(original, dropped, "HeLa cells.") == [
        "caption number dropped: 5",
        "panel label dropped: B",
    ]
    kept = "Western blot of p53 (A) in HeLa cells and its quantification (panel B); n = 5."
    assert check_refinement(original, kept, "HeLa cells.") == []
    assert check_refinement(original, "Blot of p53 (A), (B); n = 5.", "") == ["shorter than the caption: 28 < 54"]
    # tiny tokens: the original is 19 tokens, "kept" is 24
    assert check_refinement(original, kept, "HeLa cells.", budget=23, tokenizer=TINY) == ["over budget: 24 > 23 tokens"]
    assert check_refinement(original, "  ", "") == ["empty refinement"]
    with pytest.raises(ValueError, match="budget"):
        check_refinement(original, kept, "", budget=10)


# --- the long caption within its budget ---------------------------------------------------

# Tiny tokens (a word or a punctuation mark each, plus 2): "the cells were stained with the marker for ten
# minutes." is 10 words and a period, 11 tokens; 61 of them and one with "twenty long" (12) make 683 + 2 = 685.
CAPTION_685 = " ".join(["the cells were stained with the marker for ten minutes."] * 61) + (
    " the cells were stained with the marker for twenty long minutes."
)
# "Western blot of p53 (A)." is 8 tokens (p53 is one word; "(", "A", ")", "."); "Quantification of the bands
# (B); n = 5." is 12: the caption is 8 + 12 + 2 = 22 tokens.
CAPTION_22 = "Western blot of p53 (A). Quantification of the bands (B); n = 5."
# The refinement's first sentence carries the caption's first (15 tokens), the second is added context (8),
# the third is the caption's second (12): 15 + 8 + 12 + 2 = 37 tokens.
WIDER = "Western blot of p53 (A) in HeLa cells treated for two days."
ADDED = "The lysates were loaded in equal amounts."
QUANTIFIED = "Quantification of the bands (B); n = 5."
REFINED_37 = f"{WIDER} {ADDED} {QUANTIFIED}"


def test_a_caption_over_budget_ships_whole_and_says_why():
    assert TINY.count(CAPTION_685) == 685
    fit = fit_long_caption(CAPTION_685, None, TINY, 512)
    assert (fit.text, fit.refined, fit.cut) == (CAPTION_685, False, False)
    assert fit.note == "the caption alone is 685 tokens, over the 512-token budget: shipped whole"
    # a refinement of it cannot fit either: the caption ships, whole, without the added sentence
    fit = fit_long_caption(CAPTION_685, CAPTION_685 + " The marker labels nuclei.", TINY, 512)
    assert (fit.text, fit.refined, fit.cut) == (CAPTION_685, False, False)
    assert fit.note.endswith("shipped whole, without the refinement's context")


def test_the_budget_cuts_the_added_context_not_the_caption():
    assert (TINY.count(CAPTION_22), TINY.count(REFINED_37)) == (22, 37)
    assert fit_long_caption(CAPTION_22, REFINED_37, TINY, 37) == fit_long_caption(CAPTION_22, REFINED_37, TINY, 512)
    assert fit_long_caption(CAPTION_22, REFINED_37, TINY, 37).text == REFINED_37
    # 30 tokens: the added sentence in the middle goes (29 left), the caption's second sentence stays
    fit = fit_long_caption(CAPTION_22, REFINED_37, TINY, 30)
    assert (fit.text, fit.refined, fit.cut, fit.note) == (f"{WIDER} {QUANTIFIED}", True, True, None)
    # 25 tokens: without the added sentence it is still 29; the rest is the caption's: the caption ships
    fit = fit_long_caption(CAPTION_22, REFINED_37, TINY, 25)
    assert (fit.text, fit.refined, fit.cut) == (CAPTION_22, False, False)
    assert fit.note == (
        "the refinement is 37 tokens, over the 25-token budget, and its added context cannot be cut without "
        "cutting the caption"
    )
    assert fit_long_caption(CAPTION_22, None, TINY, 25) == fit_long_caption(CAPTION_22, None, TINY, 512)


def test_real_refinements_invented_number_invented_entity_and_a_faithful_one():
    article, figure, mentions = _figure("articles/pone.0178565/main.jats.xml", "pone.0178565.g004")
    caption = f"{figure['caption_title']} {figure['caption_text']}"
    context = assemble_context(caption, article["title"], article["abstract"], mentions, None, TINY, 2000).text
    invented_number = caption + " Profiles cover 1,200 cyanobacterial genomes."
    assert check_refinement(caption, invented_number, context) == ["number not in sources: 1200"]
    faithful = (
        "Histogram of the gene conservation index (GCI) for the 23,633 phylogenetic profiles of cyanobacteria. "
        "The GCI, the percentage of organism clusters in which the query gene is present in the reduced dataset, "
        "was calculated from the presence and absence of the query gene in the 73 organism clusters; of the 750 "
        "genes deemed essential in S. elongatus PCC 7942, 494 are conserved across the phylum."
    )
    assert check_refinement(caption, faithful, context) == []

    article, figure, mentions = _figure("nxml/europepmc/PMC2231364/PMC2231364.xml", "F3")
    caption = figure["caption_text"]
    context = assemble_context(caption, article["title"], article["abstract"], mentions, None, TINY, 2000, "F3").text
    invented_entity = (
        caption + " Cluster IV holds Yersinia pestis genes repressed by ampicillin and by Fur in HeLa cells."
    )
    assert check_refinement(caption, invented_entity, context) == [
        "entity not in sources: ampicillin",
        "entity not in sources: HeLa",
    ]

    article, figure, mentions = _figure("articles/elife-43154/main.jats.xml", "fig1")
    caption = f"{figure['caption_title']} {figure['caption_text']}"
    context = assemble_context(caption, article["title"], article["abstract"], mentions, None, TINY, 2000, "fig1").text
    reordered = (
        "G6PD deficiency is the exposure of interest (green) and cerebral malaria (CM) is the outcome of interest "
        "(red) in this causal diagram highlighting collider bias in Clarke et al. (2017) and Malaria Genomic "
        "Epidemiology Network et al. (2014). By defining the CM cases as those who had coma but no severe anaemia, "
        "collider bias operates on the effect of G6PDd on CM. Excluding patients with both SMA and CM (approximately "
        "12% of those with either SMA or CM in the pooled data) artificially reduces the number of G6PDd patients in "
        "the CM category; the vertex Case definition is a collider between G6PD deficiency and Cerebral malaria."
    )
    assert check_refinement(caption, reordered, context) == []
