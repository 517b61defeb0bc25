"""The lexicon of attribute values: which words claim a laterality, location, colour, stain,
modality or size, what each may be swapped into, and the phrases where a word is no attribute."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

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
