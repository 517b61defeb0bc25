"""Caption clauses that tie a visual marker to a meaning: the proposals of mark-guided region
mining. "Arrows indicate the lesion" says that the region an arrow points at *is* a lesion,
so the model is asked to locate it (``LOCATE_REGION``) and the crop gets that text.

Rules only, deterministic and extractive: every clause and target is a verbatim substring of
the text passed in, with its offsets, so a region's text can be traced back to its caption.
Pass ``normalize_caption(caption)`` (or a panel's text from ``split_caption``, which is already
normalised) to have offsets into the text the rest of the pipeline stores.

The forms read, each anchored on a marker noun phrase ("the red arrows", "dashed circle",
"asterisks (*)", "the arrow in D"):

* active: ``Arrowheads point to the nuclei``, ``with a red arrow indicating the T-bar``,
  ``An arrow and an asterisk indicate the probe and the complex, respectively`` (one phrase each);
* passive: ``Nucleophilic sites are indicated by an arrow``;
* parenthetical: ``SGs (arrowheads)``, ``the lesion (B, red arrows)``, ``necrosis (*)``, ``(see arrows)``,
  ``the mask misses the hippocampus (indicated by red arrows)`` (the clause before it is the target);
* legend: ``red arrows: apoptotic cells``, ``* = genes in several categories``;
* marked area: ``the boxed area is magnified in B``.

What is *not* a region marker is left out on purpose: significance asterisks and hashes
(``*p < 0.05``, ``**P<0.01``, "asterisks denote significant differences"), plot glyphs
(``open circles``, ``filled triangles``), box plots and words that merely contain a marker
(``DEAD-box``, ``narrow``). False proposals cost a model call each and can mislabel a crop;
missed ones only cost recall, so the rules lean to precision.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from pipelines.text.captions import open_bracket

MARKERS = ("arrow", "arrowhead", "asterisk", "box", "circle", "other")


@dataclass(frozen=True)
class MarkerPhrase:
    """One marker-meaning clause. ``clause`` is ``text[start:end]``; ``target`` is the noun
    phrase the marker refers to (a verbatim substring of ``clause``, best effort, may be "")."""

    marker: str
    colour: str | None
    clause: str
    start: int
    end: int
    target: str


# --- vocabulary -----------------------------------------------------------------------------

_WORD_KIND = [
    (r"arrow[- ]?heads?", "arrowhead"),
    (r"arrows?", "arrow"),
    (r"asterisks?", "asterisk"),
    (r"box(?:es)?|rectangles?|squares?", "box"),
    (r"circles?|ovals?|ellipses?", "circle"),
    (r"stars?|triangles?|daggers?|crosses|cross|chevrons?|hash(?:es)?|pound signs?", "other"),
]
_SYMBOL_KIND = [
    (r"\*{1,4}", "asterisk"),
    (r"→|←|↑|↓|➤|►|▶|◄|◀", "arrow"),
    (r"#{1,3}|†{1,3}|‡{1,3}|§|★|☆|▲|△|▼|▽|◆|◇", "other"),
]
_COLOURS = (
    "red|green|blue|yellow|white|black|orange|purple|violet|magenta|cyan|pink|grey|gray|brown|turquoise|gold|golden"
)
_MOD = (
    rf"(?:(?:light|dark|bright|pale)[- ])?(?:{_COLOURS})|dashed|dotted|broken|solid|open|closed|close|filled|"
    r"hollow|empty|shaded|thin|thick|small|large|big|long|short|curved|straight|double|double-headed|"
    r"single|upper|lower|left|right|top|bottom|horizontal|vertical|white-outlined|[a-z]+-headed"
)
_DET = r"the|a|an|these|those|this|each|both|two|three|four|all"
_WORD = "|".join(f"(?:{p})" for p, _ in _WORD_KIND)
_SYMBOL = "|".join(f"(?:{p})" for p, _ in _SYMBOL_KIND)
# "in D", "in panel B", "in (A)", "in A and C"
_WHERE = r"(?:\s+in\s+(?:panels?\s+)?\(?[A-Za-z]?\d{0,2}\)?(?:\s*(?:,|and|-)\s*\(?[A-Za-z]?\d{0,2}\)?)*(?![\w]))?"
# One marker noun phrase. The named groups are read from a match of _NP alone; the same text
# without names is used inside larger patterns.
_NP_BODY = rf"(?:(?:{_DET})\s+)?((?:(?:{_MOD})[\s-]+){{0,3}})({_WORD})(?![\w-])(?:\s*\(\s*({_SYMBOL})\s*\))?{_WHERE}"
_NP = re.compile(_NP_BODY, re.IGNORECASE)
_NP_PLAIN = re.sub(r"(?<!\\)\((?!\?)", "(?:", _NP_BODY)  # the same, its groups unnamed
_SUBJECT = rf"(?:{_NP_PLAIN}|(?:{_SYMBOL}))(?:(?:\s*,\s*(?:and\s+)?|\s+and\s+)(?:{_NP_PLAIN}|(?:{_SYMBOL}))){{0,5}}"

_ACTIVE_VERB = (
    r"(?:are\s+|is\s+)?(?:indicat(?:es?|ed|ing)|marks?|marked|marking|points?\s+(?:to(?:wards?)?|at|out)|"
    r"pointed\s+(?:to(?:wards?)?|at)|pointing\s+(?:to(?:wards?)?|at|out)|denot(?:es?|ed|ing)|"
    r"highlight(?:s|ed|ing)?|outlin(?:es?|ed|ing)|delineat(?:es?|ed|ing)|designat(?:es?|ed|ing)|"
    r"identif(?:y|ies|ied|ying)|depict(?:s|ed|ing)?|shows?|showing|locat(?:es?|ing)|enclos(?:es?|ing)|"
    r"surround(?:s|ing)?|encircl(?:es?|ing)|demarcat(?:es?|ed|ing)|label(?:s|ling|ing)?)(?![\w-])"
)
_PASSIVE_VERB = (
    r"(?:indicated|marked|highlighted|denoted|outlined|delineated|designated|identified|shown|depicted|"
    r"pointed\s+(?:to|at)|enclosed|surrounded|encircled|demarcated|labell?ed|located)"
)
_ACTIVE = re.compile(rf"(?P<subject>{_SUBJECT})\s+(?P<verb>{_ACTIVE_VERB})\s*(?::\s*)?", re.IGNORECASE)
_PASSIVE = re.compile(
    rf"(?<!\bas)(?P<be>\s+(?:is|are|was|were|being|as)\s+|\s*,?\s+)(?:(?:also|each|respectively)\s+)?"
    rf"{_PASSIVE_VERB}"
    rf"\s+(?:by|with)\s+(?P<np>{_NP_PLAIN}|{_SYMBOL})",
    re.IGNORECASE,
)
# "(arrow)", "(B, red arrows)", "(see arrows)"; "(indicated by red arrow)" is a reduced passive
# clause, which may say what the whole clause before it shows, not just the last noun.
_PAREN = re.compile(
    r"\(\s*(?:[A-Za-z]\d?(?:\s*[-,]\s*[A-Za-z]\d?)*\s*[,;:]\s*)?"
    rf"(?:see\s+|(?P<passive>(?:as\s+)?{_PASSIVE_VERB}\s+(?:by|with)\s+))?(?P<np>{_NP_PLAIN}|{_SYMBOL})\s*\)",
    re.IGNORECASE,
)
_LEGEND = re.compile(rf"(?P<np>{_NP_PLAIN}|{_SYMBOL})\s*(?::|=|,(?=\s))\s*(?=\S)", re.IGNORECASE)
_MARKED_AREA = re.compile(
    rf"(?:(?:{_DET})\s+)?(?:(?:{_MOD})[\s-]+){{0,2}}(?P<adj>boxed|circled|encircled|outlined|framed)\s+"
    r"(?!(?:in|by|with|on|at|and|or|is|are)\b)[A-Za-z][\w-]*",
    re.IGNORECASE,
)
_AREA_MARKED = re.compile(
    rf"(?:(?:{_DET})\s+)?(?:[A-Za-z][\w-]*\s+)?(?:areas?|regions?|fields?|portions?|parts?|zones?|sections?)\s+"
    r"(?P<adj>boxed|circled|encircled|outlined|framed)(?![\w-])",
    re.IGNORECASE,
)
_SYMBOL_RE = re.compile(_SYMBOL)
_COLOUR_RE = re.compile(rf"\b(?:{_COLOURS})\b", re.IGNORECASE)

# Statistics, not regions: a symbol directly before a p value, or an asterisk/hash/dagger
# clause that speaks of significance.
_STAT_AFTER = re.compile(r"\s*[,:]?\s*(?:p|P)\s*(?:[<>=≤≥]|value)|\s*[<>=≤≥]\s*0?\.\d")
_STAT_CLAUSE = re.compile(
    r"\bp\s*[<>=≤≥]|\bp[- ]values?\b|significan|\bn\.\s?s\.|\bcompared\s+(?:to|with)\b|\bvs\.?\s", re.IGNORECASE
)
# Plot glyphs: a filled or open circle/triangle/square is a data point, not a pointer.
_GLYPH_MODS = re.compile(r"\b(?:open|closed|close|filled|hollow|empty|shaded|solid)\b", re.IGNORECASE)
_BOX_PLOT_CLAUSE = re.compile(r"whisker|percentile|quartile|\bIQR\b|\bmedian\b", re.IGNORECASE)
# In a legend ("squares = WT, triangles = KO") a shape is a plot symbol unless drawn as a line.
_SHAPE = re.compile(r"squares?|triangles?|circles?|ovals?|ellipses?|stars?|diamonds?|cross(?:es)?", re.IGNORECASE)
_LINE_STYLE = re.compile(r"\b(?:dashed|dotted|broken)\b", re.IGNORECASE)
_NOT_BOX = re.compile(r"\s*(?:-\s*and\s*-\s*whisker|and\s+whisker|plots?\b|-?whisker)", re.IGNORECASE)

# Words that end a best-effort noun phrase read backwards from a parenthesis.
_STOP_BACK = frozenset(
    "is are was were be been being and or but with by in on at to from for of into onto where which that while "
    "whereas than as also note shows show showed displayed display displays contains contain "
    "reveals reveal revealed express expresses expressed exhibit exhibits see".split()
)
_MAX_CLAUSE = 400
_JOIN = re.compile(r"(?:,\s*(?:and\s+|while\s+|whereas\s+)?|\s+(?:and|while|whereas|but)\s+)")
_DETERMINERS = frozenset("the a an these those this that each both".split())
_SENTENCE_END = re.compile(r"[.!?](?=\s+[A-Z(\[]|\(|$)|;|\s\((?:[A-Za-z]\d?|[ivx]{1,4})\)\s+(?=[A-Z])")
_LABEL_END = re.compile(r"\(\s*[A-Za-z]\d?(?:\s*[-,]\s*[A-Za-z]\d?)*\s*\)$")
_LABEL_PREFIX = re.compile(r"\s*(?:\(\s*[A-Za-z]\d?(?:\s*[-,]\s*[A-Za-z]\d?)*\s*\)\s*)+")


# --- public ---------------------------------------------------------------------------------


def find_marker_phrases(text: str | None) -> list[MarkerPhrase]:
    """Every marker-meaning clause in ``text``, in order of the marker's position; one phrase
    per marker mention, the most specific form winning (active, passive, marked area, legend,
    parenthetical)."""
    if not text:
        return []
    found: list[tuple[tuple[int, int], MarkerPhrase]] = []
    for finder in (_active, _passive, _marked_area, _legend, _parenthetical):
        for span, phrase in finder(text):
            if not any(_overlaps(span, other) for other, _ in found) and not _statistical(phrase):
                found.append((span, phrase))
    found.sort(key=lambda f: f[0])
    return [phrase for _, phrase in found]


# --- forms ----------------------------------------------------------------------------------

Found = list[tuple[tuple[int, int], MarkerPhrase]]


def _active(text: str) -> Found:
    """``[lead] SUBJECT VERB TARGET``: the marker is the subject of the clause."""
    out: Found = []
    for m in _ACTIVE.finditer(text):
        if not _at_lead(text, m.start()):
            continue
        markers = list(_markers_in(text, m.start("subject"), m.end("subject")))
        if not markers:
            continue
        end = _clause_end(text, m.end())
        target_text, target_start = _trim(text, m.end(), end)
        targets = _respectively(target_text, target_start, len(markers))
        for (span, kind, colour, usable), (t_start, t_end) in zip(markers, targets, strict=True):
            if usable:
                phrase = MarkerPhrase(kind, colour, text[m.start() : end], m.start(), end, text[t_start:t_end])
                out.append((span, phrase))
    return out


def _passive(text: str) -> Found:
    """``TARGET is indicated by MARKER``: the target runs back to the clause start."""
    out: Found = []
    for m in _PASSIVE.finditer(text):
        markers = list(_markers_in(text, m.start("np"), m.end("np")))
        if len(markers) != 1 or not markers[0][3]:
            continue
        span, kind, colour, _ = markers[0]
        t_start, t_end = _back_to_clause_start(text, m.start())
        if t_end <= t_start:
            continue
        out.append((span, MarkerPhrase(kind, colour, text[t_start : m.end()], t_start, m.end(), text[t_start:t_end])))
    return out


def _parenthetical(text: str) -> Found:
    """``the lesion (arrow)``: the target is the few words before the parenthesis. After
    ``(indicated by an arrow)`` it is the clause back to its start, as for a passive: "portions
    lie outside the mask (indicated by red arrow)" marks the portions, not the mask."""
    out: Found = []
    floor = 0  # a clause does not run back over the previous marker's parenthesis
    for m in _PAREN.finditer(text):
        markers = list(_markers_in(text, m.start("np"), m.end("np")))
        if len(markers) != 1 or not markers[0][3]:
            continue
        span, kind, colour, _ = markers[0]
        if m.group("passive"):
            t_start, t_end = _back_to_clause_start(text, m.start(), floor)
        else:
            t_start, t_end = _words_back(text, m.start())
        start = t_start if t_end > t_start else m.start()
        out.append((span, MarkerPhrase(kind, colour, text[start : m.end()], start, m.end(), text[t_start:t_end])))
        floor = m.end()
    return out


