"""Thin Dagster assets: pick the partition, call ``pipelines``, write to the lake, report metadata."""
