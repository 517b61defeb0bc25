"""The article-disjoint held-out split: which articles no model may train on, so retrieval on them
measures generalisation rather than memorised captions.

An article is held out when a keyed hash of its normalized PMCID falls below ``share`` (blake2b,
64 bits, keyed with ``key``). The rule needs no state, so the same article stays held out in every
release for a given key and share (a later release only adds articles), and training code on any
machine can apply it. The split of a release is still *recorded* in the lake
(``models/eval/<release>/heldout.json``: the rule and the list of PMCIDs), because the record is
what an evaluation report cites and what training reads: a changed key or share in a later
configuration cannot silently leak earlier held-out articles into training.

It lives in ``core`` because both stage packages use it: ``pipelines.evaluation`` retrieves on the
held-out articles, ``pipelines.training`` drops their samples (``pipelines/training/heldout.py``:
a per-sample predicate for the multi-level trainer, a filtered tar stream for OpenCLIP's loader).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

from pipelines.core.lake import Lake
from pipelines.core.schemas import Table

DEFAULT_SHARE = 0.01
DEFAULT_KEY = "panelforge-heldout-v1"
RULE = "blake2b(normalized pmcid, key, 8 bytes) as big-endian uint64 / 2**64 < share"


def normalize_pmcid(pmcid: str) -> str:
    """The partitioning's normalization (strip, upper case), so ``pmc123`` and ``PMC123`` agree."""
    return pmcid.strip().upper()


