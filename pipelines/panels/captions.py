"""Captions split by panel label (the join of a figure's panels to their texts is ``pairing``).

Rules only: deterministic and extractive. Every text returned is a substring of
``normalize_caption(caption)``, so a panel's text can always be traced back to the caption.

How a caption is read:

1. ``normalize_caption`` folds the Unicode look-alikes that break matching (the dash family,
   non-breaking and thin spaces, fullwidth brackets, primes) and collapses white space.
2. Candidate label markers are found: ``(A)``, ``[A]``, ``(A-C)``, ``(A, B)``, ``(A and B)``,
   ``(D, upper graph)``, ``(panel B)``, an unmatched ``A)``, and at a clause start ``A.``,
   ``A:``, ``A,``, ``Panels A & B``. Known references are not candidates: ``as in (B)``,
   ``see (C)``, ``Fig. 2 (A)``, ``37 (C)`` (Celsius); words such as ``Fig. 2A``, ``p53``,
   ``IL-6``, ``(n = 5)`` or ``(i.v.)`` never look like markers.
3. The scheme (upper, lower, digit, roman, alnum) is the one whose labels form the longest run
   from its first label (A, a, 1, i, A1) with at most one label missing between two found ones.
4. Each label is defined by one marker: the first one, in order, that names it. A label printed
   before its text ("(A) Western blot") prefers a marker at a clause start, so that a reference
   earlier in the caption ("shown in (A-C). (A) ...") is kept in the text; a label printed after
   its text ("Western blot (A) and ...") takes the first marker. Later mentions of a defined
   label are references and stay in the text.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

from pipelines.panels.types import CaptionSplit

SCHEMES = ("upper", "lower", "digit", "roman", "alnum")
ROMANS = tuple("i ii iii iv v vi vii viii ix x xi xii xiii xiv xv xvi xvii xviii xix xx".split())

# Characters folded by normalize_caption: dashes and minus signs to "-", odd spaces to " ",
# invisible characters removed, fullwidth brackets and punctuation to ASCII, primes to "'".
_FOLD = str.maketrans(
    {
        **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212\ufe58\ufe63\uff0d", "-"),
        **dict.fromkeys(
            "\u00a0\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000\t\n\r\f\v", " "
        ),
        **dict.fromkeys("\u200b\u200c\u200d\u2060\ufeff\u00ad", ""),
        "\uff08": "(",
        "\uff09": ")",
        "\uff3b": "[",
        "\uff3d": "]",
        "\uff0c": ",",
        "\uff1a": ":",
        "\uff1b": ";",
        "\uff0e": ".",
        "\u2032": "'",
        "\u2019": "'",
        "\u2018": "'",
        "\u201c": '"',
        "\u201d": '"',
    }
)
_SPACES = re.compile(r" {2,}")

_ROMAN_ALT = "|".join(sorted(ROMANS, key=len, reverse=True))
_LABEL = rf"(?:[A-Za-z]\d{{1,2}}(?!\d)|\d{{1,2}}(?!\d)|(?:{_ROMAN_ALT})(?![a-z])|[A-Za-z](?![a-z]))'?"
_SEP = r"\s*(?:,\s*and\s|,|&|\band\b|\bto\b|-)\s*"
_LIST = rf"{_LABEL}(?:{_SEP}{_LABEL})*"
_PANEL = r"(?:[Pp]anels?\s+)?"
# (A), [A], (A-C), (A, B), (panel B), (D, upper graph), (a; TF, TGd)
_PAREN = re.compile(rf"(?:\b{_PANEL})?[(\[]\s*{_PANEL}(?P<list>{_LIST})\s*(?:[)\]]|[,;]\s+[^()\[\]]*[)\]])")
# A) B) printed without the opening bracket
_CLOSE = re.compile(rf"(?<![\w(\['.-]){_PANEL}(?P<list>{_LIST})\)")
# A. A: A, b-d. "Panels A & B" at a clause start
_BARE = re.compile(rf"(?<![\w'.-])(?P<panel>[Pp]anels?\s+)?(?P<list>{_LIST})(?P<punct>\s*[.:,])?(?=\s)")
_TOKEN = re.compile(rf"({_LABEL})|({_SEP})")
_REFERENCE = re.compile(
    r"(?:\bas\s+(?:in|for)|\bsee(?:\s+also)?|\bcompared?(?:\s+(?:to|with))?|\bcf\.|\b(?:that|those)\s+in"
    r"|\bsame\s+as(?:\s+in)?|\bsimilar\s+to|\bFig(?:ure)?s?\.?(?:\s*S?\d+)?|\bTables?(?:\s*S?\d+)?)\s*$",
    re.IGNORECASE,
)
_CELSIUS = re.compile(r"(?:^|\s)[-+]?\d+(?:[.,]\d+)?\s*°?\s*$|°\s*$")
_CLAUSE_END = re.compile(r"[.;:!?]\s+")


def normalize_caption(text: str | None) -> str:
    """The caption every other function works on: NFC, one dash, one space, no invisible
    characters, so that "(A–C)" and "(A-C)" or "A\u00a0B" and "A B" are read the same way."""
    if not text:
        return ""
    text = unicodedata.normalize("NFC", str(text)).translate(_FOLD)
    return _SPACES.sub(" ", text).strip()


def _label_scheme(token: str) -> tuple[str, ...]:
    """The schemes a single label may belong to ("i" is both a letter and a Roman numeral)."""
    if re.fullmatch(r"[A-Za-z]\d+", token):
        return ("alnum",)
    if token.isdigit():
        return ("digit",)
    if token in ROMANS:
        return ("roman", "lower") if len(token) == 1 else ("roman",)
    return ("upper",) if token.isupper() else ("lower",)


def _index(token: str, scheme: str) -> int:
    """Position of a label in its scheme's sequence, so that runs and ranges can be computed."""
    if scheme == "upper" or scheme == "lower":
        return ord(token.lower()) - ord("a")
    if scheme == "digit":
        return int(token) - 1
    if scheme == "roman":
        return ROMANS.index(token)
    return (ord(token[0].lower()) - ord("a")) * 100 + int(token[1:]) - 1


