"""Abbreviations an article defines, found deterministically, so a long caption never guesses them.

``find_definitions`` is our implementation of Schwartz & Hearst (2003), "A simple algorithm for
identifying abbreviation definitions in biomedical text" (PSB 2003). The PyPI package
``abbreviations`` (0.2.5, last release 2019) implements it too; it is unmaintained, so the
algorithm is written here, following the paper and its reference Java code:

1. Candidates are parenthesised pairs, ``long form (SF)``, or ``SF (long form)`` when the text in
   the parentheses has more than two words or is longer than the text before it. In parentheses
   only the part before the first ``", "`` or ``"; "`` is the short form: ``(FBl1, FBl3, ...)``.
2. A short form has 2 to 10 characters, at most two words, a letter, and an alphanumeric first
   character.
3. The long form is searched in the words just before the parenthesis, at most
   ``min(|SF| + 5, 2 |SF|)`` of them (|SF| counts the short form's letters and digits).
4. ``_best_long_form``: each letter and digit of the short form, right to left, must be found
   in the long form, right to left; the first one must start a word. The long form starts at the
   word holding that first character. It is rejected when it is shorter than the short form,
   contains it as a word, ends with it, or has more words (split on spaces and hyphens) than
   the window allows.

Deviations, all for precision on PMC full text (each is tested):

* the long form stays in its clause and its sentence: the search window stops at a sentence end,
  a newline, ``", "``, ``"; "``, ``": "``, an enclosing ``(`` and a previous ``)`` followed by a
  non-word character (the Java code also restarts after each parenthesis). So
  ``BXD, C57BL/6J (B6)`` defines nothing, and in ``(excluding medial temporal lobe (MTL) areas)``
  the inner pair is found;
* a parenthesis glued to a lowercase word is a candidate (``ellipsoid body(EB)``, a frequent
  typesetting slip); glued to a capital or a digit it is not (``AKT1(K179M)``, ``STAT1(Y701)``);
* parentheses that hold references, statistics, quantities or lists are never candidates:
  ``(Fig. 2)``, ``(Table 1)``, ``(Avants et al., 2008)``, ``(n = 5)``, ``(p < 0.05)``, ``(30 nM)``,
  ``(EBa, EBoc, EBop)``; ``[`` and ``]`` bound a long form like a clause separator;
* each word of a short form has a capital or a digit (``(in fact, ...)`` is not one);
* the long form may not contain the short form as a word, case-insensitively (the paper: followed
  by a space): ``ErbB2 (forming an ErbB1/ErbB2/EphrinB1 complex)``; in ``SF (long form)`` the long
  form is the whole parenthesis, not a tail of it;
* a short form that reads as a word (``Tet``, ``Halo``, ``Pierce``) is a clipping: two words at
  most (``(Pierce, Rockford, IL)`` after an 11-word method sentence is not a definition);
* quotes around a long form are dropped (``'Filter-Assisted Sample Preparation' (FASP)``).

Known limits of the algorithm, kept: the shortest matching long form wins, so ``gnathal ganglia
(GNG)`` gives ``ganglia`` and ``central complex (CX)`` gives ``complex``; a plural SF after its
long form, ``CVs (coefficients of variation)``, is not matched.

Conflicts: an article sometimes defines one short form twice. The long form defined most often
wins (compared case-, space- and hyphen-insensitively); on a tie the first one. The kept
:class:`Definition` is the first occurrence of the winning long form, so its offsets point to text
the reader can check.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from dataclasses import dataclass

_HYPHENS = r"\-\u2010\u2011\u2012\u2013\u2014\u2015\u2212"
_WORD_SPLIT = re.compile(rf"[\s{_HYPHENS}]+")
# Where a long form may not reach back across: a sentence end, a line break, a clause separator.
_BOUNDARY = re.compile(r"[.!?]\s+(?=[A-Z0-9\"'(\[])|\n|[,;:]\s|[\[\]]")
_NOT_SHORT_FORM = re.compile(
    r"\bet al\b|^(?:figs?|figures?|tables?|tabs?|eqs?|equations?|refs?|suppl\w*|supporting|see|cf|e\.g|i\.e)\b"
    r"|[=<>±≤≥]|^\d+(?:[.,]\d+)?\s",
    re.IGNORECASE,
)
# A short form that reads as a word (Tet, Halo, Pierce) is a clipping, never a many-word initialism.
_WORDLIKE = re.compile(r"^[A-Z][a-z]+$")
_MAX_LOOKBACK = 400
_QUOTES = "\"'\u2018\u2019\u201c\u201d"  # characters; the widest window is 15 words


@dataclass(frozen=True)
class Definition:
    """One abbreviation defined in a text: ``long`` sits at ``text[start:end]``."""

    short: str
    long: str
    start: int
    end: int


def _alnum_count(short: str) -> int:
    return sum(ch.isalnum() for ch in short)


def _is_valid_short_form(short: str) -> bool:
    """The paper's rules, plus: no brackets inside, a capital or a digit in each word (``wt``,
    ``in fact``, ``the HNS`` are words; :func:`used_acronyms` never treats an all-lowercase token
    as an abbreviation either), and not a reference or a quantity."""
    if not 2 <= len(short) <= 10 or len(short.split()) > 2:
        return False
    if not short[0].isalnum() or not any(ch.isalpha() for ch in short) or any(ch in "()[]" for ch in short):
        return False
    if not all(any(ch.isupper() or ch.isdigit() for ch in word) for word in short.split()):
        return False
    return not _NOT_SHORT_FORM.search(short)


def _best_long_form(short: str, long: str) -> int | None:
    """Index in ``long`` where the long form of ``short`` starts, or None (Schwartz & Hearst's
    right-to-left match: every letter and digit of ``short`` in order, the first at a word start)."""
    s_index, l_index = len(short) - 1, len(long) - 1
    while s_index >= 0:
        ch = short[s_index].lower()
        if not ch.isalnum():
            s_index -= 1
            continue
        while l_index >= 0 and (
            long[l_index].lower() != ch or (s_index == 0 and l_index > 0 and long[l_index - 1].isalnum())
        ):
            l_index -= 1
        if l_index < 0:
            return None
        l_index -= 1
        s_index -= 1
    return max(long.rfind(" ", 0, l_index + 1), long.rfind("\n", 0, l_index + 1)) + 1


def _window(short: str) -> int:
    n = _alnum_count(short)
    return min(n + 5, n * 2)


def _accept(short: str, long: str) -> bool:
    """The paper's checks on a matched long form. Its "contains the short form followed by a
    space" is widened to "contains it as a word" (``ErbB1/ErbB2/EphrinB1 complex`` for ErbB2)."""
    words = [w for w in _WORD_SPLIT.split(long) if w]
    if len(long) < len(short) or long.endswith(short):
        return False
    if re.search(rf"(?<![\w{_HYPHENS}]){re.escape(short)}(?![\w{_HYPHENS}])", long, re.IGNORECASE):
        return False
    if _WORDLIKE.match(short) and len(words) > 2:
        return False
    return len(words) <= _window(short) and _alnum_count(short) <= 10


