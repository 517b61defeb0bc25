"""The engine over an OpenAI-compatible HTTP server: ``vllm serve``, SGLang, or any server with
``POST /v1/chat/completions``.

The model runs elsewhere (a GPU box, a Kubernetes service); this engine only sends chat requests,
a bounded number at a time, so the server's continuous batching sees a steady queue without the
client opening hundreds of connections.

**The pixel band must match.** ``image_sizes`` (which boxes are mapped back with) are computed
here, from ``config.min_pixels``/``max_pixels``; the server resizes with its own processor
settings. Start it with the same band, e.g. for vLLM::

    vllm serve Qwen/Qwen2.5-VL-7B-Instruct \\
        --mm-processor-kwargs '{"min_pixels": 200704, "max_pixels": 1003520}'

(SGLang and others have their own flag for processor kwargs.) A mismatch would shift every box
silently, so the first ``generate`` checks the server's frame (``pipelines.vlm.frame_check``:
three probe images and the prompt tokens they cost) and refuses to run on a mismatch.

**Sampling**: every field of ``Sampling`` is sent, neutral values included. vLLM fills each field
a request leaves out from the model's ``generation_config.json`` (Qwen2.5-VL: repetition penalty
1.05, top_k 1), which would decode differently from the other backends and from the provenance.

**Structured outputs** are sent in one of two dialects, as the server understands them:
``structured_outputs`` (vLLM >= 0.12, which removed ``guided_json``) or ``response_format``
(OpenAI's ``json_schema``, understood by SGLang and others). A server that does not know the
parameter may ignore it silently; ``pipelines.vlm.canary`` is the check for that.

Failures: a refused connection, a request past its deadline, 429 or 5xx is retried with
exponential backoff, and when the retries run out the whole call raises :class:`VlmOutage` (no
item is failed: the run is retried later). ``timeout_s`` is the deadline of one request *as a
whole* (``pipelines.net.deadline``), not of each socket read: a server that trickles bytes
cannot hold a call (and the run's GPU slot) past it. A silent server is given up after
``(retries + 1) x timeout_s`` plus the backoff: about 6 minutes with the defaults (120 s, 2
retries); raise ``timeout_s`` for answers that take longer than that to generate.
400/413/422 (the server rejected this request: an image it cannot read, a prompt over the
context) and an unreadable 200 answer are that request's ``error``. Any other
status (401 wrong key, 404 wrong model or URL) means the service cannot be used as configured,
which is an outage too, raised at once. The API key is only ever in the ``Authorization``
header, never in a log line or an error message.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

import requests
from PIL import Image

from pipelines.net.deadline import DeadlineExceeded, DeadlineSession
from pipelines.net.retry import PermanentError, RetryPolicy, TransientError
from pipelines.vlm.engine import EngineConfig, VlmEngine, VlmOutage, VlmRequest, VlmResponse, in_order
from pipelines.vlm.frame_check import FrameResult, require_frame
from pipelines.vlm.grounding import model_frame

log = logging.getLogger(__name__)

STRUCTURED_DIALECTS = ("structured_outputs", "response_format")
REQUEST_ERROR_STATUS = frozenset({400, 413, 422})  # this request is refused; the others can go on
_TRANSPORT_ERRORS = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)
_ERROR_CHARS = 300  # how much of a server's error message is kept in a request's error


class _UnusableError(Exception):
    """The server answered, but it cannot be used as configured (401, 404...): no retry."""


class _AbandonedError(VlmOutage):
    """Not sent, or not retried, because another request of the same call found an outage."""


def image_data_url(image: Image.Image) -> str:
    """A PNG data URL: lossless, so the server sees the pixels the local resize assumed."""
    if image.mode not in ("RGB", "RGBA", "L", "LA"):
        image = image.convert("RGB")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def chat_messages(request: VlmRequest) -> list[dict]:
    """OpenAI chat messages: the system prompt, then one user turn with images before the text
    (the order the Qwen-VL chat template was trained on)."""
    messages = [{"role": "system", "content": request.system}] if request.system else []
    content = [{"type": "image_url", "image_url": {"url": image_data_url(im)}} for im in request.images]
    content.append({"type": "text", "text": request.prompt})
    messages.append({"role": "user", "content": content})
    return messages


def structured_params(schema: dict, dialect: str) -> dict:
    """The request fields that constrain the answer to ``schema`` in the server's dialect."""
    if dialect == "structured_outputs":
        return {"structured_outputs": {"json": schema}}
    return {
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    }


