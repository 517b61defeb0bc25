"""Progress a person can follow in the run log: long stages write a line at least every 30 seconds
and one at the end (pipelines/core/stage.py ``Progress``), into the run log when an asset runs them."""

from __future__ import annotations

import logging
import threading

from pipelines.core.lake import Lake
from pipelines.core.stage import SHARD, Partition, Progress, Stage, StageResult


class FakeClock:
    """Seconds that pass only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_line_each_time_thirty_seconds_pass_and_one_at_the_end():
    clock, lines = FakeClock(), []
    progress = Progress("download 2026|000", 10, "articles", sink=lines.append, clock=clock)
    progress.advance()
    clock.now += 29.9
    progress.advance(1, failed=1)
    assert lines == []  # 29.9 s: nothing yet
    clock.now += 0.1
    progress.advance(1, staged=1)
    assert lines == ["download 2026|000 progress: 3/10 articles (30%), failed 1, staged 1; 30s"]
    clock.now += 20
    progress.advance(2, staged=2)
    assert len(lines) == 1  # 20 s after the last line
    clock.now += 15  # 35 s after the last line, and no item finished: only a beat can tell
    progress.beat()
    assert lines[-1] == "download 2026|000 progress: 5/10 articles (50%), failed 1, staged 3; 65s"
    clock.now += 1
    progress.advance(5, staged=5)
    progress.finish()
    assert lines[-1] == "download 2026|000 done: 10/10 articles (100%), failed 1, staged 8; 66s"
    assert progress.lines == len(lines) == 3


def test_the_heartbeat_writes_while_no_item_finishes():
    """One slow item (a download stuck in retries, Ray starting actors) must not leave the log
    silent: the heartbeat thread writes the line although ``advance`` is never called."""
    lines, heard = [], threading.Event()

    def sink(line: str) -> None:
        lines.append(line)
        heard.set()

    progress = Progress("embedding", 4, "images", sink=sink, interval_s=0.05)
    with progress.heartbeat(poll_s=0.01):
        assert heard.wait(timeout=30), "no heartbeat line"
        assert lines[0].startswith("embedding progress: 0/4 images (0%)")
    assert lines[-1].startswith("embedding done: 0/4 images (0%)")


class _Slow(Stage):
    """Three items, each taking 40 (fake) seconds."""

    name = "slow"
    level = SHARD
    clock = FakeClock()

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        progress = Progress(f"slow {partition}", 3, clock=self.clock)
        for _ in range(3):
            self.clock.now += 40
            progress.advance()
        progress.finish()
        return self.result(partition, ok=3)


def test_stage_run_sends_the_lines_to_its_caller_and_the_logger_otherwise(tmp_path, caplog):
    lake, lines = Lake(tmp_path / "lake"), []
    _Slow().run(lake, Partition("2026", "001"), progress=lines.append)
    assert lines == [
        "slow 2026|001 progress: 1/3 items (33%); 40s",
        "slow 2026|001 progress: 2/3 items (67%); 80s",
        "slow 2026|001 progress: 3/3 items (100%); 120s",
        "slow 2026|001 done: 3/3 items (100%); 120s",
    ]
    with caplog.at_level(logging.INFO, logger="panelforge.progress"):
        _Slow().run(lake, Partition("2026", "002"))  # no sink: tests, benchmarks, Ray workers
    assert [r.getMessage() for r in caplog.records][-1] == "slow 2026|002 done: 3/3 items (100%); 120s"
    assert len(lines) == 4  # the first run's sink is not reused


def test_the_download_asset_writes_its_progress_into_the_run_log(tmp_path, cloud_mirror):
    from dagster import DagsterEventType, DagsterInstance, MultiPartitionKey, materialize

    from assets.acquisition import pmc_inventory, pmc_raw_articles
    from resources.lake import LakeResource
    from resources.pmc_source import PmcSourceResource
    from resources.quality import QualityResource
    from tests.helpers import N_SHARDS, open_test_release

    (tmp_path / "home").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "home"))
    open_test_release(instance, "2026")
    resources = {
        "lake": LakeResource(home=str(tmp_path / "lake"), shards=N_SHARDS),
        "pmc_source": PmcSourceResource(url=cloud_mirror.as_uri(), rate_limit=500),
        "quality": QualityResource(),
    }
    assert materialize([pmc_inventory], partition_key="2026", instance=instance, resources=resources).success
    # what the download has to fetch: every article the inventory put into shard 000
    articles = Lake(tmp_path / "lake").read_table("inventory", "2026", "000").num_rows
    assert articles > 0
    key = MultiPartitionKey({"release": "2026", "shard": "000"})
    result = materialize([pmc_raw_articles], partition_key=key, instance=instance, resources=resources)
    logged = [
        e.user_message
        for e in instance.all_logs(result.run_id)
        if e.dagster_event is None or e.dagster_event.event_type != DagsterEventType.STEP_FAILURE
    ]
    assert f"download 2026|000 done: {articles}/{articles} articles (100%), staged {articles}" in "\n".join(logged)
