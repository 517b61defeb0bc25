"""The detector's training data: synthetic compound figures made from the release's own
single-panel figures, written once per release and settings as a COCO dataset in the lake."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from pipelines.core.fingerprints import fingerprint
from pipelines.core.lake import TMP_DIR, Lake
from pipelines.core.schemas import Table
from pipelines.core.stage import RELEASE, Partition, Stage, StageInputError, StageResult
from pipelines.panels.layout import split_panels
from pipelines.panels.synthetic import source_panels, write_coco_dataset


def is_single_by_layout(image) -> bool:
    """The layout splitter's opinion, for figures the concept stage left unlabelled."""
    return len(split_panels(image)) <= 1


@dataclass
class SyntheticSetStage(Stage):
    """Synthetic compound figures (COCO, train and val) built from the release's single-panel
    figures; ``commercial_only`` keeps only commercially licensed sources (for a commercial
    detector). Reproducible from ``seed``; written once per release and settings."""

    figures: int = 2000
    seed: int = 0
    val_share: float = 0.1
    commercial_only: bool = False

    name = "panel_training_set"
    level = RELEASE
    reads = (Table.FIGURES, Table.RAW_FILES, Table.FIGURE_CONCEPTS, Table.ARTICLES)

    @property
    def version(self) -> str:
        """The set's version: its settings hashed (the generator is seeded: same settings, same set)."""
        return fingerprint(asdict(self))[:8]

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        release = partition.release
        dest = training_set_dir(lake, release, self.version)
        summary_path = f"{dest}/summary.json"
        if lake.exists(summary_path):  # written whole before: the same settings give the same set
            summary = json.loads(lake.fs.cat(summary_path))
            return self._result(partition, summary, dest, reused=True)
        sources = source_panels(lake, release, lake.shards(), self.commercial_only, is_single_by_layout)
        staging = Path(lake.path(TMP_DIR) if lake.is_local else tempfile.gettempdir()) / f"synthetic-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            try:
                summary = write_coco_dataset(staging, sources, self.figures, self.seed, split=self.val_share)
            except ValueError as exc:  # no source panel left for a split
                raise StageInputError(f"release {release}: cannot build synthetic compound figures: {exc}") from exc
            publish_dir(lake, staging, dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return self._result(partition, summary, dest, reused=False)

    def _result(self, partition: Partition, summary: dict, dest: str, reused: bool) -> StageResult:
        images = {name: split["images"] for name, split in summary["splits"].items()}
        result = self.result(
            partition,
            ok=sum(images.values()),
            counts={
                "version": self.version,
                "reused": reused,
                "seed": self.seed,
                "source_panels": summary["sources"],
                "near_duplicates_dropped": summary["dedup"]["dropped_near_duplicates"],
                **{f"{name}_figures": n for name, n in images.items()},
            },
            paths={"train": f"{dest}/train", "val": f"{dest}/val"},
        )
        result.version = fingerprint({"release": partition.release, "set": self.version})
        return result


def training_set_dir(lake: Lake, release: str, version: str) -> str:
    return lake.path("models", "panels", "synthetic", f"{release}-{version}")


def latest_training_set(lake: Lake, release: str, version: str = "") -> str:
    """The complete synthetic set of ``release`` (``version``, or the newest written)."""
    if version:
        found = [training_set_dir(lake, release, version)]
    else:
        pattern = lake.path("models", "panels", "synthetic", f"{release}-*", "summary.json")
        done = (
            sorted(lake.fs.glob(pattern), key=lambda p: lake.fs.modified(p))
            if lake.exists(lake.path("models", "panels", "synthetic"))
            else []
        )
        found = [p.rsplit("/", 1)[0] for p in done[-1:]]
    if not found or not lake.exists(f"{found[0]}/summary.json"):
        raise StageInputError(f"no synthetic training set for release {release}: materialize panel_training_set first")
    return found[0]


def publish_dir(lake: Lake, local: Path, dest: str) -> None:
    """Put a finished local folder at ``dest`` in one step on a local lake (rename), or by
    uploading it whole, summary last, so a reader that finds ``summary.json`` finds everything."""
    if lake.is_local:
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if os.path.exists(dest):
            shutil.rmtree(dest)
        os.replace(local, dest)
        return
    for path in sorted(p for p in local.rglob("*") if p.is_file() and p.name != "summary.json"):
        lake.fs.put_file(str(path), f"{dest}/{path.relative_to(local).as_posix()}")
    lake.fs.put_file(str(local / "summary.json"), f"{dest}/summary.json")
