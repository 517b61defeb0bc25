"""Shard assignment: a stable hash bucket of the PMCID.

The shard of an article never depends on the release or on the other articles, so an
unchanged article lands in the same (release, shard) partition every year and its raw
files can be carried over instead of fetched again.
"""

from __future__ import annotations

import hashlib

DEFAULT_SHARDS = 256


def _shard_key(index: int, n_shards: int) -> str:
    return f"{index:0{max(3, len(str(n_shards - 1)))}d}"


def shard_keys(n_shards: int) -> list[str]:
    """Return the partition keys of ``n_shards`` shards, zero-padded so they sort."""
    return [_shard_key(i, n_shards) for i in range(n_shards)]


def shard_of(pmcid: str, n_shards: int) -> str:
    """Return the shard key of ``pmcid`` (blake2b of the normalized id, modulo ``n_shards``)."""
    digest = hashlib.blake2b(pmcid.strip().upper().encode("ascii"), digest_size=8).digest()
    return _shard_key(int.from_bytes(digest, "big") % n_shards, n_shards)
