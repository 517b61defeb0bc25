"""LongCAP and RegionMed-CLIP stages: hard-negative captions for region pairs, and long captions.

Both read what earlier stages wrote (the `pairs` table; the article's text and mentions) and
keep every original: a negative is a new row next to its pair, a long caption is a new column
next to the caption, which is always kept. Both run in the model-stage loop
(``pipelines/model_stage.py``): reuse by fingerprint, the canary, batches, progress and
checkpoints; the logic is in ``negatives/`` and ``refine.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pipelines.core.fingerprints import fingerprint, model_identity
from pipelines.core.lake import Lake
from pipelines.core.schemas import Table
from pipelines.core.stage import GPU_POOL, Check, Compute, Markdown, Partition, Preview, StageResult
from pipelines.images.plots import figure_png
from pipelines.longcap.negatives import NEGATIVES_PROMPT_VERSION, RULES_VERSION, pair_negatives
from pipelines.longcap.prompts import FEASIBLE, PROMPT_VERSION
from pipelines.longcap.refine import (
    CaptionItem,
    CaptionRows,
    LongCapSettings,
    caption_items,
    longcap_request,
    needs_model,
)
from pipelines.longcap.tokens import load_tokenizer
from pipelines.model_stage import Item, ModelRun, ModelStage, Outcome
from pipelines.vlm.canary import canary_check
from pipelines.vlm.engine import VlmEngine, provenance
from pipelines.vlm.metering import MeteredEngine

# Bump when a change to the long-caption logic (context, guards, rows) changes what is written
# for the same inputs, engine and prompt (the prompt has its own version, PROMPT_VERSION); a new
# version recomputes what earlier ones made. 2: the token budget cuts the refinement's added
# sentences, never the caption (``fit_long_caption``).
LONGCAP_VERSION = "2"


@dataclass
class NegativesStage(ModelStage):
    """Hard-negative captions for every region pair with text (RegionMed-CLIP): one attribute
    changed (laterality, location, count, colour, stain, modality, size) by rules, and by the VLM
    when an engine is given; each checked to contradict its positive."""

    engine: VlmEngine | None = None
    max_per_type: int = 1
    vlm_per_pair: int = 2
    seed: int = 0
    batch_size: int = 64  # region pairs per VLM call
    require_canary: bool = True

    name = "pair_negatives"
    label = "negatives"
    unit = "region pairs"
    version = RULES_VERSION
    table, child_table, link = Table.NEGATIVE_ITEMS, Table.PAIR_NEGATIVES, ("pair_id",)
    reads = (Table.PAIRS, Table.NEGATIVE_ITEMS, Table.PAIR_NEGATIVES)
    writes = (Table.PAIR_NEGATIVES, Table.NEGATIVE_ITEMS)

    # no pool: by default the rules alone run (use_vlm off); the VLM path shares the engine the
    # ``vlm`` resource opened, as mining and long captions do
    compute = Compute()

    def hashed_settings(self) -> dict:
        prompt = NEGATIVES_PROMPT_VERSION if self.engine is not None else None
        return {
            "prompt": prompt,
            "max_per_type": self.max_per_type,
            "vlm_per_pair": self.vlm_per_pair,
            "seed": self.seed,
        }

    def items(self, lake: Lake, partition: Partition) -> list[Item]:
        settings = self.settings_fingerprint()
        regions = region_pairs(lake, partition.release, partition.shard)
        return [Item(p["pair_id"], fingerprint({"text": p["text"], "settings": settings}), p) for p in regions]

    def run_batch(self, items: list[Item], engine: MeteredEngine | None, done: Callable[[], None]) -> list[Outcome]:
        made = pair_negatives([i.data for i in items], engine, self.max_per_type, self.seed, self.vlm_per_pair)
        return [
            Outcome({**row, "fingerprint": i.fingerprint}, rows) for i, (row, rows) in zip(items, made, strict=True)
        ]

    def summarize(self, partition: Partition, run: ModelRun) -> StageResult:
        return negatives_result(self, partition, run)


def region_pairs(lake: Lake, release: str, shard: str) -> list[dict]:
    """The partition's region pairs with text: what gets negatives."""
    pairs = lake.require(Table.PAIRS, release, shard)
    return [p for p in pairs.to_pylist() if p["level"] == "region" and (p["text"] or "").strip()]


