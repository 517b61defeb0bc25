"""Partitions: releases (dynamic, one per yearly refresh) x shards (hash buckets of PMCID).

Full PMC-OA (6.4M articles, 24M figures) in 256 shards is about 25k articles and 94k figures
per partition, and 10 yearly releases make 2,560 partitions per asset — far below Dagster's
recommended 100k, while one partition is still a few minutes of GPU work later on.
"""

from __future__ import annotations

from dagster import DynamicPartitionsDefinition, MultiPartitionsDefinition, StaticPartitionsDefinition

from pipelines.partitioning import shard_keys
from resources.settings import n_shards

RELEASES = "releases"
releases_partitions = DynamicPartitionsDefinition(name=RELEASES)
shard_partitions = StaticPartitionsDefinition(shard_keys(n_shards()))
release_shard_partitions = MultiPartitionsDefinition({"release": releases_partitions, "shard": shard_partitions})
