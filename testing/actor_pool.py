"""Ray Data's actor pool run in this process, for the fast test tiers.

``pipelines.compute.ray_pool.actor_pool_batches`` starts (or joins) a Ray cluster: a GCS, a raylet
and worker processes, about 20 s on two cores before the first batch, which is why tests that go
through Ray live in ``tests/e2e`` (``local_ray``, ``ray_cluster``). A fast-tier test that needs a
model stage's rows but not Ray itself (what a stage records for each image, not how Ray schedules
it) runs the same CPU function and the same actor class here, batch by batch: the actor is built
once, each batch is a dict of numpy columns as Ray Data's ``batch_format="numpy"`` gives it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from numbers import Number
from unittest import mock

import numpy as np


def _columns(rows: list[dict]) -> dict[str, np.ndarray]:
    """Rows as numpy columns: numbers as a numeric array, anything else (strings, None, bytes) as
    an object array, as Ray Data hands Arrow columns to numpy."""
    out = {}
    for key in rows[0]:
        values = [row[key] for row in rows]
        numeric = all(isinstance(v, Number) and not isinstance(v, bool) for v in values)
        out[key] = np.array(values) if numeric else np.array(values, dtype=object)
    return out


def in_process_batches(
    rows: list[dict],
    prepare,
    prepare_kwargs: dict,
    actor,
    actor_kwargs: dict,
    batch_size: int,
    *args,
    **kwargs,
) -> Iterator[dict]:
    """``actor_pool_batches`` without Ray: one ``actor`` instance, ``prepare`` then the actor on
    each batch of ``batch_size`` rows, in order. The placement arguments (actors, GPUs, address,
    custom resources) mean nothing in one process and are ignored."""
    model = actor(**actor_kwargs)
    for start in range(0, len(rows), batch_size):
        yield model(prepare(_columns(rows[start : start + batch_size]), **prepare_kwargs))


@contextlib.contextmanager
def actor_pool_in_process() -> Iterator[None]:
    """While the block runs, the embedding and panel-detection stages use :func:`in_process_batches`."""
    with (
        mock.patch("pipelines.compute.ray_pool.actor_pool_batches", in_process_batches),
        mock.patch("pipelines.concepts.embed.actor_pool_batches", in_process_batches),
    ):
        yield
