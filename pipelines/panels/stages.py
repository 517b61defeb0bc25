"""The panels stage: every figure image of a (release, shard) split into panels, with its caption
split by panel label, in the loop every model stage runs (``pipelines.model_stage``: reuse by
the image's bytes, caption and settings from the previous release then the partition's own rows,
batches, progress, checkpoints where a detector runs, one commit). How a figure is split, and when
the detector looks: ``pipelines.panels.figures``. The panels' crops: ``pipelines.panels.crops``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from pipelines.core.lake import Lake
from pipelines.core.schemas import Table
from pipelines.core.stage import GPU_POOL, Check, Compute, Partition, Preview, StageResult
from pipelines.images.decode import reason_kind
from pipelines.model_stage import Item, ModelRun, ModelStage, Outcome
from pipelines.panels.crops import PanelCropsStage, crops_tar
from pipelines.panels.figures import (
    PANELS_VERSION,
    FigureImage,
    PanelSettings,
    caption_rows,
    choose,
    detect,
    detector_candidates,
    figure_images,
    figure_key,
    figure_rows,
    needs_detector,
)
from pipelines.panels.inputs import FigureSplit
from pipelines.panels.labels import get_reader
from pipelines.panels.split import figure_decision
from pipelines.text.pairing import COUNT_AGREEMENTS, MATCHES, VLM
from pipelines.text.pairing import count_agreement as figure_agreement
from pipelines.vlm.metering import MeteredEngine

__all__ = [  # what assets, tests and benchmarks import from here
    "BOXES_INSIDE",
    "COUNT_AGREEMENT",
    "GPU_POOL",
    "ZERO_PANELS",
    "PanelCropsStage",
    "PanelSettings",
    "PanelStage",
    "choose",
    "crops_tar",
    "needs_detector",
]


@dataclass
class PanelStage(ModelStage):
    """Every figure image split into panels (the figure decision, DAB-DETR, their consensus), with
    boxes in original pixels and provenance, and its caption split by panel label."""

    settings: PanelSettings = field(default_factory=PanelSettings)

    name = "panels"
    label = "panels"
    version = PANELS_VERSION
    table, child_table = Table.PANEL_FIGURES, Table.PANELS
    reads = (Table.FIGURES, Table.RAW_FILES, Table.FIGURE_CONCEPTS, Table.PANEL_FIGURES, Table.PANELS)
    writes = (Table.PANEL_FIGURES, Table.PANELS, Table.PANEL_CAPTIONS)
    engine = None  # no VLM: no canary; the detector runs in batches, checkpointed

    compute = Compute(pool=GPU_POOL, kinds=("ray", "pytorch"))

    @property
    def checkpointing(self) -> bool:
        return self.settings.detector is not None

    def settings_fingerprint(self) -> str:
        return self.settings.fingerprint

    def items(self, lake: Lake, partition: Partition) -> list[Item]:
        self.lake, self.sent_to_detector = lake, 0
        self.ocr = get_reader(self.settings.ocr)  # fails the run, not the figures, when the engine is missing
        fp = self.settings_fingerprint()
        return [
            Item(f"{f.ref['pmcid']} {f.ref['image_file']}", figure_key(f, fp), f, ref=f.ref)
            for f in figure_images(lake, partition.release, partition.shard)
        ]

    def carried(self, item: Item, row: dict, panels: list[dict]) -> Outcome:
        # the row of an image with the same bytes and caption: this image's names (an image may be in two figures)
        names = {k: item.data.ref[k] for k in ("pmcid", "fig_id", "image_file")}
        return Outcome({**row, **names}, [{**p, **names} for p in panels])

    def prepare(self, item: Item, data: bytes) -> tuple[FigureSplit | None, str | None]:
        """The figure decision, as the image's bytes are read (the batch keeps it, not the image)."""
        layout = figure_decision(data, item.data.caption, panel_type=item.data.panel_type, reader=self.ocr)
        return (None, layout.reason) if reason_kind(layout.reason) else (layout, None)  # the decoder refused it

    def unreadable(self, item: Item, reason: str) -> Outcome:
        return self.outcome(item.data, FigureSplit(reason=reason), None)

    def run_batch(self, items: list[Item], engine: MeteredEngine | None, done: Callable[[], None]) -> list[Outcome]:
        figures, layouts = [item.data for item in items], [item.image for item in items]
        candidates = detector_candidates(figures, layouts, self.settings)
        found = detect(self.lake, [figures[i] for i in candidates], self.settings)
        detections = dict(zip(candidates, found, strict=True))
        self.sent_to_detector += len(candidates)
        return [self.outcome(figures[i], layouts[i], detections.get(i)) for i in range(len(items))]

    def outcome(self, figure: FigureImage, layout: FigureSplit, detection: dict | None) -> Outcome:
        row, panels = figure_rows(figure, layout, detection, self.settings)
        return Outcome(row, panels, error=row["reason"] if row["status"] == "error" else None)

    def derived_tables(self, run: ModelRun) -> dict[str, list[dict]]:
        captions = [caption_rows(i.data, o.children) for i, o in zip(run.items, run.outcomes, strict=True)]
        return {Table.PANEL_CAPTIONS: [row for rows in captions for row in rows]}

    def summarize(self, partition: Partition, run: ModelRun) -> StageResult:
        return panels_result(self, partition, run)


