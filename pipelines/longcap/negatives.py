"""Hard-negative captions for region pairs: the region's text with exactly one attribute changed.

RegionMed-CLIP (shared/papers/002, "Text Encoding and Multi-Level Annotations" and "ROI Processor:
Region Alignment and Hard Negative Mining") trains its ROI processor with, for every region
caption, several negative captions made "by perturbing relevant terms in the region captions",
"subtly modifying clinical terms" so that the negative is clinically similar yet false; its
Appendix B ("Negative Sample Generation") has Qwen2.5-VL-72B write five alternative shape or
appearance adjectives, "systematically varying texture, color, shape, or location". We do the same
on caption clauses anchored to arrows and on VLM region descriptions, with two differences:

* rules come first (a lexicon of opposite values, per attribute), the VLM is an option; every
  negative says which attribute it changes (laterality, location, count, colour, stain, modality,
  size), so a trainer can weigh or ablate the kinds;
* a negative must never be a true statement about the region, because a true "negative" teaches
  the model to push the right text away. :func:`is_contradiction` is the one gate, for rule and
  VLM negatives alike: the negative must claim a value of the attribute that the positive does
  not claim (so "left and right ventricles" cannot become "right and right ventricles"), must not
  change any other attribute, and must keep the rest of the sentence.

Matching is by whole words (never "bright" -> "bwrong"), case is kept ("Left" -> "Right"), and
phrases where a word is not the attribute ("white matter", "Congo red", "if left unchanged",
"lower than", "small intestine") are protected. A lexicon cannot read every sentence, so it errs
towards making no negative: an unrecognised value is unverifiable and rejected.
"""

from __future__ import annotations

import difflib
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipelines.core.fingerprints import fingerprint
from pipelines.text.captions import normalize_caption
from pipelines.vlm.engine import VlmEngine
from pipelines.vlm.grounding import parse_json
from pipelines.vlm.metering import MeteredEngine
from pipelines.vlm.prompt import Prompt

LATERALITY, LOCATION, COUNT, COLOUR, STAIN, MODALITY, SIZE = (
    "laterality",
    "location",
    "count",
    "colour",
    "stain",
    "modality",
    "size",
)
KINDS = (LATERALITY, LOCATION, COUNT, COLOUR, STAIN, MODALITY, SIZE)
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


# --- the lexicon ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Term:
    """A surface form of an attribute value. ``value``: equal values make the same claim
    ("superior" and "upper"), so swapping one for the other is no negative. ``swaps``: what the
    rules may rewrite it into (empty: recognised, never rewritten, e.g. "reduced", which mostly
    means less of something rather than smaller). A surface with an upper-case letter is matched
    case-sensitively and written as listed ("CT", "H&E"); a lower-case one matches any case."""

    surface: str
    kind: str
    value: str
    swaps: tuple[str, ...] = ()


def _axis(kind: str, poles: tuple[str, str], pairs: Sequence[tuple[str, str]], also=((), ())) -> list[_Term]:
    """Two opposite values and the word pairs that swap between them (both ways)."""
    terms = []
    for a, b in pairs:
        terms += [_Term(a, kind, poles[0], (b,)), _Term(b, kind, poles[1], (a,))]
    for pole, extra in zip(poles, also, strict=True):
        terms += [_Term(s, kind, pole) for s in extra]
    return terms


def _colours() -> list[_Term]:
    """Colours are many-valued: each swaps into contrasting colours, chosen by the seed.
    Channel colours first (red/green/blue/magenta are the usual fluorescence channels; brown and
    blue are DAB and haematoxylin in immunohistochemistry)."""
    swaps = {
        "red": ("green", "blue"),
        "green": ("red", "magenta"),
        "blue": ("red", "green"),
        "yellow": ("blue", "red"),
        "magenta": ("green", "cyan"),
        "cyan": ("red", "magenta"),
        "orange": ("blue", "green"),
        "purple": ("green", "yellow"),
        "brown": ("blue",),
        "black": ("white",),
        "white": ("black",),
        "pink": ("blue",),
    }
    terms = [_Term(c, COLOUR, c, s) for c, s in swaps.items()]
    return terms + [_Term("grey", COLOUR, "grey", ("red",)), _Term("gray", COLOUR, "grey", ("red",))]


