"""Captions split by panel label (the join of a figure's panels to their texts is ``pairing``).

Rules only: deterministic and extractive. Every text returned is made of substrings of
``normalize_caption(caption)`` in caption order, joined by a space (``is_extractive``): one
span, or for a label of a group described item by item, the group's head, the label's own
item and the group's closing sentences. A panel's text can always be traced back to the caption.

The house styles read, as a grammar over the normalised caption (``|`` alternatives, ``[]``
optional, ``*`` repeated; a *clause start* is the caption start, the end of the figure label
"Figure 2." or a position after ``. ; : ! ?``)::

    caption  := [figure-label] [preface] part* [no-panel-tail]
    part     := lead text                            "(A) Western blot ...", "A. The indicated ..."
              | text trail                           "... the lungs of patient 1 (A), patient 2 (B)"
    lead     := [position] marker                    at a clause start, or before a word
    trail    := "(" labels [";" words] ")"           before , ; . ) and, or, the end: "TF (a)", "RSC (b; red)"
    marker   := ["Panel(s)"] "(" ["panel(s)"] labels ["," words] ")"   (A) (A-C) (a, b) (A and B) (panel B) (D, top)
              | ["Panel(s)"] labels ("." | ":" | "," | ")")           A. text  A: text  A, text  A) text  A-C, text
              | "Panel(s)" labels                                     Panel A shows ...
              | labels Word                                           a Schematic ... (bold label, no punctuation)
              (captions copied from web pages glue the first label to the title: "cancer.A. Photos",
               "tissuesA) Evaluation"; and drop a stop after a bracket: "(neurons) B: Colon")
    position := ("Upper"|"Lower"|"Top"|"Bottom"|"Middle"|"Left"|"Right")+ ["panel(s)"|"row"|...]
                                                     "Lower left (A): ..."; alone, "Left: ... Right: ..." are labels
    labels   := label (("," | "and" | "&" | "-" | "to") label)*          a range "A-C" names A, B and C
    label    := A | a | 1 | i | I | A1 | a1 | 1A    case-insensitive within a scheme, keys as printed
    no-panel := "DOI: ..." | "10.7554/eLife.N.N" | "Figure N-source data N. ..." | "Figure N-figure supplement N. ..."
                (to the end), and anywhere a credit: "Reproduced with permission from [3] Copyright 2019 Wiley"

How a caption is read:

1. ``normalize_caption`` folds the Unicode look-alikes that break matching (the dash family,
   non-breaking and thin spaces, fullwidth brackets, primes) and collapses white space.
2. The figure label is skipped; the no-panel tail is cut, with the closing sentences that only
   point to data elsewhere ("The raw data are available in Figure 1-source data 1."); credit
   lines are set aside.
3. Candidate markers are found. Not candidates: references (``as in (B)``, ``see (C)``,
   ``Fig. 2 (A)``, ``(A) in Figure 3``), "(C)" after a number in a temperature context
   ("kept at 37 (C)", "4 °C" elsewhere; "patient 3 (C)" is a label), glossaries ("E,
   extracellular"), words such as ``Fig. 2A``, ``p53``, ``IL-6``, ``(n = 5)``, ``(i.v.)``.
4. Each scheme (letter, digit, roman, alnum "A1", figure-numbered "1A") gets the run of its
   labels from the first one (A, 1, i, A1), one missing label allowed between two found ones.
5. Labels are defined in caption order by one marker each. A marker naming a label already
   defined is a reference; when it also names new labels, or when a clause counts the labels
   again from the first ("for (a) FTO, (b) fibres, ..."), the rest of that clause defines nothing
   (another figure's panels, one panel's curves: "b SEM (a, c, e) images of fibres (c, d)"). In
   a caption whose labels are printed before their texts, a marker mid-sentence does not define
   a label that a later marker at a clause start defines, nor one out of order ("carbon (C)
   atoms. (B) ..."). A range mid-sentence whose labels are each named later leaves them to
   those markers; one that is the caption's only marker splits nothing ("bands (A-F) were
   tested"). Bare labels without punctuation count only as a sequence of two or more.
6. The scheme with most defined labels is the panel level. Sub-labels are a second level:
   ``a1``, ``a2`` beside ``a``, or letters inside one numbered part ("(2) SEM images of (a) ...").
   A letter the caption names only by its sub-labels ("(A) ... (B1) ...; (B2) ...; (C) ...") is
   a panel too, its text from its first sub-label to the next letter.
7. Texts: a lead label's text runs to the next label; a trailing label's text is its list item
   with the label itself ("patient 2 (B)"), the first item of a list leaving the shared head to
   the preface ("Chest CT images showing the lungs of" | "patient 1 (A)"); after a list of
   trailing labels, a later sentence naming one of them in brackets is that label's too ("EC
   displayed high density throughout (a)."). A range or group
   "(A, B) ..." whose text then names each of its labels, in order, all after or all before
   their descriptions ("... shown in (A), and ... in (B)"; "for: (A) genes up; (B) ...") gives
   each label its own description, with what the group says of all of them: the words before
   the first description ("Enrichment of genes for" | "PTEN (b), CDC42 (c) and AKT3 (d)") and
   the sentences after the last, but a sentence naming one of them ("In (E), ...") is that
   label's, and one listing several after their items ("... into the RSC (b; red), PeEc (c)
   and TE2a (d)") gives each its item with the sentence's head. A credit line is cut out of
   the text it stands in, a credit in brackets with its brackets ("hippocampus (right; Images
   reproduced with permission from (22)) show ..."). Text edges lose punctuation and a
   dangling "and"/"or".

``panels`` keys every label as printed: panels, and sub-panels after their panel
(``{"a": ..., "a1": ..., "a2": ..., "b": ...}``); a panel's text covers its sub-panels' texts;
``parents`` maps each sub-label to its panel ("a1" -> "a").
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import pairwise


@dataclass
class CaptionSplit:
    """A caption split by panel label. ``panels`` maps each label as printed (without brackets
    or punctuation) to its text, excluding the ``preface`` (the text before the first label,
    shared by every panel). Sub-panels are keyed beside their panel, after it ("a", "a1", "a2",
    "b"), the panel's text covering theirs; ``parents`` maps each sub-label to its panel's label.
    Every text is made of pieces of the normalised caption (``is_extractive``)."""

    preface: str = ""
    panels: dict[str, str] = field(default_factory=dict)
    # upper, lower, digit, roman, alnum (A1, A2, B1), fignum (1A, 1B, 2A), position (Left, Right), none
    scheme: str = "none"
    confidence: float = 0.0
    parents: dict[str, str] = field(default_factory=dict)


SCHEMES = ("upper", "lower", "digit", "roman", "alnum", "fignum", "position")
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
_LABEL = (
    r"(?:[A-Za-z]\d{1,2}(?!\d)"  # A1, a2: a sub-label
    r"|\d{1,2}[A-Za-z](?![A-Za-z])"  # 1A, 2b: figure number and letter
    r"|\d{1,2}(?!\d)"
    rf"|(?:{_ROMAN_ALT}|{_ROMAN_ALT.upper()})(?![A-Za-z])"
    r"|[A-Za-z](?![A-Za-z]))'?"
)
_SEP = r"\s*(?:,\s*and\s|,|&|\band\b|\bto\b|-)\s*"
_LIST = rf"{_LABEL}(?:{_SEP}{_LABEL})*"
_PANEL = r"(?:[Pp]anels?\s+)?"
# (A), [A], (A-C), (A, B), (panel B), Panel (a), (D, upper graph), (a; TF, TGd)
_PAREN = re.compile(rf"(?:\b[Pp]anels?\s+)?[(\[]\s*{_PANEL}(?P<list>{_LIST})\s*(?:[)\]]|[,;]\s+[^()\[\]]*[)\]])")
# "In panel A (...), ...", "For (B), ...": a label introduced at a clause start
_IN_PANEL = re.compile(
    rf"\b(?:In|For)\s+(?:[Pp]anels?\s+(?P<bare>{_LIST})|\(\s*{_PANEL}(?P<paren>{_LIST})\s*\))(?=[\s,:])"
)
# A label glued to the sentence before it, as captions copied from web pages print the title
# and the first paragraph: "... prostate cancer.A. Photographs ..." (two characters of a word
# before the stop, so that "i.e." and "U.S.A." are not read so).
_GLUED = r"(?<=[a-z0-9)*]{2}\.)"
# The same with no stop at all, the first label only: "... in prostate tissuesA) Evaluation of"
# (three lower-case letters before it, so that "IgA)" and "HbA)" are not read so).
_GLUED_FIRST = r"(?<=[a-z]{3})(?=A\)\s+[A-Z])"
_NUMBERS_BEFORE = re.compile(rf"(?:\d{{1,2}}{_SEP})+(?=[A-Za-z]['\s)]*$)")
# A) B) printed without the opening bracket
_CLOSE = re.compile(rf"(?:(?<![\w(\['.-])|{_GLUED}|{_GLUED_FIRST}){_PANEL}(?P<list>{_LIST})\)")
# A. A: A, b-d. "Panels A & B", and "a Schematic" (a bold label without punctuation)
_BARE = re.compile(rf"(?:(?<![\w'.-])|{_GLUED})(?P<panel>[Pp]anels?\s+)?(?P<list>{_LIST})(?P<punct>\s*[.:,])?(?=\s)")
_TOKEN = re.compile(rf"({_LABEL})|({_SEP})")
_REFERENCE = re.compile(
    r"(?:\bas\s+(?:in|for)|\bsee(?:\s+also)?|\bcompared?(?:\s+(?:to|with))?|\bcf\.|\b(?:that|those)\s+in"
    r"|\bsame\s+as(?:\s+in)?|\bsimilar\s+to|\bFig(?:ure)?s?\.?(?:\s*S?\d+)?|\bTables?(?:\s*S?\d+)?)\s*$",
    re.IGNORECASE,
)
_REFERENCE_AFTER = re.compile(
    r"\s*(?:of|in|from)\s+(?:the\s+)?(?:(?:main|previous|next|original)\s+)?(?:Supplementa\w*\s+)?(?:Fig|Figure|Table)\b",
    re.IGNORECASE,
)
_FIGURE_LABEL = re.compile(
    r"(?:(?:Supplementa(?:ry|l)|Extended\s+Data|Appendix|Source\s+Data)\s+)?(?:Fig(?:ure)?s?|Plate|Scheme|Table|Chart)"
    r"\.?\s*S?\d+(?:\s*-\s*figure\s+supplement\s+\d+)?\s*[.:|]?(?=\s|$)",
    re.IGNORECASE,
)
_POSITION_WORD = r"(?:[Uu]pper|[Ll]ower|[Tt]op|[Bb]ottom|[Mm]iddle|[Cc]ent(?:er|re)|[Ll]eft|[Rr]ight|[Ff]ar)"
_POSITION = (
    rf"{_POSITION_WORD}(?:[\s-]+{_POSITION_WORD}){{0,2}}(?:\s+(?:panels?|rows?|columns?|images?|graphs?|plots?))?"
)
# A figure's panels spoken of without labels: "The left panel shows ... The right panel ...",
# "top and bottom panels", "in each panel", "given in the panel titles" (``panels_mentioned``).
_POSITIONS = rf"{_POSITION_WORD}(?:[\s-]+{_POSITION_WORD}){{0,2}}"
_PANEL_MENTION = re.compile(
    rf"(?<![\w-])(?P<pos>{_POSITIONS}(?:\s*(?:,\s*and|,|and|&)\s*{_POSITIONS})*)(?:[\s-]+hand)?\s+panels?\b"
    r"|\b(?:each|every|both|all|individual|separate|respective)\s+panels?\b|\bpanels?\s+(?:titles?|headings?)\b",
    re.IGNORECASE,
)
# ... or as places without the word "panel": "on the left for T-bars, and on the right for ...",
# "control (left) and knock-down (right) cells". Only two opposite sides count (left and right,
# top and bottom), each followed by punctuation or a verb: a place before a noun ("on the left
# ventricle"), "of" ("at the top of the image"), "and" ("markers on the left and lane numbers at
# the top") or a corner names a part of one picture.
_PLACE_MENTION = re.compile(
    r"(?<![\w-])(?:(?:[Oo]n|[Aa]t|[Ii]n)\s+the\s+(?P<pos>left|right|top|bottom|upper|lower)"
    r"(?=\s*[,;:.)]|\s*$|\s+(?:for|is|are|was|were|shows?|depicts?|represents?|displays?|with|from)\b)"
    r"|\((?P<inner>left|right)\))"
)
_OPPOSITE_SIDES = ({"left", "right"}, {"top", "bottom"})
_SAME_POSITION = {"upper": "top", "lower": "bottom", "center": "middle", "centre": "middle"}
_POSITION_BEFORE = re.compile(rf"(?<![\w-])(?P<pos>{_POSITION})[\s,]*$")
_POSITION_MARK = re.compile(rf"(?<![\w-])(?:(?P<pos>{_POSITION})\s*:|\((?P<inner>{_POSITION})\))(?=\s)")
_NUMBER_BEFORE = re.compile(r"(?:(?P<word>[A-Za-z]+)\s+)?[-+~]?\d+(?:[.,]\d+)?\s*(?P<degree>°)?\s*$")
_TEMPERATURE = re.compile(
    r"°|\btemperatur|\bincubat|\bheat|\bwarm|\bcool|\bcold\b|\bfroz|\bfreez|\bthaw|\bdegrees?\b|\bkept\b"
    r"|\bgrown\b|\bstored\b|\bcultur|\bmaintained\b|\bovernight\b",
    re.IGNORECASE,
)
_TEMPERATURE_WORDS = {"at", "to", "from", "and", "or", "between"}
# A label followed by a length names a scale bar, not a panel's text: "Scale bars: (i), 100 um; (ii-vi), 25 um".
_SCALE_AFTER = re.compile(r"\s*[,:=]?\s*\d+(?:[.,]\d+)?\s*(?:[\u00b5\u03bc]m|um|mum|nm|mm|cm)\b")
_WINDOW = 120  # characters before a marker where its reference or position words are printed
# Where a sentence or clause ends: the start of a trailing label's text.
_CLAUSE_END = re.compile(r"(?:[.!?]\)?\s+(?=[A-Z(\[\"'])|[;:]\s+)")
# The no-panel tail (eLife/PMC source data, figure supplements, DOIs) and credit lines.
_TAIL = re.compile(
    r"(?:DOI:?\s*)?(?:https?://(?:dx\.)?doi\.org/)?10\.7554/eLife\.\d+\.\d+"
    r"|(?:DOI:?\s*)?(?:https?://(?:dx\.)?doi\.org/)?10\.\d{4,9}/\S+\s*$"
    r"|(?:Figure|Fig\.?)\s*\d+(?:-(?:source\s+data|figure\s+supplement|video|animation|source\s+code)\s+\d+)+\s*[.:]"
    r"|(?:Source\s+data|Figure\s+supplement|Video)\s+\d+\s*[.:]\s"
    r"|The\s+following\s+(?:source\s+data|figure\s+supplements?|videos?|supplementary)\b[^.]{0,120}?\bavailable\b",
    re.IGNORECASE,
)
_CREDIT = re.compile(
    r"\b(?:(?P<upper>Reproduced|Reprinted|Adapted|Modified|Copyright|Courtesy)|reproduced|reprinted|adapted)\b"
    r"(?=[^.]{0,60}?\b(?:permission|Copyright|license|licence|courtesy|©)|\s+from\b|\s+\d{4}\b|\s+©)|©",
)
# A credit line ends at a full stop, unless an abbreviation holds it and the credit goes on after
# it: a reference, a year, a lower-case word, or one word to its own stop ("Smith et al. [28]",
# "Wiley-VCH Verlag GmbH & Co. KGaA."); "Elsevier B.V. (b) XRD ...", "Smith et al. b SEM ..."
# and "Elsevier Ltd. B. Blots" end at the stop (a letter alone is the next label).
_FULL_STOP = re.compile(r"\.(?:\s|$)")
_ABBREVIATION = re.compile(r"(?:\b(?:al|[Rr]efs?|Figs?|No|Co|Inc|Ltd)|\b[A-Z]|\.[A-Z])$")
_CREDIT_GOES_ON = re.compile(r"\s*(?:\[|\d|[a-z]{2}|[^\s.()\[\]]{2,}\.(?:\s|$))")


_LABEL_BRACKET = re.compile(r"\(\s*(?=\w)[A-Za-z]?\d{0,2}[A-Za-z]?\s*[;,]")


def _credit_end(text: str, start: int, end: int) -> int:
    """Where a credit line that runs from ``start`` ends (``end`` when no stop ends it)."""
    for stop in _FULL_STOP.finditer(text, start, end):
        if not (_ABBREVIATION.search(text, 0, stop.start()) and _CREDIT_GOES_ON.match(text, stop.end())):
            return stop.end()
    return end


# A closing sentence that points to data elsewhere describes no panel.
_POINTER = re.compile(
    r"\b(?:source\s+data|figure\s+supplements?|(?:raw|underlying)\s+data|can\s+be\s+found\s+(?:at|in)"
    r"|(?:are|is)\s+(?:available|provided|deposited|listed)\s+(?:at|in|from|online)|Additional\s+file\s+\d"
    r"|https?://|doi\.org)",
    re.IGNORECASE,
)
_CUT_WORDS = frozenset(
    "of for in on at from with by to into between showing shows show shown including against under after before"
    " during via per versus vs and or".split()
)
_DETERMINERS = frozenset("the a an and or".split())


def normalize_caption(text: str | None) -> str:
    """The caption every other function works on: NFC, one dash, one space, no invisible
    characters, so that "(A–C)" and "(A-C)" or "A\u00a0B" and "A B" are read the same way."""
    if not text:
        return ""
    text = unicodedata.normalize("NFC", str(text)).translate(_FOLD)
    return _SPACES.sub(" ", text).strip()


# --- labels and schemes ------------------------------------------------------------------------
# Schemes while reading: "letter" (A or a, one sequence whatever the case), "digit", "roman",
# "alnum" (A1: letter and number) and "fignum" (1A: figure number and letter).
_READ_SCHEMES = ("letter", "digit", "roman", "fignum", "alnum")


def _schemes_of(token: str) -> tuple[str, ...]:
    """The schemes a single label may belong to ("i" is both a letter and a Roman numeral)."""
    if re.fullmatch(r"[A-Za-z]\d+", token):
        return ("alnum",)
    if re.fullmatch(r"\d+[A-Za-z]", token):
        return ("fignum",)
    if token.isdigit():
        return ("digit",)
    if token.lower() in ROMANS and (token.islower() or token.isupper()):
        return ("roman", "letter") if len(token) == 1 else ("roman",)
    return ("letter",) if len(token) == 1 and token.isalpha() else ()


def _index(token: str, scheme: str) -> int:
    """Position of a label in its scheme's sequence, so that runs and ranges can be computed."""
    if scheme == "letter":
        return ord(token.lower()) - ord("a")
    if scheme == "digit":
        return int(token) - 1
    if scheme == "roman":
        return ROMANS.index(token.lower())
    if scheme == "alnum":
        return (ord(token[0].lower()) - ord("a")) * 100 + int(token[1:]) - 1
    return int(token[:-1]) * 100 + ord(token[-1].lower()) - ord("a")