def panels_result(stage: PanelStage, partition: Partition, run: ModelRun) -> StageResult:
    figures, panels = run.rows, run.children
    captions = stage.derived_tables(run)[Table.PANEL_CAPTIONS]
    statuses = Counter(f["status"] for f in figures)
    methods = Counter(f["method"] for f in figures if f["method"])
    errors = [f for f in figures if f["status"] == "error"]
    split = [f for f in figures if f["status"] == "split"]
    with_labels = [f for f in split if f["caption_labels"]]
    matching = sum(1 for f in with_labels if f["caption_labels"] == f["n_panels"])
    agreements = Counter(figure_agreement(f["n_panels"], f["caption_labels"] or 0) for f in figures if f["n_panels"])
    detector = stage.settings.detector
    result = stage.result(  # error rows are never carried: they are decided again
        partition,
        ok=len(figures) - len(errors) - run.carried,
        error=len(errors),
        skipped=run.carried,
        carried=run.carried,
        counts={
            "images": len(figures),
            **{f"status_{k}": v for k, v in sorted(statuses.items())},
            **{f"method_{k}": v for k, v in sorted(methods.items())},
            "panels": len(panels),
            "carried": run.carried,
            "resumed": run.resumed,
            "sent_to_detector": stage.sent_to_detector,
            "detector": detector.model_label if detector else "none (figure decision)",
            "caption_panels": len(captions),
            **{f"match_{m}": sum(1 for c in captions if c["match"] == m) for m in MATCHES if m != VLM},
            **{f"figures_{a}": agreements[a] for a in COUNT_AGREEMENTS},
        },
        previews={"preview": Preview(panels, ["pmcid", "fig_id", "panel_index", "x1", "y1", "x2", "y2", "method"])},
        checks=[
            boxes_inside(figures, panels),
            count_agreement(len(with_labels), matching),
            zero_panel_share(figures),
        ],
    )
    result.errors = [(f"{f['pmcid']} {f['image_file']}", f["reason"]) for f in errors]
    return result


BOXES_INSIDE, COUNT_AGREEMENT, ZERO_PANELS = (
    "panel_boxes_inside_image",
    "panel_count_matches_caption",
    "zero_panel_share",
)
MIN_COUNT_AGREEMENT = 0.5  # of split figures whose caption has labels
MAX_ZERO_PANEL_SHARE = 0.2


def boxes_inside(figures: list[dict], panels: list[dict]) -> Check:
    size = {(f["pmcid"], f["image_file"]): (f["width"], f["height"]) for f in figures}
    bad = [
        f"{p['pmcid']} {p['image_file']} #{p['panel_index']}"
        for p in panels
        if not (
            0 <= p["x1"] < p["x2"] <= (size[(p["pmcid"], p["image_file"])][0] or 0)
            and 0 <= p["y1"] < p["y2"] <= (size[(p["pmcid"], p["image_file"])][1] or 0)
        )
    ]
    return Check(
        BOXES_INSIDE,
        passed=not bad,
        description=f"{len(bad)} of {len(panels)} panel boxes outside their image or empty",
        metadata={"bad": bad[:50]},
    )


def count_agreement(with_labels: int, matching: int) -> Check:
    share = matching / with_labels if with_labels else 1.0
    return Check(
        COUNT_AGREEMENT,
        passed=share >= MIN_COUNT_AGREEMENT,
        description=f"{matching} of {with_labels} split figures with caption labels have as many panels as labels "
        f"({share:.0%}; expected at least {MIN_COUNT_AGREEMENT:.0%})",
        blocking=False,
        metadata={"share": share, "figures": with_labels},
    )


def zero_panel_share(figures: list[dict]) -> Check:
    zero = sum(1 for f in figures if f["n_panels"] == 0)
    share = zero / len(figures) if figures else 0.0
    reasons = Counter(f["reason"] for f in figures if f["n_panels"] == 0)
    return Check(
        ZERO_PANELS,
        passed=share <= MAX_ZERO_PANEL_SHARE,
        description=f"{zero} of {len(figures)} figure images have no panel ({share:.0%}; at most "
        f"{MAX_ZERO_PANEL_SHARE:.0%} expected)",
        blocking=False,
        metadata={"share": share, "reasons": dict(reasons.most_common(10))},
    )