_SWAPPED_TERMS: list[_Term] = [
    *_axis(LATERALITY, ("left", "right"), [("left", "right")]),
    *_axis(LATERALITY, ("ipsilateral", "contralateral"), [("ipsilateral", "contralateral")]),
    *_axis(LATERALITY, ("unilateral", "bilateral"), [("unilateral", "bilateral")]),
    *_axis(
        LOCATION,
        ("superior", "inferior"),
        [("superior", "inferior"), ("upper", "lower")],
        also=(("above", "top", "cranial"), ("below", "bottom")),
    ),
    *_axis(LOCATION, ("anterior", "posterior"), [("anterior", "posterior")]),
    *_axis(LOCATION, ("medial", "lateral"), [("medial", "lateral")]),
    *_axis(LOCATION, ("proximal", "distal"), [("proximal", "distal")]),
    *_axis(LOCATION, ("apical", "basal"), [("apical", "basal")]),
    *_axis(LOCATION, ("dorsal", "ventral"), [("dorsal", "ventral")]),
    *_axis(LOCATION, ("rostral", "caudal"), [("rostral", "caudal")]),
    *_axis(LOCATION, ("cortex", "medulla"), [("cortex", "medulla"), ("cortical", "medullary")]),
    *_axis(LOCATION, ("central", "peripheral"), [("central", "peripheral")]),
    *_axis(LOCATION, ("inner", "outer"), [("inner", "outer")]),
    *_axis(LOCATION, ("superficial", "deep"), [("superficial", "deep")]),
    *_colours(),
    *_axis(
        STAIN,
        ("H&E", "trichrome"),
        [("H&E", "Masson's trichrome"), ("hematoxylin and eosin", "Masson's trichrome")],
        also=(("haematoxylin and eosin", "HE staining"), ("Masson trichrome", "trichrome")),
    ),
    *_axis(STAIN, ("DAPI", "phalloidin"), [("DAPI", "phalloidin")]),
    *_axis(STAIN, ("PAS", "Alcian blue"), [("PAS", "Alcian blue")]),
    *_axis(STAIN, ("positive", "negative"), [("positive", "negative"), ("immunopositive", "immunonegative")]),
    *_axis(
        MODALITY,
        ("CT", "MRI"),
        [("CT", "MRI"), ("computed tomography", "magnetic resonance imaging")],
        also=((), ("MR imaging",)),
    ),
    *_axis(
        MODALITY,
        ("T1", "T2"),
        [("T1-weighted", "T2-weighted"), ("T1WI", "T2WI")],
        also=(("T1 weighted",), ("T2 weighted",)),
    ),
    *_axis(
        MODALITY,
        ("ultrasound", "X-ray"),
        [("ultrasound", "X-ray"), ("ultrasonography", "radiography")],
        also=(("sonography",), ("radiograph",)),
    ),
    *_axis(
        MODALITY,
        ("fluorescence", "bright-field"),
        [("fluorescence", "bright-field")],
        also=(("fluorescent",), ("brightfield", "bright field")),
    ),
    *_axis(MODALITY, ("electron", "light"), [("electron microscopy", "light microscopy")]),
    *_axis(MODALITY, ("IF", "IHC"), [("immunofluorescence", "immunohistochemistry")]),
    *_axis(
        SIZE,
        ("large", "small"),
        [
            ("enlarged", "shrunken"),
            ("large", "small"),
            ("larger", "smaller"),
            ("hypertrophic", "atrophic"),
            ("swollen", "shrunken"),
        ],
        also=(("big",), ("reduced",)),
    ),
    *_axis(
        SIZE,
        ("wide", "narrow"),
        [("dilated", "constricted"), ("widened", "narrowed")],
        also=(("distended", "wide"), ("narrow", "stenotic")),
    ),
    *_axis(SIZE, ("thick", "thin"), [("thickened", "thinned"), ("thick", "thin")]),
]


def _dedupe(terms: list[_Term]) -> dict[str, _Term]:
    """One entry per surface; a surface listed twice ("shrunken") gathers its swaps."""
    out: dict[str, _Term] = {}
    for t in terms:
        old = out.get(t.surface)
        out[t.surface] = t if old is None else _Term(t.surface, t.kind, t.value, old.swaps + t.swaps)
    return out


TERMS = _dedupe(_SWAPPED_TERMS)

