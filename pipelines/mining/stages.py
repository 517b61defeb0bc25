"""The mining stage: every figure image of a (release, shard) turned into image–text pairs at
three levels — global (the figure, its caption), panel (a panel, its part of the caption) and
region (a marked area, the clause about it) — by reading the figure's own instructional design
with a vision-language model (Panel2Patch).

Cost is what decides the design. The paper spent ~2,900 H100-hours with a 72B model; most of
that is spent on prompts that cannot help. So every costly prompt sits behind a cheap
pre-filter: Set-of-Mark panel proposals only for figures whose caption or panels carry panel
identifiers, region prompts only for panels whose text names a marker ("arrows indicate…")
and whose concept label is photographic, the VLM text association only for panels the caption
split could not serve. Requests of a batch of figures go to the engine together (the engine
batches them; a shared system prompt is computed once by an engine with prefix caching).

What the model says is never trusted as is: boxes are parsed per model family and clipped to
their parent, texts said to come from the caption must occur in it, unparseable answers become
a recorded reason for that figure. Results are reused for an image whose inputs and settings
(engine, prompts, caption, panels) are unchanged, so a new prompt or model mines again only
what it affects, and a rerun redoes nothing.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from pipelines.core.lake import Lake
from pipelines.core.schemas import Table
from pipelines.core.stage import GPU_POOL, Check, Compute, Partition, Preview, StageResult
from pipelines.images.boxes import within
from pipelines.mining.mine import (
    GLOBAL,
    LEVELS,
    PANEL,
    REGION,
    MinedFigure,
    MiningSettings,
    figure_items,
    figure_row,
    inputs_fingerprint,
    mine,
)
from pipelines.model_stage import Item, ModelRun, ModelStage, Outcome
from pipelines.text.pairing import MATCHES, NONE
from pipelines.vlm.canary import canary_check
from pipelines.vlm.engine import VlmEngine, provenance
from pipelines.vlm.metering import MeteredEngine
from pipelines.vlm.prompts import PROMPT_VERSION

# The mining logic's version: bump it when a change to pipelines/mining/ changes what is written
# for the same inputs, engine and prompts (prompts have their own version, PROMPT_VERSION).
MINING_VERSION = "1"


@dataclass
class MiningStage(ModelStage):
    """Figure, panel and region image–text pairs mined with a vision-language model
    (Panel2Patch), with boxes in original pixels and every pair's provenance."""

    engine: VlmEngine
    settings: MiningSettings = field(default_factory=MiningSettings)
    actors: int = 0
    gpus_per_actor: float = 0.0

    name = "pairs"
    label = "mining"
    version = MINING_VERSION
    table, child_table = Table.MINING_FIGURES, Table.PAIRS
    reads = (
        Table.FIGURES,
        Table.RAW_FILES,
        Table.FIGURE_CONCEPTS,
        Table.PANELS,
        Table.PANEL_CAPTIONS,
        Table.MINING_FIGURES,
        Table.PAIRS,
    )
    writes = (Table.PAIRS, Table.MINING_FIGURES)

    compute = Compute(pool=GPU_POOL, kinds=("ray", "vllm"))

    def hashed_settings(self) -> dict:
        return {"prompts": PROMPT_VERSION, "settings": self.settings.as_dict()}

    def items(self, lake: Lake, partition: Partition) -> list[Item]:
        fp = self.settings_fingerprint()
        figures = figure_items(lake, partition.release, partition.shard)
        return [Item(f"{f['pmcid']}/{f['image_file']}", inputs_fingerprint(f, fp), f, ref=f) for f in figures]

    def carried(self, item: Item, row: dict, pairs: list[dict]) -> Outcome:
        fig_id = item.data["fig_id"]
        return Outcome({**row, "fig_id": fig_id, "status": "carried"}, [{**p, "fig_id": fig_id} for p in pairs])

    def unreadable(self, item: Item, reason: str) -> Outcome:
        return Outcome(figure_row(item.data, item.fingerprint, "error", [reason], None, None), error=reason)

    def run_batch(self, items: list[Item], engine: MeteredEngine, done: Callable[[], None]) -> list[Outcome]:
        figures = [MinedFigure(item.data, item.image) for item in items]
        mine(figures, engine, self.settings)
        columns = provenance(self.engine, PROMPT_VERSION)
        return [
            Outcome(
                figure_row(f.item, item.fingerprint, "mined", f.reasons, engine.meter, f),
                [{**pair, **columns} for pair in f.pairs],
            )
            for item, f in zip(items, figures, strict=True)
        ]

    def tallies(self, outcomes: list[Outcome]) -> dict[str, int]:
        return {"pairs": sum(len(o.children) for o in outcomes)}

    def summarize(self, partition: Partition, run: ModelRun) -> StageResult:
        return mining_result(self, partition, run)


