"""A figure image's panels as the ``panels`` stage writes them, in plain functions: the stage
(``pipelines.panels.stages.PanelStage``) runs them in the model-stage loop.

Every figure image goes through the weight-free figure decision (``split.figure_decision``:
layout gutters, printed panel labels read by OCR, the caption's labels, chart structure, the
concept stage's figure kind; tens of milliseconds on a CPU). It is the stage's answer where no
detector weights are configured. Where they are, DAB-DETR runs on the images that may be
compound: not labelled ``single panel`` by the concept stage, and either labelled as
multi-panel, or split into two or more panels by the decision, or with two or more panel labels
in the caption; the decision is its second opinion (``choose``: consensus, or the preferred
method) and its fallback (a detector that finds nothing). The printed labels read by the
decision fill the ``label`` column whichever method's boxes are kept. The rest keep the
decision's answer (one panel, or a recorded reason such as ``uniform image``). Images
unchanged since the previous release or the partition's last run keep their panels: the same
bytes, caption, figure kind and settings (``figure_key``, everything the decision reads); error
rows are decided again, as every model stage retries its errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipelines.core.figures import image_refs
from pipelines.core.fingerprints import fingerprint, model_identity
from pipelines.core.lake import Lake
from pipelines.core.panel_methods import CONSENSUS, DECISION, DETR
from pipelines.core.schemas import Table
from pipelines.images.boxes import Panel, attach_labels, consensus, finalize, iou
from pipelines.images.decode import reason_kind
from pipelines.panels.detector import DetectorConfig, detect_images
from pipelines.panels.inputs import FigureSplit
from pipelines.panels.split import DECISION_VERSION
from pipelines.text.captions import CaptionSplit, caption_of, split_caption
from pipelines.text.pairing import assign_captions, panel_labels

SINGLE_PANEL = "single panel"
CONSENSUS_MIN = 0.7  # figure agreement from which both methods' panels merge into consensus panels
# The panel logic's version: bump it when a change to how figures are split (layout, detector use,
# post-processing) changes the panels of the same image, so reruns and new releases split it again.
PANELS_VERSION = "1"
# Figure images per batch of the loop: one detector pool (a Ray Data actor pool: actors start and
# load the model) and one checkpoint each. Starting a pool cost 8-9 s on 2 CPU cores with the tiny
# detector (docs/architecture.md), about what the H200 spends detecting 200 figures (22.9 figures/s),
# so batches are large: a batch holds decisions, never images, and a kill loses at most one batch.
FIGURES_PER_BATCH = 2048


@dataclass(frozen=True)
class PanelSettings:
    """``detector`` None: the figure decision alone (no weights configured). ``prefer``: the
    method whose panels are kept when the two disagree (``detr`` for trained weights; a random
    synthetic detector should never be preferred). ``ocr``: the engine reading printed panel
    labels (``labels.get_reader``). ``batch_size``: images per detector batch;
    ``figures_per_batch``: images per batch of the stage's loop (each batch's candidates go to
    one detector pool; its decisions are kept, never its images, so memory stays small)."""

    detector: DetectorConfig | None = None
    ocr: str = "tesseract"
    prefer: str = DETR
    consensus_min: float = CONSENSUS_MIN
    batch_size: int = 8
    actors: int = 1
    gpus_per_actor: float = 0.0
    address: str | None = None
    actor_resources: dict[str, float] = field(default_factory=dict)  # Ray custom resources per actor
    figures_per_batch: int = FIGURES_PER_BATCH

    @property
    def fingerprint(self) -> str:
        """What a carried-over result must have been made with: the panel logic's version, the
        detector (by its identity: a local directory by its content, never its path) and how the
        two methods are combined."""
        detector = self.detector
        model = None
        if detector is not None:
            model = detector.model_label if detector.synthetic else model_identity(detector.model, detector.revision)
        return fingerprint(
            {
                "version": PANELS_VERSION,
                "detector": model,
                "threshold": detector.threshold if detector else None,
                "input_size": detector.input_size if detector else None,
                "prefer": self.prefer,
                "consensus_min": self.consensus_min,
                "decision": DECISION_VERSION,
                "ocr": self.ocr,
            }
        )


@dataclass
class FigureImage:
    """One figure image of the partition: ``ref`` its raw location and identity (pmcid, fig_id,
    image_file, sha256, tar_path, offset, size, ``image_error`` when parsing refused it), its
    figure's caption and concept label (``panel_type``); ``split`` that caption split by label."""

    ref: dict
    split: CaptionSplit

    @property
    def caption(self) -> str | None:
        return self.ref["caption"]

    @property
    def panel_type(self) -> str | None:
        return self.ref["panel_type"]


