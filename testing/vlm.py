"""A scripted engine for the logic around the model (NMS over proposals, fusion, text
association): the real models cannot run here, so tests write what a model would answer, by
hand, and check what the pipeline makes of it. End-to-end tests use the tiny real model."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from pipelines.vlm.engine import EngineConfig, VlmEngine, VlmRequest, VlmResponse
from pipelines.vlm.frame_check import visual_tokens
from pipelines.vlm.grounding import model_frame


class ScriptedEngine(VlmEngine):
    """Answers each request with ``answer(request)`` (a string, or an Exception to record as the
    request's error). Image sizes in the model frame are computed like the real processor's.
    Prompt tokens are the prompt's words, plus, with ``image_tokens``, each image's visual tokens
    and its two markers as a Qwen-VL processor counts them (what the frame check reads)."""

    backend = "scripted"

    def __init__(
        self,
        answer: Callable[[VlmRequest], str | Exception],
        config: EngineConfig | None = None,
        image_tokens: bool = False,
    ):
        self.answer = answer
        self.config = config or EngineConfig(model="scripted", synthetic=True)
        self.image_tokens = image_tokens
        self.requests: list[VlmRequest] = []

    def backend_version(self) -> str:
        return "0"

    def generate(self, requests: Sequence[VlmRequest]) -> list[VlmResponse]:
        return [self._respond(request) for request in requests]

    def stream(self, requests: Sequence[VlmRequest]) -> Iterator[tuple[int, VlmResponse]]:
        """One answer at a time, each written only when the caller asks for the next: what the
        caller did with the earlier ones (progress, checkpoints) is visible to ``answer``. A test's
        subclass that scripts ``generate`` itself (an outage, a dropped schema) is streamed
        through it."""
        if type(self).generate is not ScriptedEngine.generate:
            yield from super().stream(requests)
            return
        for index, request in enumerate(requests):
            yield index, self._respond(request)

    def _respond(self, request: VlmRequest) -> VlmResponse:
        self.requests.append(request)
        sizes = [model_frame(im.width, im.height, self.config) for im in request.images]
        answer = self.answer(request)
        if isinstance(answer, Exception):
            return VlmResponse(request.id, None, image_sizes=sizes, error=str(answer))
        return VlmResponse(
            request.id,
            answer,
            prompt_tokens=len(request.prompt.split()) + self._visual_tokens(request),
            completion_tokens=len(answer.split()),
            image_sizes=sizes,
        )

    def _visual_tokens(self, request: VlmRequest) -> int:
        if not self.image_tokens:
            return 0
        return sum(visual_tokens(im.width, im.height, self.config) + 2 for im in request.images)
