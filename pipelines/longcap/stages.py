"""LongCAP and RegionMed-CLIP stages: hard-negative captions for region pairs, and long captions.

Both read what earlier stages wrote (the `pairs` table; the article's text and mentions) and
keep every original: a negative is a new row next to its pair, a long caption is a new column
next to the caption, which is always kept.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from pipelines.lake import Lake
from pipelines.longcap.negatives import negative_rows, vlm_negatives
from pipelines.schemas import Table
from pipelines.stage import Check, Compute, Partition, Preview, Stage, StageInputError, StageResult
from pipelines.vlm.engine import VlmEngine

GPU_POOL = "gpu"


@dataclass
class NegativesStage(Stage):
    """Hard-negative captions for every region pair with text (RegionMed-CLIP): one attribute
    changed (laterality, location, count, colour, stain, modality, size) by rules, and by the VLM
    when an engine is given; each checked to contradict its positive."""

    engine: VlmEngine | None = None
    max_per_type: int = 1
    vlm_per_pair: int = 2
    seed: int = 0

    name = "pair_negatives"
    reads = (Table.PAIRS,)
    writes = (Table.PAIR_NEGATIVES,)

    @property
    def compute(self) -> Compute:  # type: ignore[override]
        return Compute(pool=GPU_POOL) if self.engine is not None else Compute()

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        pairs = lake.read_table(Table.PAIRS, partition.release, partition.shard)
        if pairs is None:
            raise StageInputError(
                f"release {partition.release} shard {partition.shard} has no pairs yet: materialize `pairs` first"
            )
        regions = [p for p in pairs.to_pylist() if p["level"] == "region" and (p["text"] or "").strip()]
        vlm, reasons = None, {}
        if self.engine is not None and regions:
            answer = vlm_negatives(self.engine, [(p["pair_id"], p["text"]) for p in regions], self.vlm_per_pair)
            vlm, reasons = answer.negatives, answer.reasons
        rows = negative_rows(regions, self.max_per_type, self.seed, vlm)
        lake.write_table(Table.PAIR_NEGATIVES, partition.release, partition.shard, rows)
        negated = {r["pair_id"] for r in rows}
        kinds = Counter(r["perturbation"] for r in rows)
        sources = Counter(r["source"] for r in rows)
        result = self.result(
            partition,
            ok=len(negated),
            skipped=len(regions) - len(negated),
            counts={
                "region_pairs": len(regions),
                "negatives": len(rows),
                **{f"perturbation_{k}": v for k, v in sorted(kinds.items())},
                **{f"source_{k}": v for k, v in sorted(sources.items())},
                "vlm_reasons": sum(len(v) for v in reasons.values()),
            },
            previews={"preview": Preview(rows, ["pair_id", "perturbation", "original_span", "replacement", "text"])},
            checks=[negatives_differ(rows, {p["pair_id"]: p["text"] for p in regions})],
        )
        return result


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