def _match(short: str, region: str, region_start: int) -> Definition | None:
    """Best long form of ``short`` at the end of ``region`` (which starts at ``region_start``)."""
    trimmed = region.rstrip()
    words = list(re.finditer(r"\S+", trimmed))[-_window(short) :]
    if not words:
        return None
    offset = words[0].start()
    tail = trimmed[offset:]
    index = _best_long_form(short, tail)
    if index is None:
        return None
    while index < len(tail) and tail[index] in _QUOTES:  # ‘Filter-Assisted Sample Preparation’
        index += 1
    long = tail[index:].rstrip(_QUOTES)
    if not long or not _accept(short, long):
        return None
    start = region_start + offset + index
    return Definition(short=short, long=long, start=start, end=start + len(long))


def _short_part(inner: str) -> str:
    """Text in the parentheses up to the first ", " or "; " (``(FBl1, FBl3, and FBl7)``)."""
    for sep in (", ", "; "):
        if sep in inner:
            inner = inner[: inner.index(sep)]
    return inner.strip()


def _candidate(text: str, open_at: int, close_at: int, region_start: int) -> Definition | None:
    """The definition one parenthesis pair makes, if any; ``region_start`` bounds the long form."""
    region = text[region_start:open_at]
    inner = text[open_at + 1 : close_at]
    short = _short_part(inner)
    if not short or not region.strip() or inner.count(", ") >= 2:  # a list: (EBa, EBoc, EBop)
        return None
    if len(short.split()) > 2 or len(short) > len(region.strip()):
        # "SF (long form)": the short form is the word before the parenthesis, the long form a
        # tail of the text in the parentheses (up to its first ", " or "; ").
        before = region.split()
        word = before[-1].rstrip(",;:") if before else ""
        if not any(ch.isupper() for ch in word) or not _is_valid_short_form(word):
            return None
        if any(ch in "()" for ch in short) or _NOT_SHORT_FORM.search(short):
            return None
        at = open_at + 1 + inner.index(short)
        found = _match(word, short, at)
        return found if found is not None and found.start == at else None
    if not _is_valid_short_form(short):
        return None
    return _match(short, region, region_start)