def mining_result(stage: MiningStage, partition: Partition, run: ModelRun) -> StageResult:
    figures, pairs = run.rows, run.children
    levels = Counter(p["level"] for p in pairs)
    sources = Counter(f"{p['level']}_{p['text_source']}" for p in pairs)
    by_prompt = run.engine.meter.by_prompt if run.engine else {}
    mined = [f for f in figures if f["status"] == "mined"]
    panels = [p for p in pairs if p["level"] == PANEL]
    matches = Counter(p["text_match"] or NONE for p in panels)
    readers = Counter(p["label_source"] or "none" for p in panels)
    conflicts = sum(len(json.loads(f["disagreement"])["label_conflicts"]) for f in figures if f["disagreement"])
    result = stage.result(
        partition,
        ok=len(mined),
        error=len(run.errors),
        skipped=run.carried,
        carried=run.carried,
        counts={
            "images": len(figures),
            "carried": run.carried,
            "resumed": run.resumed,
            **{f"pairs_{level}": levels[level] for level in LEVELS},
            **{f"text_{k}": v for k, v in sorted(sources.items())},
            **{f"panel_match_{m}": matches[m] for m in MATCHES},
            **{f"panel_label_from_{k}": v for k, v in sorted(readers.items())},
            "label_conflicts": conflicts,
            **run.totals(),
            "prefilter_none": sum(1 for f in mined if f["prefilter"] == "none"),
            "per_prompt": json.dumps({k: dict(v) for k, v in by_prompt.items()}, sort_keys=True),
            "engine": f"{stage.engine.backend} {stage.engine.config.model}",
            "synthetic": stage.engine.config.synthetic,
        },
        previews={
            "preview": Preview(
                pairs, ["pair_id", "level", "x1", "y1", "x2", "y2", "text_source", "text", "description"]
            )
        },
        checks=[
            boxes_inside_parent(figures, pairs),
            extractive_share(pairs),
            parse_failure_rate(figures),
            canary_check(CANARY, run.canary),
        ],
    )
    result.errors = run.errors
    return result


BOXES_INSIDE, EXTRACTIVE, PARSE_FAILURES, CANARY = (
    "pair_boxes_inside_parent",
    "caption_texts_extractive",
    "vlm_parse_failure_rate",
    "structured_outputs_canary",
)
MIN_EXTRACTIVE = 0.99
MAX_PARSE_FAILURES = 0.1


def boxes_inside_parent(figures: list[dict], pairs: list[dict]) -> Check:
    """Panels inside their figure image, regions inside their panel."""
    panel_box = {
        (p["pmcid"], p["image_file"], p["panel_index"]): (p["x1"], p["y1"], p["x2"], p["y2"])
        for p in pairs
        if p["level"] == PANEL
    }
    image_box = {
        (p["pmcid"], p["image_file"]): (p["x1"], p["y1"], p["x2"], p["y2"]) for p in pairs if p["level"] == GLOBAL
    }
    bad = []
    for p in pairs:
        box = (p["x1"], p["y1"], p["x2"], p["y2"])
        image = image_box.get((p["pmcid"], p["image_file"]))
        parent = image
        if p["level"] == REGION:
            parent = panel_box.get((p["pmcid"], p["image_file"], p["panel_index"]), image)
        if parent is None or not within(box, parent):
            bad.append(p["pair_id"])
    return Check(
        BOXES_INSIDE,
        passed=not bad,
        description=f"{len(bad)} of {len(pairs)} pair boxes outside their parent (figure, or panel for regions)",
        metadata={"bad": bad[:50]},
    )


def extractive_share(pairs: list[dict]) -> Check:
    """Texts said to come from the caption must occur in it."""
    derived = [p for p in pairs if p["text_source"] in ("caption", "caption_split", "vlm") and p["text"]]
    extractive = sum(1 for p in derived if p["extractive"])
    share = extractive / len(derived) if derived else 1.0
    return Check(
        EXTRACTIVE,
        passed=share >= MIN_EXTRACTIVE,
        description=f"{extractive} of {len(derived)} caption-derived texts occur verbatim in their caption "
        f"({share:.1%}; at least {MIN_EXTRACTIVE:.0%} expected)",
        metadata={"share": share, "texts": len(derived)},
    )


def parse_failure_rate(figures: list[dict]) -> Check:
    mined = [f for f in figures if f["status"] == "mined"]
    requests = sum(f["vlm_requests"] for f in mined)
    failures = sum(f["parse_failures"] for f in mined)
    rate = failures / requests if requests else 0.0
    return Check(
        PARSE_FAILURES,
        passed=rate <= MAX_PARSE_FAILURES,
        description=f"{failures} of {requests} model answers could not be used ({rate:.1%}; at most "
        f"{MAX_PARSE_FAILURES:.0%} expected)",
        blocking=False,
        metadata={"rate": rate, "requests": requests},
    )
