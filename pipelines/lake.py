"""The data lake: Parquet tables partitioned by release and shard, raw tars, a DuckDB catalog.

The root is a local path or an fsspec URL. Every file appears atomically: local files are
written to the lake's own ``_tmp/`` folder and renamed into place (``os.replace``; same file
system), remote files are written completely to local disk first and then uploaded as one
object, so a reader never sees a partial file, and a killed writer leaves its partial file in
``_tmp/``, never among the tables or the published dataset.

The DuckDB catalog names the Parquet files of a local lake relative to the lake root, so a
moved or copied lake keeps working: open it with :meth:`Lake.connect`, or with the DuckDB CLI
from the lake root (``cd data && duckdb catalog.duckdb``) or with ``SET file_search_path`` to
the lake root. DuckDB resolves a view's relative paths against the working directory (or
``file_search_path``), never against the catalog file.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from pipelines.partitioning import shard_keys
from pipelines.schemas import TABLES

CATALOG_FILE = "catalog.duckdb"
LAYOUT_FILE = "lake.json"


class LakeLayoutError(ValueError):
    """The lake was created with another shard count than the one asked for."""


BATCH_ROWS = 1024  # rows per Parquet row group, and at most this many rows buffered by a writer


def release_unused() -> None:
    """Hand Arrow's freed memory back to the system. Arrow's allocator (mimalloc) keeps freed
    pages for reuse; batch after batch, that alone grows the RSS of a streaming reader or writer
    with the number of batches (measured: 110 to 240 MB over 80 row groups), although no data
    is kept."""
    pa.default_memory_pool().release_unused()


def validated(table: str, data: pa.Table | list[dict]) -> pa.Table:
    """``data`` as an Arrow table with exactly the schema of ``table``; rows must have its fields."""
    schema = TABLES[table]
    if isinstance(data, pa.Table):
        return data.select(schema.names).cast(schema)
    rows, names = list(data), set(schema.names)
    for row in rows:  # from_pylist would quietly fill a forgotten field with nulls
        if row.keys() != names:
            raise ValueError(f"{table} row fields differ from the schema: {sorted(row.keys() ^ names)}")
    return pa.Table.from_pylist(rows, schema=schema)


class TableWriter:
    """Validates rows against a table's schema and writes them as Parquet row groups of
    ``batch_rows`` rows (zstd). Made by :meth:`Lake.table_writer`, which publishes the file."""

    def __init__(self, table: str, local_path: str, batch_rows: int, path: str):
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be at least 1, not {batch_rows}")
        self.table, self.batch_rows, self.path = table, batch_rows, path
        self.rows = 0  # written or buffered so far
        self._buffer: list[dict] = []
        self._writer = pq.ParquetWriter(local_path, TABLES[table], compression="zstd")

    def write(self, data: pa.Table | list[dict]) -> None:
        """Add rows (dicts with exactly the schema's fields) or an Arrow table."""
        if isinstance(data, pa.Table):
            self.flush()
            data = validated(self.table, data)
            self._writer.write_table(data, row_group_size=self.batch_rows)
            self.rows += data.num_rows
            return
        for row in data:
            self._buffer.append(row)
            self.rows += 1
            if len(self._buffer) >= self.batch_rows:
                self.flush()

    def flush(self) -> None:
        """Write the buffered rows as one row group."""
        if self._buffer:
            rows, self._buffer = self._buffer, []
            self._writer.write_table(validated(self.table, rows), row_group_size=self.batch_rows)
            release_unused()

    def close(self) -> None:
        self.flush()
        self._writer.close()

    def abort(self) -> None:
        self._buffer = []
        self._writer.close()


TMP_DIR = "_tmp"  # partial files of running (or killed) writers; never read, never published


class Lake:
    """A lake rooted at ``root`` (``./data``, ``/abs/path``, ``s3://bucket/prefix``...)."""

    def __init__(self, root: str | os.PathLike[str]):
        root = os.fspath(root)
        self.fs, path = fsspec.core.url_to_fs(root)
        self.is_local = isinstance(self.fs, LocalFileSystem)
        self.root = os.path.abspath(path) if self.is_local else path.rstrip("/")
        self.url = self.root if self.is_local else root.rstrip("/")
        if self.is_local:
            os.makedirs(self.root, exist_ok=True)

    # ---- paths -------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def table_path(self, table: str, release: str, shard: str) -> str:
        return self.path("tables", table, f"release={release}", f"shard={shard}", "data.parquet")

    def raw_dir(self, release: str, shard: str) -> str:
        return self.path("raw", f"release={release}", f"shard={shard}")

    def staging_dir(self, release: str, shard: str) -> Path:
        """Local scratch space for one partition's downloads (kept across runs to resume)."""
        base = Path(self.root) if self.is_local else Path(tempfile.gettempdir()) / "panelforge"
        path = base / "_staging" / f"release={release}" / f"shard={shard}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def exists(self, path: str) -> bool:
        return self.fs.exists(path)

    @property
    def tables(self) -> tuple[str, ...]:
        return tuple(TABLES)

    # ---- layout ------------------------------------------------------------------------
    def n_shards(self) -> int | None:
        """The shard count the lake was created with (``lake.json``), None for a new lake."""
        path = self.path(LAYOUT_FILE)
        if not self.fs.exists(path):
            return None
        return int(json.loads(self.fs.cat(path))["shards"])

    def shards(self) -> list[str]:
        """Every shard key of the lake; a lake that holds no release yet has none."""
        n = self.n_shards()
        return shard_keys(n) if n else []

    def ensure_layout(self, n_shards: int) -> list[str]:
        """Record ``n_shards`` for a new lake, or check it against the recorded one: every
        article's shard depends on it, so it is fixed for the life of a lake."""
        if n_shards < 1:
            raise LakeLayoutError(f"a lake needs at least one shard, got {n_shards}")
        recorded = self.n_shards()
        if recorded is None:
            with self.atomic_local_file(self.path(LAYOUT_FILE)) as tmp:
                Path(tmp).write_text(json.dumps({"shards": n_shards}))
        elif recorded != n_shards:
            raise LakeLayoutError(
                f"the lake at {self.url} has {recorded} shards per release, not {n_shards}: "
                "the shard count (PANELFORGE_SHARDS) is fixed for the life of a lake"
            )
        return shard_keys(n_shards)

    def previous_release(self, table: str, release: str) -> str | None:
        """The latest release before ``release`` that has ``table`` (keys sort by year)."""
        earlier = [r for r in self.releases(table) if r < release]
        return earlier[-1] if earlier else None

    # ---- atomic writes -----------------------------------------------------------------
    @contextlib.contextmanager
    def atomic_local_file(self, dest: str, suffix: str = "", overwrite: bool = True) -> Iterator[str]:
        """Yield a local temporary path; on success it becomes ``dest`` in one step.

        With ``overwrite=False`` an existing ``dest`` is never replaced: FileExistsError instead
        (on a local lake the check and the publishing are one ``link``)."""
        refuse = f"refusing to overwrite {dest}"
        if not overwrite and self.exists(dest):
            raise FileExistsError(refuse)
        if self.is_local:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            os.makedirs(self.path(TMP_DIR), exist_ok=True)
            tmp = self.path(TMP_DIR, f"{os.path.basename(dest)}.{uuid.uuid4().hex}.tmp{suffix}")
        else:
            fd, tmp = tempfile.mkstemp(suffix=suffix)
            os.close(fd)
        try:
            yield tmp
            if self.is_local:
                with open(tmp, "rb+") as fh:
                    os.fsync(fh.fileno())
                if overwrite:
                    os.replace(tmp, dest)
                else:
                    try:
                        os.link(tmp, dest)
                    except FileExistsError as exc:
                        raise FileExistsError(refuse) from exc
            else:
                if not overwrite and self.exists(dest):
                    raise FileExistsError(refuse)
                self.fs.put_file(tmp, dest)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def write_table(self, table: str, release: str, shard: str, data: pa.Table | list[dict]) -> str:
        """Write one partition of ``table`` atomically, validated against its schema."""
        with self.table_writer(table, release, shard) as writer:
            writer.write(data)
        return writer.path

    @contextlib.contextmanager
    def table_writer(self, table: str, release: str, shard: str, batch_rows: int = BATCH_ROWS) -> Iterator[TableWriter]:
        """Stream one partition of ``table`` to Parquet, ``batch_rows`` rows per row group.

        Rows are buffered at most ``batch_rows`` at a time and validated batch by batch, so
        memory is bounded by the batch, not the partition. The file appears when the block
        ends without an exception; if it raises, nothing is published and no file is left.
        """
        dest = self.table_path(table, release, shard)
        with self.atomic_local_file(dest) as tmp:
            writer = TableWriter(table, tmp, batch_rows, dest)
            try:
                yield writer
                writer.close()
            except BaseException:
                writer.abort()
                raise

    def read_table(self, table: str, release: str, shard: str) -> pa.Table | None:
        """Return one partition of ``table``, or None when it was never written."""
        path = self.table_path(table, release, shard)
        if not self.fs.exists(path):
            return None
        with self.fs.open(path, "rb") as fh:
            return pq.read_table(fh, schema=TABLES[table])

    def iter_batches(
        self, table: str, release: str, shard: str, batch_rows: int = BATCH_ROWS, columns: list[str] | None = None
    ) -> Iterator[pa.Table]:
        """Yield one partition of ``table`` in tables of at most ``batch_rows`` rows (nothing when
        it was never written), cast to the table's schema (or its ``columns``)."""
        path = self.table_path(table, release, shard)
        if not self.fs.exists(path):
            return
        schema = TABLES[table]
        wanted = pa.schema([schema.field(c) for c in columns]) if columns else schema
        with self.fs.open(path, "rb") as fh:
            for batch in pq.ParquetFile(fh).iter_batches(batch_size=batch_rows, columns=wanted.names):
                yield pa.Table.from_batches([batch]).select(wanted.names).cast(wanted)
                release_unused()

    def read_release(self, table: str, release: str) -> pa.Table:
        """Return every shard of ``table`` in ``release`` (empty table when none exist)."""
        parts = [
            self.read_table(table, release, p.rsplit("shard=", 1)[1].split("/")[0])
            for p in sorted(self.fs.glob(self.path("tables", table, f"release={release}", "shard=*", "data.parquet")))
        ]
        parts = [p for p in parts if p is not None]
        return pa.concat_tables(parts) if parts else TABLES[table].empty_table()

    def releases(self, table: str) -> list[str]:
        """Return the releases that have at least one partition of ``table``, sorted."""
        found = self.fs.glob(self.path("tables", table, "release=*"))
        return sorted({p.rstrip("/").rsplit("release=", 1)[1] for p in found})

    # ---- catalog -----------------------------------------------------------------------
    def _create_views(self, con, relative: bool) -> None:
        """One view per table that has data; ``relative``: paths relative to the lake root."""
        for table in TABLES:
            pattern = self.path("tables", table, "release=*", "shard=*", "data.parquet")
            if not self.fs.glob(pattern):
                continue
            if not self.is_local:
                location = self.fs.unstrip_protocol(pattern)
            elif relative:
                location = f"tables/{table}/release=*/shard=*/data.parquet"
            else:
                location = pattern
            location = location.replace("'", "''")
            con.execute(
                f"CREATE OR REPLACE VIEW {table} AS SELECT * FROM read_parquet("
                f"'{location}', hive_partitioning = true, union_by_name = true, "
                "hive_types = {'release': VARCHAR, 'shard': VARCHAR})"
            )

    def refresh_catalog(self) -> str:
        """Rebuild ``catalog.duckdb`` with one view per table that has data.

        The catalog holds only view definitions over the Parquet files, so it is rebuilt
        whole into a temporary file and renamed into place: concurrent runs never leave a
        half-written or locked catalog behind. A local lake's views name their files relative
        to the lake root (see the module docstring), so moving or copying the lake keeps them
        valid and a copy never reads the original's files; an object-store lake's views (and
        those of a local root whose path holds a comma) hold full paths.
        """
        import duckdb

        dest = self.path(CATALOG_FILE)
        with self.atomic_local_file(dest, suffix=".duckdb") as tmp:
            if os.path.exists(tmp):  # remote lakes hand us an empty mkstemp file
                os.unlink(tmp)
            con = duckdb.connect(tmp)
            try:
                # creating a view reads its files' schemas, so the relative paths must resolve now;
                # a root holding a comma (file_search_path's separator) keeps absolute paths
                relative = self.is_local and "," not in self.root
                if relative:
                    con.execute("SET file_search_path = ?", [self.root])
                self._create_views(con, relative=relative)
            finally:
                con.close()
        return dest

    def connect(self):
        """A read-only DuckDB connection with the lake's views, wherever the lake now lives.

        A local lake opens ``catalog.duckdb`` with ``file_search_path`` set to the lake root;
        an object-store lake (or a root whose path holds a comma, which ``file_search_path``
        would split) gets an in-memory database with the views created on the spot.
        """
        import duckdb

        catalog = self.path(CATALOG_FILE)
        if self.is_local and "," not in self.root and os.path.exists(catalog):
            con = duckdb.connect(catalog, read_only=True)
            con.execute("SET file_search_path = ?", [self.root])
            return con
        con = duckdb.connect()
        self._create_views(con, relative=False)
        return con
