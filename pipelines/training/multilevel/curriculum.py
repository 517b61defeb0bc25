"""Which levels a step trains (the rotating schedule) and, in a curriculum, which stage it is in:
its loss-weight overrides and the parameter groups it trains."""

from __future__ import annotations

from pipelines.training.multilevel.config import WEIGHT_KEYS


def levels_at(step: int, schedule: list[list[str]], every: int = 1) -> list[str]:
    """The levels step ``step`` (0-based) trains: slot ``(step // every) mod len(schedule)``."""
    return list(schedule[(step // every) % len(schedule)])


def _epoch_lengths(curriculum: list[dict], steps: int, epoch_steps: int | None) -> dict[int, int]:
    """Steps of the stages given in ``epochs``: ``epochs * epoch_steps``, or without
    ``epoch_steps`` their share of the run's ``steps`` by epochs (the paper's 2 / 8 / 8 / 8 as
    shares of 26), rounded at the cumulative boundaries so the lengths add up to ``steps``."""
    indexed = [(i, float(stage["epochs"])) for i, stage in enumerate(curriculum) if "epochs" in stage]
    if epoch_steps is not None:
        return {i: round(epochs * epoch_steps) for i, epochs in indexed}
    total = sum(epochs for _, epochs in indexed) or 1.0
    out, done, start = {}, 0.0, 0
    for i, epochs in indexed:
        done += epochs
        end = round(steps * done / total)
        out[i], start = end - start, end
    return out


def _stage_lengths(curriculum: list[dict], steps: int, epoch_steps: int | None = None) -> list[tuple[int, int]]:
    """(length, ramp) in steps for each stage; fractions are of the run's ``steps``."""
    by_epochs = _epoch_lengths(curriculum, steps, epoch_steps)
    out = []
    for index, stage in enumerate(curriculum):
        if index in by_epochs:
            length = by_epochs[index]
        else:
            length = int(stage["steps"]) if "steps" in stage else round(stage["fraction"] * steps)
        ramp = int(stage.get("ramp_steps", round(stage.get("ramp_fraction", 0.0) * steps)))
        out.append((length, ramp))
    return out


def stage_spans(curriculum: list[dict], steps: int, epoch_steps: int | None = None) -> list[tuple[int, int]]:
    """Each stage's first and last step: a stage of no steps ends before it starts; the last one
    holds past its end, so it reaches at least the run's last step."""
    spans, start = [], 0
    for index, (length, _) in enumerate(_stage_lengths(curriculum, steps, epoch_steps)):
        last = start + length - 1
        if index == len(curriculum) - 1:
            last = max(last, steps - 1, start)
        spans.append((start, last))
        start += length
    return spans


def stage_at(step: int, curriculum: list[dict], steps: int, epoch_steps: int | None = None) -> int | None:
    """The index of the curriculum stage ``step`` falls in (the last one past the end); None
    without a curriculum."""
    start = 0
    for index, (length, _) in enumerate(_stage_lengths(curriculum, steps, epoch_steps)):
        start += length
        if step < start:
            return index
    return len(curriculum) - 1 if curriculum else None


def param_group(name: str) -> str:
    """A :class:`StepModel` parameter's curriculum group: ``vision`` (the image tower),
    ``roi_processor``, or ``text`` (the text tower, its projection and the logit scale)."""
    if name.startswith("model.visual."):
        return "vision"
    if name.startswith("roi_processor."):
        return "roi_processor"
    return "text"


def curriculum_weights(
    step: int, base: dict[str, float], curriculum: list[dict], steps: int, epoch_steps: int | None = None
) -> dict[str, float]:
    """The loss weights at ``step``: ``base`` overridden by the stage the step falls in; a stage
    with a ramp moves linearly from the previous stage's weights to its own, reaching them at its
    ``ramp``-th step. Past the last stage its weights hold (progressive global -> region)."""
    weights = {k: float(base.get(k, 0.0)) for k in WEIGHT_KEYS}
    if not curriculum:
        return weights
    previous, start = weights, 0
    for (length, ramp), stage in zip(_stage_lengths(curriculum, steps, epoch_steps), curriculum, strict=True):
        own = {**weights, **{k: float(v) for k, v in stage.get("weights", {}).items()}}
        if step < start + length or stage is curriculum[-1]:
            t = 1.0 if ramp <= 0 else min(1.0, (step - start + 1) / ramp)
            return {k: previous[k] + (own[k] - previous[k]) * t for k in WEIGHT_KEYS}
        previous, start = own, start + length
    return previous