def negatives_result(stage: NegativesStage, partition: Partition, run: ModelRun) -> StageResult:
    rows, regions = run.children, [item.data for item in run.items]
    negated = {r["pair_id"] for r in rows}
    kinds = Counter(r["perturbation"] for r in rows)
    sources = Counter(r["source"] for r in rows)
    return stage.result(
        partition,
        ok=len(negated),
        skipped=len(regions) - len(negated),
        counts={
            "region_pairs": len(regions),
            "negatives": len(rows),
            **{f"perturbation_{k}": v for k, v in sorted(kinds.items())},
            **{f"source_{k}": v for k, v in sorted(sources.items())},
            "vlm_reasons": sum(len(r["reasons"] or []) for r in run.rows),
            "carried": run.carried,
            "resumed": run.resumed,
            **run.totals(),
        },
        previews={"preview": Preview(rows, ["pair_id", "perturbation", "original_span", "replacement", "text"])},
        checks=[negatives_differ(rows, {p["pair_id"]: p["text"] for p in regions})],
    )


NEGATIVES_DIFFER = "negatives_differ_from_positive"


def negatives_differ(rows: list[dict], positives: dict[str, str]) -> Check:
    """No negative equals its positive (a negative that says the same is a false negative)."""
    same = [r["pair_id"] for r in rows if r["text"].strip().lower() == positives[r["pair_id"]].strip().lower()]
    return Check(
        NEGATIVES_DIFFER,
        passed=not same,
        description=f"{len(same)} of {len(rows)} negatives read like their positive",
        metadata={"same": same[:50]},
    )


# ---- long captions ------------------------------------------------------------------------------


@dataclass
class LongCapStage(ModelStage):
    """Every figure's caption enriched with its article's context (the paragraphs citing it, title,
    abstract; acronyms as the article defines them) by a VLM that must say which added facts the
    image shows, then checked by guards that do not trust it; the original caption always kept."""

    engine: VlmEngine
    settings: LongCapSettings = field(default_factory=LongCapSettings)
    actors: int = 0
    gpus_per_actor: float = 0.0

    name = "long_captions"
    label = "long captions"
    version = LONGCAP_VERSION
    table = Table.LONG_CAPTIONS
    reads = (Table.FIGURES, Table.ARTICLES, Table.MENTIONS, Table.RAW_FILES, Table.LONG_CAPTIONS)
    writes = (Table.LONG_CAPTIONS,)

    compute = Compute(pool=GPU_POOL, kinds=("vllm",))

    def hashed_settings(self) -> dict:
        settings = self.settings.as_dict()
        if settings["tokenizer"].startswith("hf:"):  # a local tokenizer counts by its files, not its path
            settings["tokenizer"] = f"hf:{model_identity(settings['tokenizer'][3:])}"
        return {"prompt": PROMPT_VERSION, "settings": settings}

    def items(self, lake: Lake, partition: Partition) -> list[Item]:
        tokenizer = load_tokenizer(self.settings.tokenizer, self.settings.budget)
        self.caption_rows = CaptionRows(tokenizer, self.settings.budget, provenance(self.engine, PROMPT_VERSION))
        found = caption_items(
            lake,
            partition.release,
            partition.shard,
            tokenizer,
            self.settings.context_budget,
            self.settings_fingerprint(),
        )
        return [Item(c.key, c.fingerprint, c, ref=c.ref) for c in found]

    def carried(self, item: Item, row: dict, children: list[dict]) -> Outcome:
        return Outcome({**row, "fig_id": item.data.ref["fig_id"]})

    def precomputed(self, item: Item) -> Outcome | None:
        return None if needs_model(item.data) else Outcome(self.caption_rows.row(item.data, "no_context", None, None))

    def unreadable(self, item: Item, reason: str) -> Outcome:
        return Outcome(self.caption_rows.row(item.data, "error", reason, None), error=reason)

    def run_batch(self, items: list[Item], engine: MeteredEngine, done: Callable[[], None]) -> list[Outcome]:
        captions: list[CaptionItem] = [item.data for item in items]
        for caption, item in zip(captions, items, strict=True):
            caption.image = item.image
        outcomes: dict[int, Outcome] = {}
        for index, response in engine.stream([longcap_request(c) for c in captions]):
            outcomes[index] = Outcome(self.caption_rows.refine(captions[index], response))
            captions[index].image = None
            done()  # a figure is done when its answer is back, not its whole batch
        return [outcomes[index] for index in range(len(captions))]

    def summarize(self, partition: Partition, run: ModelRun) -> StageResult:
        return longcap_result(self, partition, run)


