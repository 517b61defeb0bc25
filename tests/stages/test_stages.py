"""The stage contract: every asset is a stage, every stage declares real tables, counters are uniform."""

import pytest

from jobs.definitions import ASSETS
from pipelines.acquire.stages import AcquireStage, InventoryStage
from pipelines.concepts.stages import (
    ClusterLabelsStage,
    ConceptModelStage,
    ConceptReviewStage,
    EmbedStage,
    FigureConceptsStage,
)
from pipelines.core.lake import Lake, LakeLayoutError
from pipelines.core.schemas import TABLES
from pipelines.core.stage import RELEASE, SHARD, Partition, Stage, StageResult
from pipelines.entrez.stage import PubmedStage
from pipelines.longcap.stages import LongCapStage, NegativesStage
from pipelines.mining.stages import MiningStage
from pipelines.panels.stages import PanelCropsStage, PanelStage
from pipelines.panels.training import SyntheticSetStage
from pipelines.parse.stages import DuplicatesStage, ParseStage
from pipelines.release.stages import (
    DatasetCardStage,
    HubUploadStage,
    PairPlanStage,
    PairWebDatasetStage,
    ReleaseTablesStage,
    SamplePlanStage,
    WebDatasetStage,
)

STAGES = [
    LongCapStage,
    NegativesStage,
    InventoryStage,
    AcquireStage,
    ParseStage,
    DuplicatesStage,
    PubmedStage,
    EmbedStage,
    ConceptModelStage,
    ConceptReviewStage,
    ClusterLabelsStage,
    FigureConceptsStage,
    SamplePlanStage,
    WebDatasetStage,
    ReleaseTablesStage,
    DatasetCardStage,
    HubUploadStage,
    PanelStage,
    PanelCropsStage,
    SyntheticSetStage,
    MiningStage,
    PairPlanStage,
    PairWebDatasetStage,
]


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.__name__)
def test_every_stage_declares_known_tables_and_a_level(stage):
    assert stage.level in (RELEASE, SHARD)
    assert set(stage.reads) <= set(TABLES) and set(stage.writes) <= set(TABLES)
    assert stage.__doc__ and stage.process is not Stage.process


def test_every_asset_is_a_stage_of_its_level():
    by_name = {getattr(s, "name", None): s for s in STAGES}
    webdataset = {"webdataset_shards", "webdataset_concept_filtered", "webdataset_concept_balanced"}
    # training and evaluation jobs run by the launcher, not stages in this process
    launched = {"panel_detector", "clip_continual_pretraining", "clip_evaluation", "multilevel_training"}
    for asset in ASSETS:
        name = asset.key.path[-1]
        if name in launched:
            continue
        stage = WebDatasetStage if name in webdataset else by_name[name]
        dims = asset.partitions_def.partitions_defs if hasattr(asset.partitions_def, "partitions_defs") else []
        assert (stage.level == SHARD) == (len(dims) == 2), name


class _Counting(Stage):
    """A stage that counts five items: two fine, one failed, one carried over, one skipped by rule."""

    name = "counting"
    level = SHARD
    writes = ("raw_manifest",)

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        lake.write_table("raw_manifest", partition.release, partition.shard, [])
        return self.result(partition, ok=2, error=1, skipped=2, carried=1, errors=[("PMC1", "broken")])


def test_run_checks_the_level_times_and_refreshes_the_catalog(tmp_path):
    lake = Lake(tmp_path / "lake")
    with pytest.raises(ValueError, match="runs per shard"):
        _Counting().run(lake, Partition("2026"))
    result = _Counting().run(lake, Partition("2026", "000"))
    assert (result.ok, result.error, result.skipped, result.items) == (2, 1, 2, 5)
    # one failed of four: the carried item succeeded in an earlier run, the rule-skipped one was not tried
    assert result.error_rate == pytest.approx(1 / 4)
    assert result.seconds > 0 and lake.exists(lake.path("catalog.duckdb"))
    assert result.summary()["items_error"] == 1