def _region_start(text: str, open_at: int, floor: int) -> int:
    """Start of the clause a long form before ``open_at`` must stay in."""
    lo = max(floor, open_at - _MAX_LOOKBACK)
    start = lo
    for m in _BOUNDARY.finditer(text, lo, open_at):
        start = m.end()
    return start


def _opens_candidate(text: str, i: int) -> bool:
    """A "(" after white space or a lowercase letter (``body(EB)``); not ``AKT1(K179M)``."""
    return i == 0 or text[i - 1].isspace() or text[i - 1].islower() or text[i - 1] in "\"'"


def _pairs(text: str) -> list[tuple[int, int, int]]:
    """(open, close, floor) for each matched parenthesis pair, in order of closing; ``floor`` is
    the first character after the enclosing "(" or a previous closed group."""
    stack: list[int] = []
    closes: list[int] = []  # ")" followed by a non-word character: a group that ended
    out = []
    for i, ch in enumerate(text):
        if ch == "(":
            stack.append(i)
        elif ch == ")":
            if not stack:
                closes.append(i)
                continue
            open_at = stack.pop()
            floor = stack[-1] + 1 if stack else 0
            k = bisect.bisect_left(closes, open_at)
            if k:
                floor = max(floor, closes[k - 1] + 1)
            out.append((open_at, i, floor))
            if i + 1 >= len(text) or not (text[i + 1].isalnum() or text[i + 1] == "_"):
                closes.append(i)
    return out


def _norm(long: str) -> str:
    return " ".join(_WORD_SPLIT.split(long.lower())).strip()


def find_definitions(text: str) -> dict[str, Definition]:
    """Abbreviations defined in ``text``: short form (as written) -> its :class:`Definition`.

    Keyed case-sensitively (``ROIs`` and ``ROI`` are different keys; :func:`used_acronyms` knows
    plurals). When a short form is defined with different long forms, the most frequent wins.
    """
    found: dict[str, list[Definition]] = {}
    for open_at, close_at, floor in _pairs(text):
        if not _opens_candidate(text, open_at):
            continue
        definition = _candidate(text, open_at, close_at, _region_start(text, open_at, floor))
        if definition is not None:
            found.setdefault(definition.short, []).append(definition)
    out: dict[str, Definition] = {}
    for short, defs in sorted(found.items(), key=lambda kv: min(d.start for d in kv[1])):
        defs.sort(key=lambda d: d.start)
        counts = Counter(_norm(d.long) for d in defs)
        best = max(counts.values())
        out[short] = next(d for d in defs if counts[_norm(d.long)] == best)
    return out


# ---- acronyms in a caption ---------------------------------------------------------------------
_UNITS = frozenset(
    "mg ml mL µl µL μl μL nl nL dl dL kg g ng pg µg μg l L mM µM μM nM pM fM M mol mmol nmol µmol μmol "
    "kDa Da kD kb bp nt Mb Gb Hz kHz MHz GHz ms µs μs ns min h hr hrs s sec mV µV μV kV V mA µA μA nA pA "
    "mW W kW mm cm µm μm nm km Å rpm RPM OD CFU cfu IU U kPa Pa MPa mmHg dB ppm ppb °C psi Gy cGy Sv "
    "MBq GBq kBq Bq Ci mCi µCi MOI".split()
)
_ROMAN = re.compile(r"^(?:X{0,3})(?:IX|IV|V?I{0,3})$")
_TOKEN = re.compile(rf"(?<![\w{_HYPHENS}])[^\W_][\w{_HYPHENS}]*(?<![{_HYPHENS}])")
_GLOSSARY = re.compile(r"(?:^|[.;:]\s+)([^\W_][\w\-/]{0,9}),\s+\S")


