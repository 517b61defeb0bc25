"""Panel stages: every figure image of a (release, shard) split into panels, with its caption
split by panel label; and the panels' crops for the release.

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
unchanged since the previous release (same sha256, same settings) keep their panels.
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from pipelines.core.figures import image_refs
from pipelines.core.fingerprints import fingerprint, model_identity
from pipelines.core.lake import Lake
from pipelines.core.panel_methods import CONSENSUS, DECISION, DETR
from pipelines.core.rawstore import RawReader, add_member
from pipelines.core.schemas import Table
from pipelines.core.stage import (
    GPU_POOL,
    Check,
    Compute,
    Markdown,
    Partition,
    Preview,
    Stage,
    StageResult,
    reusable_results,
)
from pipelines.images.boxes import (
    Panel,
    attach_labels,
    consensus,
    crop_panel,
    finalize,
    iou,
)
from pipelines.images.decode import decode_image, reason_kind
from pipelines.images.gate import REASONS as GATE_REASONS
from pipelines.images.gate import GateSettings, crop_gate
from pipelines.images.jpeg import jpeg_bytes
from pipelines.images.previews import SHEET_ITEMS, captioned_sheet, sheet_preview
from pipelines.panels.detector import DetectorConfig, detect_images
from pipelines.panels.inputs import FigureSplit
from pipelines.panels.labels import get_reader
from pipelines.panels.split import DECISION_VERSION, figure_decision
from pipelines.text.captions import caption_of, split_caption
from pipelines.text.pairing import COUNT_AGREEMENTS, MATCHES, VLM, assign_captions, panel_labels
from pipelines.text.pairing import count_agreement as figure_agreement

SINGLE_PANEL = "single panel"
CONSENSUS_MIN = 0.7  # figure agreement from which both methods' panels merge into consensus panels
# The panel logic's version: bump it when a change to how figures are split (layout, detector use,
# post-processing) changes the panels of the same image, so reruns and new releases split it again.
PANELS_VERSION = "1"


@dataclass(frozen=True)
class PanelSettings:
    """``detector`` None: the figure decision alone (no weights configured). ``prefer``: the
    method whose panels are kept when the two disagree (``detr`` for trained weights; a random
    synthetic detector should never be preferred). ``ocr``: the engine reading printed panel
    labels (``labels.get_reader``)."""

    detector: DetectorConfig | None = None
    ocr: str = "tesseract"
    prefer: str = DETR
    consensus_min: float = CONSENSUS_MIN
    batch_size: int = 8
    actors: int = 1
    gpus_per_actor: float = 0.0
    address: str | None = None
    actor_resources: dict[str, float] = field(default_factory=dict)  # Ray custom resources per actor

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


def _figure_images(lake: Lake, release: str, shard: str) -> Iterator[dict]:
    """One item per resolved figure image: its raw location, its figure's caption and its
    concept label."""
    figures = lake.require(Table.FIGURES, release, shard).to_pylist()
    captions = {(f["pmcid"], f["fig_id"]): caption_of(f) for f in figures}
    concepts_table = lake.read_table(Table.FIGURE_CONCEPTS, release, shard)
    concepts = {
        (c["pmcid"], c["image_file"]): c["panel_type"]
        for c in (concepts_table.to_pylist() if concepts_table is not None else [])
    }
    for ref in image_refs(lake, release, shard, figures):
        key = (ref["pmcid"], ref["image_file"])
        yield {**ref, "caption": captions[(ref["pmcid"], ref["fig_id"])], "panel_type": concepts.get(key)}


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


@dataclass
class PanelStage(Stage):
    """Every figure image split into panels (the figure decision, DAB-DETR, their consensus), with
    boxes in original pixels and provenance, and its caption split by panel label."""

    settings: PanelSettings = field(default_factory=PanelSettings)

    name = "panels"
    reads = (Table.FIGURES, Table.RAW_FILES, Table.FIGURE_CONCEPTS, Table.PANEL_FIGURES, Table.PANELS)
    writes = (Table.PANEL_FIGURES, Table.PANELS, Table.PANEL_CAPTIONS)

    compute = Compute(pool=GPU_POOL, kinds=("ray", "pytorch"))

    def _previous(self, lake: Lake, partition: Partition) -> dict[str, tuple[dict, list[dict]]]:
        """Results made with the same settings, by image sha256: the previous release's, then
        this partition's own (a rerun)."""
        fp = self.settings.fingerprint
        return reusable_results(
            lake, Table.PANEL_FIGURES, partition, lambda f: f["sha256"] if f["settings"] == fp else None, Table.PANELS
        )

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        release, shard = partition.release, partition.shard
        settings, detector = self.settings, self.settings.detector
        known = self._previous(lake, partition)
        items = list(_figure_images(lake, release, shard))
        splits, layouts, carried = {}, {}, {}
        ocr = get_reader(settings.ocr)  # fails the run, not the figures, when the engine is missing
        with RawReader(lake) as reader:
            for item in items:
                key = (item["pmcid"], item["image_file"])
                splits[key] = split_caption(item["caption"])
                if item["sha256"] in known:
                    carried[key] = known[item["sha256"]]
                    continue
                if item.get("image_error"):  # refused when parsed: the same reason, not decoded again
                    layouts[key] = FigureSplit(reason=item["image_error"])
                    continue
                data = reader.read(item["tar_path"], item["offset"], item["size"])
                layouts[key] = figure_decision(data, item["caption"], panel_type=item["panel_type"], reader=ocr)
        todo = [
            item
            for item in items
            if (item["pmcid"], item["image_file"]) in layouts
            and detector is not None
            and layouts[(item["pmcid"], item["image_file"])].reason is None
            and needs_detector(
                item["panel_type"],
                len(layouts[(item["pmcid"], item["image_file"])].panels),
                len(panel_labels(splits[(item["pmcid"], item["image_file"])])),
            )
        ]
        detected = {}
        if todo:
            refs = [{k: it[k] for k in ("pmcid", "image_file", "tar_path", "offset", "size")} for it in todo]
            for row in detect_images(
                lake,
                refs,
                detector,
                settings.batch_size,
                settings.actors,
                settings.gpus_per_actor,
                settings.address,
                settings.actor_resources,
            ):
                detected[(row["pmcid"], row["image_file"])] = row
        figure_rows, panel_rows, caption_rows = [], [], []
        for item in items:
            key = (item["pmcid"], item["image_file"])
            if key in carried:
                figure, panels = carried[key]
                figure_rows.append({**figure, "fig_id": item["fig_id"]})
                panel_rows.extend({**p, "fig_id": item["fig_id"]} for p in panels)
                kept = [Panel(box=(p["x1"], p["y1"], p["x2"], p["y2"]), label=p["label"]) for p in panels]
                caption_rows.extend(_caption_rows(item, kept, splits[key]))
                continue
            figure, panels = self._figure(item, layouts[key], detected.get(key), splits[key])
            figure_rows.append(figure)
            panel_rows.extend(panels)
            kept = [Panel(box=(p["x1"], p["y1"], p["x2"], p["y2"]), label=p["label"]) for p in panels]
            caption_rows.extend(_caption_rows(item, kept, splits[key]))
        with lake.commit(self.name, release, shard) as commit:  # the three tables together, or none
            commit.write_table(Table.PANEL_FIGURES, figure_rows)
            commit.write_table(Table.PANELS, panel_rows)
            commit.write_table(Table.PANEL_CAPTIONS, caption_rows)
        return self._result(partition, figure_rows, panel_rows, caption_rows, len(carried), len(todo))

    def _figure(self, item: dict, layout, detection: dict | None, split) -> tuple[dict, list[dict]]:
        detector = self.settings.detector
        figure = {
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
            "caption_labels": len(panel_labels(split)),
            "model": detector.model_label if detector else None,
            "model_revision": detector.revision if detector else None,
            "threshold": detector.threshold if detector else None,
            "synthetic": bool(detector and detector.synthetic),
            "settings": self.settings.fingerprint,
        }
        if layout.reason is not None:
            # the decoder refused it, or the decision failed: an error, not a skip
            unreadable = reason_kind(layout.reason) is not None or layout.reason.startswith("panel decision failed")
            figure["status"] = "error" if unreadable else "skipped"
            return figure, []
        detr = None
        if detection is not None:
            if detection["error"]:
                figure.update(status="error", reason=f"detector: {detection['error']}")
                return figure, []
            labels = [(b.box, b.label) for b in detection["label_boxes"] if b.label]
            # the printed labels the decision read come first: OCR, not the detector's label class
            printed = [(lab.box, lab.text) for lab in layout.labels]
            detr = finalize(detection["panels"], layout.width, layout.height, printed + labels)
            figure["n_detr"] = len(detr)
        method, panels, agreement = choose(layout.panels, detr, self.settings)
        if method != DECISION and layout.labels:
            panels = attach_labels(panels, [(lab.box, lab.text) for lab in layout.labels])
        other = detr if method == DECISION else layout.panels
        overlaps = best_overlaps(panels, other) if detr is not None else [None] * len(panels)
        figure.update(
            status="split" if len(panels) > 1 else "single",
            reason=None if detr is not None or len(panels) > 1 else "one panel, not sent to the detector",
            method=method,
            n_panels=len(panels),
            agreement=agreement,
        )
        rows = [
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
                "model": figure["model"] if method != DECISION else None,
                "model_revision": figure["model_revision"] if method != DECISION else None,
                "threshold": figure["threshold"] if method != DECISION else None,
            }
            for index, (panel, overlap) in enumerate(zip(panels, overlaps, strict=True))
        ]
        return figure, rows

    def _result(self, partition, figures, panels, captions, carried: int, detected: int) -> StageResult:
        statuses = Counter(f["status"] for f in figures)
        methods = Counter(f["method"] for f in figures if f["method"])
        errors = [f for f in figures if f["status"] == "error"]
        split = [f for f in figures if f["status"] == "split"]
        with_labels = [f for f in split if f["caption_labels"]]
        matching = sum(1 for f in with_labels if f["caption_labels"] == f["n_panels"])
        agreements = Counter(
            figure_agreement(f["n_panels"], f["caption_labels"] or 0) for f in figures if f["n_panels"]
        )
        result = self.result(
            partition,
            ok=len(figures) - len(errors) - carried,
            error=len(errors),
            skipped=carried,
            counts={
                "images": len(figures),
                **{f"status_{k}": v for k, v in sorted(statuses.items())},
                **{f"method_{k}": v for k, v in sorted(methods.items())},
                "panels": len(panels),
                "carried": carried,
                "sent_to_detector": detected,
                "detector": self.settings.detector.model_label if self.settings.detector else "none (figure decision)",
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


def _caption_rows(item: dict, panels: list[Panel], split) -> list[dict]:
    """One ``panel_captions`` row per panel (``panels`` in ``panel_index`` order)."""
    assigned = assign_captions(panels, split)
    return [
        {
            "pmcid": item["pmcid"],
            "fig_id": item["fig_id"],
            "image_file": item["image_file"],
            "panel_index": index,
            **row,
        }
        for index, row in enumerate(assigned)
    ]


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


# ---- crops --------------------------------------------------------------------------------


def crops_tar(lake: Lake, release: str, shard: str) -> str:
    return lake.path("panels", f"release={release}", f"shard={shard}", "crops.tar")


@dataclass
class PanelCropsStage(Stage):
    """Every panel of the partition cut from its original image into one tar (JPEG, quality 95,
    4:4:4), indexed by ``panel_crops``: crops are derived once, never millions of loose files.
    Each crop goes through the release gate (``pipelines.images.gate``): one that fails it is
    still cut, for inspection, with its reason in ``gate``, and is never released as a panel.
    Its items are panels: ``ok`` the crops cut, ``error`` the panels of images that could not be
    decoded (the reason is recorded once per image)."""

    gate: GateSettings = field(default_factory=GateSettings)

    name = "panel_crops"
    reads = (Table.PANELS, Table.RAW_FILES)
    writes = (Table.PANEL_CROPS,)

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        import hashlib
        import tarfile

        release, shard = partition.release, partition.shard
        panels = lake.require(Table.PANELS, release, shard)
        files = lake.require(Table.RAW_FILES, release, shard)
        where = {(f["pmcid"], f["name"]): f for f in files.to_pylist()}
        by_image: dict[tuple[str, str], list[dict]] = {}
        for row in panels.to_pylist():
            by_image.setdefault((row["pmcid"], row["image_file"]), []).append(row)
        dest = crops_tar(lake, release, shard)
        relative = lake.relative(dest)
        rows, errors, written, uncut = [], [], 0, 0
        sheet: list[tuple[bytes, str]] = []  # the first crops, for the UI
        # the tar and its index are published together: an index row never points at other bytes
        with lake.commit(self.name, release, shard) as commit:
            with (
                commit.file(dest, suffix=".tar") as tmp,
                tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar,
                RawReader(lake) as reader,
            ):
                for (pmcid, image_file), image_panels in sorted(by_image.items()):
                    raw = where[(pmcid, image_file)]
                    image, reason = decode_image(reader.read(raw["tar_path"], raw["offset"], raw["size"]))
                    if image is None:
                        errors.append((f"{pmcid} {image_file}", reason))
                        uncut += len(image_panels)  # the unit is the panel, like ``ok``
                        continue
                    for panel in sorted(image_panels, key=lambda p: p["panel_index"]):
                        box = (panel["x1"], panel["y1"], panel["x2"], panel["y2"])
                        crop = crop_panel(image, box)
                        reason, measures = crop_gate(crop, self.gate)
                        data = jpeg_bytes(crop)
                        name = f"{pmcid}/{image_file}.p{panel['panel_index']:03d}.jpg"
                        offset = add_member(tar, name, io.BytesIO(data), len(data))
                        written += len(data)
                        if len(sheet) < SHEET_ITEMS:
                            sheet.append((data, f"{image_file} p{panel['panel_index']} {reason or 'passes the gate'}"))
                        rows.append(
                            {
                                "pmcid": pmcid,
                                "fig_id": panel["fig_id"],
                                "image_file": image_file,
                                "panel_index": panel["panel_index"],
                                "method": panel["method"],
                                "tar_path": relative,
                                "offset": offset,
                                "size": len(data),
                                "sha256": hashlib.sha256(data).hexdigest(),
                                "width": box[2] - box[0],
                                "height": box[3] - box[1],
                                "gate": reason,
                                "ink": measures.ink,
                                "text_run": round(measures.text_run, 3),
                            }
                        )
            commit.write_table(Table.PANEL_CROPS, rows)
        result = self.result(
            partition,
            ok=len(rows),
            error=uncut,
            bytes=written,
            counts={
                "crops": len(rows),
                "panels_uncut": uncut,
                "images_unreadable": len(errors),
                "gate_passed": sum(1 for r in rows if r["gate"] is None),
                **{f"gate_{reason}": sum(1 for r in rows if r["gate"] == reason) for reason in GATE_REASONS},
            },
            paths={"tar": dest},
        )
        if sheet:
            title = f"panel crops of {partition}: {len(sheet)} of {len(rows)}, with the gate's verdict"
            result.counts["crops_sheet"] = Markdown(sheet_preview(captioned_sheet(sheet, title), title=title))
        result.errors = errors
        return result
