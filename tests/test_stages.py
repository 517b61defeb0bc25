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
from pipelines.entrez.stage import PubmedStage
from pipelines.lake import Lake, LakeLayoutError
from pipelines.parse.stages import DuplicatesStage, ParseStage
from pipelines.release.stages import (
    DatasetCardStage,
    HubUploadStage,
    ReleaseTablesStage,
    SamplePlanStage,
    WebDatasetStage,
)
from pipelines.schemas import TABLES
from pipelines.stage import RELEASE, SHARD, Partition, Stage, StageResult

STAGES = [
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
]


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.__name__)
def test_every_stage_declares_known_tables_and_a_level(stage):
    assert stage.level in (RELEASE, SHARD)
    assert set(stage.reads) <= set(TABLES) and set(stage.writes) <= set(TABLES)
    assert stage.__doc__ and stage.process is not Stage.process


def test_every_asset_is_a_stage_of_its_level():
    by_name = {getattr(s, "name", None): s for s in STAGES}
    webdataset = {"webdataset_shards", "webdataset_concept_filtered", "webdataset_concept_balanced"}
    for asset in ASSETS:
        name = asset.key.path[-1]
        stage = WebDatasetStage if name in webdataset else by_name[name]
        dims = asset.partitions_def.partitions_defs if hasattr(asset.partitions_def, "partitions_defs") else []
        assert (stage.level == SHARD) == (len(dims) == 2), name


class _Counting(Stage):
    """A stage that counts three items: two fine, one failed, one carried over."""

    name = "counting"
    level = SHARD
    writes = ("raw_manifest",)

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        lake.write_table("raw_manifest", partition.release, partition.shard, [])
        return self.result(partition, ok=2, error=1, skipped=1, errors=[("PMC1", "broken")])


def test_run_checks_the_level_times_and_refreshes_the_catalog(tmp_path):
    lake = Lake(tmp_path / "lake")
    with pytest.raises(ValueError, match="runs per shard"):
        _Counting().run(lake, Partition("2026"))
    result = _Counting().run(lake, Partition("2026", "000"))
    assert (result.ok, result.error, result.skipped, result.items) == (2, 1, 1, 4)
    assert result.error_rate == pytest.approx(1 / 3)  # carried items were not tried
    assert result.seconds > 0 and lake.exists(lake.path("catalog.duckdb"))
    assert result.summary()["items_error"] == 1


def test_the_shard_count_is_fixed_for_the_life_of_a_lake(tmp_path):
    lake = Lake(tmp_path / "lake")
    assert lake.shards() == []
    assert lake.ensure_layout(4) == ["000", "001", "002", "003"]
    assert Lake(tmp_path / "lake").ensure_layout(4) == lake.shards()
    with pytest.raises(LakeLayoutError, match="has 4 shards per release, not 256"):
        lake.ensure_layout(256)
    with pytest.raises(LakeLayoutError, match="at least one shard"):
        Lake(tmp_path / "other").ensure_layout(0)
