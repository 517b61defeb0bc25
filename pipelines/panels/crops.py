"""The panels' crops: every panel of a (release, shard) cut from its original image into one tar,
indexed by ``panel_crops``, each crop with the release gate's verdict."""

from __future__ import annotations

import hashlib
import io
import tarfile
from dataclasses import dataclass, field

from pipelines.core.lake import Lake
from pipelines.core.rawstore import RawReader, add_member
from pipelines.core.schemas import Table
from pipelines.core.stage import Markdown, Partition, Stage, StageResult
from pipelines.images.boxes import crop_panel
from pipelines.images.decode import decode_image
from pipelines.images.gate import REASONS as GATE_REASONS
from pipelines.images.gate import GateSettings, crop_gate
from pipelines.images.jpeg import jpeg_bytes
from pipelines.images.previews import SHEET_ITEMS, captioned_sheet, sheet_preview


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
        release, shard = partition.release, partition.shard
        panels = lake.require(Table.PANELS, release, shard).to_pylist()
        files = lake.require(Table.RAW_FILES, release, shard).to_pylist()
        dest = crops_tar(lake, release, shard)
        # the tar and its index are published together: an index row never points at other bytes
        with lake.commit(self.name, release, shard) as commit:
            with (
                commit.file(dest, suffix=".tar") as tmp,
                tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar,
                RawReader(lake) as reader,
            ):
                cut = cut_crops(panels, files, tar, reader, lake.relative(dest), self.gate)
            commit.write_table(Table.PANEL_CROPS, cut.rows)
        return crops_result(self, partition, cut, dest)


@dataclass
class Cut:
    """What :func:`cut_crops` wrote: the ``panel_crops`` rows, the images it could not decode
    (with the reason), the bytes written, the panels not cut, and the first crops for the UI."""

    rows: list[dict] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)
    written: int = 0
    uncut: int = 0
    sheet: list[tuple[bytes, str]] = field(default_factory=list)


def cut_crops(
    panels: list[dict], files: list[dict], tar: tarfile.TarFile, reader: RawReader, relative: str, gate: GateSettings
) -> Cut:
    """Every panel cut from its decoded image into ``tar`` (``relative``: the tar's lake path,
    for the index rows), image by image in (pmcid, image_file) order, panels in index order."""
    where = {(f["pmcid"], f["name"]): f for f in files}
    by_image: dict[tuple[str, str], list[dict]] = {}
    for row in panels:
        by_image.setdefault((row["pmcid"], row["image_file"]), []).append(row)
    cut = Cut()
    for (pmcid, image_file), image_panels in sorted(by_image.items()):
        raw = where[(pmcid, image_file)]
        image, reason = decode_image(reader.read(raw["tar_path"], raw["offset"], raw["size"]))
        if image is None:
            cut.errors.append((f"{pmcid} {image_file}", reason))
            cut.uncut += len(image_panels)  # the unit is the panel, like ``ok``
            continue
        for panel in sorted(image_panels, key=lambda p: p["panel_index"]):
            box = (panel["x1"], panel["y1"], panel["x2"], panel["y2"])
            crop = crop_panel(image, box)
            reason, measures = crop_gate(crop, gate)
            data = jpeg_bytes(crop)
            name = f"{pmcid}/{image_file}.p{panel['panel_index']:03d}.jpg"
            offset = add_member(tar, name, io.BytesIO(data), len(data))
            cut.written += len(data)
            if len(cut.sheet) < SHEET_ITEMS:
                cut.sheet.append((data, f"{image_file} p{panel['panel_index']} {reason or 'passes the gate'}"))
            cut.rows.append(
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
    return cut


def crops_result(stage: PanelCropsStage, partition: Partition, cut: Cut, dest: str) -> StageResult:
    rows = cut.rows
    result = stage.result(
        partition,
        ok=len(rows),
        error=cut.uncut,
        bytes=cut.written,
        counts={
            "crops": len(rows),
            "panels_uncut": cut.uncut,
            "images_unreadable": len(cut.errors),
            "gate_passed": sum(1 for r in rows if r["gate"] is None),
            **{f"gate_{reason}": sum(1 for r in rows if r["gate"] == reason) for reason in GATE_REASONS},
        },
        paths={"tar": dest},
    )
    if cut.sheet:
        title = f"panel crops of {partition}: {len(cut.sheet)} of {len(rows)}, with the gate's verdict"
        result.counts["crops_sheet"] = Markdown(sheet_preview(captioned_sheet(cut.sheet, title), title=title))
    result.errors = cut.errors
    return result
