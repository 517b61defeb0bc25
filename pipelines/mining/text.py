"""Each panel's caption text, its description, and which panels region mining looks into.

The caption split of the panel stage (rules, extractive by construction) comes first; the VLM is
asked only about the panels the rules left without text, and what it answers is kept only if it
is a verbatim piece of the caption. A model asked to "copy" paraphrases often enough that an
unchecked answer would put invented caption text into the training data.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache

from PIL import Image

from pipelines.core.taxonomy import TAXONOMY_FILE
from pipelines.images.boxes import Panel
from pipelines.text.captions import CaptionSplit, is_extractive, normalize_caption, split_caption
from pipelines.text.pairing import NONE, VLM, assign_captions
from pipelines.vlm import prompts
from pipelines.vlm.engine import VlmEngine
from pipelines.vlm.grounding import parse_json

CAPTION_SPLIT = "caption_split"


@dataclass(frozen=True)
class PanelText:
    """One panel's own caption text. ``source``: "caption_split" (the rules), "vlm" (asked the
    model), None (nobody could give one; ``reason`` says why). ``extractive``: ``text`` is made
    of pieces of the normalised caption (``captions.is_extractive``; always, when ``text`` is
    set). ``match``: how the text was matched to the panel (``pipelines.text.pairing``: label,
    order, vlm, none); ``count_agreement``: the figure's panels against the caption's labels."""

    panel_index: int
    label: str | None
    text: str | None
    source: str | None
    extractive: bool
    reason: str | None = None
    match: str = NONE
    count_agreement: str | None = None


def panel_texts(
    panels: Sequence[Panel],
    caption: str | None,
    split: CaptionSplit | None,
    engine: VlmEngine | None,
    key: str = "",
) -> list[PanelText]:
    """The text of every panel, in the order given (the i-th panel has ``panel_index`` i); ``key``
    names the figure in the request's id (``<key>|associate``), as every mining request does.

    The panels (boxes and printed labels) are paired with ``split`` (or ``split_caption(caption)``
    when None) by ``pairing.assign_captions``. A panel with text is done. The others with a
    label are asked about in one ASSOCIATE request (none when every panel has text, or no engine
    is given); an unlabelled one cannot be asked about: it keeps no text (the pairing says why)."""
    normalized = normalize_caption(caption)
    split = split if split is not None else split_caption(caption)
    rows = assign_captions(panels, split)
    out: dict[int, PanelText] = {}
    residual: list[tuple[int, str]] = []
    for index, row in enumerate(rows):
        label, text, agreement = row["label"], row["text"], row["count_agreement"]
        if text:
            extractive = is_extractive(text, normalized)
            out[index] = PanelText(index, label, text, CAPTION_SPLIT, extractive, None, row["match"], agreement)
        elif not label:
            why = f"no caption text: {row['match_detail']}" if row["match_detail"] else "no caption text and no label"
            out[index] = PanelText(index, label, None, None, False, why, NONE, agreement)
        elif engine is None or not normalized:
            why = "no caption" if not normalized else f"no caption text ({row['match_detail']}); no engine to ask"
            out[index] = PanelText(index, label, None, None, False, why, NONE, agreement)
        else:
            residual.append((index, label))
    if residual:
        agreement = rows[0]["count_agreement"]
        for index, answer in _associate(engine, normalized, residual, key).items():
            out[index] = replace(answer, match=VLM if answer.text else NONE, count_agreement=agreement)
    return [out[index] for index in range(len(rows))]


def _associate(engine: VlmEngine, caption: str, residual: list[tuple[int, str]], key: str = "") -> dict[int, PanelText]:
    """One ASSOCIATE request for the residual panels; each answer kept only if extractive."""
    labels = ", ".join(label for _, label in residual)
    request = prompts.ASSOCIATE.request(f"{key}|associate" if key else "associate", caption=caption, labels=labels)
    (response,) = engine.generate([request])

    def failed(why: str) -> dict[int, PanelText]:
        return {index: PanelText(index, label, None, VLM, False, why) for index, label in residual}

    if response.error or response.text is None:
        return failed(f"request failed: {response.error or 'no text'}")
    parsed = parse_json(response.text)
    if parsed.value is None:
        return failed(parsed.error or "no JSON in answer")
    answers = _answers(parsed.value)
    if answers is None:
        return failed("answer has no list of panels")
    out = {}
    for index, label in residual:
        text = answers.get(label.casefold())
        out[index] = _checked(index, label, text, caption, parsed.truncated)
    return out


def _answers(value: object) -> dict[str, str] | None:
    """label (casefolded) -> text from ``{"panels": [...]}`` or a bare list; the first answer
    for a label wins."""
    items = value.get("panels") if isinstance(value, dict) else value
    if isinstance(value, dict) and "label" in value:
        items = [value]
    if not isinstance(items, list):
        return None
    answers: dict[str, str] = {}
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("text"), str) and item.get("label") is not None:
            answers.setdefault(str(item["label"]).strip().strip("()[]").casefold(), item["text"])
    return answers


def _checked(index: int, label: str, text: str | None, caption: str, truncated: bool) -> PanelText:
    """The extractive check: after the caption's whitespace normalisation, the answer must occur
    in the caption exactly (case-sensitive)."""
    if text is None:
        why = "not in the answer (cut off)" if truncated else "not in the answer"
        return PanelText(index, label, None, VLM, False, why)
    piece = normalize_caption(text)
    if not piece:
        return PanelText(index, label, None, VLM, False, "the model found no text for it")
    if piece not in caption:
        return PanelText(index, label, None, VLM, False, "not extractive")
    return PanelText(index, label, piece, VLM, True)


# --- descriptions ---------------------------------------------------------------------------


def describe_panels(
    engine: VlmEngine, crops: Sequence[Image.Image], texts: Sequence[str | None]
) -> list[tuple[str | None, str | None]]:
    """(description, error) per crop, asked in one ``generate`` call (the engine batches)."""
    if len(crops) != len(texts):
        raise ValueError(f"{len(crops)} crops but {len(texts)} texts")
    if not crops:
        return []
    requests = [
        prompts.DESCRIBE_PANEL.request(f"describe/{i}", [crop], text=text or "")
        for i, (crop, text) in enumerate(zip(crops, texts, strict=True))
    ]
    by_id = {r.id: r for r in engine.generate(requests)}
    out: list[tuple[str | None, str | None]] = []
    for request in requests:
        response = by_id.get(request.id)
        if response is None:
            out.append((None, "no response"))
        elif response.error or response.text is None:
            out.append((None, f"request failed: {response.error or 'no text'}"))
        else:
            out.append(_description(response.text))
    return out


def _description(text: str) -> tuple[str | None, str | None]:
    parsed = parse_json(text)
    if parsed.value is None:
        return None, parsed.error or "no JSON in answer"
    value = parsed.value
    description = value.get("description") if isinstance(value, dict) else None
    if not isinstance(description, str) or not description.strip():
        return None, "answer has no description"
    return re.sub(r"\s+", " ", description).strip(), None


# --- the classifier gate --------------------------------------------------------------------

TAXONOMY = TAXONOMY_FILE
# Panel2Patch mined regions only in photographic panels: a region of a bar chart or a diagram
# is not an object a caption phrase points at.
NOT_PHOTOGRAPHIC = (
    "Plots and Charts",
    "Tables",
    "Illustrative Diagrams",
    "Graph and Network",
    "Scientific Formulae and Equations",
)


@cache
def _local_concepts() -> dict[str, str]:
    """local concept (casefolded) -> its global concept, from the taxonomy."""
    taxonomy = json.loads(TAXONOMY.read_text())
    return {local.casefold(): glob for glob, locals_ in taxonomy["local_concepts"].items() for local in locals_}


def gate(concept: str | None, allowed: tuple[str, ...] | None = None) -> bool:
    """Whether region mining looks into a panel of this concept.

    ``concept`` is a concept label of the taxonomy: a global concept ("Microscopy", the
    ``figure_concepts.global_concept`` column) or a local one ("bar chart"), which stands for
    its global concept. (``figure_concepts.panel_type`` only says single or multiple panels and
    whether they hold imaging, so it cannot tell a chart from a photograph.)

    ``allowed`` None: every concept passes but the non-photographic ones (``NOT_PHOTOGRAPHIC``);
    a tuple: only those concepts (global or local, case-insensitive) pass. Unknown (None)
    always passes: no label is no evidence against mining."""
    if concept is None or not concept.strip():
        return True
    name = concept.strip().casefold()
    glob = _local_concepts().get(name, concept.strip()).casefold()
    if allowed is None:
        return glob not in {c.casefold() for c in NOT_PHOTOGRAPHIC}
    wanted = {a.casefold() for a in allowed}
    return name in wanted or glob in wanted
