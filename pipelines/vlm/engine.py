"""The engine interface every backend implements, and what a request and a response are.

A request is one chat turn: a user prompt with zero or more images (shown before the text),
an optional system prompt and an optional JSON schema the answer must follow (structured
outputs). A response carries the text, the token counts and the size of every image in the
model's frame (after the processor's resize), so boxes can be mapped back to original pixels.

Two kinds of failure are kept apart on purpose: a request the backend rejects or cannot read
(a corrupt image, a 400 from the server) is that request's ``error``, recorded for its item,
and the rest of the batch goes on; an engine that cannot be reached (connection refused,
timeouts after the retries, a crashed worker) raises :class:`VlmOutage`, which fails the run so
that Dagster retries it, and marks no item failed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field

from PIL import Image

from pipelines.core.errors import ServiceUnavailableError
from pipelines.core.fingerprints import fingerprint, model_identity
from pipelines.core.provenance import public_model

QWEN2_VL, QWEN2_5_VL, QWEN3_VL = "qwen2_vl", "qwen2_5_vl", "qwen3_vl"
FAMILIES = (QWEN2_VL, QWEN2_5_VL, QWEN3_VL)

# 256 to 1280 visual tokens of 28x28 pixels per image: the band of Qwen's model card examples (a
# checkpoint's own preprocessor_config.json allows 3,136 to 12,845,056 pixels, 4 to 16,384 tokens)
DEFAULT_MIN_PIXELS = 256 * 28 * 28
DEFAULT_MAX_PIXELS = 1280 * 28 * 28


class VlmOutage(ServiceUnavailableError):  # noqa: N818 (an outage, not an error of the item)
    """The engine cannot be reached or died: the run fails and is retried; no item is failed."""


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters, the same for every backend (greedy by default: mining is extraction,
    not creative writing, and greedy answers are reproducible).

    Every field is sent to every backend, neutral values included: a vLLM server fills each
    field a request leaves out from the model's ``generation_config.json``
    (``ModelConfig.get_diff_sampling_param``: ``repetition_penalty``, ``temperature``,
    ``top_k``, ``top_p``, ``min_p``, ``max_new_tokens``; Qwen2.5-VL's say 1.05, 0.1, 1 and
    0.001), and transformers' ``generate`` does the same, so a field not sent is a field decided
    by the checkpoint, not by this configuration or its provenance. ``top_k`` -1 means all
    tokens, as vLLM and SGLang spell it (SGLang refuses 0); ``max_tokens`` caps every answer
    (each request's own budget is at most this)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_tokens: int = 512
    seed: int = 0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (all tokens) or at least 1, got {self.top_k}")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or not 0 <= self.min_p <= 1:
            raise ValueError(f"need temperature >= 0, 0 < top_p <= 1, 0 <= min_p <= 1: {self}")
        if self.max_tokens < 1 or self.repetition_penalty <= 0:
            raise ValueError(f"need max_tokens >= 1 and repetition_penalty > 0: {self}")

    def as_dict(self) -> dict:
        return asdict(self)

    def request_fields(self, max_tokens: int) -> dict:
        """Every sampling field of one request, with its own answer budget: what goes on the wire
        (OpenAI body, vLLM ``SamplingParams``), and what provenance records besides the cap."""
        return {**self.as_dict(), "max_tokens": max_tokens}


@dataclass(frozen=True)
class EngineConfig:
    """What every backend needs to know about the model.

    ``model`` is a hub id or a local directory; ``family`` decides how grounded boxes are read
    (``qwen2_5_vl``: absolute pixels of the resized image; ``qwen2_vl``/``qwen3_vl``: a 0–1000
    grid). ``min_pixels``/``max_pixels`` is the pixel band of the processor's resize.
    ``synthetic`` marks a tiny randomly initialised model: everything it produces is marked."""

    model: str = "Qwen/Qwen2.5-VL-7B-Instruct"
    revision: str | None = None
    family: str = QWEN2_5_VL
    dtype: str = "bfloat16"
    min_pixels: int = DEFAULT_MIN_PIXELS
    max_pixels: int = DEFAULT_MAX_PIXELS
    sampling: Sampling = field(default_factory=Sampling)
    synthetic: bool = False

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"model family must be one of {FAMILIES}, not {self.family!r}")
        if not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError(f"need 0 < min_pixels <= max_pixels, got {self.min_pixels}, {self.max_pixels}")

    def max_tokens(self, request: VlmRequest) -> int:
        """A request's answer budget: its prompt's own, capped by the engine's (a deployment can
        cap every answer, e.g. a tiny test model that never stops on its own)."""
        cap = self.sampling.max_tokens
        return min(request.max_tokens, cap) if request.max_tokens else cap

    @property
    def patch_factor(self) -> int:
        """The side a resized image must be a multiple of: patch size x spatial merge size."""
        return 32 if self.family == QWEN3_VL else 28


@dataclass
class VlmRequest:
    """One chat turn. ``id`` is the caller's key, echoed in the response."""

    id: str
    prompt: str
    images: list[Image.Image] = field(default_factory=list)
    system: str | None = None
    schema: dict | None = None
    max_tokens: int | None = None  # the prompt's budget; the engine's sampling.max_tokens caps it
    prompt_name: str | None = None  # which prompt it asks (``Prompt.request`` sets it): costs per prompt


