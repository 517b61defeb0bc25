"""The two kinds of failure a stage run can end in, besides a bug.

Every error PanelForge raises on purpose derives from one of two bases, so a caller (the assets'
``run_stage``, the command line, a notebook) decides what to do by the base alone:

* :class:`StageInputError` — a person must act before a rerun can succeed: an upstream asset is
  not materialized, a setting is missing or invalid, annotations are for another model, the lake
  was made with another shard count, a folder exceeds the Hub's limits. Retrying changes nothing,
  so the run fails at once with the message, which says what to do.
* :class:`ServiceUnavailableError` — an outage of something outside the data: the PMC source,
  NCBI's E-utilities, the VLM engine, the Ray cluster. Nothing was written as the items' final
  state; the run fails and is retried later, and no item is marked failed.

Bad input (one article's broken XML, an undecodable figure) is neither: it is a recorded row.
"""

from __future__ import annotations


class StageInputError(RuntimeError):
    """The stage cannot run on what the lake holds or on how it is configured (an upstream
    stage has not run, a setting is missing); the message says what to do."""


class ServiceUnavailableError(RuntimeError):
    """An external service the stage needs cannot be used right now; retrying later may succeed."""


class UpstreamMissingError(StageInputError):
    """A table the stage reads has no partition yet: the asset that writes it must run first."""

    def __init__(self, table: str, release: str, shard: str | None, asset: str | None):
        where = f"release {release}" + (f" shard {shard}" if shard not in (None, "all") else "")
        then = f"materialize `{asset}` first" if asset else f"materialize the asset that writes `{table}` first"
        super().__init__(f"{where} has no `{table}` table: {then}")
        self.table, self.release, self.shard, self.asset = table, release, shard, asset
