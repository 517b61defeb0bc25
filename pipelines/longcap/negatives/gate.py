"""The one gate of every negative, rule or VLM: it must claim a value the positive does not, change
no other attribute and keep the rest of the sentence."""

from __future__ import annotations

import difflib
import re
from collections import Counter
from dataclasses import dataclass

from pipelines.longcap.negatives.counts import _count_values, _counts
from pipelines.longcap.negatives.lexicon import COUNT, KINDS, _hits
from pipelines.text.captions import normalize_caption

RULE, VLM = "rule", "vlm"

# A VLM negative must keep this share of the positive's words (attribute words masked): one that
# rewrites the sentence may change things no lexicon sees, so it is not a "one attribute" negative.
MIN_KEPT = 0.75


@dataclass(frozen=True)
class Negative:
    """A false caption for a region: ``text`` is the positive with ``original_span`` changed into
    ``replacement`` (every occurrence of it, for a consistent sentence)."""

    text: str
    perturbation: str
    original_span: str
    replacement: str
    source: str


def _normal(text: str) -> str:
    return normalize_caption(text).casefold().strip(" .;,:")


def values(text: str, kind: str) -> list[str]:
    """The claims ``text`` makes about one attribute, as canonical values ("upper" and "superior"
    are one value), sorted, with repeats."""
    text = normalize_caption(text)
    if kind == COUNT:
        return [str(v) for v in _count_values(text)]
    return sorted(h.term.value for h in _hits(text) if h.term.kind == kind)


def _masked_words(text: str, kind: str) -> list[str]:
    """The words outside the attribute, crudely singular, to compare a negative's wording."""
    text = normalize_caption(text)
    spans = [(h.start, h.end) for h in _hits(text) if h.term.kind == kind]
    if kind == COUNT:
        spans = [(s, e) for s, e, _v, _m in _counts(text)]
    for s, e in sorted(spans, reverse=True):
        text = text[:s] + " \x00 " + text[e:]
    return [w.rstrip("s") for w in re.findall(r"[\w\x00'&-]+", text.casefold())]


def rejection(positive: str, negative: str, perturbation: str) -> str | None:
    """Why ``negative`` is not a safe negative of ``positive`` for this attribute (None: it is)."""
    if perturbation not in KINDS:
        return f"unknown perturbation {perturbation!r}"
    if not negative or not negative.strip():
        return "empty negative"
    if _normal(positive) == _normal(negative):
        return "identical to the positive"
    before, after = values(positive, perturbation), values(negative, perturbation)
    if not after:
        return f"no {perturbation} recognised in the negative"
    if not set(after) - set(before):
        return f"claims no {perturbation} the positive does not ({', '.join(after)})"
    for kind in KINDS:
        if kind != perturbation and Counter(values(positive, kind)) != Counter(values(negative, kind)):
            return f"also changes {kind}"
    kept = difflib.SequenceMatcher(None, _masked_words(positive, perturbation), _masked_words(negative, perturbation))
    if kept.ratio() < MIN_KEPT:
        return f"rewrites the sentence (similarity {kept.ratio():.2f} < {MIN_KEPT})"
    return None


def is_contradiction(positive: str, negative: str, perturbation: str) -> bool:
    """``negative`` claims a value of ``perturbation`` that ``positive`` does not, changes no
    other attribute and keeps the rest of the sentence: it is false of the region, not a
    rewording of the truth. Used on rule and VLM negatives alike."""
    return rejection(positive, negative, perturbation) is None
