"""Checks of a refined caption that do not trust the model.

A VLM asked to enrich a caption with its article's context will, now and then, invent a dose,
a gene or a disease, or drop a panel. These checks are lexical and deliberately strict: a
refinement passes only when every number and every entity-like term it states occurs in the
caption or the context it was given, and it keeps everything the caption had. A false
rejection costs a fallback to the original caption; a false acceptance poisons training data.

Entities are found by shape, not by a lexicon: acronyms ("SMA", "RT-PCR"), gene- or
protein-like tokens with mixed case or digits ("IL-6", "p53", "CD4+", "mRNA"), abbreviated
binomials ("Y. pestis"), drug-like words ("streptomycin", "imatinib") and capitalised words
inside a sentence ("Parkinson"). Lowercase common words are not entities; a capitalised word
that opens a sentence or follows a panel label is only checked when its shape says entity.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from pipelines.longcap.tokens import TextTokenizer, split_sentences
from pipelines.text.captions import normalize_caption, split_caption

UNITS = (
    "%",
    "°C",
    "°F",
    "°",
    "mmHg",
    "kDa",
    "Da",
    "bp",
    "kb",
    "Mb",
    "nt",
    "aa",
    "nm",
    "μm",
    "mm",
    "cm",
    "km",
    "m",
    "ha",
    "pl",
    "nl",
    "μl",
    "ml",
    "dl",
    "l",
    "pL",
    "nL",
    "μL",
    "mL",
    "dL",
    "L",
    "pg",
    "ng",
    "μg",
    "mg",
    "kg",
    "g",
    "pM",
    "nM",
    "μM",
    "mM",
    "M",
    "mol",
    "mmol",
    "μmol",
    "nmol",
    "IU",
    "U",
    "ms",
    "s",
    "sec",
    "min",
    "h",
    "hr",
    "hrs",
    "hours",
    "d",
    "days",
    "weeks",
    "wk",
    "months",
    "years",
    "yr",
    "Hz",
    "kHz",
    "MHz",
    "mV",
    "V",
    "Gy",
    "rpm",
    "x",
    "×",
    "fold",
    "kV",
    "W",
    "mW",
    "J",
    "Pa",
    "kPa",
    "ppm",
    "um",
    "ul",
    "uL",
    "ug",
    "uM",
    "umol",
)
_UNIT = "|".join(re.escape(u) for u in sorted(UNITS, key=len, reverse=True))
_PER = r"(?:/(?:[a-zA-Zμ]{1,4}))*"
# A number (sign only when not hyphenated to a word: "IL-6" has no number), thousands commas,
# decimals; then an optional unit from the list with an optional "/unit" tail.
_NUMBER = re.compile(
    rf"(?:(?<![\w.])[-+])?(?<![\w.])(?<![A-Za-z]-)(?P<num>\d{{1,3}}(?:,\d{{3}})+(?![\d,])|\d+(?:\.\d+)?)"
    rf"(?:\s?(?P<unit>(?:{_UNIT}){_PER})(?![A-Za-z]))?"
)
_U_PREFIX = re.compile(r"^u(?=[mlLgM]|mol)")

# Capitalised words that are not entities even inside a sentence.
_NOT_ENTITIES = frozenset(
    """figure figures fig figs panel panels table tables supplementary supplemental methods results
    discussion left right top bottom upper lower inset insets scale bar""".split()
)
_DRUG_SUFFIXES = (
    "mab",
    "nib",
    "vir",
    "cillin",
    "mycin",
    "micin",
    "azole",
    "statin",
    "pril",
    "sartan",
    "olol",
    "dipine",
    "oxacin",
    "cycline",
    "platin",
    "taxel",
    "parin",
    "rubicin",
    "phenicol",
    "formin",
    "xifen",
    "caine",
    "tidine",
    "semide",
    "gliptin",
    "glitazone",
    "dronate",
    "lukast",
    "triptan",
)
_TOKEN = re.compile(r"[A-Za-zα-ωΑ-Ω0-9][\w'+\-/αβγδκ]*[\w+]|[A-Za-z]")
_PANEL_LABEL = re.compile(
    r"^[(\[]?\s*(?:[A-Za-z]|\d{1,2}|[ivx]{1,4})(?:\s*[-,]\s*[A-Za-z0-9]+)*\s*[)\]]\s*|^[A-Z][.:]\s"
)
_BINOMIAL = re.compile(r"\b([A-Z])\.\s?([a-z]{3,})\b")
_UNIT_TOKEN = re.compile(rf"^(?:\d[\d.,]*)?(?:{_UNIT}){_PER}$")


def fold(text: str | None) -> str:
    """Text for comparison: compatibility forms (NFKC: micro sign and Greek mu are one, the
    Celsius sign is "°C"), then the caption normalisation (one dash, one space)."""
    text = unicodedata.normalize("NFKC", (text or "").replace("º", "°").replace("˚", "°"))
    return normalize_caption(text)


def numbers(text: str) -> list[tuple[str, str]]:
    """``(number, unit)`` pairs, normalised: "5 mg/kg" and "5mg/kg" are ("5", "mg/kg"), "1,839"
    is "1839", "um" is "μm"; unit "" for a bare number."""
    found = []
    for match in _NUMBER.finditer(fold(text)):
        sign = match.group()[0] if match.group()[0] in "+-" else ""
        number = sign + match.group("num").replace(",", "") if "," in match.group("num") else sign + match.group("num")
        unit = _U_PREFIX.sub("μ", match.group("unit") or "")
        found.append((number, unit))
    return found


def _norm(token: str) -> str:
    """Entity comparison: case, hyphens, possessive and a plural "s" ignored."""
    token = token.lower().replace("-", "")
    token = re.sub(r"'s$", "", token)
    if len(token) > 3 and token.endswith("s") and not token.endswith("ss"):
        token = token[:-1]
    return token


def _vocabulary(text: str) -> set[str]:
    """Normalised tokens of the sources, whole and split at hyphens and slashes."""
    vocabulary = set()
    for token in _TOKEN.findall(fold(text)):
        vocabulary.add(_norm(token))
        vocabulary.update(_norm(part) for part in re.split(r"[-/]", token) if part)
    return vocabulary


def _shaped_like_entity(token: str) -> bool:
    """Acronym, mixed case, letters with digits, or a drug-like word."""
    letters = [c for c in token if c.isalpha()]
    if len(letters) < 1 or _UNIT_TOKEN.match(token) or re.fullmatch(r"\d+[A-Za-z]?|\d+(?:st|nd|rd|th)", token):
        return False
    has_digit = any(c.isdigit() for c in token)
    uppers = sum(c.isupper() for c in letters)
    if has_digit and len(letters) >= 1 and not re.fullmatch(r"[\d.,]+[A-Za-z]", token):
        return True
    if uppers >= 2:
        return True
    if uppers == 1 and not token[0].isupper():  # mRNA-like: "mRNA", "sdhC", "iPSC"
        return True
    lower = token.lower()
    return len(lower) > 6 and lower.endswith(_DRUG_SUFFIXES)


def entities(text: str) -> list[str]:
    """Entity-like terms of ``text`` (see the module docstring), in order, without repeats."""
    found: list[str] = []
    for sentence in split_sentences(fold(text)):
        body = _PANEL_LABEL.sub("", sentence)
        found.extend(f"{g}. {s}" for g, s in _BINOMIAL.findall(body))
        for i, match in enumerate(_TOKEN.finditer(body)):
            token = re.sub(r"'s$", "", match.group())
            if len(token) < 2 or token.lower() in _NOT_ENTITIES:
                continue
            if _shaped_like_entity(token) or (i > 0 and token[0].isupper() and not _is_initial(body, match)):
                found.append(token)
    return list(dict.fromkeys(found))


def _is_initial(body: str, match: re.Match) -> bool:
    return body[match.end() : match.end() + 1] == "." and len(match.group()) == 1


def _entity_in(entity: str, vocabulary: set[str], sources: str) -> bool:
    binomial = _BINOMIAL.fullmatch(entity)
    if binomial:
        genus, species = binomial.groups()
        pattern = rf"\b{genus}(?:[a-z]+|\.)\s?{species}\b"
        return re.search(pattern, sources) is not None
    if _norm(entity) in vocabulary:
        return True
    parts = [p for p in re.split(r"[-/]", entity) if p]
    return len(parts) > 1 and all(_norm(p) in vocabulary or not _shaped_like_entity(p) for p in parts)


def _length(text: str, tokenizer: TextTokenizer | None) -> int:
    return tokenizer.count(text) if tokenizer else len(fold(text))


def check_refinement(
    original: str,
    refined: str,
    context: str,
    budget: int | None = None,
    tokenizer: TextTokenizer | None = None,
) -> list[str]:
    """Why ``refined`` must not replace ``original`` (empty: it passes).

    ``context`` is the text the model was given; ``budget`` is in ``tokenizer``'s tokens
    (required with a budget). Lengths are compared in those tokens, else in characters.
    """
    if budget is not None and tokenizer is None:
        raise ValueError("a budget needs the tokenizer it is counted in")
    if not fold(refined):
        return ["empty refinement"]
    sources = fold(f"{original}\n{context}")
    reasons = _number_failures(refined, sources)
    vocabulary = _vocabulary(sources)
    reasons += [f"entity not in sources: {e}" for e in entities(refined) if not _entity_in(e, vocabulary, sources)]
    reasons += _kept_failures(original, refined)
    before, after = _length(original, tokenizer), _length(refined, tokenizer)
    if after < before:
        reasons.append(f"shorter than the caption: {after} < {before}")
    if budget is not None and after > budget:
        reasons.append(f"over budget: {after} > {budget} tokens")
    return reasons


def _show(number: str, unit: str) -> str:
    return f"{number} {unit}" if unit and unit not in ("%", "°", "×") else number + unit


def _number_failures(refined: str, sources: str) -> list[str]:
    """A number with a unit must occur with that unit; a bare number must occur at all."""
    with_units = set(numbers(sources))
    bare = {n for n, _ in with_units}
    reasons = []
    for number, unit in dict.fromkeys(numbers(refined)):
        ok = (number, unit) in with_units if unit else number in bare
        if not ok:
            reasons.append(f"number not in sources: {_show(number, unit)}")
    return reasons


def _kept_failures(original: str, refined: str) -> list[str]:
    """Every number and panel label of the caption must survive the refinement."""
    kept_numbers = {n for n, _ in numbers(refined)}
    reasons = [
        f"caption number dropped: {n}" for n in dict.fromkeys(n for n, _ in numbers(original)) if n not in kept_numbers
    ]
    labels = split_caption(fold(original)).panels
    refined_labels = split_caption(fold(refined)).panels
    reasons += [
        f"panel label dropped: {label}"
        for label in labels
        if label not in refined_labels and not _names(refined, label)
    ]
    return reasons


def _names(text: str, label: str) -> bool:
    """Whether ``text`` still shows panel ``label``: "(A)", "(A, B)", "[A-C]", "panel A"."""
    label = re.escape(label)
    in_brackets = rf"[(\[][^()\[\]]*?(?<![\w])(?:[Pp]anels?\s+)?{label}(?![\w])[^()\[\]]*?[)\]]"
    return re.search(rf"{in_brackets}|\b[Pp]anels?\s+{label}\b", fold(text)) is not None


# A sentence of the refinement carries a caption sentence when it holds at least this share of
# that sentence's words: the model may expand an acronym or reorder a clause, but the claim stays.
CARRIES = 0.8
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Fit:
    """What a long caption ships as once fitted to the token budget.

    ``refined``: the text is (a part of) the refinement, else the original caption; ``cut``: added
    context was dropped to fit; ``note``: why the text is not the whole refinement within budget
    (the refinement dropped, or the caption alone over budget), recorded with the row."""

    text: str
    refined: bool
    cut: bool = False
    note: str | None = None


def _words(text: str) -> set[str]:
    return set(_WORD.findall(fold(text).lower()))


def _carries_caption(sentence: str, caption_words: list[set[str]]) -> bool:
    words = _words(sentence)
    return any(len(c & words) >= CARRIES * len(c) for c in caption_words if c)


def fit_long_caption(caption: str, refined: str | None, tokenizer: TextTokenizer, budget: int) -> Fit:
    """The long caption within ``budget`` tokens, never shorter than ``caption`` (LongCAP's budget
    is for the context a caption gains, not a licence to truncate the caption).

    A refinement over budget loses its added sentences, last first (the prompt asks for the
    caption's facts, then the context's), and keeps every sentence that carries one of the
    caption's; what remains must still keep the caption's numbers and panel labels and be at
    least as long as the caption, else the caption ships instead. The caption alone over
    budget ships whole, and the note says so (an encoder with a shorter window truncates it
    itself; the dataset keeps the claim whole)."""
    caption = normalize_caption(caption)
    before = tokenizer.count(caption)
    over = f"the caption alone is {before} tokens, over the {budget}-token budget: shipped whole"
    if refined is None:
        return Fit(caption, False, note=over if before > budget else None)
    refined = normalize_caption(refined)
    if tokenizer.fits(refined, budget):
        return Fit(refined, True)
    if before > budget:
        return Fit(caption, False, note=f"{over}, without the refinement's context")
    caption_words = [_words(s) for s in split_sentences(caption)]
    kept = split_sentences(refined)
    for i in reversed(range(len(kept))):
        if tokenizer.fits(" ".join(kept), budget):
            break
        if not _carries_caption(kept[i], caption_words):
            del kept[i]
    text = " ".join(kept)
    if tokenizer.fits(text, budget) and not _kept_failures(caption, text) and tokenizer.count(text) >= before:
        return Fit(text, True, cut=True)
    return Fit(
        caption,
        False,
        note=f"the refinement is {tokenizer.count(refined)} tokens, over the {budget}-token budget, and its "
        "added context cannot be cut without cutting the caption",
    )
