"""The text the LongCAP benchmark measures as its upper bound, and its padding arithmetic."""

from __future__ import annotations

from benchmarks.longcap import prose, shares
from pipelines.longcap.tokens import tiny_tokenizer


def test_prose_drops_labels_and_section_tags_and_ends_titles():
    context = (
        "Caption: Cells stained for actin.\n\n"
        "Text citing the figure:\n"
        "- (Results) Actin rings form at day 3 (Figure 2).\n"
        "- Controls show none.\n\n"
        "Article title: Actin rings in organoids\n\n"
        "Abstract: We study rings. They matter."
    )
    assert prose(context) == (
        "Cells stained for actin. Actin rings form at day 3 (Figure 2). Controls show none. "
        "Actin rings in organoids. We study rings. They matter."
    )


def test_shares_at_both_windows():
    tokenizer = tiny_tokenizer(512)
    # tiny tokenizer: one token per word or punctuation mark, plus two: 2 + 2 = 4 and 3 + 1 + 2 = 6
    result = shares(["the cell", "the mouse cells ."], tokenizer)
    assert result["texts"] == 2
    assert result["padding_share_77"] == round((73 + 71) / (2 * 77), 4)
    assert result["padding_share_512"] == round((508 + 506) / (2 * 512), 4)
    assert result["share_over_77"] == 0.0
