"""The evaluation job: ``python -m pipelines.evaluation.job --config <url>``, launched by the
``clip_evaluation`` asset through the job launcher (never in the Dagster process: it needs the
GPU the model was trained on).

The config names the lake, the release, the model (an OpenCLIP name with ``pretrained``, an
``hf-hub:`` id or a ``local-dir:`` directory, e.g. a training run's exported ``model/``) and an
optional baseline checkpoint evaluated in the same run, and ``benchmarks``: a list of
``{kind, path, ...options}`` read by ``benchmarks_formats.load_benchmark`` (``vqa-rad``, ``slake``,
``medmnist``, ``hf``, ``image-folder``, ``manifest``); the report (Markdown table with 95%
bootstrap intervals, deltas against the baseline, plots) comes back as the asset's metadata and
stays in ``models/eval/<release>/<run id>/``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipelines import launch
from pipelines.core.lake import Lake
from pipelines.evaluation.benchmarks_formats import load_benchmarks
from pipelines.evaluation.harness import evaluate_release, load_clip


@dataclass(frozen=True)
class EvalJobConfig(launch.JobConfig):
    """``share``: record a new held-out split of that share of articles first (None: use the
    release's recorded split); ``limit``: at most this many pairs per retrieval set;
    ``benchmarks``: extra datasets as ``{kind, path, ...options}`` (paths on the job's machine)."""

    lake: str
    release: str
    model: str
    pretrained: str | None = None
    baseline: str | None = None
    baseline_pretrained: str | None = None
    license_group: str = "commercial"
    share: float | None = None
    limit: int | None = 5000
    batch_size: int = 64
    n_resamples: int = 1000
    seed: int = 0
    device: str = "cpu"
    synthetic: bool = False
    benchmarks: tuple[dict, ...] = ()

    JOB = "evaluation"


def run(config: EvalJobConfig, run_id: str, run_dir: str | None = None) -> dict:
    """Evaluate, report, return the metadata."""
    lake = Lake(config.lake)
    launch.log(f"evaluating {config.model} on release {config.release}" + (" (synthetic)" if config.synthetic else ""))
    label = " (synthetic)" if config.synthetic else ""  # the demo's tiny random model: no quality claim
    model = load_clip(config.model, config.pretrained or None, name=config.model + label, device=config.device)
    baseline = None
    if config.baseline:
        pretrained = config.baseline_pretrained or None
        baseline = load_clip(config.baseline, pretrained, config.baseline + label, config.device)
    report, paths = evaluate_release(
        lake,
        config.release,
        model,
        baseline,
        run_id=run_id,
        license_group=config.license_group,
        extra=load_benchmarks(config.benchmarks, config.synthetic),
        share=config.share,
        limit=config.limit,
        batch_size=config.batch_size,
        n_resamples=config.n_resamples,
        seed=config.seed,
    )
    metadata = {
        "report": {"raw_value": report.markdown(), "type": "md"},
        "datasets": len({row.dataset for row in report.rows}),
        "model": config.model,
        "baseline": config.baseline or "",
        "synthetic": config.synthetic,
        "report_dir": paths.get("report.json", ""),
    }
    launch.report_final(metadata, run_dir)
    return metadata


def launched(config: EvalJobConfig, job: launch.LaunchInfo) -> dict:
    """The run under the launcher's run id; the report also in its run dir."""
    return run(config, job.run_id, job.run_dir)


def main(argv: list[str] | None = None) -> dict:
    return launch.main(EvalJobConfig, launched, argv, description=__doc__.splitlines()[0])


if __name__ == "__main__":
    main()
