"""WebDataset shards of a release: a global shuffled order, bounded shards, byte-reproducible.

Every partition's sample plan is stored sorted by ``shuffle_key``, so the release order is a
k-way merge of sorted runs: memory holds one batch per partition plus one output shard, however
large the release. Shards are cut at ``max_samples`` samples or ``max_bytes`` bytes, whichever
comes first, and named ``{name}-{000000}.tar`` so OpenCLIP's brace patterns read them. A shard
appears atomically; its Parquet sidecar (the keys it holds, written after it) marks it complete.

A rerun reuses a finished shard only when the digest of the rows it was planned from (every
plan column the writer reads: the texts and JSON written, and the sha256 of every image or crop)
equals the digest stored in its sidecar, so an edited caption or a re-cut crop always rewrites
its shard. Image bytes are checked against the plan's ``image_sha256`` as they are written: a
crop archive replaced under a stale index is refused, never shipped.
"""

from __future__ import annotations

import hashlib
import heapq
import io
import json
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from operator import itemgetter

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.core.errors import UpstreamMissingError
from pipelines.core.lake import Lake, dataset_dir, writer_of
from pipelines.core.rawstore import RawReader, add_member, padded_size
from pipelines.core.schemas import PAIR_SIDECAR, SHARD_SIDECAR, Table

SHARD_NAME = "panelforge"
LICENSE_SUBSETS = ("commercial", "noncommercial", "other")
_TAR_END = 2 * tarfile.BLOCKSIZE + tarfile.RECORDSIZE  # end-of-archive blocks and record padding, at most

FIGURE_LEVEL = "figure"
# The plan table of each level's samples and the columns of the sidecar beside its shards: the
# figure level plans in ``samples``, the pair levels (panel, region, longcap) in ``pair_samples``.
SIDECARS = {Table.SAMPLES: SHARD_SIDECAR, Table.PAIR_SAMPLES: PAIR_SIDECAR}
# Members beyond jpg/json/txt: the member's extension and the plan column holding its text; a
# member is written when its column is not null (every sample of a level has the same members).
EXTRA_MEMBERS = {"neg.txt": "neg_txt"}
_WRITER_COLUMNS = ["status", "shuffle_seed", "shuffle_key", "image_tar", "image_offset", "image_size", "caption"]


def plan_columns(table: str) -> list[str]:
    """The plan columns the writer reads: the sidecar's, and what it needs to write a sample."""
    columns = [n for n in SIDECARS[table].names if n != "shard"] + _WRITER_COLUMNS + ["meta_json"]
    return columns + (list(EXTRA_MEMBERS.values()) if table == Table.PAIR_SAMPLES else [])


@dataclass(frozen=True)
class ShardLimits:
    max_samples: int = 10_000
    max_bytes: int = 1_000_000_000


@dataclass
class SubsetResult:
    subset: str
    shards: list[dict] = field(default_factory=list)  # name, samples, bytes, sha256, reused
    seed: int | None = None
    license_codes: dict[str, int] = field(default_factory=dict)
    concepts: dict[str, int] = field(default_factory=dict)
    skipped: str | None = None  # why nothing was written: the subset had no sample

    @property
    def samples(self) -> int:
        return sum(s["samples"] for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s["bytes"] for s in self.shards)


def skipped_path(lake: Lake, release: str, subset: str = "*") -> str:
    """Where the record of a subset left unwritten (no sample) lives: in the lake, beside the
    dataset folder and never in it, so the release holds no empty folder; the card lists them."""
    return lake.path("subsets_skipped", f"release={release}", f"{subset}.json")


def skipped_subsets(lake: Lake, release: str) -> dict[str, dict]:
    """The subsets of ``release`` that had no sample: name -> {"reason", "level", "mixture"}."""
    found = {}
    for path in sorted(lake.fs.glob(skipped_path(lake, release))):
        record = json.loads(lake.fs.cat(path))
        found[record.pop("subset")] = record
    return found


def missing_subsets(lake: Lake, release: str, subsets: Iterable[str]) -> list[str]:
    """Why each of ``subsets`` has no shards to read, for a job that needs them: skipped (it had
    no sample; the recorded reason) or not written yet. Empty: every one is there."""
    skipped = skipped_subsets(lake, release)
    missing = []
    for subset in subsets:
        if lake.fs.exists(dataset_dir(lake, release, subset, "sizes.json")):
            continue
        why = skipped.get(subset, {}).get("reason")
        missing.append(f"{subset}: " + (f"no sample ({why})" if why else "not written yet (materialize its shards)"))
    return missing


