"""The count grammar: numbers and number words before countable nouns ("two nuclei", "a single
focus"), with the edits that change a count and keep the noun and its verb in agreement."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipelines.longcap.negatives.lexicon import _match_case

_WORDS = "zero one two three four five six seven eight nine ten eleven twelve thirteen".split()
NUMBER_WORDS = {w: i for i, w in enumerate(_WORDS)}
_MANY = ("multiple", "several", "numerous", "many")

# Nouns whose singular and plural we know: a count that changes the number (1 <-> 2) rewrites
# the noun too, and only for these; anything else is skipped rather than written wrongly.
_IRREGULAR = {"focus": "foci", "punctum": "puncta", "nucleus": "nuclei", "mouse": "mice", "lumen": "lumina"}
_COUNTABLE = set(_IRREGULAR) | set(
    "arrow arrowhead asterisk star triangle circle box square line dot spot band nodule lesion mass cyst tumor "
    "tumour cell vessel artery vein aneurysm stone calculus polyp ulcer cavity fracture region area site structure "
    "peak layer loop branch fiber fibre vesicle granule particle colony plaque clot thrombus defect opening "
    "node gland follicle duct septum crypt villus tubule glomerulus neuron synapse spine bud lobe segment".split()
)
_PLURALS = {**_IRREGULAR, "calculus": "calculi", "villus": "villi", "glomerulus": "glomeruli", "septum": "septa"}
_VERB_AGREEMENT = {  # singular -> plural verb right after the noun
    "indicates": "indicate", "points": "point", "shows": "show", "marks": "mark", "denotes": "denote",
    "is": "are", "was": "were", "highlights": "highlight", "represents": "represent", "depicts": "depict",
    "has": "have", "appears": "appear", "lies": "lie", "contains": "contain",
}  # fmt: skip
_UNITS = set(
    "hours hour h min mins minutes seconds s days weeks months years µm um mm cm nm m kda kb bp mg ml µl ul "
    "mm2 fold times percent x".split()
)
_NOT_A_COUNT_BEFORE = re.compile(
    r"(?:fig(?:ure)?s?\.?|panels?|lanes?|tables?|days?|weeks?|months?|stages?|grades?|types?|groups?|patients?"
    r"|cases?|steps?|passages?|exons?|chromosomes?|n\s*=|p\s*[<=>])\s*$",
    re.IGNORECASE,
)


def _plural(noun: str) -> str | None:
    low = noun.lower()
    if low not in _COUNTABLE:
        return None
    if low in _PLURALS:
        out = _PLURALS[low]
    elif low.endswith(("s", "x", "z", "ch", "sh")):
        out = low + "es"
    elif low.endswith("y") and low[-2:-1] not in "aeiou":
        out = low[:-1] + "ies"
    else:
        out = low + "s"
    return _match_case(noun, out)


def _singular(noun: str) -> str | None:
    low = noun.lower()
    for s in _COUNTABLE:
        if _plural(s) == low:
            return _match_case(noun, s)
    return None


@dataclass(frozen=True)
class _CountEdit:
    start: int
    end: int
    original: str
    replacement: str
    value: int | str  # the count the replacement claims


_WORD = r"[A-Za-z][A-Za-z-]*"
_NUMBER_RE = re.compile(
    rf"(?<![\w.,/+-])(?P<num>{'|'.join(_WORDS[1:])}|\d{{1,2}})\s+(?P<noun>{_WORD})(?:\s+(?P<verb>[a-z]+))?",
    re.IGNORECASE,
)
_SINGLE_RE = re.compile(rf"\b(?P<det>an?\s+|the\s+)?single\s+(?P<noun>{_WORD})(?:\s+(?P<verb>[a-z]+))?", re.IGNORECASE)
_MANY_RE = re.compile(
    rf"\b(?P<det>the\s+)?(?P<many>{'|'.join(_MANY)})\s+(?P<noun>{_WORD})(?:\s+(?P<verb>[a-z]+))?", re.IGNORECASE
)


def _count_value(word: str) -> int | str:
    low = word.lower()
    if low in _MANY:
        return "many"
    if low == "single":
        return 1
    return NUMBER_WORDS[low] if low in NUMBER_WORDS else int(low)


def _counts(text: str) -> list[tuple[int, int, int | str, re.Match[str]]]:
    """Counts of things in ``text``: (start, end, value, match). Numbers that are times, doses,
    figure numbers or sample sizes are not counts of what the region shows."""
    found = []
    for m in _NUMBER_RE.finditer(text):
        noun = m.group("noun").lower()
        if (
            noun in _UNITS
            or noun in ("of", "and", "or", "to", "times", "per")
            or _NOT_A_COUNT_BEFORE.search(text[: m.start()])
        ):
            continue
        n = _count_value(m.group("num"))
        if n == 1 and noun not in _COUNTABLE:
            continue  # "one of", "one another", "the one": not a count
        found.append((m.start(), m.end(), n, m))
    for pattern, group in ((_SINGLE_RE, None), (_MANY_RE, "many")):
        for m in pattern.finditer(text):
            found.append((m.start(), m.end(), "many" if group else 1, m))
    return sorted(found, key=lambda f: f[0])


def _count_values(text: str) -> list[int | str]:
    return sorted((v for *_, v, _m in _counts(text)), key=str)


def _agree(verb: str | None, plural: bool) -> str | None:
    """The verb right after the noun, agreeing with its new number (None: leave it)."""
    if not verb:
        return None
    low = verb.lower()
    if plural and low in _VERB_AGREEMENT:
        return _VERB_AGREEMENT[low]
    if not plural:
        back = {v: k for k, v in _VERB_AGREEMENT.items()}
        return back.get(low)
    return None


def _count_edits(text: str) -> list[_CountEdit]:
    """Every count rewrite we can write grammatically: n -> n+1 and n -> n-1 (not to one, which
    would need the noun singular), one/single -> two with the noun (and verb) made plural,
    several/multiple -> a single with the noun made singular."""
    present = set(_count_values(text))
    edits: list[_CountEdit] = []
    for _start, _end, value, m in _counts(text):
        noun, verb = m.group("noun"), m.group("verb")
        if "num" in m.re.groupindex:
            num = m.group("num")
            if value == 1:
                options = [(2, _plural(noun), True)]
            else:
                options = [(value + 1, noun, None)] + ([(value - 1, noun, None)] if value > 2 else [])
            for new, new_noun, plural in options:
                if new in present or new_noun is None or (num.isalpha() and new >= len(_WORDS)):
                    continue
                new_num = str(new) if num.isdigit() else _match_case(num, _WORDS[new])
                edits.append(_edit(text, m, f"{new_num} {new_noun}", new, verb, plural))
        elif value == 1:
            plural_noun = _plural(noun)
            if plural_noun is None or 2 in present:
                continue
            det = m.group("det") or ""
            lead = "the two" if det.lower().strip() == "the" else "two"
            if (det or "single")[0].isupper():
                lead = lead.capitalize()
            edits.append(_edit(text, m, f"{lead} {plural_noun}", 2, verb, True))
        else:
            singular = _singular(noun)
            if singular is None or 1 in present:
                continue
            det = m.group("det") or ""
            lead = "the single" if det.strip().lower() == "the" else "a single"
            if (det or m.group("many"))[0].isupper():
                lead = lead.capitalize()
            edits.append(_edit(text, m, f"{lead} {singular}", 1, verb, False))
    return edits


def _edit(text: str, m: re.Match[str], head: str, value: int, verb: str | None, plural: bool | None) -> _CountEdit:
    """The rewrite of the match up to the noun, and of the verb after it when it must agree."""
    new_verb = _agree(verb, plural) if plural is not None else None
    end = m.end("verb") if new_verb else m.end("noun")
    replacement = f"{head}{text[m.end('noun') : m.start('verb')]}{_match_case(verb, new_verb)}" if new_verb else head
    return _CountEdit(m.start(), end, text[m.start() : end], replacement, value)
