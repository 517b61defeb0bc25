"""The Arrow schema of every lake table, in one place.

Each table is stored as Parquet under ``tables/<name>/release=<R>/shard=<S>/data.parquet``;
``release`` and ``shard`` live in the Hive path, not in the files, so DuckDB and pyarrow
datasets add them as columns when reading the whole table.
"""

from __future__ import annotations

import pyarrow as pa

INVENTORY = pa.schema(
    [
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("version", pa.int32()),
        pa.field("pmid", pa.string()),
        pa.field("doi", pa.string()),
        pa.field("citation", pa.string()),
        pa.field("license_raw", pa.string()),
        pa.field("license_code", pa.string()),
        pa.field("license_group", pa.string()),
        pa.field("retracted", pa.bool_()),
        pa.field("last_updated", pa.timestamp("s", tz="UTC")),
        pa.field("source", pa.string()),
        pa.field("source_paths", pa.list_(pa.string())),
        pa.field("source_md5", pa.list_(pa.string())),
        pa.field("source_etag", pa.string()),
        pa.field("change", pa.string()),
        pa.field("warning", pa.string()),
        pa.field("error", pa.string()),
    ]
)

INVENTORY_ERRORS = pa.schema(
    [
        pa.field("location", pa.string()),
        pa.field("raw", pa.string()),
        pa.field("error", pa.string()),
    ]
)

RELEASE_CHANGES = pa.schema(
    [
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("change", pa.string(), nullable=False),
        pa.field("previous_release", pa.string()),
        pa.field("previous_version", pa.int32()),
        pa.field("version", pa.int32()),
        pa.field("reason", pa.string()),
    ]
)

RAW_MANIFEST = pa.schema(
    [
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("version", pa.int32()),
        pa.field("source", pa.string()),
        pa.field("status", pa.string(), nullable=False),
        pa.field("error", pa.string()),
        pa.field("warning", pa.string()),
        pa.field("n_files", pa.int32()),
        pa.field("bytes", pa.int64()),
        pa.field("files", pa.list_(pa.string())),
        pa.field("md5", pa.list_(pa.string())),
        pa.field("dropped", pa.list_(pa.string())),
        pa.field("fetched_in_release", pa.string()),
    ]
)

RAW_FILES = pa.schema(
    [
        pa.field("pmcid", pa.string(), nullable=False),
        pa.field("version", pa.int32()),
        pa.field("name", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("tar_path", pa.string(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("size", pa.int64(), nullable=False),
        pa.field("md5", pa.string(), nullable=False),
        pa.field("sha256", pa.string(), nullable=False),
    ]
)

TABLES: dict[str, pa.Schema] = {
    "inventory": INVENTORY,
    "inventory_errors": INVENTORY_ERRORS,
    "release_changes": RELEASE_CHANGES,
    "raw_manifest": RAW_MANIFEST,
    "raw_files": RAW_FILES,
}

MANIFEST_STATUSES = ("ok", "carried", "error", "retracted")