def longcap_result(stage: LongCapStage, partition: Partition, run: ModelRun) -> StageResult:
    rows, errors = run.rows, run.errors
    statuses = Counter(r["status"] for r in rows)
    before = [r["tokens_before"] for r in rows if r["caption"]]
    after = [r["tokens_after"] for r in rows if r["caption"]]
    counts = {
        "images": len(rows),
        "carried": run.carried,
        "resumed": run.resumed,
        **{f"status_{k}": v for k, v in sorted(statuses.items())},
        **run.totals(),
        "tokenizer": stage.caption_rows.tokenizer.name,
        "median_tokens_before": float(np.median(before)) if before else 0.0,
        "median_tokens_after": float(np.median(after)) if after else 0.0,
        "synthetic": stage.engine.config.synthetic,
    }
    if before:
        counts["token_lengths"] = Markdown(f"![tokens](data:image/png;base64,{token_histogram(before, after)})")
    result = stage.result(
        partition,
        ok=len(rows) - len(errors) - run.carried,
        error=len(errors),
        skipped=run.carried,
        carried=run.carried,
        counts=counts,
        previews={"preview": Preview(rows, ["pmcid", "image_file", "status", "reason", "tokens_after"])},
        checks=[
            feasibility(rows),
            guard_rejections(rows),
            gained_context(rows),
            canary_check(LONGCAP_CANARY, run.canary),
        ],
    )
    result.errors = errors
    return result


def token_histogram(before: list[int], after: list[int]) -> str:
    """Token lengths of the captions before and after, as a base64 PNG."""
    import base64

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    bins = np.linspace(0, max(max(before), max(after), 1) + 1, 30)
    ax.hist(before, bins=bins, alpha=0.6, label="caption")
    ax.hist(after, bins=bins, alpha=0.6, label="long caption")
    ax.set_xlabel("tokens (text encoder's tokenizer)")
    ax.set_ylabel("figure images")
    ax.legend()
    return base64.b64encode(figure_png(fig, plt)).decode()


FEASIBILITY, GUARD_REJECTIONS, GAINED_CONTEXT, LONGCAP_CANARY = (
    "longcap_feasibility_rate",
    "longcap_guard_rejection_rate",
    "longcap_gained_context_share",
    "longcap_structured_outputs_canary",
)
MIN_FEASIBLE, MAX_GUARD_REJECTIONS, MIN_GAINED = 0.2, 0.5, 0.1


def _asked(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["status"] in ("refined", "fallback")]


def feasibility(rows: list[dict]) -> Check:
    asked = _asked(rows)
    feasible = sum(1 for r in asked if r["verdict"] == FEASIBLE)
    rate = feasible / len(asked) if asked else 1.0
    return Check(
        FEASIBILITY,
        passed=rate >= MIN_FEASIBLE,
        description=f"{feasible} of {len(asked)} figures asked judged FEASIBLE by the model ({rate:.0%}; "
        f"at least {MIN_FEASIBLE:.0%} expected)",
        blocking=False,
        metadata={"rate": rate},
    )


def guard_rejections(rows: list[dict]) -> Check:
    feasible = [r for r in _asked(rows) if r["verdict"] == FEASIBLE]
    rejected = sum(1 for r in feasible if r["guard_failures"])
    rate = rejected / len(feasible) if feasible else 0.0
    reasons = Counter(f.split(":")[0] for r in feasible for f in r["guard_failures"])
    return Check(
        GUARD_REJECTIONS,
        passed=rate <= MAX_GUARD_REJECTIONS,
        description=f"{rejected} of {len(feasible)} feasible refinements rejected by the guards ({rate:.0%}; "
        f"at most {MAX_GUARD_REJECTIONS:.0%} expected)",
        blocking=False,
        metadata={"rate": rate, "reasons": dict(reasons.most_common(10))},
    )


def gained_context(rows: list[dict]) -> Check:
    with_caption = [r for r in rows if r["caption"]]
    gained = sum(1 for r in with_caption if r["gained_context"])
    share = gained / len(with_caption) if with_caption else 0.0
    return Check(
        GAINED_CONTEXT,
        passed=share >= MIN_GAINED,
        description=f"{gained} of {len(with_caption)} captions gained verified context ({share:.0%}; at least "
        f"{MIN_GAINED:.0%} expected)",
        blocking=False,
        metadata={"share": share},
    )
