"""One error vocabulary (issue 21 §4): every deliberate failure is either something a person must
fix (``StageInputError``) or an outage (``ServiceUnavailableError``); a missing upstream table
names the asset to materialize; the assets and the command line treat each base one way."""

import io
import tarfile

import pyarrow as pa
import pytest
from dagster import Failure, RetryRequested, build_asset_context
from PIL import Image

from assets.report import run_stage
from pipelines.core.errors import ServiceUnavailableError, StageInputError, UpstreamMissingError
from pipelines.core.lake import Lake, writer_of
from pipelines.core.schemas import TABLES
from pipelines.core.stage import Partition, Stage

RELEASE, SHARD = "2026", "000"


def test_every_deliberate_error_has_one_of_the_two_bases():
    from pipelines.compute.ray_pool import ComputeUnavailableError
    from pipelines.compute.weights import ModelUnavailableError
    from pipelines.concepts.annotations import AnnotationError
    from pipelines.core.lake import LakeLayoutError
    from pipelines.entrez.client import EntrezUnavailableError
    from pipelines.longcap.tokens import TokenizerUnavailableError
    from pipelines.net.retry import SourceUnavailableError
    from pipelines.release.hub import HubLimitError
    from pipelines.vlm.engine import VlmOutage
    from resources.launcher import LauncherUnavailableError
    from resources.settings import SettingsError

    person = [AnnotationError, HubLimitError, LakeLayoutError, SettingsError, ModelUnavailableError]
    person += [TokenizerUnavailableError, LauncherUnavailableError, UpstreamMissingError]
    outage = [SourceUnavailableError, EntrezUnavailableError, VlmOutage, ComputeUnavailableError]
    for cls in person:
        assert issubclass(cls, StageInputError) and not issubclass(cls, ServiceUnavailableError), cls
    for cls in outage:
        assert issubclass(cls, ServiceUnavailableError) and not issubclass(cls, StageInputError), cls
    # the ValueErrors stay ValueErrors for callers that caught them so
    assert issubclass(AnnotationError, ValueError) and issubclass(SettingsError, ValueError)


def test_the_writer_of_a_table_comes_from_the_stages_writes():
    assert writer_of("figures") == "parsed_articles"
    assert writer_of("raw_manifest") == "pmc_raw_articles"
    assert writer_of("samples") == "dataset_samples"
    assert writer_of("pair_samples") == "pair_samples"
    assert writer_of("panels") == "panels"
    assert writer_of("no_such_table") is None


def test_require_names_the_asset_to_materialize(tmp_path):
    lake = Lake(tmp_path)
    with pytest.raises(UpstreamMissingError) as err:
        lake.require("figures", RELEASE, SHARD)
    assert str(err.value) == "release 2026 shard 000 has no `figures` table: materialize `parsed_articles` first"
    with pytest.raises(UpstreamMissingError) as err:
        lake.require("samples", RELEASE)
    assert str(err.value) == "release 2026 has no `samples` table: materialize `dataset_samples` first"
    lake.write_table("figures", RELEASE, SHARD, [])
    assert lake.require("figures", RELEASE, SHARD).num_rows == 0  # written, if empty: not missing


def _missing(call) -> str:
    with pytest.raises(StageInputError) as err:
        call()
    return str(err.value)


def test_each_stage_on_an_empty_lake_says_what_to_materialize(tmp_path):
    """The seven paths that raised FileNotFoundError (a traceback) now say which asset runs first."""
    from pipelines.concepts.shard import image_refs
    from pipelines.panels.stages import PanelCropsStage, PanelStage
    from pipelines.parse.stages import ParseStage
    from pipelines.release.stages import PairPlanStage, SamplePlanStage
    from pipelines.release.webdataset import shuffled_samples

    lake, part = Lake(tmp_path), Partition(RELEASE, SHARD)
    assert _missing(lambda: PanelStage().run(lake, part)).endswith("materialize `parsed_articles` first")
    assert _missing(lambda: PanelCropsStage().run(lake, part)).endswith("materialize `panels` first")
    assert _missing(lambda: image_refs(lake, RELEASE, SHARD)).endswith("materialize `parsed_articles` first")
    assert _missing(lambda: ParseStage().run(lake, part)).endswith("materialize `pmc_raw_articles` first")
    assert _missing(lambda: SamplePlanStage().run(lake, part)).endswith("materialize `parsed_articles` first")
    assert _missing(lambda: next(shuffled_samples(lake, RELEASE))).endswith("materialize `dataset_samples` first")
    no_pairs = _missing(lambda: next(shuffled_samples(lake, RELEASE, table="pair_samples")))
    assert no_pairs.endswith("materialize `pair_samples` first")
    no_plan = _missing(lambda: PairPlanStage().run(lake, part))
    assert no_plan == "release 2026 shard 000 has no `samples` table: materialize `dataset_samples` first"


