"""Materialization metadata helpers shared by the assets."""

from __future__ import annotations

from dagster import MetadataValue


def preview(rows: list[dict], columns: list[str], limit: int = 10) -> MetadataValue:
    """A Markdown table of the first ``limit`` rows, for the asset's page in the UI."""
    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    body = "".join(
        "| " + " | ".join(str(row.get(c, "")).replace("|", "\\|")[:80] for c in columns) + " |\n"
        for row in rows[:limit]
    )
    return MetadataValue.md(head + body if rows else "_no rows_")


def previous_release(releases: list[str], release: str) -> str | None:
    """The latest release before ``release`` among those in the lake (keys sort by year)."""
    earlier = [r for r in releases if r < release]
    return earlier[-1] if earlier else None
