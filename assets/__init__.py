"""Thin Dagster assets: resolve the partition, run the stage from ``pipelines``, report its result."""

import warnings

from dagster import BetaWarning, PreviewWarning

# PanelForge uses beta Dagster APIs on purpose (backfill_policy, MultiToSingleDimensionPartitionMapping);
# their BetaWarnings, raised while these modules are imported, would flood `dagster dev`, run logs
# and tests. Filtered here, before any asset module is imported, so every process loading them is quiet.
warnings.filterwarnings("ignore", category=BetaWarning)
warnings.filterwarnings("ignore", category=PreviewWarning)
