"""The article context of one figure, fitted to a token budget for the VLM's refinement prompt.

Priority follows what tells most about the figure: the caption itself (always, never cut), the
paragraphs that cite the figure (the citing sentences first, then the rest of those paragraphs),
the title, the abstract, then the section titles. Units are whole sentences, titles or
paragraphs: a unit that does not fit is dropped, never cut mid-sentence, and later, smaller
units may still fit. The text keeps reading order whatever the order of selection.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pipelines.longcap.tokens import TextTokenizer, split_sentences
from pipelines.text.captions import normalize_caption

SOURCES = ("caption", "mentions", "title", "abstract", "sections")

# The parser's inline figure reference: "[Figure 1](fig:fig1)".
_MARKER = re.compile(r"\[([^\[\]]*)\]\(fig:([^()\s]*)\)")
# Without markers (text from elsewhere), a sentence cites "a figure" when it names one.
_FIGURE_WORD = re.compile(r"\bFig(?:ure)?s?\.?\s*S?\d", re.IGNORECASE)


@dataclass
class Context:
    """``sources``: what contributed (in priority order); ``dropped``: what did not fit, a
    source name when all of it was dropped, else "source (k of n sentences)"."""

    text: str
    sources: list[str]
    tokens: int
    dropped: list[str] = field(default_factory=list)


@dataclass
class _Unit:
    source: str
    block: int  # which block of its source (a paragraph); reading order
    position: int  # position in the block; reading order
    text: str


def strip_markers(text: str) -> str:
    """Text with the parser's figure markers replaced by what was printed ("Figure 1")."""
    return _MARKER.sub(lambda m: m.group(1), text)


def _cites(sentence: str, fig_id: str | None) -> bool:
    markers = _MARKER.findall(sentence)
    if markers:
        return fig_id is None or any(target == fig_id for _, target in markers)
    return bool(_FIGURE_WORD.search(sentence))


def _key(text: str) -> str:
    """Equality of paragraphs and sentences for dedupe: markers, case and spacing ignored."""
    return normalize_caption(strip_markers(text)).lower()


def _mention_units(mentions: list[dict], fig_id: str | None) -> tuple[list[_Unit], list[_Unit], list[str]]:
    """Citing sentences, other sentences (both in reading order), and each paragraph's section."""
    ordered = sorted(
        enumerate(mentions),
        key=lambda im: (im[1].get("paragraph_index") is None, im[1].get("paragraph_index") or 0, im[0]),
    )
    seen: set[str] = set()
    citing: list[_Unit] = []
    rest: list[_Unit] = []
    sections: list[str] = []
    for _, mention in ordered:
        text = mention.get("text") or ""
        key = _key(text)
        if not key or key in seen:
            continue
        seen.add(key)
        block = len(sections)
        sections.append(normalize_caption(mention.get("section")))
        for position, sentence in enumerate(split_sentences(text)):
            unit = _Unit("mentions", block, position, normalize_caption(strip_markers(sentence)))
            (citing if _cites(sentence, fig_id) else rest).append(unit)
    return citing, rest, sections


def _render(caption: str, chosen: list[_Unit], mention_sections: list[str]) -> str:
    """The context as sent: labelled blocks, sentences in reading order within each block."""
    parts = [f"Caption: {caption}"]
    by_source: dict[str, dict[int, list[_Unit]]] = {}
    for unit in chosen:
        by_source.setdefault(unit.source, {}).setdefault(unit.block, []).append(unit)
    paragraphs = by_source.get("mentions", {})
    if paragraphs:
        lines = []
        for block in sorted(paragraphs):
            text = " ".join(u.text for u in sorted(paragraphs[block], key=lambda u: u.position))
            section = mention_sections[block]
            lines.append(f"- ({section}) {text}" if section else f"- {text}")
        parts.append("Text citing the figure:\n" + "\n".join(lines))
    for source, label, joiner in (
        ("title", "Article title", " "),
        ("abstract", "Abstract", " "),
        ("sections", "Sections", "; "),
    ):
        units = [u for block in sorted(by_source.get(source, {})) for u in by_source[source][block]]
        if units:
            parts.append(f"{label}: " + joiner.join(u.text for u in sorted(units, key=lambda u: u.position)))
    return "\n\n".join(parts)


def assemble_context(
    caption: str,
    title: str | None,
    abstract: str | None,
    mentions: list[dict],
    sections: list[str] | None,
    tokenizer: TextTokenizer,
    budget: int,
    fig_id: str | None = None,
) -> Context:
    """Fill ``budget`` tokens (``tokenizer.count`` of the rendered text) greedily by priority.

    ``mentions`` are rows of the ``mentions`` table (section, text, paragraph_index); ``fig_id``
    picks the sentences whose figure marker names this figure (without it, any figure marker).
    The caption is always kept, even over budget: the model must see what it refines.
    """
    caption = normalize_caption(strip_markers(caption))
    citing, rest, mention_sections = _mention_units(mentions, fig_id)
    title_units = [_Unit("title", 0, 0, normalize_caption(title))] if normalize_caption(title) else []
    abstract_units = [_Unit("abstract", 0, i, s) for i, s in enumerate(split_sentences(abstract or ""))]
    section_names = list(dict.fromkeys(s for s in map(normalize_caption, sections or []) if s))
    section_units = [_Unit("sections", 0, i, s) for i, s in enumerate(section_names)]

    seen = {_key(s) for s in split_sentences(caption)}
    chosen: list[_Unit] = []
    offered: dict[str, int] = {}
    kept: dict[str, int] = {}
    abstract_closed = False
    for unit in [*citing, *rest, *title_units, *abstract_units, *section_units]:
        if _key(unit.text) in seen:
            continue
        offered[unit.source] = offered.get(unit.source, 0) + 1
        if unit.source == "abstract" and abstract_closed:
            continue
        if tokenizer.count(_render(caption, [*chosen, unit], mention_sections)) <= budget:
            chosen.append(unit)
            seen.add(_key(unit.text))
            kept[unit.source] = kept.get(unit.source, 0) + 1
        elif unit.source == "abstract":
            abstract_closed = True  # an abstract reads in order: no sentence after a gap
    text = _render(caption, chosen, mention_sections)
    sources = ["caption", *(s for s in SOURCES[1:] if kept.get(s))]
    dropped = [_dropped(s, kept.get(s, 0), offered[s]) for s in SOURCES[1:] if offered.get(s, 0) > kept.get(s, 0)]
    return Context(text=text, sources=sources, tokens=tokenizer.count(text), dropped=dropped)


def _dropped(source: str, kept: int, offered: int) -> str:
    if kept == 0:
        return source
    unit = "titles" if source == "sections" else "sentences"
    return f"{source} ({offered - kept} of {offered} {unit})"
