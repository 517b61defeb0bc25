"""An outage of the Ray backend (a dead engine actor, on a real local Ray) is retried and fails no
figure. (The other backends' outages: tests/assets/test_vlm_outages.py.)"""

import os

import pytest
from dagster import DagsterInstance

from assets.mining import pairs
from resources.vlm import VlmEngineResource
from tests.assets.test_vlm_outages import (
    NO_FAILURES,
    RELEASE,
    SERVED,
    _failed_items,
    _materialize,
    _retried_then_failed,
    mined_lake,
)
from tests.helpers import open_test_release


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    return mined_lake(tmp_path_factory.mktemp("outages"))


@pytest.fixture
def instance(tmp_path):
    (tmp_path / "dagster").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "dagster"))
    open_test_release(instance, RELEASE)
    return instance


def test_dead_ray_engine_actors_are_retried_and_fail_no_figure(lake, instance, local_ray):
    """The Ray backend: the engine's actor died (killed here; OOM or a lost node in production).
    The exception is the one Ray raises for a call to a dead actor."""
    ray = pytest.importorskip("ray")
    from pipelines.vlm.ray_llm import RayVllmEngine

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:

        @ray.remote(num_cpus=0)
        class Engine:
            def ping(self) -> int:
                return 1

            def die(self) -> None:
                os._exit(1)  # the worker process gone mid-call, as an OOM kill leaves it

        actor = Engine.remote()
        ray.get(actor.ping.remote())
        # (ray.kill is asynchronous: a call made right after it may still be answered)
        with pytest.raises(ray.exceptions.RayActorError) as died:
            ray.get(actor.die.remote(), timeout=60)
    finally:
        if started:
            ray.shutdown()
    # died, or not yet known to be dead when called: both are the cluster failing, not our code
    assert type(died.value).__name__ in ("ActorDiedError", "ActorUnavailableError"), repr(died.value)

    class DeadActors(RayVllmEngine):
        def _run(self, rows):
            raise RuntimeError("dataset execution failed") from died.value  # as Ray Data wraps it

    class RayVlm(VlmEngineResource):
        def engine(self, cache_dir=None):
            from pipelines.vlm.ray_llm import RayVllmSettings

            return DeadActors(self.engine_config(), RayVllmSettings(runtime_env=None))

    resource = RayVlm(backend="ray", model=SERVED, outage_retries=2, outage_retry_delay_s=0)
    result = _materialize(pairs, lake, instance, resource)
    messages = _retried_then_failed(result, instance, retries=2)
    assert any("Ray vLLM engine unavailable: RuntimeError" in m for m in messages)
    assert _failed_items(lake) == NO_FAILURES