def _member_bytes(size: int) -> int:
    return tarfile.BLOCKSIZE + padded_size(size)


def _extra_members(row: dict) -> list[tuple[str, bytes]]:
    return [(ext, row[column].encode()) for ext, column in EXTRA_MEMBERS.items() if row.get(column) is not None]


def sample_bytes(row: dict) -> int:
    texts = [row["caption"].encode(), row["meta_json"].encode(), *(data for _, data in _extra_members(row))]
    return _member_bytes(row["image_size"]) + sum(_member_bytes(len(t)) for t in texts)


def _plan_rows(lake: Lake, path: str, batch_size: int, columns: list[str]) -> Iterator[dict]:
    with lake.fs.open(path, "rb") as fh:
        for batch in pq.ParquetFile(fh).iter_batches(batch_size=batch_size, columns=columns):
            yield from batch.to_pylist()


def shuffled_samples(lake: Lake, release: str, batch_size: int = 1024, table: str = Table.SAMPLES) -> Iterator[dict]:
    """Every included sample of ``release`` in shuffle order (a merge of the sorted partitions)."""
    paths = sorted(lake.fs.glob(lake.path("tables", table, f"release={release}", "shard=*", "data.parquet")))
    if not paths:
        raise UpstreamMissingError(table, release, None, writer_of(table))
    columns = plan_columns(table)
    seed = None
    rows = (_plan_rows(lake, p, batch_size, columns) for p in paths)
    for row in heapq.merge(*rows, key=itemgetter("shuffle_key")):
        if seed is None:
            seed = row["shuffle_seed"]
        elif row["shuffle_seed"] != seed:
            raise ValueError(
                f"release {release} was planned with shuffle seeds {seed} and {row['shuffle_seed']}: "
                "re-materialize dataset_samples for every shard with one seed"
            )
        if row["status"] == "included":
            yield row


class _HashingFile(io.RawIOBase):
    """A write-only file that hashes what passes through, so a shard is read once."""

    def __init__(self, fh):
        self.fh, self.sha, self.position = fh, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.fh.write(data)
        self.sha.update(data)
        self.position += len(data)
        return len(data)

    def tell(self) -> int:
        return self.position


class StaleImageError(RuntimeError):
    """An image's bytes differ from the sha256 its plan row recorded: the archive it points into
    was rewritten after the plan was made (re-materialize the plan's upstream assets)."""


