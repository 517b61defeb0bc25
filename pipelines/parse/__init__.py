"""nXML parsing: plain functions over article XML (no Dagster, no network)."""
