"""What in a release was made by a synthetic model, said plainly on the card and on every plot.

The demo and the tests build releases with tiny randomly initialised models: DINOv2 for the
concept labels, DAB-DETR for panel boxes, Qwen2.5-VL for panel and region texts and for long
captions. Their outputs have the shape of the real thing and none of its meaning (a random VLM
describes a panel as "ifi"), so a release holding any of them must say which parts they are and
how many samples they touch; a reader who sees one plot or one page of the card sees the mark.

Every count here is over what the release ships (included samples); the flags are the ones each
stage stored with its rows (``synthetic`` / ``labels_from_synthetic_model``).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from pipelines.core.lake import Lake
from pipelines.core.panel_methods import CONSENSUS, DECISION, DETR, XYCUT
from pipelines.core.schemas import Table

MARK = "SYNTHETIC TEST BUILD"


@dataclass
class SyntheticParts:
    """Sentences, one per synthetic part (empty: nothing synthetic), and a short list of the parts
    for a plot's footer."""

    parts: list[str] = field(default_factory=list)
    short: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.parts)

    def footer(self) -> str:
        """Two lines for a plot: the mark, and what is synthetic."""
        return f"{MARK} (tiny random models):\n" + ", ".join(self.short)


def _rows(lake: Lake, table: str, release: str, columns: list[str]):
    for shard in lake.shards():
        found = lake.read_table(table, release, shard)
        if found is not None:
            yield from found.select(columns).to_pylist()


def _of(n: int, total: int) -> str:
    return f"{n:,} of {total:,}"


def synthetic_parts(lake: Lake, release: str) -> SyntheticParts:
    """The synthetic parts of ``release`` as the lake holds it now."""
    out = SyntheticParts()
    figures = labelled = 0
    for row in _rows(lake, Table.SAMPLES, release, ["status", "meta_json"]):
        if row["status"] == "included":
            figures += 1
            labelled += bool(json.loads(row["meta_json"])["labels_from_synthetic_model"])
    if labelled:
        out.parts.append(
            f"**Concept labels** (`global_concept`, `local_concepts`, `panel_type`) of {_of(labelled, figures)} "
            "figures come from a tiny randomly initialised model, not DINOv2: they are placeholders."
        )
        out.short.append("concept labels")
    split = [r for r in _rows(lake, Table.PANEL_FIGURES, release, ["synthetic"]) if r["synthetic"]]
    if split:
        methods = Counter(r["method"] for r in _rows(lake, Table.PANELS, release, ["method"]))
        kept = methods[DETR] + methods[CONSENSUS]
        out.parts.append(
            f"**Panel detector**: {len(split):,} figures were also run through a tiny randomly initialised "
            f"DAB-DETR; {_of(kept, sum(methods.values()))} panels kept its boxes (`method` `{DETR}` or "
            f"`{CONSENSUS}`: noise), the others are the weight-free split's (`{DECISION}` or `{XYCUT}`)."
        )
        if kept:
            out.short.append("panel boxes")
    levels: dict[str, Counter] = {}
    for row in _rows(lake, Table.PAIR_SAMPLES, release, ["level", "status", "meta_json"]):
        if row["status"] != "included":
            continue
        meta = json.loads(row["meta_json"])
        seen = levels.setdefault(row["level"], Counter())
        seen["samples"] += 1
        if meta.get("synthetic"):
            seen["synthetic"] += 1
            seen["model_text"] += meta.get("text_source") == "vlm"
            seen["described"] += bool(meta.get("description"))
            seen[f"status_{meta.get('status')}"] += 1
    for level, noun in (("panel", "panel"), ("region", "region")):
        seen = levels.get(level, Counter())
        if seen["synthetic"]:
            texts = f" and the text of {seen['model_text']:,} (`text_source` `vlm`)" if seen["model_text"] else ""
            out.parts.append(
                f"**{noun.capitalize()} pairs** ({_of(seen['synthetic'], seen['samples'])} samples) were mined by a "
                f"tiny random Qwen2.5-VL: the `description` of {_of(seen['described'], seen['samples'])}{texts} "
                "are random strings; texts taken from the caption are real."
            )
            out.short.append(f"{noun} descriptions")
    seen = levels.get("longcap", Counter())
    if seen["synthetic"]:
        kept = seen["status_fallback"] + seen["status_no_context"]
        out.parts.append(
            f"**Long captions** ({_of(seen['synthetic'], seen['samples'])}) were written by a tiny random "
            f"Qwen2.5-VL; {_of(kept, seen['samples'])} are the original caption unchanged (the guards rejected the "
            f"model's text, or there was no context) and {seen['status_refined']:,} are the model's."
        )
        out.short.append("long captions")
    return out