def plan_digest(rows: list[dict], columns: list[str]) -> str:
    """A hash of the planned rows of one shard: every plan column in ``columns`` of every row, in
    order. Image bytes enter through ``image_sha256`` (and their location), so a shard whose
    texts, metadata or images would come out different never matches."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps({c: row.get(c) for c in columns}, sort_keys=True, default=str).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def _image_bytes(reader: RawReader, row: dict) -> bytes:
    data = reader.read(row["image_tar"], row["image_offset"], row["image_size"])
    expected = row.get("image_sha256")
    if expected and hashlib.sha256(data).hexdigest() != expected:
        raise StaleImageError(
            f"sample {row['key']}: the bytes at {row['image_tar']}@{row['image_offset']} no longer have the "
            f"sha256 its plan recorded ({expected[:12]}...): the archive was rewritten after the plan; "
            "re-materialize the plan (dataset_samples / pair_samples) and what it reads"
        )
    return data


def _write_tar(lake: Lake, dest: str, rows: list[dict], reader: RawReader) -> tuple[int, str]:
    with lake.atomic_local_file(dest) as tmp:
        with open(tmp, "wb") as raw:
            out = _HashingFile(raw)
            with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
                for row in rows:
                    members = (
                        ("jpg", _image_bytes(reader, row)),
                        ("json", row["meta_json"].encode()),
                        *_extra_members(row),
                        ("txt", row["caption"].encode()),
                    )
                    for ext, data in members:
                        add_member(tar, f"{row['key']}.{ext}", io.BytesIO(data), len(data))
        return out.position, out.sha.hexdigest()


def sidecar_values(row: dict, schema: pa.Schema) -> dict:
    """One sidecar row: the plan's columns, and for a pair level what its JSON holds (the box,
    the text source, the description, the synthetic flag) and its text."""
    values = {name: row.get(name) for name in schema.names}
    if schema is PAIR_SIDECAR:
        meta = json.loads(row["meta_json"])
        box = meta.get("box") or [None] * 4
        values.update(zip(("x1", "y1", "x2", "y2"), box, strict=True))
        values.update(text=row["caption"], synthetic=bool(meta.get("synthetic")))
        values.update(text_source=meta.get("text_source"), description=meta.get("description"))
    return values


def _sidecar_table(rows: list[dict], shard: str, nbytes: int, sha256: str, digest: str, schema: pa.Schema) -> pa.Table:
    table = pa.Table.from_pylist([sidecar_values(row, schema) | {"shard": shard} for row in rows], schema=schema)
    return table.replace_schema_metadata({"tar_bytes": str(nbytes), "tar_sha256": sha256, "plan_sha256": digest})


def _existing_shard(lake: Lake, directory: str, stem: str, digest: str, schema: pa.Schema) -> dict | None:
    """The finished shard's facts when its sidecar records the plan ``digest`` and its tar has
    the recorded size, else None (a sidecar from before digests were recorded, or with other columns than
    ``schema``, never matches)."""
    tar, sidecar = f"{directory}/{stem}.tar", f"{directory}/{stem}.parquet"
    if not (lake.fs.exists(tar) and lake.fs.exists(sidecar)):
        return None
    with lake.fs.open(sidecar, "rb") as fh:
        found = pq.read_schema(fh)
    meta = found.metadata or {}
    if meta.get(b"plan_sha256", b"").decode() != digest or b"tar_sha256" not in meta:
        return None
    if found.names != schema.names:  # a sidecar from before its columns changed: rewritten with the shard
        return None
    if lake.fs.size(tar) != int(meta[b"tar_bytes"]):
        return None
    return {"bytes": int(meta[b"tar_bytes"]), "sha256": meta[b"tar_sha256"].decode()}


def write_subset(
    lake: Lake,
    release: str,
    subset: str,
    rows: Iterable[dict],
    limits: ShardLimits = ShardLimits(),
    name: str = SHARD_NAME,
    mixture: str | None = None,
    table: str = Table.SAMPLES,
    level: str = FIGURE_LEVEL,
    empty_reason: str = "no included sample passes the subset's filter",
) -> SubsetResult:
    """Write ``rows`` (in order) as the shards of ``dataset/<release>/<subset>/``; ``mixture`` names
    the training mixture the subset belongs to (None for a license-group subset); ``table`` is the
    plan the rows come from (it decides the sidecar's columns), ``level`` what one sample is.

    A subset without a sample is not written (a folder with an empty ``sizes.json`` is a config a
    loader fails on): its folder from an earlier run is removed and ``empty_reason`` recorded."""
    directory = dataset_dir(lake, release, subset)
    columns = plan_columns(table)
    result = SubsetResult(subset)
    reader = RawReader(lake)
    pending: list[dict] = []
    pending_bytes = _TAR_END

    def flush() -> None:
        nonlocal pending, pending_bytes
        stem = f"{name}-{len(result.shards):06d}"
        digest = plan_digest(pending, columns)
        facts = _existing_shard(lake, directory, stem, digest, SIDECARS[table])
        reused = facts is not None
        if not reused:
            nbytes, sha = _write_tar(lake, f"{directory}/{stem}.tar", pending, reader)
            with lake.atomic_local_file(f"{directory}/{stem}.parquet") as tmp:
                sidecar = _sidecar_table(pending, f"{stem}.tar", nbytes, sha, digest, SIDECARS[table])
                pq.write_table(sidecar, tmp, compression="zstd")
            facts = {"bytes": nbytes, "sha256": sha}
        result.shards.append({"name": f"{stem}.tar", "samples": len(pending), "reused": reused, **facts})
        pending, pending_bytes = [], _TAR_END

    try:
        for row in rows:
            result.seed = row["shuffle_seed"]
            code, concept = row["license_code"], row["global_concept"] or "unlabeled"
            result.license_codes[code] = result.license_codes.get(code, 0) + 1
            result.concepts[concept] = result.concepts.get(concept, 0) + 1
            size = sample_bytes(row)
            if size + _TAR_END > limits.max_bytes:
                raise ValueError(f"sample {row['key']} alone ({size} bytes) exceeds the shard limit")
            if pending and (len(pending) >= limits.max_samples or pending_bytes + size > limits.max_bytes):
                flush()
            pending.append(row)
            pending_bytes += size
        if pending:
            flush()
    finally:
        reader.close()
    record = skipped_path(lake, release, subset)
    if not result.shards:
        if lake.fs.exists(directory):
            lake.fs.rm(directory, recursive=True)
        result.skipped = empty_reason
        with lake.atomic_local_file(record) as tmp, open(tmp, "w") as fh:
            json.dump({"subset": subset, "reason": empty_reason, "level": level, "mixture": mixture}, fh, indent=1)
        return result
    if lake.fs.exists(record):
        lake.fs.rm(record)
    settings = {"limits": vars(limits), "shard_name": name, "mixture": mixture, "level": level}
    _finish_directory(lake, directory, result, name, settings)
    return result


def _finish_directory(lake: Lake, directory: str, result: SubsetResult, name: str, settings: dict) -> None:
    """Remove shards left from a larger earlier run and the partial ``.<file>.<uuid>.tmp`` files
    that writers killed before temporary files moved to the lake's ``_tmp/`` left here, then
    write ``sizes.json`` (OpenCLIP reads it for the sample count) and ``manifest.json`` last."""
    keep = {s["name"] for s in result.shards} | {s["name"].replace(".tar", ".parquet") for s in result.shards}
    if lake.fs.exists(directory):
        for path in lake.fs.glob(f"{directory}/{name}-*"):
            if path.rsplit("/", 1)[1] not in keep:
                lake.fs.rm(path)
        for path in lake.fs.glob(f"{directory}/.*.tmp*"):
            lake.fs.rm(path)
    files = {
        "sizes.json": {s["name"]: s["samples"] for s in result.shards},
        "manifest.json": {
            "subset": result.subset,
            "shuffle_seed": result.seed,
            "samples": result.samples,
            "bytes": result.bytes,
            "license_codes": result.license_codes,
            "concepts": result.concepts,
            "shards": [{k: s[k] for k in ("name", "samples", "bytes", "sha256")} for s in result.shards],
            **settings,
        },
    }
    for filename, payload in files.items():
        with lake.atomic_local_file(f"{directory}/{filename}") as tmp, open(tmp, "w") as fh:
            json.dump(payload, fh, indent=1, sort_keys=True)


def by_license(group: str) -> Callable[[dict], bool]:
    return lambda row: row["license_group"] == group


def concept_filter(group: str, concepts: Iterable[str]) -> Callable[[dict], bool]:
    wanted = set(concepts)
    return lambda row: row["license_group"] == group and row["global_concept"] in wanted


def concept_cap(group: str, cap: int) -> Callable[[dict], bool]:
    """At most ``cap`` samples per global concept: in shuffle order, so a random subset of each."""
    counts: dict[str, int] = {}

    def keep(row: dict) -> bool:
        concept = row["global_concept"]
        if row["license_group"] != group or concept is None or counts.get(concept, 0) >= cap:
            return False
        counts[concept] = counts.get(concept, 0) + 1
        return True

    return keep


def by_level_and_license(level: str, group: str) -> Callable[[dict], bool]:
    return lambda row: row["level"] == level and row["license_group"] == group


def write_release_subsets(
    lake: Lake,
    release: str,
    subsets: dict[str, Callable[[dict], bool]],
    limits: ShardLimits = ShardLimits(),
    name: str = SHARD_NAME,
    mixture: str | None = None,
    table: str = Table.SAMPLES,
    levels: dict[str, str] | None = None,
    empty_reasons: dict[str, str] | None = None,
) -> dict[str, SubsetResult]:
    """Write each named subset (its own pass over the merged plan, so memory stays flat);
    ``levels`` says each subset's level (the figure level where not named), ``empty_reasons``
    what it means that a subset has no sample (recorded when it is skipped)."""
    levels, reasons = levels or {}, empty_reasons or {}
    return {
        subset: write_subset(
            lake,
            release,
            subset,
            filter(keep, shuffled_samples(lake, release, table=table)),
            limits,
            name,
            mixture,
            table,
            levels.get(subset, FIGURE_LEVEL),
            *([reasons[subset]] if subset in reasons else []),
        )
        for subset, keep in subsets.items()
    }
