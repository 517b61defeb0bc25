"""No machine path in a released file: the audit of a dataset folder before it is published.

A released file must never hold a path of the machine that built it (``/home/me/data/models/...``):
it is useless to a reader and says who built it where. Provenance columns name models by id
(``pipelines.core.provenance``); this audit is the net under that rule. It reads every file of the
folder: JSON, Markdown and text files whole, the text members of every WebDataset tar (the
``.json``, ``.txt`` and ``.neg.txt`` of each sample, never the images), and every string value of
every Parquet file (nested lists and structs included, and the file's key-value metadata).

An absolute path is one under a folder machines keep files in (``/home/me/x``, ``/tmp/x``,
``/scratch/...``, ``MACHINE_ROOTS``) or under a root the caller names (the lake's), a ``~/`` path,
a Windows drive path or a ``file://`` URI; a ``/`` inside a word or after a host (``mg/kg``,
``https://host/a/b``, a DOI, a genotype ``+/+/Oprm1B6/B6``) is not one. Article text may quote a
real path (a methods section naming ``/usr/bin/...``): ``content=False`` leaves out the fields
that hold the articles' own words, for the check that runs on real releases.
"""

from __future__ import annotations

import json
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

# The top folders machine paths start from (Linux, macOS, clusters, cloud notebooks). A generic
# "/a/b" would flag genotypes in article text ("Taar1+/+/Oprm1B6/B6"); a machine path outside these
# is caught through the roots the caller names (the lake's own root).
MACHINE_ROOTS = (
    "home Users root tmp var opt mnt media srv scratch work workspace workspaces data nfs gpfs lustre net "
    "private usr etc proc run cluster shared storage projects Volumes fsx efs content kaggle app code"
).split()
ABSOLUTE_PATH = re.compile(
    r"(?<![\w/.~\\+-])/(?:" + "|".join(MACHINE_ROOTS) + r")(?:/[\w.~+@-]+)+"
    r"|(?<![\w/.~\\+-])~/[\w.~+-]+"
    r"|(?<![A-Za-z])[A-Za-z]:\\[\w.~+-]+"
    r"|file://\S+"
)
# Fields (JSON keys, Parquet columns, tar members) that hold the articles' own words.
CONTENT_FIELDS = frozenset(
    """title abstract body_text keywords subjects citation license_text caption caption_title caption_text
    mentions text section description long_caption original_span replacement features acronyms label fig_label
    neg.txt txt mesh mesh_terms mesh_major_terms publication_types negatives preface""".split()
)
SKIPPED_SUFFIXES = (".jpg", ".jpeg", ".png", ".tif", ".tiff", ".gif", ".webp")
MAX_SHOWN = 120


@dataclass(frozen=True)
class Finding:
    file: str  # relative to the folder
    where: str  # the tar member, Parquet column or JSON key path
    value: str  # the path found, as written


def find_machine_paths(
    folder: str | Path, content: bool = True, tars_per_folder: int | None = None, roots: tuple[str, ...] = ()
) -> list[Finding]:
    """Every absolute path in the files under ``folder``. ``content=False`` skips the article
    text fields (``CONTENT_FIELDS``); ``tars_per_folder`` reads only the first N tars of each
    folder (a bounded check on a large release); ``roots``: more folders whose paths must not
    appear (the lake's root, wherever it is)."""
    folder = Path(folder)
    scan = _Scanner(_pattern(roots), content)
    found: list[Finding] = []
    tars_seen: dict[Path, int] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        name = path.name.lower()
        if name.endswith(SKIPPED_SUFFIXES):
            continue
        if name.endswith(".tar"):
            tars_seen[path.parent] = tars_seen.get(path.parent, 0) + 1
            if tars_per_folder is None or tars_seen[path.parent] <= tars_per_folder:
                found += [Finding(rel, w, v) for w, v in scan.tar(path)]
        elif name.endswith(".parquet"):
            found += [Finding(rel, w, v) for w, v in scan.parquet(path)]
        else:
            text = path.read_bytes().decode("utf-8", errors="replace")
            texts = scan.json(text) if name.endswith(".json") else (("", p) for p in scan.paths(text))
            found += [Finding(rel, w, v) for w, v in texts]
    return found


def _pattern(roots: tuple[str, ...]) -> re.Pattern:
    extra = [re.escape(r.rstrip("/")) + r"(?![\w.~+@-])(?:/[\w.~+@-]+)*" for r in roots if r and r.rstrip("/")]
    return re.compile("|".join([ABSOLUTE_PATH.pattern, *extra])) if extra else ABSOLUTE_PATH


def _has_strings(kind: pa.DataType) -> bool:
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return True
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _has_strings(kind.value_type)
    if pa.types.is_struct(kind):
        return any(_has_strings(kind.field(i).type) for i in range(kind.num_fields))
    return False


@dataclass(frozen=True)
class _Scanner:
    pattern: re.Pattern
    content: bool

    def paths(self, text: str) -> list[str]:
        return [m.group()[:MAX_SHOWN] for m in self.pattern.finditer(text)]

    def walk(self, value, where: str) -> Iterator[tuple[str, str]]:
        """(where, path) for every string inside a JSON-like value, skipping content keys when asked."""
        if isinstance(value, str):
            yield from ((where, p) for p in self.paths(value))
        elif isinstance(value, dict):
            for key, item in value.items():
                if self.content or key not in CONTENT_FIELDS:
                    yield from self.walk(item, f"{where}.{key}" if where else str(key))
        elif isinstance(value, list):
            for item in value:
                yield from self.walk(item, where)

    def json(self, text: str) -> Iterator[tuple[str, str]]:
        try:
            value = json.loads(text)
        except ValueError:
            yield from (("", p) for p in self.paths(text))
            return
        yield from self.walk(value, "")

    def tar(self, path: Path) -> Iterator[tuple[str, str]]:
        with tarfile.open(path) as tar:
            for member in tar:
                if not member.isfile() or member.name.lower().endswith(SKIPPED_SUFFIXES):
                    continue
                extension = member.name.split(".", 1)[1] if "." in member.name else ""
                if not self.content and extension in CONTENT_FIELDS:
                    continue
                text = tar.extractfile(member).read().decode("utf-8", errors="replace")
                texts = self.json(text) if extension == "json" else (("", p) for p in self.paths(text))
                yield from ((f"{member.name}:{where}" if where else member.name, p) for where, p in texts)

    def parquet(self, path: Path) -> Iterator[tuple[str, str]]:
        parquet = pq.ParquetFile(path)
        schema = parquet.schema_arrow
        for key, value in (schema.metadata or {}).items():
            where = f"metadata:{key.decode(errors='replace')}"
            yield from ((where, p) for p in self.paths(value.decode(errors="replace")))
        columns = [f.name for f in schema if _has_strings(f.type) and (self.content or f.name not in CONTENT_FIELDS)]
        if not columns:
            return
        for batch in parquet.iter_batches(columns=columns, batch_size=4096):
            for name in columns:
                for value in batch.column(name).to_pylist():
                    yield from self.walk(value, name)