def _legend(text: str) -> Found:
    """``red arrows: apoptotic cells`` or ``* = genes in several categories``, at a clause start."""
    out: Found = []
    for m in _LEGEND.finditer(text):
        if not _at_lead(text, m.start(), allow_words=False):
            continue
        markers = list(_markers_in(text, m.start("np"), m.end("np")))
        if len(markers) != 1 or not markers[0][3]:
            continue
        span, kind, colour, _ = markers[0]
        if _SHAPE.fullmatch(text[span[0] : span[1]]) and not _LINE_STYLE.search(m.group("np")):
            continue
        end = _legend_end(text, m.end())
        target, _ = _trim(text, m.end(), end)
        if not target:
            continue
        phrase = MarkerPhrase(kind, colour, text[m.start() : end], m.start(), end, target)
        out.append((span, phrase))
    return out


def _marked_area(text: str) -> Found:
    """``the boxed area is magnified in B``, ``the region boxed in A``: the marked area is itself
    the target."""
    out: Found = []
    for pattern in (_MARKED_AREA, _AREA_MARKED):
        for m in pattern.finditer(text):
            if not _at_lead(text, m.start()) and not _after_preposition(text, m.start()):
                continue
            adj = m.group("adj").lower()
            kind = {"boxed": "box", "framed": "box", "outlined": "other"}.get(adj, "circle")
            end = _clause_end(text, m.end())
            colour = _colour(text[m.start() : m.start("adj")])
            span = (m.start("adj"), m.end("adj"))
            target = text[m.start() : m.end() if pattern is _MARKED_AREA else m.start("adj")].rstrip()
            out.append((span, MarkerPhrase(kind, colour, text[m.start() : end], m.start(), end, target)))
    return out


