"""What a model stage's requests cost, per item and per prompt, whoever sends them.

:class:`MeteredEngine` wraps any engine: every response's tokens and seconds are added to the
item that asked (the ``owner`` set around a helper's calls, else the ``<item key>|...`` prefix of
the request id) and to the prompt it came from (``VlmRequest.prompt_name``). Stages write the per
item numbers into their rows and the totals into their run's metadata; benchmarks subclass it to
keep every request (:meth:`MeteredEngine.record`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from pipelines.vlm.engine import VlmEngine, VlmRequest, VlmResponse


@dataclass
class Meter:
    """Requests, tokens and seconds per item (the owner) and per prompt."""

    owner: str | None = None
    requests: Counter = field(default_factory=Counter)
    prompt_tokens: Counter = field(default_factory=Counter)
    completion_tokens: Counter = field(default_factory=Counter)
    seconds: Counter = field(default_factory=Counter)
    by_prompt: dict = field(default_factory=lambda: defaultdict(Counter))

    def totals(self) -> dict[str, object]:
        """The run's totals, as every model stage reports them."""
        return {
            "vlm_requests": sum(self.requests.values()),
            "prompt_tokens": sum(self.prompt_tokens.values()),
            "completion_tokens": sum(self.completion_tokens.values()),
            "vlm_seconds": round(sum(self.seconds.values()), 3),
        }

    def of(self, owner: str) -> dict[str, object]:
        """One item's numbers, as its row stores them."""
        return {
            "vlm_requests": self.requests[owner],
            "prompt_tokens": self.prompt_tokens[owner],
            "completion_tokens": self.completion_tokens[owner],
            "seconds": self.seconds[owner],
        }


class MeteredEngine(VlmEngine):
    """Wraps an engine to attribute every request's cost to its item and its prompt: requests sent
    while ``meter.owner`` is set belong to that owner; the others to the ``<key>|`` prefix of
    their id."""

    def __init__(self, engine: VlmEngine):
        self.engine, self.config, self.backend = engine, engine.config, engine.backend
        self.meter = Meter()

    def backend_version(self) -> str:
        return self.engine.backend_version()

    def info(self) -> dict:
        return self.engine.info()

    def generate(self, requests: Sequence[VlmRequest]) -> list[VlmResponse]:
        responses = self.engine.generate(requests)
        for request, response in zip(requests, responses, strict=True):
            self.record(request, response)
        return responses

    def stream(self, requests: Sequence[VlmRequest]) -> Iterator[tuple[int, VlmResponse]]:
        for index, response in self.engine.stream(requests):
            self.record(requests[index], response)
            yield index, response

    def record(self, request: VlmRequest, response: VlmResponse) -> None:
        """Count one answered request (subclasses keep more)."""
        m = self.meter
        owner = m.owner or request.id.split("|", 1)[0]
        m.requests[owner] += 1
        m.prompt_tokens[owner] += response.prompt_tokens
        m.completion_tokens[owner] += response.completion_tokens
        m.seconds[owner] += response.seconds
        kind = m.by_prompt[request.prompt_name or "other"]
        kind["requests"] += 1
        kind["prompt_tokens"] += response.prompt_tokens
        kind["completion_tokens"] += response.completion_tokens
        kind["seconds"] += response.seconds