def figure_images(lake: Lake, release: str, shard: str) -> list[FigureImage]:
    """One item per resolved figure image: its raw location, its figure's caption and its
    concept label."""
    figures = lake.require(Table.FIGURES, release, shard).to_pylist()
    captions = {(f["pmcid"], f["fig_id"]): caption_of(f) for f in figures}
    concepts_table = lake.read_table(Table.FIGURE_CONCEPTS, release, shard)
    concepts = {
        (c["pmcid"], c["image_file"]): c["panel_type"]
        for c in (concepts_table.to_pylist() if concepts_table is not None else [])
    }
    items = []
    for ref in image_refs(lake, release, shard, figures):
        caption = captions[(ref["pmcid"], ref["fig_id"])]
        ref = {**ref, "caption": caption, "panel_type": concepts.get((ref["pmcid"], ref["image_file"]))}
        items.append(FigureImage(ref, split_caption(caption)))
    return items


def figure_key(figure: FigureImage, settings: str) -> str | None:
    """What a figure image's result is reused by (``panel_figures.fingerprint``): everything the
    decision reads — the image's bytes (sha256), its figure's caption (its label set says how
    many panels to expect, and the panels' texts are cut from it), the concept stage's figure
    kind — and the settings fingerprint. None (never reused) when the image has no bytes."""
    ref = figure.ref
    if not ref["sha256"]:
        return None
    return fingerprint(
        {"sha256": ref["sha256"], "caption": ref["caption"], "panel_type": ref["panel_type"], "settings": settings}
    )


def needs_detector(panel_type: str | None, layout_panels: int, caption_labels: int) -> bool:
    """The cheap pre-filter in front of the detector (see the module docstring)."""
    if panel_type == SINGLE_PANEL:
        return False
    if panel_type and panel_type.startswith("multiple panels"):
        return True
    return layout_panels >= 2 or caption_labels >= 2


def best_overlaps(panels: list[Panel], others: list[Panel]) -> list[float | None]:
    """Each panel's best IoU with the other method's panels (None when the other did not run)."""
    return [max((iou(p.box, o.box) for o in others), default=0.0) for p in panels]


def choose(
    decided: list[Panel], detr: list[Panel] | None, settings: PanelSettings
) -> tuple[str, list[Panel], float | None]:
    """The panels kept for a figure, their method and the two methods' agreement."""
    if detr is None:
        return DECISION, decided, None
    merged, agreement = consensus(decided, detr)
    if agreement >= settings.consensus_min and merged:
        return CONSENSUS, merged, agreement
    if settings.prefer == DETR and (detr or not decided):
        return DETR, detr, agreement
    # a detector that finds nothing where the decision found panels is no evidence of no panel
    return DECISION, decided, agreement


def detector_candidates(figures: list[FigureImage], layouts: list[FigureSplit], settings: PanelSettings) -> list[int]:
    """The indices of the figures the detector looks at: a detector is configured, the decision
    could read the image, and the pre-filter says it may be compound."""
    if settings.detector is None:
        return []
    return [
        index
        for index, (figure, layout) in enumerate(zip(figures, layouts, strict=True))
        if layout.reason is None
        and needs_detector(figure.panel_type, len(layout.panels), len(panel_labels(figure.split)))
    ]