class _Writing(Stage):
    """Writes the manifest rows it is given (a stage that sets no version of its own)."""

    name = "writing"
    level = SHARD
    writes = ("raw_manifest",)

    def __init__(self, pmcids: list[str]):
        self.pmcids = pmcids

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        rows = [_manifest_row(p) for p in self.pmcids]
        lake.write_table("raw_manifest", partition.release, partition.shard, rows)
        return self.result(partition, ok=len(rows))


def _manifest_row(pmcid: str) -> dict:
    row = dict.fromkeys(TABLES["raw_manifest"].names)
    row.update(pmcid=pmcid, version=1, source="ftp", status="ok", n_files=0, bytes=0)
    return row | {"files": [], "md5": [], "dropped": []}


def test_every_stage_has_a_data_version_that_follows_its_rows(tmp_path):
    """A stage that sets no version gets one from the rows it wrote: the same rows, the same
    version (downstream assets stay fresh); other rows, another version."""
    lake = Lake(tmp_path / "lake")
    first = _Writing(["PMC1", "PMC2"]).run(lake, Partition("2026", "000"))
    again = _Writing(["PMC1", "PMC2"]).run(lake, Partition("2026", "000"))
    other = _Writing(["PMC1", "PMC3"]).run(lake, Partition("2026", "000"))
    assert first.version and again.version == first.version and other.version != first.version
    # an empty table is an output too, distinct from a full one
    empty = _Writing([]).run(lake, Partition("2026", "000"))
    assert empty.version and empty.version not in (first.version, other.version)


def test_the_shard_count_is_fixed_for_the_life_of_a_lake(tmp_path):
    lake = Lake(tmp_path / "lake")
    assert lake.shards() == []
    assert lake.ensure_layout(4) == ["000", "001", "002", "003"]
    assert Lake(tmp_path / "lake").ensure_layout(4) == lake.shards()
    with pytest.raises(LakeLayoutError, match="has 4 shards per release, not 256"):
        lake.ensure_layout(256)
    with pytest.raises(LakeLayoutError, match="at least one shard"):
        Lake(tmp_path / "other").ensure_layout(0)


def test_too_many_failed_items_fail_the_blocking_check_and_stop_downstream(tmp_path, cloud_mirror):
    """Two of the sample's articles answer 404 (per-article errors, the run goes on); with a 1%
    threshold the blocking error_rate check fails and parsing in the same run does not start."""
    from dagster import DagsterInstance, MultiPartitionKey, materialize

    from assets.acquisition import pmc_inventory, pmc_raw_articles
    from assets.parsing import parsed_articles
    from pipelines.core.partitioning import shard_of
    from resources.lake import LakeResource
    from resources.pmc_source import PmcSourceResource
    from resources.quality import QualityResource
    from testing.loopback.faults import Fault, FaultPlan
    from testing.loopback.s3_server import S3LoopbackServer
    from tests.helpers import N_SHARDS, open_test_release

    # two articles of shard 000 of the 4-shard sample, by their hash shard
    gone = sorted(p.name.split(".")[0] for p in cloud_mirror.iterdir() if shard_of(p.name.split(".")[0], 4) == "000")[
        :2
    ]
    plan = FaultPlan(faults=[Fault(f"{pmcid}.1/{pmcid}.1.xml", status=404, times=99) for pmcid in gone])
    (tmp_path / "home").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "home"))
    open_test_release(instance, "2026")
    with S3LoopbackServer(cloud_mirror, plan=plan) as server:
        resources = {
            "lake": LakeResource(home=str(tmp_path / "lake"), shards=N_SHARDS),
            "pmc_source": PmcSourceResource(url=server.url, rate_limit=500, attempts=1),
            "quality": QualityResource(max_error_rate=0.01),
        }
        assert materialize([pmc_inventory], partition_key="2026", instance=instance, resources=resources).success
        key = MultiPartitionKey({"release": "2026", "shard": "000"})
        result = materialize(
            [pmc_raw_articles, parsed_articles],
            partition_key=key,
            instance=instance,
            resources=resources,
            raise_on_error=False,
        )
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert not checks["error_rate"].passed and checks["raw_articles_consistent"].passed
    assert checks["error_rate"].metadata["failed"].value == 2
    materialized = {e.asset_key.path[-1] for e in result.get_asset_materialization_events()}
    assert materialized == {"pmc_raw_articles"}  # parsing never started
