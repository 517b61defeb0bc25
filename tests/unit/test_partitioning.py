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


def test_releases_are_listed_in_order_whenever_they_are_opened(tmp_path):
    """The UI lists dynamic partitions in the order they were added: a back-filled older release
    still sorts first, and what was materialized for the releases moved behind it is kept."""
    from dagster import AssetKey, AssetMaterialization, DagsterInstance

    from assets.partitions import RELEASES, SHARDS, open_release

    with DagsterInstance.local_temp(str(tmp_path)) as instance:
        open_release(instance, "2026", 2)
        instance.report_runless_asset_event(AssetMaterialization("card", partition="2026"))
        open_release(instance, "2027", 2)
        open_release(instance, "2024", 2)
        open_release(instance, "2026", 2)  # opening again changes nothing
        assert instance.get_dynamic_partitions(RELEASES) == ["2024", "2026", "2027"]
        assert instance.get_dynamic_partitions(SHARDS) == ["000", "001"]
        assert instance.get_materialized_partitions(AssetKey("card")) == {"2026"}
