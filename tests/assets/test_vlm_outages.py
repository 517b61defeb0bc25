"""A VLM outage fails the step for a retry, as PMC and NCBI outages do, and marks no item failed.

Each outage class goes through the real assets (``pairs``, ``long_captions``, ``pair_negatives``
with ``use_vlm``) materialized by Dagster, with the engine the ``vlm`` resource builds: an
OpenAI-compatible backend whose server refuses connections, trickles its answers past the
request deadline, or answers 503 to every mining request once the start-up checks passed; and
the Ray backend whose engine actor died (a real Ray actor, killed). Every run must ask for a
retry (``STEP_UP_FOR_RETRY``, as often as ``outage_retries`` says), then fail, with no figure
recorded as failed.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from dagster import DagsterInstance, MultiPartitionKey, materialize

from assets.longcap import long_captions, pair_negatives
from assets.mining import pairs
from pipelines.core.stage import Partition
from pipelines.mining.stages import MiningSettings, MiningStage
from pipelines.vlm import prompts
from pipelines.vlm.engine import EngineConfig, VlmRequest
from resources.compute import ModelsResource, RayResource
from resources.lake import LakeResource
from resources.quality import QualityResource
from resources.vlm import VlmEngineResource
from testing.loopback.faults import Fault, FaultPlan
from testing.loopback.openai_server import OpenAICompatibleServer
from testing.pipeline import sample_lake
from testing.vlm import ScriptedEngine
from tests.helpers import open_test_release

RELEASE, SHARD = "2026", "002"
KEY = MultiPartitionKey({"release": RELEASE, "shard": SHARD})
SERVED = "Qwen/Qwen2.5-VL-7B-Instruct"
CANARY_ANSWER = json.dumps({"canary": prompts.CANARY_TOKEN})
# every request but the frame probes ("Reply with OK.") and the canary ("Say hello in one word.")
MINING_REQUESTS = r"^/v1/chat/completions (?!Reply with OK\.)(?!Say hello in one word\.)"


def _answer(request: VlmRequest) -> str:
    return CANARY_ANSWER if prompts.name_of(request.prompt) == "canary" else '{"panels": []}'


def mined_lake(root: Path):
    """The sample release parsed, split into panels and mined once by a scripted model, plus one
    region pair written by hand (pair_negatives perturbs region texts); the outages below then
    hit reruns under another engine."""
    lake = sample_lake(root, RELEASE, panels=(SHARD,))
    MiningStage(ScriptedEngine(_mine), MiningSettings(som_views=1)).run(lake, Partition(RELEASE, SHARD))
    rows = lake.read_table("pairs", RELEASE, SHARD).to_pylist()
    panel = next(p for p in rows if p["level"] == "panel")
    region = {**panel, "level": "region", "pair_id": panel["pair_id"] + "/r00", "region_index": 0}
    region.update(text="the arrow indicates the lesion in the left lobe", text_source="caption", marker="arrow")
    lake.write_table("pairs", RELEASE, SHARD, [*rows, region])
    return lake


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    return mined_lake(tmp_path_factory.mktemp("outages"))


def _mine(request: VlmRequest) -> str:
    name = prompts.name_of(request.prompt)
    return {
        "canary": CANARY_ANSWER,
        "describe_panel": '{"description": "Two MRI slices."}',
        "locate_region": '{"regions": []}',
        "describe_region": '{"description": "The left hippocampus."}',
    }.get(name, '{"panels": []}')


@pytest.fixture
def instance(tmp_path):
    (tmp_path / "dagster").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "dagster"))
    open_test_release(instance, RELEASE)
    return instance


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"  # nothing listens once it is closed


def _vlm(url: str, **kwargs) -> VlmEngineResource:
    """The openai backend as a deployment configures it, with one outage retry, no delay."""
    settings = {"retries": 0} | kwargs
    return VlmEngineResource(
        backend="openai", base_url=url, model=SERVED, outage_retries=1, outage_retry_delay_s=0, **settings
    )


def _materialize(asset, lake, instance, vlm: VlmEngineResource, config: dict | None = None):
    resources = {
        "lake": LakeResource(home=str(lake.root)),
        "vlm": vlm,
        "ray": RayResource(),
        "quality": QualityResource(),
        "models": ModelsResource(synthetic=True, text_tokenizer="tiny"),
    }
    return materialize(
        [asset],
        partition_key=KEY,
        instance=instance,
        resources=resources,
        run_config={"ops": {asset.key.path[-1]: {"config": config}}} if config else None,
        raise_on_error=False,
    )


def _retried_then_failed(result, instance, retries: int = 1) -> list[str]:
    """The step asked for ``retries`` retries and failed after them; returns the outage warnings
    it logged (one per attempt)."""
    events = [e.event_type_value for e in result.all_events]
    assert not result.success
    assert events.count("STEP_UP_FOR_RETRY") == retries, events
    assert events.count("STEP_FAILURE") == 1
    warnings = [r.user_message for r in instance.all_logs(result.run_id) if "service unavailable" in r.user_message]
    assert len(warnings) == retries + 1
    return warnings


def _failed_items(lake) -> dict[str, list[dict]]:
    """Rows recorded as failed in the tables the VLM stages write (none may be, after an outage)."""
    failed = {}
    for table in ("mining_figures", "long_captions", "pair_negatives"):
        rows = lake.read_table(table, RELEASE, SHARD)
        failed[table] = [r for r in (rows.to_pylist() if rows is not None else []) if r.get("status") == "error"]
    return failed


def _mined(lake) -> list[dict]:
    return lake.read_table("mining_figures", RELEASE, SHARD).to_pylist()


NO_FAILURES = {"mining_figures": [], "long_captions": [], "pair_negatives": []}


def test_connection_refused_is_retried_and_fails_no_figure(lake, instance):
    before = _mined(lake)
    result = _materialize(pairs, lake, instance, _vlm(_closed_port_url()))
    messages = _retried_then_failed(result, instance)
    assert any("service unavailable" in m and "ConnectionError" in m for m in messages)
    assert _failed_items(lake) == NO_FAILURES
    assert _mined(lake) == before  # the scripted run's table stands as it was


def test_a_request_past_its_deadline_is_retried_and_fails_no_figure(lake, instance):
    """The server trickles every answer a byte a second; each request is cut at its 1 s deadline."""
    plan = FaultPlan(faults=[Fault("/v1/chat/completions", kind="trickle", interval=1.0, times=10**6)])
    behind = ScriptedEngine(_answer, EngineConfig(model=SERVED), image_tokens=True)
    with OpenAICompatibleServer(behind, plan=plan) as server:
        result = _materialize(pairs, lake, instance, _vlm(server.url, timeout_s=1.0))
    messages = _retried_then_failed(result, instance)
    assert any("no complete answer within the 1 s deadline" in m for m in messages)
    assert _failed_items(lake) == NO_FAILURES


def test_5xx_on_every_mining_request_is_retried_and_fails_no_figure(lake, instance):
    """The start-up checks pass (frame probes, canary); then every mining request gets 503
    until the engine's own retries run out: an outage mid-run, not 15 failed figures."""
    plan = FaultPlan(faults=[Fault(MINING_REQUESTS, status=503, times=10**6)])
    behind = ScriptedEngine(_answer, EngineConfig(model=SERVED), image_tokens=True)
    with OpenAICompatibleServer(behind, plan=plan) as server:
        result = _materialize(pairs, lake, instance, _vlm(server.url, retries=1))
    messages = _retried_then_failed(result, instance)
    assert any("HTTP 503" in m for m in messages)
    prompts_seen = [prompts.name_of(r.prompt) for r in behind.requests]
    assert prompts_seen.count("canary") == 2  # each attempt passed its checks, then hit the outage
    assert set(prompts_seen) == {"canary", "other"}  # and the frame probes: no mining request got through
    assert _failed_items(lake) == NO_FAILURES


def test_long_captions_and_vlm_negatives_retry_an_outage_too(lake, instance):
    url = _closed_port_url()
    result = _materialize(long_captions, lake, instance, _vlm(url))
    _retried_then_failed(result, instance)
    result = _materialize(pair_negatives, lake, instance, _vlm(url), config={"use_vlm": True})
    _retried_then_failed(result, instance)
    assert _failed_items(lake) == NO_FAILURES
