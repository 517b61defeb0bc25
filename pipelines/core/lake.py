"""The data lake: Parquet tables partitioned by release and shard, raw tars, a DuckDB catalog.

The root is a local path or an fsspec URL. Every file appears atomically: local files are
written to the lake's own ``_tmp/`` folder and renamed into place (``os.replace``; same file
system), remote files are written completely to local disk first and then uploaded as one
object, so a reader never sees a partial file, and a killed writer leaves its partial file in
``_tmp/``, never among the tables or the published dataset.

A stage that writes several outputs for one partition (tables, a tar and its index) publishes
them together with :meth:`Lake.commit`: every file is staged under ``_tmp/commits/``, a journal
listing the moves is written in one step to ``_commits/``, then the moves are made and the
journal removed. Whoever next reads the release, and every stage start, finishes a journal a
killed process left (:meth:`Lake.recover`), so a kill at any point leaves the old set or the new
set, never a mix. Every Parquet file carries the id of the commit that published it
(:meth:`Lake.commit_of`), so reuse can check that rows of two tables belong together.

Partial files a killed writer left in ``_tmp/`` are removed when the same file (or the same
stage's partition) is written again; a live writer's are never touched (each holds a lock).

The DuckDB catalog names the Parquet files of a local lake relative to the lake root, so a
moved or copied lake keeps working: open it with :meth:`Lake.connect`, or with the DuckDB CLI
from the lake root (``cd data && duckdb catalog.duckdb``) or with ``SET file_search_path`` to
the lake root. DuckDB resolves a view's relative paths against the working directory (or
``file_search_path``), never against the catalog file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from pipelines.core.errors import StageInputError, UpstreamMissingError
from pipelines.core.partitioning import shard_keys
from pipelines.core.schemas import TABLES

CATALOG_FILE = "catalog.duckdb"
LAYOUT_FILE = "lake.json"


class LakeLayoutError(StageInputError, ValueError):
    """The lake was created with another shard count than the one asked for."""


# The asset that writes each table, from the stages' declared ``writes`` (``Stage`` subclasses
# register themselves): what ``Lake.require`` tells a person to materialize.
WRITERS: dict[str, str] = {}


def writer_of(table: str) -> str | None:
    """The asset (stage name) that writes ``table``; every stage module is imported the first
    time a table's writer is not known yet (an error path: a notebook that imported one stage)."""
    if table not in WRITERS:
        import_stages()
    return WRITERS.get(table)


def import_stages() -> None:
    """Import every stage module of ``pipelines`` (``<package>/stages.py`` or ``stage.py``), so
    every stage class has declared what it writes (by name: the lake never imports the stage
    contract, which imports the lake)."""
    import importlib
    import importlib.util
    import pkgutil

    import pipelines

    for package in pkgutil.iter_modules(pipelines.__path__):
        if not package.ispkg:
            continue
        for module in ("stages", "stage"):
            name = f"pipelines.{package.name}.{module}"
            if importlib.util.find_spec(name) is not None:
                importlib.import_module(name)


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
    ``batch_rows`` rows (zstd). Made by :meth:`Lake.table_writer` or :meth:`Commit.table_writer`,
    which publish the file; ``commit`` is stamped into the file's metadata."""

    def __init__(self, table: str, local_path: str, batch_rows: int, path: str, commit: str):
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be at least 1, not {batch_rows}")
        self.table, self.batch_rows, self.path, self.commit = table, batch_rows, path, commit
        self.rows = 0  # written or buffered so far
        self._buffer: list[dict] = []
        schema = TABLES[table].with_metadata({COMMIT_KEY: commit.encode()})
        self._writer = pq.ParquetWriter(local_path, schema, compression="zstd")

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


@contextlib.contextmanager
def _writing(table: str, local: str, batch_rows: int, dest: str, commit: str) -> Iterator[TableWriter]:
    """A :class:`TableWriter` closed when the block ends, aborted (nothing flushed) when it raises."""
    writer = TableWriter(table, local, batch_rows, dest, commit)
    try:
        yield writer
        writer.close()
    except BaseException:
        writer.abort()
        raise