# --- helpers --------------------------------------------------------------------------------


def _markers_in(text: str, start: int, end: int) -> Iterator[tuple[tuple[int, int], str, str | None, bool]]:
    """Each marker in ``text[start:end]`` (a subject may coordinate several): its span, kind,
    colour and whether it is usable as a region marker (not a plot glyph, not a box plot)."""
    pos = start
    while pos < end:
        m = _NP.match(text, pos, end) if not _SYMBOL_RE.match(text, pos) else None
        if m and m.end() <= end:
            mods, word = m.group(1) or "", m.group(2)
            kind = _kind_of_word(word)
            usable = not (kind in ("circle", "box", "other") and _GLYPH_MODS.search(mods))
            usable = usable and not (kind == "box" and _NOT_BOX.match(text, m.end(2)))
            yield (m.start(2), m.end()), kind, _colour(mods), usable  # the span covers "(*)" and "in D"
            pos = m.end()
        else:
            s = _SYMBOL_RE.match(text, pos)
            if s:
                yield (s.start(), s.end()), _kind_of_symbol(s.group()), None, not _STAT_AFTER.match(text, s.end())
                pos = s.end()
            else:
                pos += 1


def _kind_of_word(word: str) -> str:
    return next(kind for pattern, kind in _WORD_KIND if re.fullmatch(pattern, word, re.IGNORECASE))


