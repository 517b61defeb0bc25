from collections import Counter

from pipelines.core.partitioning import shard_keys, shard_of


def test_shard_keys_sort_and_count():
    assert shard_keys(4) == ["000", "001", "002", "003"]
    keys = shard_keys(256)
    assert len(keys) == 256 and keys == sorted(keys) and keys[-1] == "255"


def test_shard_is_stable_and_ignores_case_and_whitespace():
    assert shard_of("PMC7302504", 256) == shard_of(" pmc7302504 ", 256)
    assert shard_of("PMC7302504", 256) in shard_keys(256)


def test_shards_are_balanced_over_consecutive_ids():
    counts = Counter(shard_of(f"PMC{i}", 16) for i in range(1_000_000, 1_016_000))
    assert len(counts) == 16
    assert max(counts.values()) < 1.15 * 1000 and min(counts.values()) > 0.85 * 1000
