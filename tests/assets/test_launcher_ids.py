"""A launched training's run id: the asset, the partition and the job config's fingerprint.

The id names the folder its checkpoints go to, so the same asset, partition and config must give
the same id across versions (a training under way resumes after an upgrade)."""

from dagster import AssetExecutionContext, DailyPartitionsDefinition, asset, materialize

from resources.launcher import job_run_id

CONFIG = {"steps": 10, "lr": 0.001, "data": "s3://lake/dataset/2026"}


def _ids(config: dict, partition: str | None = None) -> list[str]:
    ids = []

    @asset(partitions_def=DailyPartitionsDefinition("2026-01-01") if partition else None)
    def clip_training(context: AssetExecutionContext) -> None:
        ids.append(job_run_id(context, config))

    assert materialize([clip_training], partition_key=partition).success
    return ids


def test_the_run_id_is_the_asset_partition_and_config_fingerprint():
    # sha256 of '{"data": "s3://lake/dataset/2026", "lr": 0.001, "steps": 10}', first 12 hex digits
    assert _ids(CONFIG) == ["clip_training__407922b501c8"]
    assert _ids(dict(reversed(CONFIG.items()))) == ["clip_training__407922b501c8"]  # key order is no change
    assert _ids(CONFIG, "2026-01-02") == ["clip_training__2026-01-02__407922b501c8"]
    assert _ids({**CONFIG, "steps": 11}) != ["clip_training__407922b501c8"]  # a changed config starts anew
