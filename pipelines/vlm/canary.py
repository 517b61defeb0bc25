"""The structured-outputs canary: proof, before a run spends GPU hours, that the engine applies
JSON schemas.

A server that silently ignores ``response_format`` (an old vLLM, a proxy that drops fields, a
misconfigured backend) still answers, just not in JSON, and every mined item would then fail
parsing one by one. The canary asks a question whose natural answer is a greeting, under a
schema whose only valid answer is ``{"canary": CANARY_TOKEN}``: only an engine that constrains
decoding can answer it. Backend-independent: it only calls ``engine.generate``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pipelines.vlm.engine import VlmEngine, VlmOutage
from pipelines.vlm.prompts import CANARY, CANARY_TOKEN


@dataclass
class CanaryResult:
    passed: bool
    answer: str | None
    reason: str


def run_canary(engine: VlmEngine) -> CanaryResult:
    """Send the canary and judge its answer. :class:`VlmOutage` propagates (the engine is
    unreachable: retry later), and so does ``StageInputError`` (the engine refused to start, e.g.
    a server with another pixel band: its own message says what to fix); anything else is a
    failed canary with the reason."""
    from pipelines.core.stage import StageInputError

    request = CANARY.request("canary")
    try:
        [response] = engine.generate([request])
    except (VlmOutage, StageInputError):
        raise
    except Exception as exc:  # noqa: BLE001 - a canary reports, it does not crash the caller
        return CanaryResult(False, None, f"engine raised {type(exc).__name__}: {exc}")
    if response.error is not None:
        return CanaryResult(False, None, f"the engine rejected the canary request: {response.error}")
    return judge(response.text)


def judge(answer: str | None) -> CanaryResult:
    """The verdict on one canary answer."""
    expected = {"canary": CANARY_TOKEN}
    if answer is None:
        return CanaryResult(False, None, "the engine returned no text")
    try:
        value = json.loads(answer)
    except json.JSONDecodeError as exc:
        return CanaryResult(
            False, answer, f"the answer is not JSON ({exc.msg}): the engine does not apply JSON schemas"
        )
    if value != expected:
        return CanaryResult(
            False, answer, f"the answer is JSON but not {json.dumps(expected)}: the schema was not enforced"
        )
    return CanaryResult(True, answer, "the answer follows the schema")


def require_structured_outputs(engine: VlmEngine, required: bool = True) -> CanaryResult:
    """The canary at the start of a run that needs the model: refuses to go on (a person must
    fix the server) when the engine does not apply JSON schemas, unless ``required`` is off."""
    from pipelines.core.stage import StageInputError

    result = run_canary(engine)
    if not result.passed and required:
        raise StageInputError(
            f"structured outputs are not applied by the {engine.backend} engine ({result.reason}); "
            "check the server's version and its structured-output parameter (docs/vlm-backends.md)"
        )
    return result


def canary_check(name: str, result: CanaryResult | None):
    """The asset check of a run's canary (None: nothing needed the model, no request was sent)."""
    from pipelines.core.stage import Check

    if result is None:
        return Check(name, passed=True, description="no request sent: every item reused or needing no model")
    return Check(
        name,
        passed=result.passed,
        description=f"structured-output canary: {result.reason}",
        metadata={"answer": (result.answer or "")[:200]},
    )