# Phrases in which a lexicon word is not the attribute (anatomy, dye names, verbs, quantities).
# An occurrence inside one of these spans is neither rewritten nor counted as a claim.
_PROTECTED = re.compile(
    "|".join(
        [
            r"\b(?:white|gr[ae]y)\s+matter\b",
            r"\blateral\s+ventricles?\b",  # an anatomical name: "medial ventricle" is no structure
            r"\b(?:red|white)\s+(?:blood|pulp)\b",
            r"\b(?:congo|sirius|picrosirius|nile|texas|neutral|ponceau|alizarin|oil)\s+red\b",
            r"\b(?:methylene|trypan|toluidine|alcian|prussian|evans|coomassie|luxol\s+fast|nile|berlin)\s+blue\b",
            r"\bgreen\s+fluorescent\b",
            r"\b(?:janus|malachite|indocyanine|fast|light)\s+green\b",
            r"\b(?:brown|white|beige)\s+(?:adipose|fat|adipocytes?)\b",
            r"\b(?:is|are|was|were|be|been|being|if|when|remains?|remained|then)\s+left\b",
            r"\bleft\s+(?:unchanged|untreated|out|behind|alone|over|intact|undisturbed|blank|empty|to)\b",
            r"\bright\s+(?:away|now|angles?|angled)\b",
            r"\ball\s+right\b",
            r"\b(?:upper|lower)\s+(?:than|levels?|limits?|bounds?|expression|amounts?|numbers?|doses?"
            r"|concentrations?|densit(?:y|ies)|intensit(?:y|ies)|magnification|resolution|quartile)\b",
            r"\b(?:central|peripheral)\s+(?:nervous|blood|tendency|limit)\b",
            r"\bbasal\s+(?:levels?|ganglia|cells?|conditions?|expression|activity|state|medium|lamina|membrane|rate)\b",
            r"\bdeep\s+(?:learning|neural|sequencing)\b",
            r"\b(?:small|large)\s+(?:intestines?|bowel|molecules?|rnas?|interfering|cell|numbers?\s+of|scale)\b",
            r"\b(?:small|large)-(?:scale|molecule|cell)\b",
            r"\b(?:thin|thick)\s+(?:sections?|slices?|films?|filaments?|layer\s+chromatography)\b",
            r"\b(?:positive|negative)\s+(?:controls?|correlations?|feedback|regulat\w*|values?|predictive|selection"
            r"|charges?|effects?|results?|samples?)\b",
            r"\b(?:light|upper|lower)\s+case\b",
            r"\bwhite\s+light\b",
            r"\b(?:above|below)\s+(?:the\s+)?(?:threshold|\d|mean|average|baseline|background|detection)",
            r"\bon\s+top\s+of\b",
            r"\bin\s+(?:the\s+)?(?:top|bottom)\s+(?:\d|percent)",
        ]
    ),
    re.IGNORECASE,
)

# "positive"/"negative" are a staining result only next to what is stained
_STAIN_CONTEXT = re.compile(
    r"\s+(?:cells?|staining|stained|nuclei|nucleus|immunostaining|immunoreactivity|signals?|label(?:l)?ing"
    r"|areas?|regions?|foci|puncta|fib(?:er|re)s?|neurons?|for|vesicles?|structures?|spots?|tissue)\b",
    re.IGNORECASE,
)


def _term_pattern(term: _Term) -> re.Pattern[str]:
    words = [re.escape(w) for w in term.surface.split(" ")]
    body = r"\s+".join(words)
    flags = 0 if any(c.isupper() for c in term.surface) else re.IGNORECASE
    # no letter or digit either side: "bright" never holds "right", "K650M" no "650", "T1" in "PT1" none
    return re.compile(rf"(?<![A-Za-z0-9]){body}(?![A-Za-z0-9])", flags)


_PATTERNS = {s: _term_pattern(t) for s, t in TERMS.items()}


@dataclass(frozen=True)
class _Hit:
    start: int
    end: int
    term: _Term

    @property
    def key(self) -> str:
        return self.term.surface


def _protected_spans(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in _PROTECTED.finditer(text)]


