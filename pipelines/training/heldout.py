"""Keeping the release's held-out articles out of training.

The training assets resolve the held-out split of the release they train on (the recorded
``models/eval/<release>/heldout.json``, or one recorded by the evaluation's default rule) and give
the launched job its path as ``heldout`` in the job config; the job reads it here. The two
trainers read shards differently, so the split reaches them in two ways:

* the multi-level trainer reads the tars itself and drops a held-out sample as it reads it
  (``webdataset_keep``, applied by ``pipelines.training.loader.samples`` at every level);
* OpenCLIP's trainer opens shard URLs on its own and has no per-sample hook, but its WebDataset
  loader opens ``pipe:<command>`` URLs, so each shard is streamed through this module
  (``python -m pipelines.training.heldout --heldout <split> <shard>``), which copies the tar
  without the held-out samples. Filtering while streaming writes no second copy of the release;
  with a 1% split nearly every 10,000-sample shard holds a held-out article, so copying only the
  affected shards would copy nearly all of them.

The samples removed are counted from each shard's Parquet sidecar (its ``pmcid`` column, written
with the tar from the same plan rows as the tar's JSON members), so OpenCLIP's
``--train-num-samples`` is the count actually kept and both reports say how many were excluded.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import shlex
import sys
import tarfile
from collections.abc import Callable
from typing import IO

import fsspec
import pyarrow.parquet as pq

from pipelines import launch
from pipelines.core.heldout import HeldoutSplit, webdataset_keep

MODULE = "pipelines.training.heldout"
# webdataset's own split of a member name into the sample key and the member's extension
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


def load_split(url: str) -> HeldoutSplit:
    """The recorded split at ``url`` (a lake path or URL, as the job config gives it)."""
    return HeldoutSplit.from_json(json.loads(launch.read_bytes(url)))


def sidecar_of(shard: str) -> str:
    return re.sub(r"\.tar$", ".parquet", shard)


def count_heldout(shards: list[str], split: HeldoutSplit) -> tuple[int, int]:
    """(samples, held-out samples) of ``shards`` (tar URLs), from their Parquet sidecars; a tar
    without one (shards not written by the release) is read whole, its JSON members judged by the
    same predicate the readers apply."""
    total = held = 0
    for shard in shards:
        try:
            with fsspec.open(sidecar_of(shard), "rb") as fh:
                pmcids = pq.read_table(fh, columns=["pmcid"]).column("pmcid").to_pylist()
        except FileNotFoundError:
            launch.log(f"{shard} has no sidecar: reading the tar to count its held-out samples", "warning")
            with fsspec.open(shard, "rb") as src:
                kept, dropped = filter_tar(src, _Discard(), webdataset_keep(split))
            total, held = total + kept + dropped, held + dropped
            continue
        total += len(pmcids)
        held += sum(1 for p in pmcids if p and split.excludes(p))
    return total, held


def filter_command(pattern: str, heldout: str, python: str | None = None) -> str:
    """The ``pipe:`` URL (a brace pattern of them: webdataset expands the braces of the whole
    string) that streams the shards of ``pattern`` without the held-out samples."""
    cmd = [python or sys.executable, "-m", MODULE, "--heldout", heldout]
    return f"pipe:{' '.join(shlex.quote(c) for c in cmd)} {shlex.quote(pattern)}"


def filter_tar(src: IO[bytes], dst: IO[bytes], keep: Callable[[dict], bool]) -> tuple[int, int]:
    """Copy the tar stream ``src`` to ``dst`` without the samples ``keep`` refuses; (kept, dropped).
    A sample's members are consecutive (webdataset's own grouping), so one sample is held at a time."""
    kept = dropped = 0
    with (
        tarfile.open(fileobj=src, mode="r|*") as tin,
        tarfile.open(fileobj=dst, mode="w|", format=tarfile.GNU_FORMAT) as tout,
    ):
        key: str | None = None
        members: list[tuple[tarfile.TarInfo, bytes, str]] = []

        def flush() -> None:
            nonlocal kept, dropped
            if not members:
                return
            if keep({ext: data for _, data, ext in members}):
                kept += 1
                for info, data, _ in members:
                    tout.addfile(info, io.BytesIO(data))
            else:
                dropped += 1

        for info in tin:
            if not info.isfile():
                continue
            match = _KEY_EXT.match(info.name)
            name_key, ext = (match.group(1), match.group(2)) if match else (info.name, "")
            if name_key != key:
                flush()
                key, members = name_key, []
            fh = tin.extractfile(info)
            members.append((info, fh.read() if fh is not None else b"", ext))
        flush()
    return kept, dropped


class _Discard:
    """A sink for a tar that is only counted."""

    def write(self, data: bytes) -> int:
        return len(data)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Stream a WebDataset shard to stdout without its held-out samples.")
    parser.add_argument("--heldout", required=True, help="the recorded split (heldout.json), a path or URL")
    parser.add_argument("shard", help="the tar, a path or URL")
    args = parser.parse_args(argv)
    keep = webdataset_keep(load_split(args.heldout))
    with fsspec.open(args.shard, "rb") as src:
        filter_tar(src, sys.stdout.buffer, keep)
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