def test_pubmed_writes_nothing_when_articles_are_missing(tmp_path):
    from pipelines.entrez.stage import PubmedStage

    def no_client(lake, release):
        raise AssertionError("no client is opened before the input is there")

    lake = Lake(tmp_path)
    message = _missing(lambda: PubmedStage(client_for=no_client).run(lake, Partition(RELEASE, SHARD)))
    assert message.endswith("materialize `parsed_articles` first")
    assert lake.read_table("pubmed", RELEASE, SHARD) is None


def test_the_hand_worded_missing_inputs_say_what_to_materialize(tmp_path):
    """Acquisition, mining, negatives and the pair plan read their inputs through ``Lake.require``."""
    from pipelines.acquire.stages import AcquireStage
    from pipelines.longcap.stages import region_pairs
    from pipelines.mining.mine import figure_items

    lake, part = Lake(tmp_path), Partition(RELEASE, SHARD)
    no_inventory = _missing(lambda: AcquireStage(source=None).run(lake, part))  # the source is never reached
    assert no_inventory == "release 2026 shard 000 has no `inventory` table: materialize `pmc_inventory` first"
    assert _missing(lambda: region_pairs(lake, RELEASE, SHARD)).endswith("no `pairs` table: materialize `pairs` first")
    assert _missing(lambda: figure_items(lake, RELEASE, SHARD)).endswith("materialize `parsed_articles` first")
    lake.write_table("figures", RELEASE, SHARD, [])
    assert _missing(lambda: figure_items(lake, RELEASE, SHARD)).endswith(
        "no `panels` table: materialize `panels` first"
    )
    lake.write_table("panels", RELEASE, SHARD, [])
    no_captions = _missing(lambda: figure_items(lake, RELEASE, SHARD))
    assert no_captions.endswith("no `panel_captions` table: materialize `panels` first")
    lake.write_table("panel_captions", RELEASE, SHARD, [])
    assert figure_items(lake, RELEASE, SHARD) == []  # a shard without figures: empty, not missing


def test_stages_write_nothing_when_their_input_is_missing_and_run_on_an_empty_one(tmp_path):
    """A missing table is not an empty table: duplicates, the release tables and the figure
    concepts wrote an empty output over a missing input; a shard without figures still runs."""
    from pipelines.concepts.stages import FigureConceptsStage
    from pipelines.parse.stages import DuplicatesStage
    from pipelines.release.stages import ReleaseTablesStage

    lake = Lake(tmp_path)
    assert _missing(lambda: DuplicatesStage().run(lake, Partition(RELEASE))).endswith(
        "release 2026 has no `figures` table: materialize `parsed_articles` first"
    )
    assert lake.read_table("image_duplicates", RELEASE, "all") is None
    no_samples = _missing(lambda: ReleaseTablesStage().run(lake, Partition(RELEASE)))
    assert no_samples == "release 2026 has no `samples` table: materialize `dataset_samples` first"
    assert not list(tmp_path.rglob("tables.json"))
    no_embeddings = _missing(lambda: FigureConceptsStage().run(lake, Partition(RELEASE, SHARD)))
    assert no_embeddings == "release 2026 shard 000 has no `embeddings` table: materialize `figure_embeddings` first"
    assert lake.read_table("figure_concepts", RELEASE, SHARD) is None

    lake.write_table("figures", RELEASE, SHARD, [])  # a shard whose articles have no figures
    assert DuplicatesStage().run(lake, Partition(RELEASE)).ok == 0
    assert lake.read_table("image_duplicates", RELEASE, "all").num_rows == 0
    lake.write_table("embeddings", RELEASE, SHARD, [])
    no_model = _missing(lambda: FigureConceptsStage().run(lake, Partition(RELEASE, SHARD)))
    assert no_model.startswith("no concept model for release 2026")  # past the embeddings, at the next input