def _kind_of_symbol(symbol: str) -> str:
    return next(kind for pattern, kind in _SYMBOL_KIND if re.fullmatch(pattern, symbol))


def _colour(mods: str) -> str | None:
    m = _COLOUR_RE.search(mods)
    if not m:
        return None
    colour = m.group().lower()
    return "grey" if colour == "gray" else colour


def _at_lead(text: str, pos: int, allow_words: bool = True) -> bool:
    """Whether a clause can begin at ``pos``: the text start, after punctuation or a panel
    label, or (``allow_words``) after a conjunction such as "and" or "with"."""
    before = text[:pos].rstrip()
    if not before or before[-1] in ".;:!?([,":
        return True
    if _LABEL_END.search(before):
        return True
    if allow_words:
        word = re.search(r"(\w+)$", before)
        return bool(word) and word.group(1).lower() in ("and", "with", "while", "whereas", "where", "but", "whilst")
    return False


def _after_preposition(text: str, pos: int) -> bool:
    word = re.search(r"(\w+)\s*$", text[:pos])
    return bool(word) and word.group(1).lower() in ("of", "in", "shows", "show", "from", "to", "within")


def _clause_end(text: str, pos: int) -> int:
    """Where the clause that goes on at ``pos`` ends: a sentence end or semicolon, a panel label
    starting the next sentence, or another marker clause joined by "and"/",". A clause is at
    most ``_MAX_CLAUSE`` characters: it bounds the work on run-on text, and a longer "target" is
    not a noun phrase anyway."""
    limit = min(len(text), pos + _MAX_CLAUSE)
    m = _SENTENCE_END.search(text, pos, limit)
    end = m.start() if m else limit
    for j in _JOIN.finditer(text, pos, end):
        a = _ACTIVE.match(text, j.end(), end)
        if a and any(u for *_, u in _markers_in(text, a.start("subject"), a.end("subject"))):
            return j.start()
    return end