def _label_at(index: int, scheme: str, like: str) -> str:
    """The label printed at ``index`` of a scheme, in the case of ``like`` (a range's end)."""
    upper = like[-1].isupper() if scheme == "fignum" else like[0].isupper()

    def case(s: str) -> str:
        return s.upper() if upper else s

    if scheme == "letter":
        return case(chr(ord("a") + index))
    if scheme == "digit":
        return str(index + 1)
    if scheme == "roman":
        return case(ROMANS[index])
    if scheme == "alnum":
        return case(chr(ord("a") + index // 100)) + str(index % 100 + 1)
    return str(index // 100) + case(chr(ord("a") + index % 100))


def _expand(label_list: str, scheme: str) -> list[tuple[int, str]]:
    """(index, label as printed) of one marker in ``scheme``, ranges expanded: "A-C" and "A to C"
    are A, B, C; "A1-3" is A1, A2, A3 and "1A-C" is 1A, 1B, 1C. Labels run forwards, so two
    letters joined backwards by a dash or "&" ("H-E", "H&E": haematoxylin and eosin) are none."""
    out: list[tuple[int, str]] = []
    pending_range, joined, pair = False, False, ""
    for token, sep in _TOKEN.findall(label_list):
        if sep:
            pending_range = sep.strip() in ("-", "to")
            joined = sep.strip() in ("-", "&")
            continue
        token = token.rstrip("'")
        if scheme == "alnum" and token.isdigit() and pair:
            token = pair[0] + token
        elif scheme == "fignum" and len(token) == 1 and token.isalpha() and pair:
            token = pair[:-1] + token
        if scheme not in _schemes_of(token):
            pending_range = False
            continue
        index = _index(token, scheme)
        if joined and out and index < out[-1][0] and scheme == "letter":
            return []
        joined = False
        if scheme in ("alnum", "fignum"):
            pair = token
        same_major = scheme not in ("alnum", "fignum") or (out and out[-1][0] // 100 == index // 100)
        if pending_range and out and same_major and 0 < index - out[-1][0] <= 60:
            out.extend((i, _label_at(i, scheme, token)) for i in range(out[-1][0] + 1, index + 1))
        else:
            out.append((index, token))
        pending_range = False
    seen: set[int] = set()
    return [(i, label) for i, label in out if not (i in seen or seen.add(i))]


# --- the caption and its markers ---------------------------------------------------------------


@dataclass(frozen=True)
class _Marker:
    """One place where the caption may name panel labels."""

    start: int  # position words before it included ("Lower left (A):")
    end: int
    label_list: str
    clause_start: bool
    follows: str  # what comes next: "end", "punct", "conj", "mark", "upper", "lower"
    kind: str  # "paren", "close", "bare", "weak" (no punctuation), "soft" (after a comma), "position"

    @property
    def trailing(self) -> bool:
        """A label printed after its text: "patient 1 (A), ..."."""
        return not self.clause_start and self.kind in ("paren", "close") and self.follows in ("end", "punct", "conj")


@dataclass
class _Def:
    """The marker that defines labels, and whether it is printed before or after their text."""

    marker: _Marker
    labels: list[str]
    indices: list[int]
    role: str = "lead"


@dataclass
class _Caption:
    """The normalised caption and what is read once: the end of the figure label, the start of
    the no-panel tail, the credit lines, and where clauses and sentences start."""

    text: str
    floor: int
    body_end: int
    credits: list[tuple[int, int]]
    clauses: list[int]
    sentences: list[int]

    def clause(self, position: int) -> int:
        """Index of the clause holding ``position`` (clauses end at . ; : ! ? outside brackets)."""
        return bisect_right(self.clauses, position)

    def clause_start(self, position: int) -> int:
        k = bisect_right(self.clauses, position)
        return max(self.floor, self.clauses[k - 1]) if k else self.floor

    def sentence_start(self, position: int) -> int:
        k = bisect_right(self.sentences, position)
        return max(self.floor, self.sentences[k - 1]) if k else self.floor


def _read(text: str) -> _Caption:
    label = _FIGURE_LABEL.match(text)
    floor = label.end() if label else 0
    while floor < len(text) and text[floor] == " ":
        floor += 1
    body_end = len(text)
    for m in _TAIL.finditer(text, floor):
        if _is_clause_start(text, m.start(), floor):
            body_end = m.start()
            break
    while True:  # closing sentences that only point to data elsewhere
        last = max([floor, *(b.end() for b in re.finditer(r"[.!?]\s+(?=\S)", text[:body_end].rstrip()))])
        if last <= floor or not _POINTER.search(text, last, body_end):
            break
        body_end = last
    depth = _depths(text)
    ends = [m for m in _CLAUSE_END.finditer(text, 0, body_end) if depth[m.start()] == 0]
    clauses = [m.end() for m in ends]
    sentences = [m.end() for m in ends if m.group().strip()[:1] in ".!?"]
    caption = _Caption(text, floor, body_end, [], clauses, sentences)
    caption.credits = _credits(caption)
    return caption


def _depths(text: str) -> list[int]:
    """How many brackets are open at each position (a stray ")" closes nothing)."""
    depths, depth = [], 0
    for ch in text:
        depths.append(depth)
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
    return [*depths, depth]


def _last_char(text: str, start: int, floor: int = 0) -> str:
    """The last character before ``start`` (and after ``floor``) that is not a space, or ""."""
    k = start - 1
    while k >= floor and text[k] == " ":
        k -= 1
    return text[k] if k >= floor else ""


def _is_clause_start(text: str, start: int, floor: int = 0) -> bool:
    last = _last_char(text, start, floor)
    return not last or last in ".;:!?"


def _credits(c: _Caption) -> list[tuple[int, int]]:
    """Credit lines ("Reproduced with permission from [3] Copyright 2019 Wiley"): they describe
    no panel, wherever they are printed."""
    text, spans = c.text, []
    for m in _CREDIT.finditer(text, c.floor, c.body_end):
        if spans and m.start() < spans[-1][1]:
            continue
        start = m.start()
        if not (m.group("upper") or m.group() == "\u00a9"):
            sentence = max([c.floor, *(b.end() for b in re.finditer(r"[.;!?]\s", text[:start]))])
            if len(text[sentence:start].split()) > 6 or text[:start].rstrip().endswith(","):
                # a long sentence, or a clause of its own ("Schematic of the pathway, reprinted
                # with permission from ..."): from the comma or bracket before the credit
                sentence = max(text.rfind(",", sentence, start) + 1, text.rfind("(", sentence, start), sentence)
            start = sentence
        opened = text[:start].rstrip().endswith("(")
        if opened:
            start = text.rindex("(", 0, start)
        else:
            # a credit inside a bracket of its clause goes with the bracket: "hippocampus (right;
            # Images reproduced with permission from (22)) show ..." keeps "show ..."
            sentence = max([c.floor, *(b.end() for b in re.finditer(r"[.!?]\s", text[:start]))])
            opener = open_bracket(text, sentence, start)
            close = _closing(text, opener + 1, c.body_end) if opener >= 0 else None  # "(n = 5, Reproduced ..."
            own = _LABEL_BRACKET.match(text, opener) if close is not None else None
            if own:
                # in a label's own bracket ("PeEc (b; adapted from Smith 2010)"): from the
                # label's ";" up to its ")"; the label keeps its marker
                spans.append((own.end() - 1, close))
                continue
            start = start if close is None else opener
        if text[start] == "(":
            end = _closing(text, start + 1, c.body_end)
            end = c.body_end if end is None else end + 1
        else:
            end = _credit_end(text, m.end(), c.body_end)
        spans.append((start, end))
    return spans


def open_bracket(text: str, start: int = 0, end: int | None = None) -> int:
    """Position of the innermost "(" of ``text[start:end]`` still open at ``end``, or -1 (as
    ``str.rfind``): a clause inside a bracket starts there, a closed one is part of its clause."""
    level = 0
    for k in range((len(text) if end is None else end) - 1, start - 1, -1):
        if text[k] == ")":
            level += 1
        elif text[k] == "(":
            if level == 0:
                return k
            level -= 1
    return -1


def _closing(text: str, start: int, end: int) -> int | None:
    """Position of the ")" closing a bracket opened before ``start``, if it comes before ``end``."""
    level = 0
    for k in range(start, min(end, len(text))):
        if text[k] == "(":
            level += 1
        elif text[k] == ")":
            if level == 0:
                return k
            level -= 1
    return None


def _follows(text: str, end: int) -> str:
    rest = text[end:].lstrip()
    if not rest:
        return "end"
    if rest[0] in ",;.:)]":
        return "punct"
    if re.match(r"(?:and|or|&|but|to|versus|vs\.?)(?!\w)", rest):
        return "conj"
    if rest[0] in "([":
        past = _remark_end(text, end)  # a remark after a trailing label: "glands (v) (black arrows),"
        return _follows(text, past) if past > end else "mark"
    return "upper" if rest[0].isupper() else "lower"


def _is_celsius(text: str, start: int) -> bool:
    """Whether "(C)" at ``start`` is a temperature: after a number with a degree sign, or after a
    number in a temperature context ("kept at 37 (C)"; "at 30 (C)" where the caption writes °C);
    "patient 3 (C)" is a label."""
    number = _NUMBER_BEFORE.search(text[max(0, start - _WINDOW) : start])
    if not number:
        return False
    if number.group("degree") or _TEMPERATURE.search(text[max(0, start - 80) : start]):
        return True
    word = (number.group("word") or "").lower()
    return word in _TEMPERATURE_WORDS and re.search(r"\d\s*°\s*C|\u2103", text) is not None


def _unmatched_close(text: str, close: int) -> bool:
    """True when the ")" at ``close`` closes no "(": the "A)" style, not the end of a remark."""
    return text[:close].count("(") <= text[:close].count(")")


def _candidates(c: _Caption) -> list[_Marker]:
    """Every marker that may name panel labels, references and look-alikes left out."""
    text, found = c.text, []
    taken = bytearray(len(text) + 1)  # 1 where a marker already is, or a credit line

    for a, b in c.credits:
        taken[a:b] = b"\x01" * (b - a)

    def free(start: int, end: int) -> bool:
        return not any(taken[start:end])

    def add(
        start: int, end: int, label_list: str, kind: str, clause_start: bool | None = None, owned: int | None = None
    ) -> None:
        # ``owned``: where the part that must be free ends (a label's own bracket may hold a credit)
        if start < c.floor or start >= c.body_end or not free(start, end if owned is None else owned):
            return
        at_start = _is_clause_start(text, start, c.floor) if clause_start is None else clause_start
        window = max(c.floor, start - _WINDOW)  # references and position words sit just before a marker
        position = _POSITION_BEFORE.search(text[window:start]) if not at_start and kind != "position" else None
        if position and _is_clause_start(text, window + position.start(), c.floor):
            start, at_start = window + position.start(), True
        if not at_start and (_REFERENCE.search(text[window:start]) or _REFERENCE_AFTER.match(text, end)):
            return
        if _SCALE_AFTER.match(text, end):
            return
        if label_list.strip("'") == "C" and _is_celsius(text, start):
            return
        found.append(_Marker(start, end, label_list, at_start, _follows(text, end), kind))
        taken[start:end] = b"\x01" * (end - start)

    for m in _IN_PANEL.finditer(text):
        if _is_clause_start(text, m.start(), c.floor):
            add(m.start(), m.end(), m.group("bare") or m.group("paren"), "bare", True)
    for m in _PAREN.finditer(text):
        add(m.start(), m.end(), m.group("list"), "paren", owned=m.end("list"))
    for m in _CLOSE.finditer(text):
        if not m.group("list").isdigit() and _unmatched_close(text, m.end() - 1):
            # one scheme to a list: the number of "gleason 6, C)" ends the text before the label
            lead = _NUMBERS_BEFORE.match(m.group("list"))
            start = m.start("list") + lead.end() if lead else m.start()
            add(start, m.end(), m.group("list")[lead.end() if lead else 0 :], "close")
    for m in _BARE.finditer(text):
        panel, punct = m.group("panel"), (m.group("punct") or "").strip()
        after = text[m.end() :].lstrip()[:1]
        before = _last_char(text, m.start(), c.floor)
        # "(B: ...", and "microglia) B: Colon mucosa" (a label after a bracket, its stop left out)
        if _is_clause_start(text, m.start(), c.floor) or (before in "()" and punct == ":"):
            if after.islower() and not panel:
                # "C. elegans", "P. berghei"; an abbreviation key "D, dorsal; V, ventral" (one
                # word with the letter as its initial). "A, prostate tumor; B, breast carcinoma"
                # and "B and D: a higher magnification" are labels.
                word = re.match(r"\s*(\w)\w*(?=[;,.)]|\s*$)", text[m.end() :])
                if punct not in (",", ":") or (word and word.group(1) == m.group("list")[-1:].lower()):
                    continue
            if punct or panel:
                add(m.start(), m.end(), m.group("list"), "bare", True)
            elif after.isupper() or after.isdigit():
                add(m.start(), m.end(), m.group("list"), "weak", True)
        elif not punct and not panel and re.fullmatch(r"[A-Za-z]", m.group("list")):
            # the next bold label of a caption printed "a Schematic ..., b the ... c Western blot"
            if after.isupper() or (before == "," and m.group("list").islower() and after.isalpha()):
                add(m.start(), m.end(), m.group("list"), "soft", False)
    for m in _POSITION_MARK.finditer(text):
        if _is_clause_start(text, m.start(), c.floor):
            add(m.start(), m.end(), m.group("pos") or m.group("inner"), "position", True)
    return sorted(found, key=lambda marker: marker.start)


# --- which labels the caption defines ---------------------------------------------------------


def _run(indices: Iterable[int]) -> list[int]:
    """The run of label positions from the first label, allowing one missing label between two
    found ones (a caption may skip a panel it does not describe)."""
    present = sorted(set(indices))
    if not present or present[0] != 0:
        return []
    run = [0]
    for index in present[1:]:
        if index - run[-1] > 2:
            break
        run.append(index)
    return run


def _allowed(markers: list[_Marker], scheme: str) -> set[int]:
    """The label positions of a scheme that may be panel labels: its run from the first label."""
    found = {i for m in markers if m.kind != "position" for i, _ in _expand(m.label_list, scheme)}
    if scheme == "alnum":
        return found if 0 in found else set()
    if scheme == "fignum":
        numbers = {i // 100 for i in found if i % 100 == 0}
        return {i for i in found if i // 100 in numbers}
    return set(_run(found))


def _define(c: _Caption, markers: list[_Marker], scheme: str, allowed: set[int]) -> tuple[list[_Def], bool]:
    """The markers that define labels, in caption order, and whether the caption prints its
    labels before their texts (see step 5 of the module docstring)."""
    naming = []
    for m in markers:
        if m.kind != "position":
            named = [(i, label) for i, label in _expand(m.label_list, scheme) if i in allowed]
            if named:
                naming.append((m, named))
    weak = sum(m.kind in ("weak", "soft") for m, _ in naming)
    naming = [(m, named) for m, named in naming if m.kind != "weak" or weak >= 2]
    if not naming:
        return [], False
    first = min(allowed)
    starts = sum(m.clause_start for m, _ in naming)
    before = starts * 2 > len(naming) or any(m.clause_start for m, named in naming if named[0][0] == first)
    defined: set[int] = set()
    weak_style = False
    references: dict[int, list[int]] = {}  # clause -> labels it names again
    reference_clauses: set[int] = set()
    defs: list[_Def] = []
    for k, (m, named) in enumerate(naming):
        indices = {i for i, _ in named}
        clause = c.clause(m.start)
        if indices & defined:
            # a marker naming defined and new labels at once, or a clause that counts the labels
            # again from the first ("for (a) FTO, (b) PVP, ..."), enumerates another figure's
            # panels or one panel's parts: the rest of the clause defines nothing
            again = references.setdefault(clause, [])
            again.extend(sorted(indices))
            if indices - defined or again[:2] == sorted(allowed)[:2]:
                reference_clauses.add(clause)
            continue
        if not m.clause_start and clause in reference_clauses:
            continue
        if before and not m.clause_start:
            later = [{i for i, _ in n} for lm, n in naming[k + 1 :] if lm.clause_start]
            if any(li & indices or (min(li) < min(indices) and not li & defined) for li in later):
                continue
        if m.kind == "soft" and (not weak_style or not defined or min(indices) != max(defined) + 1):
            continue  # only the next label of a caption whose labels are printed bare
        if len(indices) > 1 and not m.clause_start:
            # a range mid-sentence whose labels are each named again later: "stage II (a-f).
            # Staining against CK8 (a); COX-1 (b); ..." (the single labels define them)
            singles = {n[0][0] for lm, n in naming[k + 1 :] if len(n) == 1 and not lm.clause_start}
            if indices <= singles:
                continue
        defined |= indices
        weak_style = weak_style or m.kind == "weak"
        defs.append(_Def(m, [label for _, label in named], sorted(indices)))
    return defs, before


def _set_roles(c: _Caption, defs: list[_Def]) -> None:
    """Lead or trail per definition; a clause that holds a trailing label is a list of trailing
    labels ("PeEc (b) PHA1 (c), PHA2 (d)")."""
    for d in defs:
        d.role = "trail" if d.marker.trailing else "lead"
    trailing_clauses = {c.clause(d.marker.start) for d in defs if d.role == "trail"}
    for d in defs:
        m = d.marker
        if (
            d.role == "lead"
            and not m.clause_start
            and m.kind in ("paren", "close")
            and m.follows in ("upper", "lower")
            and c.clause(m.start) in trailing_clauses
        ):
            d.role = "trail"


# --- texts ------------------------------------------------------------------------------------


def _trim(text: str, start: int, end: int) -> str:
    """``text[start:end]`` without the punctuation and conjunctions left over at its edges."""
    piece = re.sub(r"^(?:and|or)\s+", "", text[start:end].lstrip(" ,;:.)]"))
    piece = re.sub(r"[\s,;]+(?:and|or)$", "", piece.rstrip(" ,;:("))
    return piece.rstrip(" ,;:(")


def _first_item(text: str, start: int, stop: int, others: list[str]) -> int:
    """Where the first item of a trailing list starts: "Chest CT images showing the lungs of
    patient 1 (A), patient 2 (B)" -> "patient 1". An item much longer than the others shares a
    head with them; it starts at the word the next item starts with, else after the earliest
    comma, then the earliest preposition, that leaves it at most twice as long as the others."""
    words = list(re.finditer(r"\S+", text[start:stop]))
    lengths = [len(other.split()) for other in others if other.split()]
    if not words or not lengths:
        return start
    limit = 2 * max(lengths) + 2
    if len(words) <= limit:
        return start
    head = next((w for w in others[0].split() if w.lower() not in _DETERMINERS), None)
    if head:
        hits = [w for w in words[1:] if w.group().lower() == head.lower()]
        if hits:
            return start + hits[-1].start()
    depth = _depths(text[start:stop])
    for at_punctuation in (True, False):
        for k, w in enumerate(words[:-1]):
            token = w.group()
            cut = token.endswith((",", ":", ";")) if at_punctuation else token.lower().strip(",;:") in _CUT_WORDS
            if cut and depth[w.end()] == 0 and len(words) - k - 1 <= limit:  # never inside brackets
                return start + words[k + 1].start()
    return start


def _remark_end(text: str, end: int) -> int:
    """The end of the remarks printed right after a trailing label, "glands (v) (black arrows),",
    which belong to its text; ``end`` itself when there are none."""
    while True:
        start = len(text) - len(text[end:].lstrip())
        close = _closing(text, start + 1, len(text)) if text[start : start + 1] == "(" else None
        if close is None or _PAREN.match(text, start):
            return end
        end = close + 1


def _ends_sentence(text: str, end: int) -> bool:
    """Whether a sentence ends at ``end`` (a stop or the caption's end follows)."""
    rest = text[end:].lstrip()
    return not rest or rest[0] in ".!?"


def _segment(c: _Caption, defs: list[_Def], lo: int, hi: int) -> tuple[int, list[tuple[int, int]]]:
    """Where the first part starts, and the span of each definition's text (see step 7)."""
    text, n = c.text, len(defs)
    starts = [d.marker.end for d in defs]
    ends = [_remark_end(text, d.marker.end) if d.role == "trail" else d.marker.end for d in defs]
    for i, d in enumerate(defs):
        if d.role != "trail":
            continue
        previous = ends[i - 1] if i else lo
        # after a trailing label, this one's text starts where that one's ends: in one clause
        # (a list, "patient 1 (A), patient 2 (B)"), or where labels close their descriptions
        # ("... from EEG recordings (panel A). Analysis ... (panel B). Circular representation
        # ... SW. Heatmap ... (panel C).": every sentence after the last label's is this one's)
        if (
            i
            and defs[i - 1].role == "trail"
            and (
                c.clause(previous - 1) == c.clause(d.marker.start)
                or (_ends_sentence(text, previous) and _ends_sentence(text, ends[i]))
            )
        ):
            starts[i] = previous
            continue
        start = max(previous, c.clause_start(d.marker.start))
        items, last = [], ends[i]
        for k, other in enumerate(defs[i + 1 :], i + 1):
            if other.role != "trail" or c.clause(other.marker.start) != c.clause(d.marker.start):
                break
            items.append(_trim(text, last, other.marker.start))
            last = ends[k]
        starts[i] = _first_item(text, start, d.marker.start, items) if items else start
    spans = []
    for i, d in enumerate(defs):
        if d.role == "trail":
            spans.append((starts[i], ends[i]))
            continue
        if i + 1 < n:
            end = defs[i + 1].marker.start if defs[i + 1].role == "lead" else starts[i + 1]
        else:
            end = hi
        end = max(end, starts[i])
        sentence = c.sentence_start(d.marker.start)
        depth = text.count("(", sentence, d.marker.start) - text.count(")", sentence, d.marker.start)
        close = _closing(text, starts[i], end) if depth > 0 else None
        spans.append((starts[i], end if close is None else close))
    first = defs[0].marker.start if defs[0].role == "lead" else starts[0]
    return first, spans


def _refine(
    c: _Caption, markers: list[_Marker], scheme: str, d: _Def, span: tuple[int, int]
) -> tuple[dict[int, tuple], dict[int, tuple]]:
    """A group "(A, B) ..." whose text names each of its labels once, in order, all after their
    descriptions ("... are shown in (A), and ... in (B)") or all before them ("Venn diagrams for:
    (A) shRNAs; (B) genes and (C) ...") gives each label its own description; a description
    printed before its label ends with its sentence. What the group says of all its labels stays
    with each: the first label's text starts at the group's, and every other label gets the
    group's head (before the first description) and tail (after the last) around its own text.
    Returns (index -> (label, span)), (index -> (head span or None, tail span))."""
    first: dict[int, _Marker] = {}
    for m in markers:
        if m is d.marker or not span[0] <= m.start < span[1] or m.kind == "position":
            continue
        named = _expand(m.label_list, scheme)
        if len(named) == 1 and named[0][0] in d.indices:
            first.setdefault(named[0][0], m)
    if set(first) != set(d.indices):
        return {}, {}
    order = [first[i] for i in d.indices]
    if any(a.start >= b.start for a, b in pairwise(order)):
        return {}, {}
    if all(m.trailing for m in order):
        role = "trail"
    elif all(not m.trailing and m.follows in ("upper", "lower") for m in order):
        role = "lead"
    else:
        return {}, {}
    parts = [_Def(m, [label], [i], role) for i, label, m in zip(d.indices, d.labels, order, strict=True)]
    end = span[1]
    if role == "lead":
        end = min(end, next((start for start in c.sentences if start > order[-1].end), end))
    _, spans = _segment(c, parts, span[0], end)
    if role == "lead":
        head = (span[0], order[0].start)
    elif c.clause_start(order[0].start) > len(c.text) - len(c.text[span[0] :].lstrip()):
        head = (span[0], c.clause_start(order[0].start))  # the descriptions are clauses of their own
    else:
        # a list in the group's first clause: the first item as long as the longest other one
        # ("Enrichment of genes for PTEN (b), CDC42 (c) and AKT3 (d)")
        head = (span[0], _list_head_end(c.text, span[0], spans, order))
    spans[0] = (span[0], spans[0][1])
    # after the last description: a sentence naming one label of the group is that label's
    # ("In (E), three cells ..."), one listing several of them after their items gives each its
    # item and its head, the others are the group's
    tail_start = spans[-1][1] if role == "trail" else end
    shared, own = [], {}
    for a, b in _sentences(c, tail_start, span[1]):
        named = _named(markers, scheme, a, b) & set(d.indices)
        items = _trailing_items(c, markers, scheme, a, b) if len(named) > 1 else {}
        if len(named) == 1:
            own.setdefault(named.pop(), []).append((a, b))
        elif items and set(items) == named:
            for i, item in items.items():
                own.setdefault(i, []).extend(item)
        else:
            shared.append((a, b))
    found, context = {}, {}
    for k, ((i, label), s) in enumerate(zip(zip(d.indices, d.labels, strict=True), spans, strict=True)):
        found[i] = (label, s)
        context[i] = (head if k else None, sorted(shared + own.get(i, [])))
    return found, context


def _sentences(c: _Caption, start: int, end: int) -> list[tuple[int, int]]:
    """The sentences between ``start`` and ``end``, the first and last cut there."""
    return list(pairwise([start, *(x for x in c.sentences if start < x < end), end]))


def _named(markers: list[_Marker], scheme: str, start: int, end: int, bracketed: bool = False) -> set[int]:
    """The label indices of ``scheme`` that markers between ``start`` and ``end`` name (with
    ``bracketed``, markers in brackets only: a bare "a" there may be the article)."""
    kinds = ("paren", "close") if bracketed else ("paren", "close", "bare", "weak", "soft")
    return {i for m in markers if start <= m.start < end and m.kind in kinds for i, _ in _expand(m.label_list, scheme)}


def _trailing_items(
    c: _Caption, markers: list[_Marker], scheme: str, start: int, end: int
) -> dict[int, list[tuple[int, int]]]:
    """A sentence that lists labels after their items, each once and in one clause ("... show
    the cells labelled after injection into the RSC (b; red), PeEc (c; black points) and TE2a
    (d)"): label index -> its spans, the sentence's head before the first item and its own item.
    Empty when the sentence is not such a list."""
    found = [m for m in markers if start <= m.start < end and m.kind != "position"]
    named = [_expand(m.label_list, scheme) for m in found]
    if (
        len(found) < 2
        or any(len(n) != 1 or not m.trailing for m, n in zip(found, named, strict=True))
        or len({c.clause(m.start) for m in found}) > 1
        or len({n[0][0] for n in named}) < len(found)
    ):
        return {}
    parts = [_Def(m, [n[0][1]], [n[0][0]], "trail") for m, n in zip(found, named, strict=True)]
    _, spans = _segment(c, parts, start, end)
    cut = _list_head_end(c.text, spans[0][0], spans, found)
    spans[0] = (cut, spans[0][1])
    head = [(start, cut)] if cut > start else []
    return {part.indices[0]: [*head, item] for part, item in zip(parts, spans, strict=True)}


def _list_head_end(text: str, start: int, spans: list[tuple[int, int]], markers: list[_Marker]) -> int:
    """Where the first item of a list of trailing labels starts when the words before its label
    run from ``start``: it is as long as the longest other item, the words before it are the
    list's head ("Enrichment of genes for" | "PTEN (b), CDC42 (c) and AKT3 (d)")."""
    longest = max(len(_trim(text, spans[k][0], markers[k].start).split()) for k in range(1, len(markers)))
    words = list(re.finditer(r"\S+", text[start : markers[0].start]))
    return start + words[-longest].start() if len(words) > longest else start


def _uncredited(text: str, start: int, end: int, credits: list[tuple[int, int]]) -> str:
    """``_trim`` of ``text[start:end]`` with the credit lines in it cut out: the pieces around
    them, each trimmed, joined by a space ("CT scan. Reproduced from [3]. Scale bar, 1 cm")."""
    pieces, at = [], start
    for a, b in sorted(credits):
        if b <= at or a >= end:
            continue
        pieces.append(_trim(text, at, max(at, a)))
        at = min(max(at, b), end)
    pieces.append(_trim(text, at, end))
    return " ".join(piece for piece in pieces if piece)


@dataclass
class _Level:
    """The labels of one scheme and the span of each label's text."""

    scheme: str
    defs: list[_Def]
    before: bool
    first: int
    spans: dict[int, tuple[str, tuple[int, int]]]  # index -> (label, span)
    context: dict[int, tuple] = field(default_factory=dict)  # index -> a group's (head, tail): _refine


def _level(
    c: _Caption, markers: list[_Marker], scheme: str, defs: list[_Def], before: bool, lo: int, hi: int
) -> _Level:
    _set_roles(c, defs)
    first, spans = _segment(c, defs, lo, hi)
    by_index: dict[int, tuple[str, tuple[int, int]]] = {}
    context: dict[int, tuple] = {}
    for d, span in zip(defs, spans, strict=True):
        for i, label in zip(d.indices, d.labels, strict=True):
            by_index[i] = (label, span)
        if len(d.indices) > 1 and d.role == "lead":
            refined, shared = _refine(c, markers, scheme, d, span)
            by_index.update(refined)
            context.update(shared)
    if defs and defs[-1].role == "trail":
        # after a list of trailing labels, a sentence naming one of them is that label's ("...
        # PHA3 (e). ... EC displayed high endpoint density throughout the hippocampus (a).")
        for a, b in _sentences(c, max(end for _, end in spans), hi):
            named = _named(markers, scheme, a, b, bracketed=True) & set(by_index)
            if len(named) == 1:
                i = named.pop()
                head, tail = context.get(i, (None, []))
                context[i] = (head, [*tail, (a, b)])
    # a lead label with no text of its own shares the next one's: "(A) and (B) Western blots of ..."
    ordered = sorted(by_index.items(), key=lambda item: item[1][1][0])
    for (i, (label, span)), (_, (_, after)) in pairwise(ordered):
        if not _trim(c.text, *span) and re.fullmatch(r"[\s,;&]*(?:and|or|to)?[\s,;&]*", c.text[span[0] : span[1]]):
            by_index[i] = (label, after)
    return _Level(scheme, defs, before, first, by_index, context)


def _options(c: _Caption, markers: list[_Marker]) -> dict[str, tuple[list[_Def], bool]]:
    options = {}
    for scheme in _READ_SCHEMES:
        allowed = _allowed(markers, scheme)
        if len(allowed) >= 2:
            defs, before = _define(c, markers, scheme, allowed)
            # one range naming every label mid-sentence ("regions between bands (A-F)") splits nothing
            alone = len(defs) == 1 and not defs[0].marker.clause_start
            if len({i for d in defs for i in d.indices}) >= 2 and not alone:
                options[scheme] = (defs, before)
    return options


def _nested(c: _Caption, markers: list[_Marker], outer: _Level, scheme: str) -> dict[int, list]:
    """Sub-labels inside the panels of ``outer`` (outer label -> [(index, (label, span))]): "a1"
    inside "a", or letters that all sit inside one numbered part ("(2) SEM images of (a) ...")."""
    if scheme == "alnum":
        pairs = _allowed_pairs(markers)
        allowed = {i for i in pairs if i // 100 in outer.spans and i // 100 * 100 in pairs}  # a1 before a2
    else:
        allowed = _allowed(markers, scheme)
    if len(allowed) < 2:
        return {}
    defs, before = _define(c, markers, scheme, allowed)
    # a panel named only by its sub-labels is defined at its first one (_parents_of_subs)
    own = {i: d.marker for d in outer.defs for i in d.indices}
    groups: dict[int, list[_Def]] = {}
    for d in defs:
        parent = next(
            (
                p
                for p, (_, (lo, hi)) in outer.spans.items()
                if (lo <= d.marker.start < hi or own.get(p) is d.marker)
                and (scheme != "alnum" or d.indices[0] // 100 == p)
            ),
            None,
        )
        if parent is None and scheme == "letter":
            return {}  # letters outside the numbered parts are not their sub-labels
        if parent is not None:
            groups.setdefault(parent, []).append(d)
    if scheme == "letter" and len(groups) != 1:
        return {}
    out = {}
    for parent, inside in groups.items():
        lo, hi = outer.spans[parent][1]
        out[parent] = sorted(_level(c, markers, scheme, inside, before, lo, hi).spans.items())
    return out if sum(len(v) for v in out.values()) >= (2 if scheme == "letter" else 1) else {}


def _parents_of_subs(markers: list[_Marker], outer: _Level) -> list[_Def]:
    """A letter the caption names only by its sub-labels ("(A) ... (B1) ...; (B2) ...; (C) ..."):
    its panel, defined where its first sub-label stands, between the letters before and after it."""
    starts = {i: span[0] for i, (_, span) in outer.spans.items()}
    out: list[_Def] = []
    for m in markers:
        if m.kind == "position" or not m.clause_start:
            continue
        subs = _expand(m.label_list, "alnum")
        if not subs or subs[0][0] % 100 != 0:
            continue  # a letter's first sub-label ("B1") defines it
        letter = subs[0][0] // 100
        before, after = starts.get(letter - 1), starts.get(letter + 1)
        if letter in starts or letter in {d.indices[0] for d in out} or before is None or before >= m.start:
            continue
        if after is not None and after <= m.start:
            continue
        out.append(_Def(m, [subs[0][1][0]], [letter]))
    return out


def _allowed_pairs(markers: list[_Marker]) -> set[int]:
    return {i for m in markers if m.kind != "position" for i, _ in _expand(m.label_list, "alnum")}


def _position_level(c: _Caption, markers: list[_Marker]) -> _Level | None:
    """ "Left: ... Right: ..." with no printed labels: the position words are the labels."""
    defs, seen = [], set()
    for m in markers:
        if m.kind != "position":
            continue
        key = re.sub(r"[\s-]+(?:panels?|rows?|columns?|images?|graphs?|plots?)$", "", m.label_list).strip()
        if key.casefold() not in seen:
            seen.add(key.casefold())
            defs.append(_Def(m, [key], [len(defs)]))
    if len(defs) < 2:
        return None
    return _level(c, markers, "position", defs, True, c.floor, c.body_end)


def _confidence(level: _Level, rivals: int) -> float:
    """1.0 for a clean run printed before its texts at clause starts; less for each doubt."""
    indices = sorted(level.spans)
    missing = indices[-1] + 1 - indices[0] - len(indices) if level.scheme in ("letter", "digit", "roman") else 0
    positions = [level.spans[i][1][0] for i in indices]
    out_of_order = any(a > b for a, b in pairwise(positions))
    loose = sum(not d.marker.clause_start for d in level.defs[1:] if d.role == "lead")
    score = 1.0 - 0.1 * missing - 0.2 * out_of_order - 0.1 * (not level.before) - 0.1 * rivals - 0.05 * min(loose, 4)
    return round(min(1.0, max(0.05, score)), 2)


def split_caption(caption: str | None) -> CaptionSplit:
    """Split a figure caption by its printed panel labels (see the module docstring).

    A caption without at least two labels is not split: scheme "none", no panels, the caption
    without its no-panel tail as preface and confidence 0.0 (nothing was split)."""
    text = normalize_caption(caption)
    c = _read(text)
    markers = _candidates(c)
    options = _options(c, markers)
    outer, nested, inner = None, {}, None
    for numeric in ("digit", "roman"):
        if numeric in options and "letter" in options and outer is None:
            candidate = _level(c, markers, numeric, *options[numeric], c.floor, c.body_end)
            nested = _nested(c, markers, candidate, "letter")
            outer, inner = (candidate, "letter") if nested else (None, None)
    if outer is None and options:
        scheme = max(options, key=lambda s: (len({i for d in options[s][0] for i in d.indices}), s == "letter"))
        scheme = "letter" if "letter" in options and "alnum" in options else scheme
        outer = _level(c, markers, scheme, *options[scheme], c.floor, c.body_end)
        if scheme == "letter":
            parents = _parents_of_subs(markers, outer)
            if parents:
                defs = sorted([*options[scheme][0], *parents], key=lambda d: d.marker.start)
                outer = _level(c, markers, scheme, defs, options[scheme][1], c.floor, c.body_end)
            nested = _nested(c, markers, outer, "alnum")
            inner = "alnum" if nested else None
    if outer is None:
        outer = _position_level(c, markers)
    if outer is None:
        return CaptionSplit(preface=_uncredited(text, 0, c.body_end, c.credits), scheme="none")
    panels: dict[str, str] = {}
    parents: dict[str, str] = {}
    for index in sorted(outer.spans):
        label, span = outer.spans[index]
        head, tail = outer.context.get(index, (None, []))
        pieces = [_uncredited(text, *piece, c.credits) for piece in ([head] if head else []) + [span, *tail]]
        panels[label] = " ".join(piece for piece in pieces if piece)
        for _, (sub, sub_span) in nested.get(index, []):
            if sub.casefold() not in {key.casefold() for key in panels}:
                panels[sub] = _uncredited(text, *sub_span, c.credits)
                parents[sub] = label
    preface = _uncredited(text, 0, outer.first, c.credits)
    rivals = sum(1 for other in options if other not in (outer.scheme, inner))
    scheme = outer.scheme
    if scheme == "letter":
        keys = [label for _, (label, _) in outer.spans.items()]
        scheme = "upper" if sum(k.isupper() for k in keys) * 2 >= len(keys) else "lower"
    return CaptionSplit(
        preface=preface, panels=panels, scheme=scheme, confidence=_confidence(outer, rivals), parents=parents
    )


def panels_mentioned(caption: str | None) -> int | None:
    """What a caption says of panels it prints no label for: the number of places it names
    ("the left panel ... the right panel", "on the left ..., on the right ...": 2; "top, middle
    and bottom panels": 3), 0 when it speaks of no panel, None when it speaks of panels without
    saying how many ("in each panel", "the panel titles", one place). Authors write so of a
    figure whose panels carry no printed label, so that a caption ``split_caption`` finds no
    label in is not read as a single figure's."""
    places: set[str] = set()
    mentioned = False
    for m in _PANEL_MENTION.finditer(normalize_caption(caption)):
        mentioned = True
        for place in re.split(r"\s*(?:,\s*and|,|and|&)\s*", m.group("pos") or ""):
            if _place(place):
                places.add(_place(place))
    # places named without "panel" count where two opposite sides are named
    elsewhere = {
        _place(m.group("pos") or m.group("inner")) for m in _PLACE_MENTION.finditer(normalize_caption(caption))
    }
    if any(sides <= elsewhere for sides in _OPPOSITE_SIDES):
        mentioned = True
        places |= elsewhere
    if not mentioned:
        return 0
    return len(places) if len(places) >= 2 else None


def _place(words: str) -> str:
    """A place as ``panels_mentioned`` counts it: "Upper left" and "top-left" are one place."""
    return " ".join(_SAME_POSITION.get(w, w) for w in re.split(r"[\s-]+", words.casefold()) if w)


def caption_agreement(cases: Iterable[dict], splitter: Callable[[str | None], CaptionSplit] | None = None) -> dict:
    """How far the splitter agrees with hand-split captions, so that a rule change is measured.

    Each case has ``caption`` and ``labels`` (expected labels as printed), and optionally
    ``texts`` (label, or "preface", -> expected text). ``exact_label`` is the share of captions
    whose predicted label set equals the expected one; ``text`` the share of expected texts
    predicted exactly (after ``normalize_caption``), None when no case has texts. ``splitter``
    (default ``split_caption``) lets a benchmark score another splitter on the same cases."""
    captions = exact = texts = same_text = 0
    misses: list[str] = []
    for case in cases:
        split = (splitter or split_caption)(case["caption"])
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


def _related(label: str, other: str, parents: dict[str, str]) -> bool:
    """Whether two labels name the same panel, or a panel and one of its sub-panels ("a" and
    "a1"): a sub-panel's phrase inside its panel's text is not a leak."""
    label, other = label.casefold(), other.casefold()
    folded = {child.casefold(): parent.casefold() for child, parent in parents.items()}
    return label == other or folded.get(label) == other or folded.get(other) == label


def phrase_agreement(cases: Iterable[dict], splitter: Callable[[str | None], CaptionSplit] | None = None) -> dict:
    """Agreement with hand-chosen caption phrases (``sample/panels/eval``), per split.

    Each case has ``caption``, ``phrases`` (caption label -> verbatim phrases describing only
    that panel), optionally ``labels`` (the caption's labels), ``shared``, ``no_panel`` and
    ``split`` ("tune", "holdout"; missing: "all"). With the split
    of the caption (``splitter``, default ``split_caption``) and after ``normalize_caption`` on
    both sides, a phrase is **found** when the text of its label (label matched
    case-insensitively) contains it, and **leaked** when the text of another label does (a
    panel and its sub-panels, ``CaptionSplit.parents``, are not other labels to each other, nor
    are labels that list the same phrase: "(b, c) pristine SnO2" describes both). A ``no_panel``
    phrase leaks when any panel's text contains it. ``label_set_exact`` is the share of captions
    with ``labels`` whose split names exactly those labels (case-insensitively); ``shared_in_preface`` the share of
    ``shared`` phrases the preface contains. ``misses`` lists each phrase not found, or leaked,
    as ``case: label: phrase``."""
    split_of = splitter or split_caption
    out: dict[str, dict] = {}
    for number, case in enumerate(cases):
        stats = out.setdefault(
            str(case.get("split") or "all"),
            {
                "captions": 0,
                "phrases": 0,
                "found": 0,
                "leaked": 0,
                "no_panel": 0,
                "no_panel_leaked": 0,
                "label_sets": 0,
                "label_sets_exact": 0,
                "shared": 0,
                "shared_in_preface": 0,
                "misses": [],
            },
        )
        name = case.get("id") or "#".join(str(case[k]) for k in ("source", "article", "fig_id") if case.get(k))
        name = name or str(number)
        split = split_of(case["caption"])
        texts = {label.casefold(): text for label, text in split.panels.items()}
        phrases = case.get("phrases") or {}
        stats["captions"] += 1
        if case.get("labels") is not None:
            stats["label_sets"] += 1
            stats["label_sets_exact"] += {x.casefold() for x in texts} == {str(x).casefold() for x in case["labels"]}
        listed: dict[str, set[str]] = {}
        for label, items in phrases.items():
            for phrase in items:
                listed.setdefault(normalize_caption(phrase), set()).add(str(label).casefold())
        for label, items in phrases.items():
            for phrase in items:
                phrase = normalize_caption(phrase)
                found = phrase in texts.get(str(label).casefold(), "")
                leaked = any(
                    phrase in text
                    for other, text in texts.items()
                    if other not in listed[phrase] and not _related(other, str(label), split.parents)
                )
                stats["phrases"] += 1
                stats["found"] += found
                stats["leaked"] += leaked
                if not found or leaked:
                    stats["misses"].append(f"{name}: {label}: {phrase}" + (" (leaked)" if leaked else ""))
        for phrase in case.get("no_panel") or []:
            phrase = normalize_caption(phrase)
            stats["no_panel"] += 1
            stats["no_panel_leaked"] += any(phrase in text for text in texts.values())
        for phrase in case.get("shared") or []:
            stats["shared"] += 1
            stats["shared_in_preface"] += normalize_caption(phrase) in split.preface
    for stats in out.values():
        stats["found_share"] = round(stats["found"] / stats["phrases"], 4) if stats["phrases"] else None
        stats["leaked_share"] = round(stats["leaked"] / stats["phrases"], 4) if stats["phrases"] else None
        stats["label_set_exact"] = (
            round(stats["label_sets_exact"] / stats["label_sets"], 4) if stats["label_sets"] else None
        )
        stats["shared_in_preface_share"] = (
            round(stats["shared_in_preface"] / stats["shared"], 4) if stats["shared"] else None
        )
    return out


def is_extractive(text: str | None, caption: str | None) -> bool:
    """Whether ``text`` is made of pieces of ``caption``, in caption order, joined by single
    spaces (after ``normalize_caption`` on both): what ``split_caption`` returns. Each piece is
    first taken as long as it still occurs after the previous one; where that greedy reading
    fails ("et al. et al. et al." from "et al. Reproduced ... et al. et al."), every way of
    cutting the words into pieces is tried, each piece ending as early in the caption as it can."""
    text, caption = normalize_caption(text), normalize_caption(caption)
    if text in caption:  # the empty text of a label that has none too
        return True
    words, i, at = text.split(" "), 0, 0
    while i < len(words):
        best = None
        for j in range(len(words), i, -1):
            k = caption.find(" ".join(words[i:j]), at)
            if k >= 0:
                best = (j, k + len(" ".join(words[i:j])))
                break
        if best is None:
            return _pieces_in_order(words, caption)
        i, at = best
    return True


def _pieces_in_order(words: list[str], caption: str) -> bool:
    """``is_extractive``'s full search: ``reach[i]`` is the earliest end in ``caption`` of the
    first ``i`` words taken as pieces in order (a longer piece is found only where its start is)."""
    reach: list[int | None] = [0] + [None] * len(words)
    for i in range(len(words)):
        if reach[i] is None:
            continue
        for j in range(i + 1, len(words) + 1):
            piece = " ".join(words[i:j])
            k = caption.find(piece, reach[i])
            if k < 0:
                break
            end = k + len(piece)
            if reach[j] is None or end < reach[j]:
                reach[j] = end
    return reach[-1] is not None


_STOP = frozenset("the and for with are was were this that from into their its than then these those which".split())


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", normalize_caption(text).lower()) if len(w) >= 3 and w not in _STOP}


def subcaption_agreement(
    cases: Iterable[dict], splitter: Callable[[str | None], CaptionSplit] | None = None, *, found: float = 0.8
) -> dict:
    """Agreement with subcaptions written by someone else (the NLM prostate subset of CompFigSep:
    per panel label, the caption text a reader gives that panel, shared sentences repeated under
    every label), where phrases were not chosen for this splitter.

    Each case has ``caption`` and ``subcaptions`` (label -> text; two labels or more). Words
    are lower-case runs of letters and digits of three characters or more, common words left
    out. A label's *own* words are those of its subcaption that not every subcaption has. A
    label is **right** when the text the splitter gives its panel (preface and own text;
    labels matched case-insensitively) holds at least ``found`` of its own words and at most
    1 - ``found`` of the words only other labels own; ``found_share`` counts the first test
    alone, ``leaked_share`` labels failing the second. Labels without own words (every label
    given the same text) are not scored."""
    split_of = splitter or split_caption
    out = {"figures": 0, "labels": 0, "right": 0, "found": 0, "leaked": 0, "missing": 0, "misses": []}
    for number, case in enumerate(cases):
        gold = {str(k).casefold(): _words(v) for k, v in case["subcaptions"].items()}
        if len(gold) < 2:
            continue
        common = set.intersection(*gold.values())
        own = {label: words - common for label, words in gold.items()}
        split = split_of(case["caption"])
        texts = {label.casefold(): text for label, text in split.panels.items()}
        out["figures"] += 1
        for label, words in own.items():
            if not words:
                continue
            others = set().union(*(own[o] for o in own if o != label)) - gold[label]
            given = _words(f"{split.preface} {texts[label]}") if label in texts else set()
            has = len(words & given) / len(words)
            leaks = len(others & given) / len(others) if others else 0.0
            out["labels"] += 1
            out["found"] += has >= found
            out["leaked"] += leaks > 1 - found
            out["missing"] += label not in texts
            right = has >= found and leaks <= 1 - found
            out["right"] += right
            if not right:
                out["misses"].append(f"{case.get('id', number)}: {label}: own words {has:.2f}, others' {leaks:.2f}")
    for key in ("right", "found", "leaked", "missing"):
        out[f"{key}_share"] = round(out[key] / out["labels"], 4) if out["labels"] else None
    return out


def caption_of(figure: dict) -> str:
    """Caption title and text joined by a space (the label, "Figure 2", carries no content)."""
    parts = [(figure.get("caption_title") or "").strip(), (figure.get("caption_text") or "").strip()]
    return " ".join(p for p in parts if p)