def _label_at(index: int, scheme: str, like: str) -> str:
    """The label printed at ``index`` of a scheme (``like`` gives the case of an alnum label)."""
    if scheme == "upper":
        return chr(ord("A") + index)
    if scheme == "lower":
        return chr(ord("a") + index)
    if scheme == "digit":
        return str(index + 1)
    if scheme == "roman":
        return ROMANS[index]
    letter = chr(ord("a") + index // 100)
    return (letter.upper() if like[0].isupper() else letter) + str(index % 100 + 1)


def _expand(label_list: str, scheme: str) -> list[str]:
    """The labels of one marker in ``scheme``, ranges expanded: "A-C" and "A to C" are A, B, C."""
    labels: list[str] = []
    pending_range = False
    for label, sep in _TOKEN.findall(label_list):
        if sep:
            pending_range = sep.strip() in ("-", "to")
            continue
        label = label.rstrip("'")
        if scheme not in _label_scheme(label):
            pending_range = False
            continue
        if pending_range and labels and (scheme != "alnum" or labels[-1][0] == label[0]):
            start, stop = _index(labels[-1], scheme), _index(label, scheme)
            if 0 < stop - start <= 60:
                labels.extend(_label_at(i, scheme, label) for i in range(start + 1, stop + 1))
                pending_range = False
                continue
        labels.append(label)
        pending_range = False
    return list(dict.fromkeys(labels))


@dataclass(frozen=True)
class _Marker:
    """One place where the caption names panel labels."""

    start: int
    end: int
    label_list: str
    clause_start: bool  # a label printed before its text is printed at a clause start
    clause_end: bool  # a label printed after its text is followed by punctuation or "and"


def _is_clause_start(text: str, start: int) -> bool:
    before = text[:start].rstrip()
    return not before or before[-1] in ".;:!?"


def _is_clause_end(text: str, end: int) -> bool:
    after = text[end:]
    return not after.strip() or after[:1] in ".,;:" or bool(re.match(r"\s+(?:and|or)\b", after))


def _unmatched_close(text: str, close: int) -> bool:
    """True when the ")" at ``close`` closes no "(": the "A)" style, not the end of a remark."""
    return text[:close].count("(") <= text[:close].count(")")


def _candidates(text: str) -> list[_Marker]:
    """Every marker that may name panel labels, references and look-alikes left out."""
    found: dict[int, _Marker] = {}

    def add(start: int, end: int, label_list: str) -> None:
        before = text[:start]
        if _REFERENCE.search(before):
            return
        if label_list.strip("'") == "C" and _CELSIUS.search(before):
            return
        if start not in found:
            found[start] = _Marker(start, end, label_list, _is_clause_start(text, start), _is_clause_end(text, end))

    for m in _PAREN.finditer(text):
        add(m.start(), m.end(), m.group("list"))
    for m in _CLOSE.finditer(text):
        if not m.group("list").isdigit() and _unmatched_close(text, m.end() - 1):
            add(m.start(), m.end(), m.group("list"))
    for m in _BARE.finditer(text):
        following = text[m.end() :].lstrip()[:1]
        if not _is_clause_start(text, m.start()) or (following.islower() and not m.group("panel")):
            continue
        if m.group("punct") or (m.group("panel") and m.group("panel")[0] == "P"):
            add(m.start(), m.end(), m.group("list"))
    return sorted(found.values(), key=lambda marker: marker.start)


def _run(indices: Iterable[int]) -> tuple[list[int], int]:
    """The run of label positions from the first label, allowing one missing label between two
    found ones (a caption may skip a panel it does not describe); and how many are missing."""
    present = sorted(set(indices))
    if not present or present[0] != 0:
        return [], 0
    run = [0]
    for index in present[1:]:
        if index - run[-1] > 2:
            break
        run.append(index)
    return run, run[-1] + 1 - len(run)


def _scheme_runs(markers: list[_Marker]) -> dict[str, tuple[list[str], int]]:
    """For each scheme with at least two labels in a run: the labels in order, and gaps."""
    runs = {}
    for scheme in SCHEMES:
        by_index: dict[int, str] = {}
        for marker in markers:
            for label in _expand(marker.label_list, scheme):
                by_index.setdefault(_index(label, scheme), label)
        if scheme == "alnum":
            firsts = [i for i in by_index if i % 100 == 0]
            run = sorted(by_index) if 0 in firsts else []
            labels, missing = [by_index[i] for i in run], 0
        else:
            run, missing = _run(by_index)
            labels = [by_index[i] for i in run]
        if len(labels) >= 2:
            runs[scheme] = (labels, missing)
    return runs


def _choose_scheme(runs: dict[str, tuple[list[str], int]]) -> str:
    """The longest run wins; a tie between "lower" and "roman" goes to roman only when a
    multi-letter numeral (ii, iv) is in the run, since i, v and x are also letters."""

    def key(scheme: str) -> tuple[int, int]:
        labels = runs[scheme][0]
        bonus = 1 if scheme == "roman" and any(len(label) > 1 for label in labels) else 0
        return (len(labels), bonus)

    return max(runs, key=key)


def _definitions(
    markers: list[_Marker], labels: list[str], scheme: str, before: bool
) -> tuple[list[tuple[_Marker, list[str]]], bool]:
    """The marker that defines each label, with the labels it defines, in caption order; and
    whether the labels were defined out of order."""
    wanted = set(labels)
    naming = [(m, [x for x in _expand(m.label_list, scheme) if x in wanted]) for m in markers]
    naming = [(m, named) for m, named in naming if named]
    defined: set[str] = set()
    chosen: list[tuple[_Marker, list[str]]] = []
    position, out_of_order = 0, False
    for label in labels:
        if label in defined:
            continue
        options = [(m, n) for m, n in naming if m.start >= position and label in n]
        if not options:
            options, out_of_order = [(m, n) for m, n in naming if label in n], True
        starts = [option for option in options if option[0].clause_start] if before else []
        marker, named = (starts or options)[0]
        new = [x for x in named if x not in defined]
        defined.update(new)
        chosen.append((marker, new))
        position = max(position, marker.end)
    chosen.sort(key=lambda item: item[0].start)
    return chosen, out_of_order


def _drop_stray(definitions: list[tuple[_Marker, list[str]]], scheme: str) -> list[tuple[_Marker, list[str]]]:
    """Labels printed before their texts come in order: a mid-sentence marker found before an
    earlier label's definition ("carbon (C) atoms. (B) ...") is a word, not a label."""
    kept = []
    for i, (marker, labels) in enumerate(definitions):
        later = [_index(x, scheme) for _, named in definitions[i + 1 :] for x in named]
        if not marker.clause_start and later and min(later) < min(_index(x, scheme) for x in labels):
            continue
        kept.append((marker, labels))
    return kept if len({x for _, named in kept for x in named}) >= 2 else definitions


def _trim(text: str, start: int, end: int) -> str:
    """``text[start:end]`` without the punctuation and conjunctions left over at its edges."""
    piece = re.sub(r"^(?:and|or)\s+", "", text[start:end].lstrip(" ,;:.)]"))
    piece = re.sub(r"[\s,;]+(?:and|or)$", "", piece.rstrip(" ,;:("))
    return piece.rstrip(" ,;:(")


def _label_before(text: str, definitions: list[tuple[_Marker, list[str]]]) -> tuple[str, dict[str, str]]:
    """Texts that follow their label: each runs from its marker to the next defining marker."""
    preface = _trim(text, 0, definitions[0][0].start)
    panels: dict[str, str] = {}
    for i, (marker, labels) in enumerate(definitions):
        end = definitions[i + 1][0].start if i + 1 < len(definitions) else len(text)
        for label in labels:
            panels[label] = _trim(text, marker.end, end)
    return preface, panels


def _label_after(text: str, definitions: list[tuple[_Marker, list[str]]]) -> tuple[str, dict[str, str]]:
    """Texts that precede their label: the first starts at the sentence holding the first
    label, the others where the previous label's marker ends; text after the last is left out."""
    first = definitions[0][0].start
    ends = [m.end() for m in _CLAUSE_END.finditer(text, 0, first)]
    sentence = ends[-1] if ends else 0
    preface = _trim(text, 0, sentence)
    panels: dict[str, str] = {}
    previous = sentence
    for marker, labels in definitions:
        for label in labels:
            panels[label] = _trim(text, previous, marker.start)
        previous = marker.end
    return preface, panels


def _confidence(missing: int, out_of_order: bool, before: bool, rivals: int, loose: int) -> float:
    """1.0 for a clean run printed before its texts at clause starts; less for each doubt."""
    score = 1.0 - 0.1 * missing - 0.2 * out_of_order - 0.1 * (not before) - 0.1 * rivals - 0.05 * min(loose, 4)
    return round(min(1.0, max(0.05, score)), 2)


def split_caption(caption: str | None) -> CaptionSplit:
    """Split a figure caption by its printed panel labels (see the module docstring).

    A caption without a run of at least two labels is not split: scheme "none", no panels,
    the whole caption as preface and confidence 0.0 (nothing was split)."""
    text = normalize_caption(caption)
    markers = _candidates(text)
    runs = _scheme_runs(markers)
    if not runs:
        return CaptionSplit(preface=text, panels={}, scheme="none", confidence=0.0)
    scheme = _choose_scheme(runs)
    labels, missing = runs[scheme]
    first = [m for m in markers if labels[0] in _expand(m.label_list, scheme)]
    named = [m for m in markers if set(_expand(m.label_list, scheme)) & set(labels)]
    before = any(m.clause_start for m in first) or sum(m.clause_start for m in named) > sum(m.clause_end for m in named)
    definitions, out_of_order = _definitions(markers, labels, scheme, before)
    if before:
        definitions = _drop_stray(definitions, scheme)
    preface, panels = (_label_before if before else _label_after)(text, definitions)
    ordered = {label: panels[label] for label in labels if label in panels}
    loose = sum(not m.clause_start for m, _ in definitions[1:]) if before else 0
    rivals = sum(1 for other in runs if other != scheme and len(runs[other][0]) >= 2)
    confidence = _confidence(missing, out_of_order, before, rivals, loose)
    return CaptionSplit(preface=preface, panels=ordered, scheme=scheme, confidence=confidence)


def caption_agreement(cases: Iterable[dict]) -> dict:
    """How far the splitter agrees with hand-split captions, so that a rule change is measured.

    Each case has ``caption`` and ``labels`` (expected labels as printed), and optionally
    ``texts`` (label, or "preface", -> expected text). ``exact_label`` is the share of captions
    whose predicted label set equals the expected one; ``text`` the share of expected texts
    predicted exactly (after ``normalize_caption``), None when no case has texts."""
    captions = exact = texts = same_text = 0
    misses: list[str] = []
    for case in cases:
        split = split_caption(case["caption"])
        captions += 1
        if set(split.panels) == set(case["labels"]):
            exact += 1
        else:
            misses.append(str(case.get("id", captions - 1)))
        for label, expected in (case.get("texts") or {}).items():
            predicted = split.preface if label == "preface" else split.panels.get(label)
            texts += 1
            same_text += predicted == normalize_caption(expected)
    return {
        "captions": captions,
        "exact_label": exact / captions if captions else 0.0,
        "texts": texts,
        "text": same_text / texts if texts else None,
        "misses": misses,
    }