TMP_DIR = "_tmp"  # partial files of running (or killed) writers; never read, never published
JOURNAL_DIR = "_commits"  # journals of commits being published (or left by a killed publisher)
COMMIT_KEY = b"panelforge.commit"  # Parquet metadata: the id of the commit that published the file
ALL = "all"  # the shard key of release-wide outputs


@contextlib.contextmanager
def hold_lock(lock: str) -> Iterator[None]:
    """Hold an exclusive lock on the file ``lock`` for the block: a sweeper that finds it held
    knows its writer is alive (the kernel drops the lock when a killed process's files close)."""
    folder = os.path.dirname(lock)
    os.makedirs(folder, exist_ok=True)
    # locked under a name no sweeper looks at, then renamed: a lock file is never seen unheld
    making = f"{folder}/.{uuid.uuid4().hex}.locking"
    fd = os.open(making, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(making, lock)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        os.close(fd)


def _abandoned(lock: str) -> bool:
    """No live process holds ``lock``: what it guards belongs to a dead writer."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def sweep_temporaries(folder: str, name: str) -> None:
    """Remove the temporary files of ``name`` in ``folder`` (``<name>.<id>.tmp...``) whose writers died:
    their lock is free."""
    try:
        entries = os.listdir(folder)
    except FileNotFoundError:
        return
    prefix = f"{name}."
    mine = [e for e in entries if e.startswith(prefix)]
    locks = {e for e in mine if e.endswith(".lock")}
    dead = [e for e in mine if e not in locks and f"{e}.lock" not in locks]  # a lock is made first, removed last
    for lock in locks:
        if _abandoned(f"{folder}/{lock}"):
            dead += [lock.removesuffix(".lock"), lock]
    for entry in dead:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{folder}/{entry}")


def _remove_local(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class Commit:
    """The outputs of one stage run on one partition, published together by :meth:`Lake.commit`.

    Write every output through it (``write_table``, ``table_writer``, ``file``); ``remove`` adds a
    path to delete in the same step (a finished run's checkpoints). Nothing is visible until the
    ``with`` block of :meth:`Lake.commit` ends without an exception."""

    def __init__(self, lake: Lake, stage: str, release: str, shard: str | None):
        self.lake, self.stage, self.release, self.shard = lake, stage, release, shard
        self.id = uuid.uuid4().hex
        self.area = lake.path(TMP_DIR, "commits", stage, f"release={release}", f"shard={shard or ALL}")
        self.staging = f"{self.area}/{self.id}"
        self.moves: dict[str, str] = {}  # destination -> staged file
        self.removals: list[str] = []

    def _staged(self, dest: str) -> str:
        return f"{self.staging}/{self.lake.relative(dest)}"

    @contextlib.contextmanager
    def file(self, dest: str, suffix: str = "") -> Iterator[str]:
        """A local path to write ``dest`` to; staged when the block ends without an exception,
        published with the rest of the commit."""
        staged = self._staged(dest)
        if self.lake.is_local:
            os.makedirs(os.path.dirname(staged), exist_ok=True)
            local = staged
        else:
            fd, local = tempfile.mkstemp(suffix=suffix)
            os.close(fd)
        try:
            yield local
            if self.lake.is_local:
                with open(local, "rb+") as fh:
                    os.fsync(fh.fileno())
            else:
                self.lake.fs.put_file(local, staged)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(local)
            raise
        else:
            if not self.lake.is_local:
                os.unlink(local)
        self.moves[dest] = staged

    @contextlib.contextmanager
    def table_writer(
        self,
        table: str,
        shard: str | None = None,
        batch_rows: int = BATCH_ROWS,
        release: str | None = None,
        dest: str | None = None,
    ) -> Iterator[TableWriter]:
        """Stream ``table`` of this partition (or of ``shard``, or into the file ``dest``) into the
        commit, as :meth:`Lake.table_writer` does into the lake."""
        dest = dest or self.lake.table_path(table, release or self.release, shard or self.shard or ALL)
        with self.file(dest) as local, _writing(table, local, batch_rows, dest, self.id) as writer:
            yield writer

    def write_table(
        self,
        table: str,
        data: pa.Table | list[dict],
        shard: str | None = None,
        release: str | None = None,
        dest: str | None = None,
    ) -> str:
        """Write one partition of ``table`` (or the file ``dest``) into the commit, validated
        against its schema."""
        with self.table_writer(table, shard, release=release, dest=dest) as writer:
            writer.write(data)
        return writer.path

    def remove(self, path: str) -> None:
        """Delete ``path`` (a file or folder of the lake) when the commit is published."""
        self.removals.append(path)

    def publish(self) -> None:
        """Write the journal in one step, then make its moves (see :meth:`Lake.recover`)."""
        lake = self.lake
        if not self.moves and not self.removals:
            lake.remove(self.staging)
            return
        journal = {
            "commit": self.id,
            "stage": self.stage,
            "release": self.release,
            "shard": self.shard or ALL,
            "staging": lake.relative(self.staging),
            "moves": [[lake.relative(staged), lake.relative(dest)] for dest, staged in self.moves.items()],
            "remove": [lake.relative(path) for path in self.removals],
        }
        path = lake.path(JOURNAL_DIR, f"release={self.release}", f"{self.stage}.{self.shard or ALL}.{self.id}.json")
        with lake.atomic_local_file(path) as tmp:
            Path(tmp).write_text(json.dumps(journal, indent=1))
        lake.apply_journal(path, journal)


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

    def relative(self, path: str) -> str:
        """``path`` relative to the lake root (``_outside/<name>`` for a path outside it)."""
        if path.startswith(self.root + "/"):
            return path[len(self.root) + 1 :]
        return f"_outside/{os.path.basename(path)}"

    def table_path(self, table: str, release: str, shard: str) -> str:
        return self.path("tables", table, f"release={release}", f"shard={shard}", "data.parquet")

    def raw_dir(self, release: str, shard: str) -> str:
        return self.path("raw", f"release={release}", f"shard={shard}")

    def job_tmp_dir(self) -> str | None:
        """Where launched jobs stage the files they write into this lake (its ``_tmp/jobs``), so a
        killed job's partial files are never beside its checkpoints; None on an object store,
        where a file appears whole in one PUT."""
        return self.path(TMP_DIR, "jobs") if self.is_local else None

    def staging_dir(self, release: str, shard: str) -> Path:
        """Local scratch space for one partition's downloads (kept across runs to resume)."""
        base = Path(self.root) if self.is_local else Path(tempfile.gettempdir()) / "panelforge"
        path = base / "_staging" / f"release={release}" / f"shard={shard}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def exists(self, path: str) -> bool:
        return self.fs.exists(path)

    def remove(self, path: str) -> None:
        """Delete a file or folder of the lake; nothing when it is not there."""
        if self.is_local:
            _remove_local(path)
        elif self.fs.exists(path):
            self.fs.rm(path, recursive=True)

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
        if self.check_layout(n_shards) is None:
            with self.atomic_local_file(self.path(LAYOUT_FILE)) as tmp:
                Path(tmp).write_text(json.dumps({"shards": n_shards}))
        return shard_keys(n_shards)

    def check_layout(self, n_shards: int) -> int | None:
        """Refuse ``n_shards`` when the lake was created with another count (``LakeLayoutError``);
        the recorded count, or None for a lake that records none yet. Writes nothing."""
        if n_shards < 1:
            raise LakeLayoutError(f"a lake needs at least one shard, got {n_shards}")
        recorded = self.n_shards()
        if recorded is not None and recorded != n_shards:
            raise LakeLayoutError(
                f"the lake at {self.url} has {recorded} shards per release, not {n_shards}: "
                "the shard count (PANELFORGE_SHARDS) is fixed for the life of a lake"
            )
        return recorded

    def previous_release(self, table: str, release: str) -> str | None:
        """The latest release before ``release`` that has ``table`` (keys sort by year)."""
        earlier = [r for r in self.releases(table) if r < release]
        return earlier[-1] if earlier else None

    # ---- atomic writes -----------------------------------------------------------------
    @contextlib.contextmanager
    def atomic_local_file(self, dest: str, suffix: str = "", overwrite: bool = True) -> Iterator[str]:
        """Yield a local temporary path; on success it becomes ``dest`` in one step.

        On a local lake the temporary file is ``_tmp/files/<dest's path>.<id>.tmp``, held under a
        lock while the block runs; what killed writers of the same ``dest`` left there is removed
        first. With ``overwrite=False`` an existing ``dest`` is never replaced: FileExistsError
        instead (on a local lake the check and the publishing are one ``link``)."""
        refuse = f"refusing to overwrite {dest}"
        if not overwrite and self.exists(dest):
            raise FileExistsError(refuse)
        if self.is_local:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            rel = self.relative(dest)
            folder = self.path(TMP_DIR, "files", os.path.dirname(rel))
            sweep_temporaries(folder, os.path.basename(rel))
            tmp = f"{folder}/{os.path.basename(rel)}.{uuid.uuid4().hex}.tmp{suffix}"
            lock = hold_lock(f"{tmp}.lock")
        else:
            fd, tmp = tempfile.mkstemp(suffix=suffix)
            os.close(fd)
            lock = contextlib.nullcontext()
        with lock:
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

    # ---- commits -----------------------------------------------------------------------
    @contextlib.contextmanager
    def commit(self, stage: str, release: str, shard: str | None = None) -> Iterator[Commit]:
        """Publish every output written through the yielded :class:`Commit` together, or none.

        Starting a commit first finishes any journal a killed run left for ``release`` and
        removes what killed runs of ``stage`` staged for this partition and never published."""
        self.recover(release)
        commit = Commit(self, stage, release, shard)
        lock = hold_lock(f"{commit.staging}.lock") if self.is_local else contextlib.nullcontext()
        with lock:
            self._sweep_commits(commit.area, keep=commit.id)
            try:
                yield commit
            except BaseException:
                self.remove(commit.staging)
                raise
            commit.publish()

    def _sweep_commits(self, area: str, keep: str) -> None:
        """Remove the staging folders of dead commits of one stage and partition."""
        try:
            entries = self.fs.ls(area, detail=False)
        except FileNotFoundError:
            return
        for entry in entries:
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            commit_id = name.removesuffix(".lock")
            if commit_id == keep:
                continue
            if self.is_local and not _abandoned(f"{area}/{commit_id}.lock"):
                continue
            self.remove(f"{area}/{commit_id}")
            if self.is_local:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{area}/{commit_id}.lock")

    def apply_journal(self, path: str, journal: dict) -> None:
        """Make a journal's moves and removals, then delete it. Safe to repeat, and to run
        while another process applies the same journal: a staged file already moved is skipped."""
        for staged_rel, dest_rel in journal["moves"]:
            staged, dest = self.path(staged_rel), self.path(dest_rel)
            if self.is_local:
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                try:
                    os.replace(staged, dest)
                except FileNotFoundError:
                    if os.path.exists(staged):
                        raise
            elif self.fs.exists(staged):
                self.fs.mv(staged, dest)
        for rel in journal["remove"]:
            self.remove(self.path(rel))
        self.remove(path)
        staging = self.path(journal["staging"])
        self.remove(staging)
        if self.is_local and _abandoned(f"{staging}.lock"):  # its publisher died: nobody else removes it
            self.remove(f"{staging}.lock")

    def recover(self, release: str) -> int:
        """Finish every commit of ``release`` whose publisher died after writing its journal;
        returns how many. Reads and stage starts call it, so a half-published set is never read."""
        folder = self.path(JOURNAL_DIR, f"release={release}")
        try:
            names = sorted(os.listdir(folder) if self.is_local else self.fs.ls(folder, detail=False))
        except FileNotFoundError:
            return 0
        done = 0
        for name in names:
            path = f"{folder}/{name.rstrip('/').rsplit('/', 1)[-1]}"
            if not path.endswith(".json"):
                continue
            try:
                journal = json.loads(self.fs.cat(path))
            except FileNotFoundError:  # finished by its publisher meanwhile
                continue
            self.apply_journal(path, journal)
            done += 1
        return done

    def commit_of(self, table: str, release: str, shard: str) -> str | None:
        """The id of the commit that published this partition of ``table`` (None: never
        written, or written before commits were stamped)."""
        self.recover(release)
        path = self.table_path(table, release, shard)
        if not self.fs.exists(path):
            return None
        with self.fs.open(path, "rb") as fh:
            metadata = pq.read_schema(fh).metadata or {}
        value = metadata.get(COMMIT_KEY)
        return value.decode() if value else None

    def data_digest(self, table: str, release: str, shard: str) -> str | None:
        """A hash of the rows of one partition of ``table`` as stored: the Parquet file without its
        footer (where the commit id and the writer's version are), so the same rows written by
        another run give the same digest. None when the partition was never written."""
        self.recover(release)
        path = self.table_path(table, release, shard)
        if not self.fs.exists(path):
            return None
        digest = hashlib.sha256()
        with self.fs.open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(size - 8)
            footer = int.from_bytes(fh.read(4), "little")
            left = size - 8 - footer
            fh.seek(0)
            while left > 0:
                block = fh.read(min(left, 1 << 20))
                if not block:
                    break
                digest.update(block)
                left -= len(block)
        return digest.hexdigest()[:16]

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
        with self.atomic_local_file(dest) as tmp, _writing(table, tmp, batch_rows, dest, uuid.uuid4().hex) as writer:
            yield writer

    def read_table(self, table: str, release: str, shard: str) -> pa.Table | None:
        """Return one partition of ``table``, or None when it was never written."""
        self.recover(release)
        return self.read_file(table, self.table_path(table, release, shard))

    def require(self, table: str, release: str, shard: str | None = None) -> pa.Table:
        """One partition of ``table`` (``shard`` None: every shard of the release) that a stage
        cannot run without: when it was never written, :class:`UpstreamMissingError` says which
        asset to materialize first (a person must act; nothing is retried)."""
        if shard is None:
            if not self.fs.glob(self.path("tables", table, f"release={release}", "shard=*", "data.parquet")):
                raise UpstreamMissingError(table, release, None, writer_of(table))
            return self.read_release(table, release)
        found = self.read_table(table, release, shard)
        if found is None:
            raise UpstreamMissingError(table, release, shard, writer_of(table))
        return found

    def read_file(self, table: str, path: str) -> pa.Table | None:
        """A Parquet file of the lake with the schema of ``table`` (None when it is not there)."""
        if not self.fs.exists(path):
            return None
        with self.fs.open(path, "rb") as fh:
            return pq.read_table(fh, schema=TABLES[table])

    def iter_batches(
        self, table: str, release: str, shard: str, batch_rows: int = BATCH_ROWS, columns: list[str] | None = None
    ) -> Iterator[pa.Table]:
        """Yield one partition of ``table`` in tables of at most ``batch_rows`` rows (nothing when
        it was never written), cast to the table's schema (or its ``columns``). A column the file
        lacks (written before the column was added) is read as nulls, as :meth:`read_file` does."""
        self.recover(release)
        path = self.table_path(table, release, shard)
        if not self.fs.exists(path):
            return
        schema = TABLES[table]
        wanted = pa.schema([schema.field(c) for c in columns]) if columns else schema
        with self.fs.open(path, "rb") as fh:
            for batch in pq.ParquetFile(fh).iter_batches(batch_size=batch_rows, columns=wanted.names):
                names = batch.schema.names
                found = [batch.column(f.name) if f.name in names else pa.nulls(batch.num_rows, f.type) for f in wanted]
                yield pa.Table.from_arrays(found, names=wanted.names).cast(wanted)
                release_unused()

    def read_release(self, table: str, release: str) -> pa.Table:
        """Return every shard of ``table`` in ``release`` (empty table when none exist)."""
        self.recover(release)
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


def dataset_dir(lake: Lake, *parts: str) -> str:
    """The folder mirrored to the Hub: ``README.md`` and one folder per release."""
    return lake.path("dataset", *parts)
