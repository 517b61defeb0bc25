"""Negatives by rule: every occurrence of one attribute value swapped for a contrasting one, or a
count changed, each checked by the gate."""

from __future__ import annotations

import random

from pipelines.longcap.negatives.counts import _count_edits
from pipelines.longcap.negatives.gate import RULE, Negative, _normal, is_contradiction
from pipelines.longcap.negatives.lexicon import COUNT, KINDS, TERMS, _Hit, _hits, _match_case
from pipelines.text.captions import normalize_caption

# The rules' version (this module, the lexicon, the count grammar, the gate): bump it when a change
# there changes the negatives made from the same text; with the prompt's version it is the asset's code version.
RULES_VERSION = "1"


def _replace_all(text: str, hits: list[_Hit], replacement: str) -> tuple[str, str, str]:
    """Every occurrence rewritten (each in its own case), so the negative is consistent."""
    out, pos = [], 0
    first: tuple[str, str] | None = None
    for h in hits:
        original = text[h.start : h.end]
        # an acronym's counterpart is written as listed: "DAPI" -> "phalloidin", not "PHALLOIDIN"
        new = replacement if h.term.surface != h.term.surface.lower() else _match_case(original, replacement)
        first = first or (original, new)
        out += [text[pos : h.start], new]
        pos = h.end
    out.append(text[pos:])
    return "".join(out), first[0], first[1]


def _lexicon_candidates(text: str, kind: str) -> list[Negative]:
    hits = [h for h in _hits(text) if h.term.kind == kind]
    present = {h.term.value for h in hits}
    by_surface: dict[str, list[_Hit]] = {}
    for h in hits:
        by_surface.setdefault(h.key, []).append(h)
    out = []
    for surface, group in by_surface.items():
        for target in TERMS[surface].swaps:
            if TERMS[target].value in present:
                continue  # the positive already claims it: "left and right" has no laterality negative
            new_text, span, repl = _replace_all(text, group, target)
            out.append(Negative(new_text, kind, span, repl, RULE))
    return out


def _count_candidates(text: str) -> list[Negative]:
    out = []
    for e in _count_edits(text):
        out.append(Negative(text[: e.start] + e.replacement + text[e.end :], COUNT, e.original, e.replacement, RULE))
    return out


def rule_negatives(text: str, max_per_type: int = 1, seed: int = 0) -> list[Negative]:
    """Negatives of ``text`` by the lexicon: up to ``max_per_type`` per attribute, chosen by
    ``seed`` among the candidates (the same text and seed always give the same negatives), each
    checked by :func:`is_contradiction`."""
    text = normalize_caption(text)
    if not text:
        return []
    rng = random.Random(f"{seed}\x00{text}")
    out: list[Negative] = []
    seen = {_normal(text)}
    for kind in KINDS:
        candidates = _count_candidates(text) if kind == COUNT else _lexicon_candidates(text, kind)
        candidates = [c for c in candidates if is_contradiction(text, c.text, kind)]
        rng.shuffle(candidates)
        for c in candidates:
            if sum(n.perturbation == kind for n in out) >= max_per_type:
                break
            if _normal(c.text) not in seen:
                seen.add(_normal(c.text))
                out.append(c)
    return out