class _Raising(Stage):
    name = "raising"

    def __init__(self, exc: Exception):
        self.exc = exc

    def process(self, lake, partition):
        raise self.exc


def test_run_stage_fails_a_person_error_for_good_and_retries_an_outage(tmp_path):
    from pipelines.vlm.engine import VlmOutage

    lake = Lake(tmp_path)
    _Raising.level = "shard"
    with build_asset_context(partition_key=RELEASE) as context:
        _Raising.level = "release"
        with pytest.raises(Failure) as failed:
            run_stage(context, _Raising(UpstreamMissingError("figures", RELEASE, None, "parsed_articles")), lake)
        assert failed.value.allow_retries is False
        assert failed.value.description == "release 2026 has no `figures` table: materialize `parsed_articles` first"
        with pytest.raises(RetryRequested):
            run_stage(context, _Raising(VlmOutage("the server went away")), lake)
        with pytest.raises(KeyError):  # a bug is neither: it keeps its traceback
            run_stage(context, _Raising(KeyError("pmcid")), lake)


def test_an_unknown_concept_filter_is_not_retried(tmp_path):
    from assets.release import ConceptFilterSettings, webdataset_concept_filtered
    from resources.lake import LakeResource
    from resources.quality import QualityResource

    with build_asset_context(partition_key=RELEASE) as context, pytest.raises(Failure) as failed:
        webdataset_concept_filtered(
            context,
            ConceptFilterSettings(concepts=["no such concept"]),
            LakeResource(home=str(tmp_path)),
            QualityResource(),
        )
    assert failed.value.allow_retries is False
    assert "unknown global concepts ['no such concept']" in failed.value.description


def _png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


def test_panel_crops_count_ok_and_error_in_panels(tmp_path):
    """Two panels of a readable image, three of an unreadable one: 2 ok, 3 failed (a 60% error
    rate), not 2 crops against 1 image (33%)."""
    from pipelines.core.rawstore import add_member
    from pipelines.panels.stages import PanelCropsStage

    lake = Lake(tmp_path)
    tar_rel = "raw/release=2026/shard=000/part-0.tar"
    (tmp_path / "raw/release=2026/shard=000").mkdir(parents=True)
    files = {"good.png": _png(200, 100), "bad.png": b"these bytes are no image"}
    raw = []
    with tarfile.open(tmp_path / tar_rel, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            offset = add_member(tar, f"PMC1/{name}", io.BytesIO(data), len(data))
            raw.append(
                dict(
                    pmcid="PMC1",
                    version=1,
                    name=name,
                    kind="image",
                    tar_path=tar_rel,
                    offset=offset,
                    size=len(data),
                    md5="",
                    sha256="",
                )
            )
    lake.write_table("raw_files", RELEASE, SHARD, raw)
    boxes = {"good.png": [(0, 0, 100, 100), (100, 0, 200, 100)], "bad.png": [(0, 0, 10, 10)] * 3}
    panels = [
        dict(
            pmcid="PMC1",
            fig_id="F1",
            image_file=name,
            panel_index=i,
            x1=b[0],
            y1=b[1],
            x2=b[2],
            y2=b[3],
            method="xycut",
        )
        for name, bs in boxes.items()
        for i, b in enumerate(bs)
    ]
    lake.write_table("panels", RELEASE, SHARD, pa.Table.from_pylist(panels, schema=TABLES["panels"]))  # no scores
    result = PanelCropsStage().run(lake, Partition(RELEASE, SHARD))
    assert (result.ok, result.error) == (2, 3)
    assert result.error_rate == pytest.approx(0.6)
    assert result.counts["crops"] == 2 and result.counts["images_unreadable"] == 1
    assert [item for item, _ in result.errors] == ["PMC1 bad.png"]
