"""The panels' crops: every panel of a (release, shard) cut from its original image into one tar,
indexed by ``panel_crops``, each crop with the release gate's verdict.

A crop is cut once: one whose inputs are unchanged (the image's bytes, the panel's box, the gate's
settings and :data:`CROPS_VERSION`: ``panel_crops.fingerprint``) is carried by the one reuse rule
(``reusable_results``: the previous release, then the partition's own rows), its bytes copied
unchanged from the earlier tar into the new one, so the rows and the tar are what cutting again
would write. Images that could not be decoded leave no row, so the next run tries them again."""

from __future__ import annotations

import hashlib
import io
import tarfile
from dataclasses import asdict, dataclass, field

from PIL import Image

from pipelines.core.fingerprints import fingerprint
from pipelines.core.lake import Lake
from pipelines.core.rawstore import RawReader, add_member
from pipelines.core.schemas import Table
from pipelines.core.stage import Markdown, Partition, Stage, StageResult, reusable_results
from pipelines.images.boxes import crop_panel
from pipelines.images.decode import decode_image
from pipelines.images.gate import REASONS as GATE_REASONS
from pipelines.images.gate import GateSettings, crop_gate
from pipelines.images.jpeg import JPEG_QUALITY, jpeg_bytes
from pipelines.images.previews import SHEET_ITEMS, captioned_sheet, sheet_preview

# The crop logic's version: bump it when a change to how a crop is cut, encoded or measured by the
# gate changes a crop's bytes or its row for the same image and box, so every crop is cut again.
CROPS_VERSION = "1"

Reusable = dict[str, tuple[dict, list[dict]]]  # what ``reusable_results`` finds: fingerprint -> (row, [])


def crops_tar(lake: Lake, release: str, shard: str) -> str:
    return lake.path("panels", f"release={release}", f"shard={shard}", "crops.tar")


@dataclass
class PanelCropsStage(Stage):
    """Every panel of the partition cut from its original image into one tar (JPEG, quality 95,
    4:4:4), indexed by ``panel_crops``: crops are derived once, never millions of loose files.
    Each crop goes through the release gate (``pipelines.images.gate``): one that fails it is
    still cut, for inspection, with its reason in ``gate``, and is never released as a panel.
    Its items are panels: ``ok`` the crops cut, ``skipped`` those carried (the module docstring),
    ``error`` the panels of images that could not be decoded (the reason is recorded once per image)."""

    gate: GateSettings = field(default_factory=GateSettings)

    name = "panel_crops"
    reads = (Table.PANELS, Table.RAW_FILES, Table.PANEL_CROPS)
    writes = (Table.PANEL_CROPS,)

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        release, shard = partition.release, partition.shard
        panels = lake.require(Table.PANELS, release, shard).to_pylist()
        files = lake.require(Table.RAW_FILES, release, shard).to_pylist()
        known = reusable_results(lake, Table.PANEL_CROPS, partition, crop_reuse_key)
        dest = crops_tar(lake, release, shard)
        # the tar and its index are published together: an index row never points at other bytes
        with lake.commit(self.name, release, shard) as commit:
            with (
                commit.file(dest, suffix=".tar") as tmp,
                tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar,
                RawReader(lake) as reader,
            ):
                cut = cut_crops(panels, files, tar, reader, lake.relative(dest), self.gate, known)
            commit.write_table(Table.PANEL_CROPS, cut.rows)
        return crops_result(self, partition, cut, dest)


def crops_settings(gate: GateSettings) -> str:
    """What a carried crop must have been made with: the crop logic's version, the JPEG quality
    and the gate's thresholds (its verdict and measures are in the row)."""
    return fingerprint({"version": CROPS_VERSION, "jpeg_quality": JPEG_QUALITY, "gate": asdict(gate)})


def crop_key(image_sha256: str | None, box: tuple[int, int, int, int], settings: str) -> str | None:
    """What a crop is reused by (``panel_crops.fingerprint``): everything its bytes and row depend
    on, the source image's bytes (sha256), the box in original pixels and :func:`crops_settings`.
    The names (pmcid, figure, panel index, method) are the panel's own and are not in it. None
    (never reused) when the image's sha256 is unknown."""
    return fingerprint({"sha256": image_sha256, "box": list(box), "settings": settings}) if image_sha256 else None


def crop_reuse_key(row: dict) -> str | None:
    """An earlier ``panel_crops`` row's key: its fingerprint (None in rows written before the
    column: never reused). Every row is a cut crop: an image that failed left no row."""
    return row.get("fingerprint")


def earlier_crop(reader: RawReader, row: dict) -> bytes | None:
    """A carried crop's bytes, read from the tar its row points into; None (cut it again) when
    that tar is gone or no longer holds the bytes the row recorded."""
    try:
        data = reader.read(row["tar_path"], row["offset"], row["size"])
    except FileNotFoundError:
        return None
    return data if hashlib.sha256(data).hexdigest() == row["sha256"] else None