def _hits(text: str) -> list[_Hit]:
    """Every lexicon word in ``text`` that is an attribute (longest match first, none overlapping,
    none in a protected phrase)."""
    protected = _protected_spans(text)
    found: list[_Hit] = []
    for surface, pattern in _PATTERNS.items():
        term = TERMS[surface]
        for m in pattern.finditer(text):
            if any(s <= m.start() < e or s < m.end() <= e for s, e in protected):
                continue
            if term.value in ("positive", "negative") and not _stained(text, m):
                continue
            found.append(_Hit(m.start(), m.end(), term))
    found.sort(key=lambda h: (h.start, -(h.end - h.start)))
    kept: list[_Hit] = []
    for h in found:
        if not kept or h.start >= kept[-1].end:
            kept.append(h)
    return kept


def _stained(text: str, m: re.Match[str]) -> bool:
    """ "GFP-positive", "positive cells", "negative for": a staining result, not a control."""
    return (m.start() > 0 and text[m.start() - 1] == "-") or bool(_STAIN_CONTEXT.match(text, m.end()))


# --- counts -----------------------------------------------------------------------------------

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


# --- shared helpers ---------------------------------------------------------------------------


def _match_case(original: str, replacement: str) -> str:
    """The case of ``original`` on ``replacement``: LEFT -> RIGHT, Left -> Right, left -> right.
    A replacement with its own capitals ("MRI", "Masson's trichrome") is written as it is."""
    if any(c.isupper() for c in replacement):
        return replacement
    letters = [c for c in original if c.isalpha()]
    if len(letters) > 1 and all(c.isupper() for c in letters):
        return replacement.upper()
    if original[:1].isupper():
        return replacement[:1].upper() + replacement[1:]
    return replacement


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


# --- rules ------------------------------------------------------------------------------------


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


# --- the VLM ----------------------------------------------------------------------------------

