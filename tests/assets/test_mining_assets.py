"""The ``pairs`` asset in Dagster: a partition mined with the tiny synthetic Qwen2.5-VL through the
resource the demo uses, its metadata and checks, and the code version that marks prompt changes."""

from __future__ import annotations

from dagster import DagsterInstance, MultiPartitionKey

from assets.longcap import long_captions, pair_negatives
from assets.mining import pairs
from pipelines.core.stage import Partition
from pipelines.longcap.stages import GUARD_REJECTIONS, LONGCAP_CANARY
from pipelines.mining.stages import BOXES_INSIDE, CANARY, EXTRACTIVE
from pipelines.panels.stages import PanelSettings, PanelStage
from pipelines.vlm.prompts import PROMPT_VERSION
from resources.compute import ModelsResource, RayResource
from resources.lake import LakeResource
from resources.profiles import SYNTHETIC_VLM, build_resources
from resources.quality import QualityResource
from resources.settings import Settings
from resources.vlm import VlmEngineResource, family_of
from testing.pipeline import sample_lake
from tests.helpers import N_SHARDS, materialize_one, open_test_release

RELEASE, SHARD = "2026", "001"


def test_pairs_asset_mines_a_partition_with_the_synthetic_engine(tmp_path):
    lake = sample_lake(tmp_path, RELEASE)
    PanelStage(PanelSettings()).run(lake, Partition(RELEASE, SHARD))
    (tmp_path / "home").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "home"))
    open_test_release(instance, RELEASE)
    resources = {
        "lake": LakeResource(home=str(lake.root), shards=N_SHARDS),
        "vlm": VlmEngineResource(synthetic=True, **SYNTHETIC_VLM),
        "ray": RayResource(),
        "quality": QualityResource(),
    }
    key = MultiPartitionKey({"release": RELEASE, "shard": SHARD})
    result = materialize_one(pairs, key, instance, resources, {"som_views": 0, "describe_panels": False})
    assert result.success
    (event,) = result.get_asset_materialization_events()
    metadata = event.materialization.metadata
    figures = lake.read_table("figures", RELEASE, SHARD).to_pylist()
    images = sum(len(f["image_files"] or []) for f in figures)
    assert metadata["pairs_global"].value == images == metadata["images"].value
    assert metadata["synthetic"].value is True and metadata["vlm_requests"].value > 0
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert checks[CANARY].passed and checks[BOXES_INSIDE].passed and checks[EXTRACTIVE].passed
    assert event.materialization.tags.get("dagster/data_version")  # downstream sees what changed
    rows = lake.read_table("pairs", RELEASE, SHARD).to_pylist()
    assert all(r["synthetic"] and r["backend"] == "transformers" for r in rows)

    # a rerun of the same partition mines nothing again
    again = materialize_one(pairs, key, instance, resources, {"som_views": 0, "describe_panels": False})
    (event,) = again.get_asset_materialization_events()
    assert event.materialization.metadata["items_skipped"].value == images
    assert event.materialization.metadata["vlm_requests"].value == 0

    # the assets below: hard negatives of the region pairs, long captions of every figure image
    resources["models"] = ModelsResource(synthetic=True, text_tokenizer="tiny", text_context=128)
    negatives = materialize_one(pair_negatives, key, instance, resources)
    assert negatives.success
    longcap = materialize_one(long_captions, key, instance, resources, {"context_budget": 256})
    assert longcap.success
    (event,) = longcap.get_asset_materialization_events()
    assert event.materialization.metadata["images"].value == images
    rows = lake.read_table("long_captions", RELEASE, SHARD).to_pylist()
    # a tiny random model's refinements never pass: every long caption is the original one
    assert all(r["long_caption"] == r["caption"] or r["cut"] for r in rows if r["status"] != "refined")
    assert {c.check_name for c in longcap.get_asset_check_evaluations()} >= {LONGCAP_CANARY, GUARD_REJECTIONS}


def test_code_version_is_the_logic_and_prompt_versions_and_profiles_choose_the_backend():
    from assets.longcap import long_captions, pair_negatives
    from pipelines.longcap.negatives import NEGATIVES_PROMPT_VERSION, RULES_VERSION
    from pipelines.longcap.prompts import PROMPT_VERSION as LONGCAP_PROMPT_VERSION
    from pipelines.longcap.stages import LONGCAP_VERSION
    from pipelines.mining.stages import MINING_VERSION

    assert pairs.code_versions_by_key[pairs.key] == f"{MINING_VERSION}-{PROMPT_VERSION}"
    assert long_captions.code_versions_by_key[long_captions.key] == f"{LONGCAP_VERSION}-{LONGCAP_PROMPT_VERSION}"
    # explicit constants, not a hash of a module's source text: a comment or a refactor changes nothing
    assert pair_negatives.code_versions_by_key[pair_negatives.key] == f"{RULES_VERSION}-{NEGATIVES_PROMPT_VERSION}"
    demo = build_resources(Settings.from_env({"PANELFORGE_PROFILE": "demo"}))["vlm"]
    cluster = build_resources(Settings.from_env({"PANELFORGE_PROFILE": "cluster"}))["vlm"]
    assert (demo.backend, demo.synthetic, demo.max_tokens) == ("transformers", True, SYNTHETIC_VLM["max_tokens"])
    assert (cluster.backend, cluster.synthetic, cluster.model) == ("ray", False, "Qwen/Qwen2.5-VL-7B-Instruct")
    assert [family_of(m) for m in ("Qwen/Qwen2.5-VL-72B-Instruct", "Qwen/Qwen2-VL-7B", "Qwen/Qwen3-VL-8B")] == [
        "qwen2_5_vl",
        "qwen2_vl",
        "qwen3_vl",
    ]
