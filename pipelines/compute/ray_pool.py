"""The Ray Data actor pool every batch-inference stage runs through, and what counts as an outage.

``actor_pool_batches`` runs CPU tasks (read and decode) then a pool of actors each holding a model
once, so the GPU never waits on decoding and memory is bounded by the batch size; embeddings and
the panel detector use it, the vLLM backend connects through ``ensure_ray``. ``is_outage`` tells
the cluster failing (retry the run) from our code or set-up failing (a person must act); both the
actor pool and the vLLM backend decide with it.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping

from pipelines.core.errors import ServiceUnavailableError


class ComputeUnavailableError(ServiceUnavailableError):
    """The Ray cluster lost what a partition was running on (a node, an actor, an object).

    Nothing was written, since a stage writes its table only after the last batch, so the run is
    retried like any outage (``run_stage``); a fresh run starts a new actor pool on the nodes left.
    An actor whose constructor failed (weights missing, a bug) is not an outage: that fails as is."""


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    import logging

    import ray
    import ray.data  # its import configures the "ray.data" logger (level DEBUG), so set ours after

    logging.getLogger("ray.data").setLevel(logging.WARNING)  # progress lines flood run logs
    if not ray.is_initialized():
        ray.init(
            address=address or None,
            num_cpus=None if address else num_cpus,
            include_dashboard=False,
            ignore_reinit_error=True,
            log_to_driver=False,
            configure_logging=False,
        )


def actor_pool_batches(
    rows: list[dict],
    prepare,
    prepare_kwargs: dict,
    actor,
    actor_kwargs: dict,
    batch_size: int,
    actors: int = 1,
    gpus_per_actor: float = 0,
    address: str | None = None,
    actor_resources: Mapping[str, float] | None = None,
) -> Iterator[dict]:
    """``rows`` through Ray Data: ``prepare`` (CPU tasks: read and decode) then a pool of
    ``actors`` instances of ``actor`` (each holding its model once, ``gpus_per_actor`` GPUs);
    yields the output as numpy batches. Every model stage (embeddings, panel detection) runs
    through here, so they pack GPUs and fail the same way.

    ``actor_resources`` are Ray custom resources each actor also holds (``{"a100": 1}``): a
    cluster whose GPU nodes advertise one keeps the model actors there and the CPU tasks
    elsewhere; the multi-node test uses it to stand in for GPUs it does not have."""
    try:
        import ray

        ensure_ray(address)
        ds = ray.data.from_items(rows)
        ds = ds.map_batches(prepare, fn_kwargs=prepare_kwargs, batch_size=batch_size)
        with warnings.catch_warnings():
            # Ray Data would restart a dead actor forever, but its constructor arguments live in the
            # object store, where a restart cannot rely on them (ray-project/ray#53727; Ray logs an
            # error for every pool): a lost actor fails this partition's run, which is rerun on its own.
            # Ray 2.60 has no named parameter for max_restarts yet, only the deprecated **ray_remote_args.
            warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
            ds = ds.map_batches(
                actor,
                fn_constructor_kwargs=actor_kwargs,
                batch_size=batch_size,
                compute=ray.data.ActorPoolStrategy(size=actors),
                num_gpus=gpus_per_actor or None,
                resources=dict(actor_resources) if actor_resources else None,
                max_restarts=0,
            )
        yield from ds.iter_batches(batch_size=batch_size, batch_format="numpy")
    except Exception as exc:
        if is_outage(exc):
            raise ComputeUnavailableError(f"the Ray cluster lost part of the run: {type(exc).__name__}: {exc}") from exc
        raise


# Ray failures that mean the cluster or an engine went away, not that a request was bad.
_OUTAGE_NAMES = (
    "ActorDiedError",
    "ActorUnavailableError",
    "NodeDiedError",
    "WorkerCrashedError",
    "LocalRayletDiedError",
    "ObjectLostError",
    "OwnerDiedError",
    "RaySystemError",
    "GetTimeoutError",
    "OutOfMemoryError",
    "RuntimeEnvSetupError",
)


def _chain(exc: BaseException | None):
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def actor_init_failed(exc: BaseException) -> bool:
    import ray.exceptions as rex

    return any(isinstance(e, rex.RayActorError) and e.actor_init_failed for e in _chain(exc))


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) is the cluster failing rather than our code or setup.

    An actor that failed in its constructor (vLLM missing from the workers, a model that does
    not load) is a setup error a person must fix: retrying the run would fail the same way."""
    if actor_init_failed(exc):
        return False
    return any(isinstance(e, ConnectionError) or type(e).__name__ in _OUTAGE_NAMES for e in _chain(exc))
