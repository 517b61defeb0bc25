"""Which sources go to train and which to val, with no near-duplicate across the two.

A val score means something only if val figures are made of sources training never saw; PMC holds
the same image many times (reposted, re-encoded, resized), so splitting by key alone leaks. Each
source falls in a split by a hash of the seed and its key (stable when sources are added), then
every val source within a few dHash bits of a train source (the project's near-duplicate rule,
:func:`pipelines.images.duplicates.find_duplicates`) is dropped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pipelines.images.duplicates import find_duplicates
from pipelines.images.info import dhash
from pipelines.panels.synthetic.seeds import unit
from pipelines.panels.synthetic.sources import SourcePanel, load_source


@dataclass
class CheckedSource:
    """A source that decodes, with its dHash and decoded size; ``split`` is train, val or
    dropped; ``uses``: how many samples pasted it (insets not counted)."""

    source: SourcePanel
    phash: str
    width: int
    height: int
    split: str = "train"
    uses: int = 0


def check_sources(sources: Iterable[SourcePanel]) -> tuple[list[CheckedSource], list[dict]]:
    """Decode every source once (one at a time) for its size and dHash; undecodable ones and
    repeated keys are returned as problems."""
    checked, problems, seen = [], [], set()
    for source in sources:
        if source.key in seen:
            problems.append({"key": source.key, "problem": "duplicate key"})
            continue
        seen.add(source.key)
        try:
            image = load_source(source)
        except ValueError as exc:
            problems.append({"key": source.key, "problem": str(exc)})
            continue
        checked.append(CheckedSource(source, source.phash or dhash(image), image.width, image.height))
    return checked, problems


def split_sources(checked: list[CheckedSource], seed: int, val_share: float, max_distance: int) -> int:
    """Assign each source to train or val (by a hash of seed and key, about ``val_share`` to
    val), then drop from val every source within ``max_distance`` dHash bits of a train source.
    Returns how many were dropped (their ``split`` becomes "dropped")."""
    for item in checked:
        item.split = "val" if unit(seed, "split", item.source.key) < val_share else "train"
    rows = [
        {"pmcid": str(i), "fig_id": None, "image_files": ["x"], "sha256": None, "phash": [item.phash]}
        for i, item in enumerate(checked)
    ]
    dropped = 0
    for pair in find_duplicates(rows, max_distance):
        a, b = checked[int(pair["pmcid"])], checked[int(pair["other_pmcid"])]
        if a.split == "val" and b.split == "train":
            a.split = "dropped"
            dropped += 1
    return dropped
