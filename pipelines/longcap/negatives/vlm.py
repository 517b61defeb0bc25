"""Negatives from the VLM: one batched request per chunk of region texts, each answer gated like
the rule negatives; an unusable answer is a reason of its item, an outage propagates."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipelines.core.fingerprints import fingerprint
from pipelines.longcap.negatives.gate import VLM, Negative, _normal, rejection
from pipelines.longcap.negatives.lexicon import KINDS
from pipelines.text.captions import normalize_caption
from pipelines.vlm.engine import VlmEngine
from pipelines.vlm.grounding import parse_json
from pipelines.vlm.prompt import Prompt

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
