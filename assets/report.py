"""How every asset reports a stage run: counters as metadata, previews, paths, checks, log lines."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    DataVersion,
    Failure,
    MaterializeResult,
    MetadataValue,
    PartitionsDefinition,
    RetryRequested,
)

from assets.partitions import partition_of
from pipelines.core.errors import ServiceUnavailableError, StageInputError
from pipelines.core.lake import Lake
from pipelines.core.stage import Check, Markdown, Preview, Stage, StageResult

ERROR_RATE = "error_rate"
MAX_LOGGED_ERRORS = 50


def preview(rows: list[dict], columns: list[str], limit: int = 10) -> MetadataValue:
    """A Markdown table of the first ``limit`` rows, for the asset's page in the UI."""
    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    body = "".join(
        "| " + " | ".join(str(row.get(c, "")).replace("|", "\\|")[:80] for c in columns) + " |\n"
        for row in rows[:limit]
    )
    return MetadataValue.md(head + body if rows else "_no rows_")


def error_rate_check(asset: str, partitions_def: PartitionsDefinition | None = None) -> AssetCheckSpec:
    """The blocking check every per-item stage carries: failed items within the threshold.
    ``partitions_def`` (the asset's) records the result per partition, so automation holds back
    only what depends on the partition that failed."""
    return AssetCheckSpec(
        ERROR_RATE,
        asset=asset,
        partitions_def=partitions_def,
        blocking=True,
        description="Share of items the stage recorded as failed is at most the quality threshold "
        "(PANELFORGE_MAX_ERROR_RATE); a higher share means something systematic, not bad input.",
    )


def shard_check(asset: str, name: str, description: str, blocking: bool = False) -> AssetCheckSpec:
    """The spec of a check a release × shard stage reports on every partition."""
    from assets.partitions import release_shard_partitions

    return AssetCheckSpec(
        name, asset=asset, partitions_def=release_shard_partitions, blocking=blocking, description=description
    )


def check_result(check: Check) -> AssetCheckResult:
    return AssetCheckResult(
        check_name=check.name,
        passed=check.passed,
        severity=AssetCheckSeverity.ERROR if check.blocking else AssetCheckSeverity.WARN,
        description=check.description,
        metadata={k: _value(v) for k, v in check.metadata.items()},
    )


def error_rate(result: StageResult, max_rate: float) -> Check:
    return Check(
        ERROR_RATE,
        passed=result.error_rate <= max_rate,
        description=f"{result.error} of {result.ok + result.error} items failed "
        f"({result.error_rate:.1%}; threshold {max_rate:.1%})",
        metadata={"error_rate": result.error_rate, "threshold": max_rate, "failed": result.error},
    )


def rounded(value: object) -> object:
    """Floats as a person reads them in the UI: three decimals from 1 up, four significant digits
    below (an error rate of 0.000123 stays visible), inside lists and dicts too."""
    if isinstance(value, float) and math.isfinite(value):
        return round(value, 3) if abs(value) >= 1 else float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v) for v in value]
    return value


def _value(value: object):
    if isinstance(value, Markdown):
        return MetadataValue.md(str(value))
    if isinstance(value, Preview):
        return preview(value.rows, value.columns, value.limit)
    if isinstance(value, (list, dict)):
        return MetadataValue.json(rounded(value))
    return rounded(value)


def report(
    context: AssetExecutionContext, result: StageResult, max_error_rate: float | None = None
) -> MaterializeResult:
    """The asset's answer for one stage run: every counter, preview and path as metadata, the
    stage's own checks, and the error-rate check when the asset declares one."""
    for item, reason in result.errors[:MAX_LOGGED_ERRORS]:
        context.log.warning(f"{item}: {reason}")
    if len(result.errors) > MAX_LOGGED_ERRORS:
        context.log.warning(f"... and {len(result.errors) - MAX_LOGGED_ERRORS} more (see the table)")
    context.log.info(
        f"{result.stage}[{result.partition}]: {result.ok} ok, {result.error} failed, "
        f"{result.skipped} skipped in {result.seconds:.1f}s"
    )
    metadata = {k: _value(v) for k, v in result.summary().items()}
    metadata.update({name: MetadataValue.path(path) for name, path in result.paths.items()})
    metadata.update({name: _value(p) for name, p in result.previews.items()})
    checks = list(result.checks)
    if max_error_rate is not None:
        checks.append(error_rate(result, max_error_rate))
    for check in checks:  # a failed warning check shows as WARN on the asset; only blocking ones are log warnings
        if not check.passed:
            log = context.log.warning if check.blocking else context.log.info
            log(f"check {check.name} failed: {check.description}")
    return MaterializeResult(
        metadata=metadata,
        check_results=[check_result(c) for c in checks],
        data_version=DataVersion(result.version) if result.version else None,
    )


@dataclass(frozen=True)
class OutageRetry:
    """How often and how long after an outage of an external service the step is retried."""

    retries: int = 0
    delay_s: float = 300.0


def outage_of(resource) -> OutageRetry:
    """The outage retries a resource is configured with (``outage_retries``,
    ``outage_retry_delay_s``: the PMC source, NCBI, the Ray cluster, the VLM engine)."""
    return OutageRetry(resource.outage_retries, resource.outage_retry_delay_s)


def needs_person(exc: StageInputError) -> Failure:
    """The run's failure for a problem a person must fix: the message alone, never retried."""
    return Failure(str(exc), allow_retries=False)


def run_stage(
    context: AssetExecutionContext,
    stage: Stage,
    lake: Lake,
    max_error_rate: float | None = None,
    outage: OutageRetry = OutageRetry(),
) -> MaterializeResult:
    """Run ``stage`` on the run's partition and report it.

    Problems a person must fix (:class:`StageInputError`: an upstream asset not materialized,
    annotations for another model, a setting missing) fail the run with their message and are not
    retried. An outage (:class:`ServiceUnavailableError`: the PMC source, NCBI, the VLM engine or
    the Ray cluster, a node lost mid-partition) is retried
    ``outage.retries`` times, ``outage.delay_s`` apart, then fails the run; nothing was written as
    the items' final state. Anything else fails the run
    with its traceback."""
    try:
        result = stage.run(lake, partition_of(context), progress=context.log.info)
    except StageInputError as exc:
        raise needs_person(exc) from exc
    except ServiceUnavailableError as exc:
        context.log.warning(f"{stage.name}[{partition_of(context)}]: service unavailable: {exc}")
        raise RetryRequested(max_retries=outage.retries, seconds_to_wait=outage.delay_s) from exc
    return report(context, result, max_error_rate)