SYSTEM = "You write hard negative captions for training biomedical image-text models. You answer with JSON only."
NEGATIVES = Prompt(
    "negatives",
    "Here is a description of a region of a biomedical figure:\n\n{text}\n\nWrite up to {n} false versions "
    "of it. Each changes exactly ONE attribute and keeps every other word: laterality (left/right, "
    "ipsilateral/contralateral), location (upper/lower, medial/lateral, anterior/posterior, proximal/distal, "
    "cortex/medulla), count (numbers), colour, stain (H&E, Masson's trichrome, DAPI, positive/negative), "
    "modality (CT, MRI, T1/T2-weighted, ultrasound, X-ray, fluorescence, bright-field) or size "
    "(enlarged/small, dilated/constricted, thickened/thinned). A false version must contradict the "
    "original, never restate it. Name the attribute changed. Answer as JSON: "
    '{{"negatives": [{{"text": "...", "perturbation": "laterality"}}]}}.',
    {
        "type": "object",
        "properties": {
            "negatives": {
                "type": "array",
                "maxItems": 12,
                "items": {
                    "type": "object",
                    "properties": {
                        "text": {"type": "string", "maxLength": 1000},
                        "perturbation": {"type": "string", "enum": list(KINDS)},
                    },
                    "required": ["text", "perturbation"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["negatives"],
        "additionalProperties": False,
    },
    768,
    system=SYSTEM,
)
# kept apart from the mining prompts: their hash is the mining stage's version, which this must not change
NEGATIVES_PROMPT_VERSION = fingerprint({"system": SYSTEM, "template": NEGATIVES.template, "schema": NEGATIVES.schema})
# The rules' version (lexicon, count grammar, gate): bump it when a change here changes the
# negatives made from the same text; with the prompt's version it is the asset's code version.
RULES_VERSION = "1"


@dataclass
class VlmNegatives:
    """Accepted negatives per item id, and why anything was dropped (an unreadable answer, a
    failed request, a negative that restates the positive)."""

    negatives: dict[str, list[Negative]] = field(default_factory=dict)
    reasons: dict[str, list[str]] = field(default_factory=dict)


def vlm_negatives(engine: VlmEngine, items: list[tuple[str, str]], n: int) -> VlmNegatives:
    """Up to ``n`` VLM negatives per (id, text), each gated by :func:`is_contradiction`. A bad
    answer costs that item its negatives and leaves a reason; :class:`VlmOutage` propagates."""
    requests = [NEGATIVES.request(item_id, text=normalize_caption(text), n=str(n)) for item_id, text in items]
    out = VlmNegatives()
    responses = engine.generate(requests) if requests else []
    for (item_id, text), response in zip(items, responses, strict=True):
        negatives, reasons = _read_answer(normalize_caption(text), response.text, response.error, n)
        out.negatives[item_id] = negatives
        if reasons:
            out.reasons[item_id] = reasons
    return out


def _read_answer(text: str, answer: str | None, error: str | None, n: int) -> tuple[list[Negative], list[str]]:
    if error is not None or answer is None:
        return [], [f"request failed: {error}"]
    parsed = parse_json(answer)
    value = parsed.value
    if isinstance(value, dict):
        value = value.get("negatives")
    if not isinstance(value, list):
        return [], [parsed.error or "answer has no list of negatives"]
    reasons = ["answer cut off: some negatives may be missing"] if parsed.truncated else []
    kept: list[Negative] = []
    seen = {_normal(text)}
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("text"), str):
            reasons.append(f"negative {i}: not an object with a text")
            continue
        neg, kind = normalize_caption(item["text"]), str(item.get("perturbation", "")).strip().lower()
        why = rejection(text, neg, kind) or ("duplicate" if _normal(neg) in seen else None)
        if why:
            reasons.append(f"negative {i}: {why}")
            continue
        if len(kept) < n:
            seen.add(_normal(neg))
            span, repl = _changed_span(text, neg)
            kept.append(Negative(neg, kind, span, repl, VLM))
    return kept, reasons


def _changed_span(positive: str, negative: str) -> tuple[str, str]:
    """What the model changed, as the shortest differing run of words (provenance only)."""
    a, b = positive.split(), negative.split()
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    end = 0
    while end < min(len(a), len(b)) - start and a[-1 - end] == b[-1 - end]:
        end += 1
    return " ".join(a[start : len(a) - end]), " ".join(b[start : len(b) - end])


# --- rows -------------------------------------------------------------------------------------


def negative_rows(
    pairs: list[dict],
    max_per_type: int = 1,
    seed: int = 0,
    vlm: dict[str, list[Negative]] | None = None,
) -> list[dict]:
    """Rows of the ``pair_negatives`` table for region pairs with text: the rule negatives, then
    the VLM ones (``vlm``, keyed by pair_id) that pass the gate and say something new, numbered
    per pair."""
    rows: list[dict] = []
    for pair in pairs:
        text = pair.get("text")
        if pair.get("level") != "region" or not isinstance(text, str) or not text.strip():
            continue
        negatives = rule_negatives(text, max_per_type=max_per_type, seed=seed)
        seen = {_normal(n.text) for n in negatives}
        for extra in (vlm or {}).get(pair["pair_id"], []):
            # gated again against this text: the VLM negatives may have been made from another one
            if _normal(extra.text) not in seen and is_contradiction(text, extra.text, extra.perturbation):
                seen.add(_normal(extra.text))
                negatives.append(extra)
        for i, neg in enumerate(negatives):
            rows.append(
                {
                    "pair_id": pair["pair_id"],
                    "pmcid": pair["pmcid"],
                    "negative_index": i,
                    "text": neg.text,
                    "perturbation": neg.perturbation,
                    "original_span": neg.original_span,
                    "replacement": neg.replacement,
                    "source": neg.source,
                }
            )
    return rows


def pair_negatives(
    pairs: list[dict], engine: MeteredEngine | None, max_per_type: int, seed: int, vlm_per_pair: int
) -> list[tuple[dict, list[dict]]]:
    """For each region pair: its ``negative_items`` row (less the fingerprint) and its
    ``pair_negatives`` rows, from the rules and, with an engine, the VLM (one batched call)."""
    vlm, reasons = {}, {}
    if engine is not None:
        answer = vlm_negatives(engine, [(p["pair_id"], p["text"]) for p in pairs], vlm_per_pair)
        vlm, reasons = answer.negatives, answer.reasons
    out = []
    for pair in pairs:
        rows = negative_rows([pair], max_per_type, seed, vlm)
        item = {
            "pair_id": pair["pair_id"],
            "pmcid": pair["pmcid"],
            "status": "rules+vlm" if engine is not None else "rules",
            "negatives": len(rows),
            "vlm_requests": engine.meter.requests[pair["pair_id"]] if engine is not None else 0,
            "reasons": reasons.get(pair["pair_id"], []),
        }
        out.append((item, rows))
    return out