def parse_completion(body: bytes) -> tuple[str, int, int]:
    """(text, prompt tokens, completion tokens) from a chat completion; ValueError when the body
    is not one."""
    try:
        data = json.loads(body)
        text = data["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"malformed chat completion ({type(exc).__name__}: {exc})") from None
    if not isinstance(text, str):
        raise ValueError(f"malformed chat completion: content is {type(text).__name__}, not text")
    usage = data.get("usage") or {}
    return text, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


def error_message(status: int, body: bytes) -> str:
    """The server's own reason when it gives one (vLLM: ``{"error": {"message"}}``, older:
    ``{"message"}``), cut short: it is stored with the item."""
    try:
        data = json.loads(body)
        err = data.get("error", data)
        reason = err.get("message") if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        reason = body[:_ERROR_CHARS].decode("utf-8", "replace")
    return f"HTTP {status}: {str(reason or '')[:_ERROR_CHARS]}".rstrip(": ")


class OpenAIEngine(VlmEngine):
    """Chat requests to an OpenAI-compatible server, ``concurrency`` at a time."""

    backend = "openai"

    def __init__(
        self,
        config: EngineConfig,
        base_url: str,
        api_key: str | None = None,
        served_model: str | None = None,
        concurrency: int = 8,
        timeout_s: float = 120.0,
        retries: int = 2,
        retry_delay_s: float = 1.0,
        structured: str = "structured_outputs",
        check_frame: bool = True,
    ):
        if structured not in STRUCTURED_DIALECTS:
            raise ValueError(f"structured must be one of {STRUCTURED_DIALECTS}, not {structured!r}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.config = config
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self._api_key = api_key
        self.served_model = served_model or config.model
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.structured = structured
        self.retry = RetryPolicy(attempts=retries + 1, base_delay=retry_delay_s, max_delay=max(30.0, retry_delay_s))
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="openai-engine")
        self._local = threading.local()
        self._sessions: list[requests.Session] = []
        self._sessions_lock = threading.Lock()
        self._version: str | None = None
        self.check_frame = check_frame
        self.frame: FrameResult | None = None  # the frame check's verdict, once it ran
        self._frame_lock = threading.Lock()

    def __repr__(self) -> str:  # the key stays out of reprs in tracebacks and logs
        return f"OpenAIEngine({self.base_url!r}, model={self.served_model!r}, concurrency={self.concurrency})"

    # ---- transport -------------------------------------------------------------------------
    @property
    def _session(self) -> requests.Session:
        """One session per worker thread: a ``requests.Session`` is not thread-safe, and each
        keeps its connection alive between requests."""
        if not hasattr(self._local, "session"):
            session = DeadlineSession()
            if self._api_key:
                session.headers["Authorization"] = f"Bearer {self._api_key}"
            with self._sessions_lock:
                self._sessions.append(session)
            self._local.session = session
        return self._local.session

    def _scrub(self, text: str) -> str:
        """Belt and braces: a server might echo the key back in an error."""
        return text.replace(self._api_key, "***") if self._api_key else text

    def _post_once(self, payload: dict) -> tuple[int, bytes]:
        url = f"{self.base_url}/v1/chat/completions"
        try:
            response = self._session.post(url, json=payload, deadline=self.timeout_s)
        except DeadlineExceeded as exc:
            raise TransientError(f"chat completion: {exc}") from None
        except _TRANSPORT_ERRORS as exc:
            raise TransientError(f"chat completion: {type(exc).__name__}") from None
        status, body = response.status_code, response.content
        if status == 408 or status == 429 or status >= 500:
            retry_after = response.headers.get("Retry-After")
            raise TransientError(
                self._scrub(error_message(status, body)),
                retry_after=float(retry_after) if retry_after and retry_after.isdigit() else None,
            )
        if status != 200 and status not in REQUEST_ERROR_STATUS:
            hint = " (check the API key)" if status in (401, 403) else " (check the URL and the served model name)"
            raise _UnusableError(self._scrub(error_message(status, body)) + hint)
        return status, body

    def _post(self, payload: dict, outage: threading.Event) -> tuple[int, bytes]:
        """POST with retries; an exhausted retry or an unusable server is a :class:`VlmOutage`.
        Once another request of the call found an outage, this one stops at its next attempt."""
        where = self.base_url

        def attempt() -> tuple[int, bytes]:
            if outage.is_set():
                raise _AbandonedError(f"OpenAI-compatible server {where} unavailable (seen by another request)")
            return self._post_once(payload)

        try:
            return self.retry.call(attempt, f"chat completion at {where}")
        except PermanentError as exc:  # the retries ran out on transient failures
            raise VlmOutage(f"OpenAI-compatible server {where} unavailable: {exc}") from None
        except _UnusableError as exc:
            raise VlmOutage(f"OpenAI-compatible server {where} refused the engine: {exc}") from None

    # ---- requests --------------------------------------------------------------------------
    def payload(self, request: VlmRequest) -> dict:
        """The chat completion body of ``request``: every sampling field, neutral ones included
        (``top_k``, ``min_p`` and ``repetition_penalty`` are vLLM/SGLang extensions; a field left
        out is filled from the model's generation config by vLLM)."""
        body = {
            "model": self.served_model,
            "messages": chat_messages(request),
            **self.config.sampling.request_fields(self.config.max_tokens(request)),
        }
        if request.schema is not None:
            body.update(structured_params(request.schema, self.structured))
        return body

    def _one(self, request: VlmRequest, outage: threading.Event) -> VlmResponse:
        start = time.perf_counter()
        try:
            sizes = [model_frame(im.width, im.height, self.config) for im in request.images]
            payload = self.payload(request)
        except (ValueError, OSError) as exc:  # an image the processor would refuse, or cannot encode
            return VlmResponse(request.id, None, error=f"image rejected before sending: {exc}")
        try:
            status, body = self._post(payload, outage)
        except VlmOutage:
            outage.set()
            raise
        seconds = time.perf_counter() - start
        if status != 200:
            error = self._scrub(error_message(status, body))
            return VlmResponse(request.id, None, seconds=seconds, image_sizes=sizes, error=error)
        try:
            text, prompt_tokens, completion_tokens = parse_completion(body)
        except ValueError as exc:
            return VlmResponse(request.id, None, seconds=seconds, image_sizes=sizes, error=self._scrub(str(exc)))
        return VlmResponse(request.id, text, prompt_tokens, completion_tokens, seconds, sizes)

    def generate(self, requests: Sequence[VlmRequest]) -> list[VlmResponse]:
        """One response per request, in order; raises :class:`VlmOutage` if the server is down
        (after the retries), in which case no response is returned at all. The first call checks
        the server's frame first (``StageInputError`` on a mismatch)."""
        return in_order(self.stream(requests), len(requests))

    def stream(self, requests: Sequence[VlmRequest]) -> Iterator[tuple[int, VlmResponse]]:
        """Each response as its request completes, after the frame check of the first call. When
        the server is down (after the retries) the requests not answered yet are cancelled, the
        running ones stop at their next attempt (nothing is left in flight), and
        :class:`VlmOutage` is raised."""
        if requests and self.check_frame and self.frame is None:
            with self._frame_lock:
                if self.frame is None:  # an outage leaves it unchecked: the next call tries again
                    self.frame = require_frame(self.config, self._generate, self.base_url)
                    log.info("frame check passed: %s", self.frame.reason)
        yield from self._stream(requests)

    def _generate(self, requests: Sequence[VlmRequest]) -> list[VlmResponse]:
        """``generate`` without the frame check (the check's own requests)."""
        return in_order(self._stream(requests), len(requests))

    def _stream(self, requests: Sequence[VlmRequest]) -> Iterator[tuple[int, VlmResponse]]:
        outage = threading.Event()
        futures: dict[Future[VlmResponse], int] = {
            self._pool.submit(self._one, r, outage): i for i, r in enumerate(requests)
        }
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                failures = [f.exception() for f in done if f.exception() is not None]
                if failures or outage.is_set():
                    for future in pending:
                        future.cancel()
                    wait(pending)
                    failures += [f.exception() for f in pending if not f.cancelled() and f.exception() is not None]
                    raise next((e for e in failures if not isinstance(e, _AbandonedError)), failures[0])
                for future in done:
                    yield futures[future], future.result()
        finally:
            for future in pending:  # a caller that stops early leaves nothing queued
                future.cancel()

    # ---- provenance ------------------------------------------------------------------------
    def _get_json(self, path: str) -> dict | None:
        try:
            response = self._session.get(f"{self.base_url}{path}", deadline=min(self.timeout_s, 10.0))
            return response.json() if response.status_code == 200 else None
        except (requests.RequestException, ValueError):
            return None

    def backend_version(self) -> str:
        """The server's version (vLLM's ``GET /version``), else who owns the served model
        (``GET /v1/models``), else "unknown". Remembered once known."""
        if self._version is None:
            found = self._get_json("/version") or {}
            version = found.get("version") if isinstance(found, dict) else None
            if not version:
                models = (self._get_json("/v1/models") or {}).get("data") or []
                owners = [m.get("owned_by") for m in models if isinstance(m, dict) and m.get("id") == self.served_model]
                version = next((o for o in owners if o), None)
            if not version:
                return "unknown"
            self._version = str(version)
        return self._version

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._sessions_lock:
            for session in self._sessions:
                session.close()
            self._sessions.clear()