@dataclass
class VlmResponse:
    """``text`` None with ``error`` set: the request failed on its own (recorded for its item).
    ``image_sizes``: each image's (width, height) in the model's frame, after the resize."""

    id: str
    text: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    image_sizes: list[tuple[int, int]] = field(default_factory=list)
    error: str | None = None


class VlmEngine:
    """The interface of every backend. ``generate`` returns one response per request, in the
    request order; ``stream`` yields them as they are ready; ``info`` is the provenance stored
    with every pair."""

    config: EngineConfig
    backend: str = "none"

    def generate(self, requests: Sequence[VlmRequest]) -> list[VlmResponse]:
        raise NotImplementedError

    def stream(self, requests: Sequence[VlmRequest]) -> Iterator[tuple[int, VlmResponse]]:
        """``(index in requests, response)`` for every request, as soon as each is ready, in any
        order: a stage can count a figure done while the rest of its batch is still with the model
        (the run log's progress line). Backends that finish requests a few at a time (a batch of
        ``batch_size``, one HTTP call) override it; this default answers once all are done.
        An outage raises :class:`VlmOutage` as ``generate`` does; what was yielded before stands.
        A subclass that changes what ``generate`` sends must change ``stream`` the same way."""
        yield from enumerate(self.generate(requests))

    def backend_version(self) -> str:
        raise NotImplementedError

    def info(self) -> dict:
        """Provenance: model, revision, backend and its version, sampling, pixel band."""
        c = self.config
        return {
            "model": c.model,
            "revision": c.revision,
            "family": c.family,
            "dtype": c.dtype,
            "min_pixels": c.min_pixels,
            "max_pixels": c.max_pixels,
            "sampling": c.sampling.as_dict(),
            "backend": self.backend,
            "backend_version": self.backend_version(),
            "synthetic": c.synthetic,
        }

    def close(self) -> None:
        """Release what the engine holds (GPU memory, HTTP sessions, Ray actors)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def in_order(responses: Iterable[tuple[int, VlmResponse]], n: int) -> list[VlmResponse]:
    """The responses of ``stream`` for ``n`` requests, in the request order: ``generate`` of a
    backend that implements ``stream``."""
    ordered: list[VlmResponse | None] = [None] * n
    for index, response in responses:
        ordered[index] = response
    missing = [i for i, r in enumerate(ordered) if r is None]
    if missing:
        raise RuntimeError(f"the engine answered {n - len(missing)} of {n} requests (none for {missing[:5]})")
    return ordered  # type: ignore[return-value]


def provenance(engine: VlmEngine, prompt_version: str) -> dict:
    """The provenance columns every table written with a model's answers carries: the model by its
    id, a local directory by its folder's name and its revision by the content hash of its files
    (``pipelines.core.provenance.public_model``): released data never holds a machine's path."""
    info = engine.info()
    model, revision = public_model(info["model"], info["revision"])
    return {
        "model": model,
        "model_revision": revision,
        "prompt_version": prompt_version,
        "sampling": json.dumps(info["sampling"], sort_keys=True),
        "backend": info["backend"],
        "backend_version": info["backend_version"],
        "synthetic": bool(info["synthetic"]),
    }


def engine_fingerprint(engine: VlmEngine, **settings: object) -> str:
    """What a reused result must have been made with: the engine (not its backend's version: the
    same model and prompts through another server give the same answers; and not where its weights
    lie: a local directory counts by its content, see ``model_identity``) and ``settings``."""
    info = {k: v for k, v in engine.info().items() if k not in ("backend", "backend_version")}
    info["model"] = model_identity(engine.config.model, engine.config.revision)
    return fingerprint({"engine": info, **settings})