def heldout_score(pmcid: str, key: str = DEFAULT_KEY) -> float:
    """A uniform number in [0, 1) fixed by the PMCID and the key."""
    digest = hashlib.blake2b(normalize_pmcid(pmcid).encode("ascii"), key=key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def is_heldout(pmcid: str, share: float = DEFAULT_SHARE, key: str = DEFAULT_KEY) -> bool:
    return heldout_score(pmcid, key) < share


@dataclass(frozen=True)
class HeldoutSplit:
    release: str
    share: float
    key: str
    pmcids: frozenset[str] = field(default_factory=frozenset)
    n_articles: int = 0

    def excludes(self, pmcid: str) -> bool:
        """True when training must not see ``pmcid`` (in the recorded list)."""
        return normalize_pmcid(pmcid) in self.pmcids

    def to_json(self) -> dict:
        return {
            "release": self.release,
            "rule": {"description": RULE, "hash": "blake2b", "digest_bytes": 8, "key": self.key, "share": self.share},
            "n_articles": self.n_articles,
            "n_heldout": len(self.pmcids),
            "pmcids": sorted(self.pmcids),
        }

    @classmethod
    def from_json(cls, data: dict) -> HeldoutSplit:
        rule = data["rule"]
        return cls(
            data["release"], float(rule["share"]), rule["key"], frozenset(data["pmcids"]), int(data["n_articles"])
        )


def split_pmcids(
    pmcids: Iterable[str], release: str, share: float = DEFAULT_SHARE, key: str = DEFAULT_KEY
) -> HeldoutSplit:
    if not 0.0 < share < 1.0:
        raise ValueError(f"held-out share must be in (0, 1), got {share}")
    unique = {normalize_pmcid(p) for p in pmcids}
    held = frozenset(p for p in unique if is_heldout(p, share, key))
    return HeldoutSplit(release, share, key, held, len(unique))


def heldout_path(lake: Lake, release: str) -> str:
    return lake.path("models", "eval", release, "heldout.json")


def release_pmcids(lake: Lake, release: str) -> set[str]:
    """Every article of ``release`` (the ``articles`` table, PMCID column only)."""
    out: set[str] = set()
    for shard in lake.shards():
        for batch in lake.iter_batches(Table.ARTICLES, release, shard, columns=["pmcid"]):
            out.update(batch.column("pmcid").to_pylist())
    return out


def record_split(lake: Lake, split: HeldoutSplit) -> str:
    """Write the split atomically to ``models/eval/<release>/heldout.json``; returns the path."""
    dest = heldout_path(lake, split.release)
    with lake.atomic_local_file(dest, suffix=".json") as tmp:
        with open(tmp, "w") as fh:
            json.dump(split.to_json(), fh, indent=1)
    return dest


def make_heldout_split(
    lake: Lake, release: str, share: float = DEFAULT_SHARE, key: str = DEFAULT_KEY, pmcids: Iterable[str] | None = None
) -> HeldoutSplit:
    """Split ``release`` (its ``articles`` unless ``pmcids`` is given) and record it in the lake."""
    split = split_pmcids(release_pmcids(lake, release) if pmcids is None else pmcids, release, share, key)
    record_split(lake, split)
    return split


def load_heldout(lake: Lake, release: str) -> HeldoutSplit:
    path = heldout_path(lake, release)
    if not lake.exists(path):
        raise FileNotFoundError(f"no held-out split recorded for release {release} at {path}")
    return HeldoutSplit.from_json(json.loads(lake.fs.cat(path)))


def training_split(
    lake: Lake, release: str, share: float = DEFAULT_SHARE, key: str = DEFAULT_KEY
) -> tuple[HeldoutSplit, bool]:
    """The split training on ``release`` must exclude, and whether it was recorded just now: the
    recorded one when there is one (whatever rule recorded it), else a new one by ``share`` and
    ``key`` (the evaluation's defaults unless told), recorded, so a later evaluation scores exactly
    the articles training left out. A release without articles has nothing to split: an error, not
    an empty split recorded for good."""
    if lake.exists(heldout_path(lake, release)):
        return load_heldout(lake, release), False
    pmcids = release_pmcids(lake, release)
    if not pmcids:
        raise ValueError(f"release {release} has no articles to split into held-out and training articles")
    return make_heldout_split(lake, release, share, key, pmcids=pmcids), True


def check_evaluation_share(lake: Lake, release: str, share: float | None, key: str = DEFAULT_KEY) -> None:
    """Refuse to record a split by another rule over the recorded one: training on ``release``
    left out exactly the recorded articles, so a new split would score articles a model trained
    on. ``share`` None (use the recorded split) or the recorded rule itself passes."""
    if share is not None and lake.exists(heldout_path(lake, release)):
        _same_rule(load_heldout(lake, release), share, key)


def _same_rule(recorded: HeldoutSplit, share: float | None, key: str) -> HeldoutSplit:
    if share is not None and (recorded.share, recorded.key) != (share, key):
        raise ValueError(
            f"release {recorded.release} already has a held-out split (share {recorded.share}, key "
            f"{recorded.key!r}; training leaves out exactly its {len(recorded.pmcids)} articles): a split by "
            f"share {share}, key {key!r} would score articles a model may have trained on. Leave share unset "
            "to evaluate on the recorded split"
        )
    return recorded


def evaluation_split(lake: Lake, release: str, share: float | None = None, key: str = DEFAULT_KEY) -> HeldoutSplit:
    """The split an evaluation of ``release`` scores: the recorded one, or a new one recorded by
    ``share`` and ``key`` when none is; a different rule over a recorded split is refused
    (:func:`check_evaluation_share`)."""
    if share is None or lake.exists(heldout_path(lake, release)):
        return _same_rule(load_heldout(lake, release), share, key)  # none recorded: load_heldout says so
    return make_heldout_split(lake, release, share, key)


def exclude_heldout(rows: Iterable[dict], split: HeldoutSplit, column: str = "pmcid") -> Iterable[dict]:
    """Training's filter: the rows whose article is not held out."""
    return (row for row in rows if not split.excludes(row[column]))


def webdataset_keep(split: HeldoutSplit) -> Callable[[dict], bool]:
    """A ``webdataset`` ``.select`` predicate for training on release shards: keeps a sample whose
    JSON member's article is not held out (samples without a PMCID are kept). A ``partial`` of a
    module function, not a closure, so it pickles into DataLoader workers."""
    return partial(_keep_sample, split)


def _keep_sample(split: HeldoutSplit, sample: dict) -> bool:
    raw = sample.get("json")
    if raw is None:
        return True
    meta = json.loads(raw) if isinstance(raw, (bytes, str)) else raw
    return not (meta.get("pmcid") and split.excludes(meta["pmcid"]))