def detect(lake: Lake, figures: list[FigureImage], settings: PanelSettings) -> list[dict]:
    """The detector's row for each of ``figures`` (``detector.detect_images``, in order): the Ray
    Data actor pool ``settings`` describe reads the images from the lake's raw tars itself."""
    refs = [{k: f.ref[k] for k in ("pmcid", "image_file", "tar_path", "offset", "size")} for f in figures]
    return detect_images(
        lake,
        refs,
        settings.detector,
        settings.batch_size,
        settings.actors,
        settings.gpus_per_actor,
        settings.address,
        settings.actor_resources,
    )


def figure_rows(
    figure: FigureImage, layout: FigureSplit, detection: dict | None, settings: PanelSettings
) -> tuple[dict, list[dict]]:
    """A figure image's ``panel_figures`` row and its ``panels`` rows, from the decision's
    ``layout`` and, when the detector looked at it, its ``detection``."""
    item, detector = figure.ref, settings.detector
    row = {
        "pmcid": item["pmcid"],
        "fig_id": item["fig_id"],
        "image_file": item["image_file"],
        "sha256": item["sha256"],
        "width": layout.width or None,
        "height": layout.height or None,
        "status": "skipped",
        "reason": layout.reason,
        "method": None,
        "n_panels": 0,
        "n_xycut": len(layout.panels),
        "n_detr": None,
        "agreement": None,
        "caption_labels": len(panel_labels(figure.split)),
        "model": detector.model_label if detector else None,
        "model_revision": detector.revision if detector else None,
        "threshold": detector.threshold if detector else None,
        "synthetic": bool(detector and detector.synthetic),
        "settings": settings.fingerprint,
        "fingerprint": figure_key(figure, settings.fingerprint),
    }
    if layout.reason is not None:
        # the decoder refused it, or the decision failed: an error, not a skip
        unreadable = reason_kind(layout.reason) is not None or layout.reason.startswith("panel decision failed")
        row["status"] = "error" if unreadable else "skipped"
        return row, []
    detr = None
    if detection is not None:
        if detection["error"]:
            row.update(status="error", reason=f"detector: {detection['error']}")
            return row, []
        labels = [(b.box, b.label) for b in detection["label_boxes"] if b.label]
        # the printed labels the decision read come first: OCR, not the detector's label class
        printed = [(lab.box, lab.text) for lab in layout.labels]
        detr = finalize(detection["panels"], layout.width, layout.height, printed + labels)
        row["n_detr"] = len(detr)
    method, panels, agreement = choose(layout.panels, detr, settings)
    if method != DECISION and layout.labels:
        panels = attach_labels(panels, [(lab.box, lab.text) for lab in layout.labels])
    other = detr if method == DECISION else layout.panels
    overlaps = best_overlaps(panels, other) if detr is not None else [None] * len(panels)
    row.update(
        status="split" if len(panels) > 1 else "single",
        reason=None if detr is not None or len(panels) > 1 else "one panel, not sent to the detector",
        method=method,
        n_panels=len(panels),
        agreement=agreement,
    )
    panel_rows = [
        {
            "pmcid": item["pmcid"],
            "fig_id": item["fig_id"],
            "image_file": item["image_file"],
            "panel_index": index,
            "x1": panel.box[0],
            "y1": panel.box[1],
            "x2": panel.box[2],
            "y2": panel.box[3],
            "score": panel.score,
            "method": method,
            "label": panel.label,
            "agreement": overlap,
            "model": row["model"] if method != DECISION else None,
            "model_revision": row["model_revision"] if method != DECISION else None,
            "threshold": row["threshold"] if method != DECISION else None,
        }
        for index, (panel, overlap) in enumerate(zip(panels, overlaps, strict=True))
    ]
    return row, panel_rows


def caption_rows(figure: FigureImage, panels: list[dict]) -> list[dict]:
    """One ``panel_captions`` row per panel (``panels``: the figure's ``panels`` rows, in
    ``panel_index`` order), its caption's part joined by label or order."""
    kept = [Panel(box=(p["x1"], p["y1"], p["x2"], p["y2"]), label=p["label"]) for p in panels]
    item = figure.ref
    return [
        {
            "pmcid": item["pmcid"],
            "fig_id": item["fig_id"],
            "image_file": item["image_file"],
            "panel_index": index,
            **row,
        }
        for index, row in enumerate(assign_captions(kept, figure.split))
    ]