def _legend_end(text: str, pos: int) -> int:
    """A legend entry ends at the clause end or at the next legend entry (``; arrowheads: ...``)."""
    end = _clause_end(text, pos)
    nxt = re.search(r"[,;]\s+(?=" + _NP_PLAIN + r"\s*[:=])", text[pos:end], re.IGNORECASE)
    return pos + nxt.start() if nxt else end


def _trim(text: str, start: int, end: int) -> tuple[str, int]:
    """``text[start:end]`` without surrounding spaces and trailing punctuation."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and (text[end - 1].isspace() or text[end - 1] in ",:"):
        end -= 1
    return text[start:end], start


def _respectively(target: str, start: int, n: int) -> list[tuple[int, int]]:
    """``X and Y, respectively`` shared out over ``n`` coordinated markers; the whole target
    for each when it does not split into ``n`` parts."""
    whole = (start, start + len(target))
    if n == 1:
        m = re.search(r",?\s*respectively$", target)
        return [(start, start + m.start())] if m else [whole]
    m = re.search(r",?\s*respectively$", target)
    if not m:
        return [whole] * n
    body = target[: m.start()]
    cuts = [c for c in re.finditer(r"\s*,\s*(?:and\s+)?|\s+and\s+", body) if _paren_depth(body, c.start()) == 0]
    if len(cuts) != n - 1:
        return [(start, start + m.start())] * n
    parts, pos = [], 0
    for c in cuts:
        parts.append((start + pos, start + c.start()))
        pos = c.end()
    parts.append((start + pos, start + len(body)))
    return parts


def _paren_depth(text: str, pos: int) -> int:
    return text[:pos].count("(") - text[:pos].count(")")


def _back_to_clause_start(text: str, pos: int, floor: int = 0) -> tuple[int, int]:
    """The span from the start of the clause that ends at ``pos`` (a sentence or semicolon,
    or a comma when that leaves some words), without a leading panel label or conjunction."""
    end = pos
    while end > 0 and text[end - 1].isspace():
        end -= 1
    head = text[max(floor, end - _MAX_CLAUSE) : end]
    offset = end - len(head)
    sentence = max(head.rfind(". "), head.rfind("; "), open_bracket(head), head.rfind(": "), head.rfind(".("))
    start = sentence + 1 if sentence >= 0 else 0
    if head[start : start + 1] == " ":
        start += 1
    comma = head.rfind(", ", start)
    if comma >= 0 and re.search(r"\w", head[comma + 2 :]):
        start = comma + 2
    start += offset
    label = _LABEL_PREFIX.match(text, start)
    if label:
        start = label.end()
    conj = re.match(r"(?:and|while|whereas|but|where)\s+", text[start:end], re.IGNORECASE)
    if conj:
        start += conj.end()
    while start < end and text[start].isspace():
        start += 1
    return start, end


def _words_back(text: str, pos: int, limit: int = 5) -> tuple[int, int]:
    """The noun phrase just before ``pos``, best effort: words back to a determiner (included),
    punctuation, or a verb or preposition from a short list, at most ``limit`` words."""
    end = pos
    while end > 0 and text[end - 1].isspace():
        end -= 1
    start = end
    words = 0
    window = max(0, end - 120)
    words_re = r"[^\s,;:.()\[\]]+(?:\([^\s()]*\)[^\s,;:.()\[\]]*)*"
    for w in reversed(list(re.compile(words_re).finditer(text, window, end))):
        gap = text[w.end() : start]
        if w.end() != start and not gap.isspace():
            break
        if w.group().lower() in _STOP_BACK or words >= limit:
            break
        start = w.start()
        words += 1
        if w.group().lower() in _DETERMINERS:
            break  # a determiner opens the noun phrase
    return start, end


def _statistical(phrase: MarkerPhrase) -> bool:
    """Markers of a statistic, not of a place in the image: asterisks, hashes and daggers that
    mark significance, and the boxes of a box plot."""
    if phrase.marker in ("asterisk", "other"):
        return bool(_STAT_CLAUSE.search(phrase.clause))
    if phrase.marker == "box":
        return bool(_BOX_PLOT_CLAUSE.search(phrase.clause))
    return False


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]
