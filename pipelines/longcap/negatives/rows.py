"""The ``pair_negatives`` and ``negative_items`` rows of region pairs, from the rules and the VLM."""

from __future__ import annotations

from pipelines.longcap.negatives.gate import Negative, _normal, is_contradiction
from pipelines.longcap.negatives.rules import rule_negatives
from pipelines.longcap.negatives.vlm import vlm_negatives
from pipelines.vlm.metering import MeteredEngine


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