def _is_acronym_like(token: str) -> bool:
    """Two capitals at least (``PCR``, ``mRNA``, ``ROIs``, ``IL-6``, ``5-HT``); not a unit, a Roman
    numeral, a panel label or a number. One capital is not enough: ``Fig``, ``Ca``, ``T0``."""
    if not 2 <= len(token) <= 10 or token in _UNITS:
        return False
    if _ROMAN.match(token):
        return False
    return sum(ch.isupper() for ch in token) >= 2


def _tokens(caption: str) -> list[tuple[str, bool]]:
    """Word-like tokens, each with whether it may be listed as undefined. A hyphenated word whose
    sides are both words (``FLAG-KSRP``) is also split, and then only its parts may be listed;
    one with a number on a side (``IL-6``, ``5-HT``) stays whole."""
    out: list[tuple[str, bool]] = []
    for m in _TOKEN.finditer(caption):
        token = m.group()
        parts = re.split(rf"[{_HYPHENS}]", token)
        compound = len(parts) > 1 and all(sum(ch.isalpha() for ch in p) >= 2 for p in parts)
        out.append((token, not compound))
        if compound:
            out.extend((p, True) for p in parts)
    return out


def _lookup(token: str, definitions: dict[str, Definition]) -> Definition | None:
    """The definition of ``token``, allowing a plural "s" on either side (``ROI``/``ROIs``)."""
    if token in definitions:
        return definitions[token]
    if token.endswith("s") and token[:-1] in definitions and len(token) > 2:
        return definitions[token[:-1]]
    return definitions.get(token + "s") if not token.endswith("s") else None


def defined_in_caption(caption: str) -> set[str]:
    """Short forms a caption defines itself: ``knockout (KO)``, and glossary entries when there
    are two or more (``BXD, C57BL/6J ...; MA, methamphetamine``); a long caption must not define
    them again."""
    shorts = set(find_definitions(caption))
    glossary = {m.group(1) for m in _GLOSSARY.finditer(caption) if _is_acronym_like(m.group(1))}
    if len(glossary) >= 2:
        shorts |= glossary
    return shorts


def used_acronyms(caption: str, definitions: dict[str, Definition]) -> tuple[dict[str, str], list[str]]:
    """Acronyms of ``caption`` the article defines (short as written in the caption -> long form),
    and acronym-like tokens it does not define: the only ones the model may expand (and mark).

    A token counts as defined if the article defines it, whatever its shape (``Tet``, ``BafA``),
    as long as it has a capital or a digit: a plain lowercase word is never an abbreviation here.
    Tokens the caption defines itself are in neither list when the article does not define them.
    Both are in caption order, without repeats.
    """
    defined: dict[str, str] = {}
    undefined: list[str] = []
    own = defined_in_caption(caption)
    for token, listable in _tokens(caption):
        if token in defined or token in undefined:
            continue
        definition = _lookup(token, definitions)
        if definition is not None and any(ch.isupper() or ch.isdigit() for ch in token):
            defined[token] = definition.long
        elif listable and token not in own and _is_acronym_like(token):
            undefined.append(token)
    return defined, undefined


def expand_inline(caption: str, expansions: dict[str, str]) -> str:
    """``long form (SF)`` at the first occurrence of each SF; the rest of the caption unchanged.

    The SF is matched as a whole word (``IL-6`` not inside ``IL-6R``, ``KO`` not in ``FIP200-KO``
    nor ``KOs``). A SF the caption already defines (:func:`defined_in_caption`) or already shows
    alone in parentheses, ``(SF)``, is left alone, so a definition is never doubled.
    """
    own = defined_in_caption(caption)
    edits: list[tuple[int, int, str]] = []
    for short, long in expansions.items():
        if not short or not long or short in own or f"({short})" in caption:
            continue
        pattern = rf"(?<![\w{_HYPHENS}]){re.escape(short)}(?!\w)(?![{_HYPHENS}]\w)"
        m = re.search(pattern, caption)
        if m is not None:
            edits.append((m.start(), m.end(), f"{long} ({short})"))
    out, last = caption, len(caption) + 1
    for start, end, new in sorted(edits, reverse=True):
        if end <= last:  # two short forms never overlap as whole words; keep the later one if they do
            out, last = out[:start] + new + out[end:], start
    return out