@dataclass
class Cut:
    """What :func:`cut_crops` wrote into the tar at ``relative`` (its lake path): the
    ``panel_crops`` rows, the images it could not decode (with the reason), the bytes written, the
    panels not cut, the crops carried from an earlier run or release (the rest were cut), and the
    first crops for the UI."""

    relative: str
    rows: list[dict] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)
    written: int = 0
    uncut: int = 0
    carried: int = 0
    sheet: list[tuple[bytes, str]] = field(default_factory=list)

    def add(self, tar: tarfile.TarFile, panel: dict, data: bytes, verdict: dict, key: str | None) -> None:
        """One crop's bytes into ``tar`` and its row; ``verdict``: the gate's (gate, ink, text_run)."""
        name = f"{panel['pmcid']}/{panel['image_file']}.p{panel['panel_index']:03d}.jpg"
        offset = add_member(tar, name, io.BytesIO(data), len(data))
        self.written += len(data)
        if len(self.sheet) < SHEET_ITEMS:
            self.sheet.append(
                (data, f"{panel['image_file']} p{panel['panel_index']} {verdict['gate'] or 'passes the gate'}")
            )
        x1, y1, x2, y2 = _box(panel)
        self.rows.append(
            {
                **{k: panel[k] for k in ("pmcid", "fig_id", "image_file", "panel_index", "method")},
                "tar_path": self.relative,
                "offset": offset,
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "width": x2 - x1,
                "height": y2 - y1,
                **verdict,
                "fingerprint": key,
            }
        )


def cut_crops(
    panels: list[dict],
    files: list[dict],
    tar: tarfile.TarFile,
    reader: RawReader,
    relative: str,
    gate: GateSettings,
    known: Reusable | None = None,
) -> Cut:
    """Every panel's crop into ``tar`` (``relative``: the tar's lake path, for the index rows),
    image by image in (pmcid, image_file) order, panels in index order: carried from ``known``
    (:func:`crop_key` to an earlier row) where its bytes can still be read, else cut from the
    decoded image, which is read only when one of its panels needs cutting."""
    where = {(f["pmcid"], f["name"]): f for f in files}
    by_image: dict[tuple[str, str], list[dict]] = {}
    for row in panels:
        by_image.setdefault((row["pmcid"], row["image_file"]), []).append(row)
    settings, known = crops_settings(gate), known or {}
    cut = Cut(relative)
    for (pmcid, image_file), image_panels in sorted(by_image.items()):
        raw = where[(pmcid, image_file)]
        ordered = sorted(image_panels, key=lambda p: p["panel_index"])
        keys = [crop_key(raw["sha256"], _box(p), settings) for p in ordered]
        earlier = {k: data for k in keys if k in known and (data := earlier_crop(reader, known[k][0])) is not None}
        image = None
        if any(k not in earlier for k in keys):  # something to cut: decode the image once
            image, reason = decode_image(reader.read(raw["tar_path"], raw["offset"], raw["size"]))
            if image is None:
                cut.errors.append((f"{pmcid} {image_file}", reason))
                cut.uncut += len(ordered)  # the unit is the panel, like ``ok``
                continue
        for panel, key in zip(ordered, keys, strict=True):
            if key in earlier:
                data, verdict = earlier[key], {c: known[key][0][c] for c in ("gate", "ink", "text_run")}
                cut.carried += 1
            else:
                data, verdict = cut_crop(image, _box(panel), gate)
            cut.add(tar, panel, data, verdict, key)
    return cut


def _box(panel: dict) -> tuple[int, int, int, int]:
    return (panel["x1"], panel["y1"], panel["x2"], panel["y2"])


def cut_crop(image: Image.Image, box: tuple[int, int, int, int], gate: GateSettings) -> tuple[bytes, dict]:
    """One panel's crop cut from its decoded image, as JPEG, with the gate's verdict and measures."""
    crop = crop_panel(image, box)
    reason, measures = crop_gate(crop, gate)
    return jpeg_bytes(crop), {"gate": reason, "ink": measures.ink, "text_run": round(measures.text_run, 3)}


def crops_version(rows: list[dict]) -> str:
    """The run's data version: each crop's name, provenance and fingerprint, and its bytes' hash
    (everything its row and tar member are made of), so downstream goes stale only when a crop changed."""
    columns = ("pmcid", "image_file", "panel_index", "fig_id", "method", "fingerprint", "sha256")
    return fingerprint([[r[c] for c in columns] for r in rows])  # rows in the tar's (deterministic) order


def crops_result(stage: PanelCropsStage, partition: Partition, cut: Cut, dest: str) -> StageResult:
    rows = cut.rows
    result = stage.result(
        partition,
        ok=len(rows) - cut.carried,
        error=cut.uncut,
        skipped=cut.carried,
        carried=cut.carried,
        bytes=cut.written,
        counts={
            "crops": len(rows),
            "carried": cut.carried,
            "cut": len(rows) - cut.carried,
            "panels_uncut": cut.uncut,
            "images_unreadable": len(cut.errors),
            "gate_passed": sum(1 for r in rows if r["gate"] is None),
            **{f"gate_{reason}": sum(1 for r in rows if r["gate"] == reason) for reason in GATE_REASONS},
        },
        paths={"tar": dest},
        version=crops_version(rows),
    )
    if cut.sheet:
        title = f"panel crops of {partition}: {len(cut.sheet)} of {len(rows)}, with the gate's verdict"
        result.counts["crops_sheet"] = Markdown(sheet_preview(captioned_sheet(cut.sheet, title), title=title))
    result.errors = cut.errors
    return result
