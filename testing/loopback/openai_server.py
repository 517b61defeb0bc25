"""A loopback OpenAI-compatible chat server in front of any :class:`VlmEngine`.

Tests put the tiny real model (or a scripted engine) behind it and drive it with
:class:`pipelines.vlm.openai_http.OpenAIEngine`, exactly as a run drives ``vllm serve``: the
same JSON, data-URL images, structured-output parameters in both dialects, usage counts, bearer
keys and error statuses. It can also play the servers that go wrong:

* ``honour_structured=False`` is a server that silently ignores an unknown parameter (an old
  vLLM given ``structured_outputs``): the answer is unconstrained and nothing says so, which is
  what the canary must catch;
* ``api_key``: a wrong or missing bearer gets 401;
* ``generation_config``: the sampling defaults of the served model's ``generation_config.json``,
  which vLLM applies to every field a request leaves out; ``sampling`` records what each request
  was decoded with (the scripted or tiny engine behind decodes with its own settings);
* faults from a :class:`FaultPlan` (503s, latency, dropped answers, answers trickled a byte at
  a time). Chat requests are matched against ``"/v1/chat/completions <user prompt>"``, so a
  pattern can pick one request out of a batch by its prompt (e.g. a 400 for one image).

The engine is called under a lock (an in-process model is not thread-safe), but connections
are accepted concurrently, so ``max_in_flight`` shows how many requests a client had open at once.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler
from typing import Self

from PIL import Image

from pipelines.vlm.engine import VlmEngine, VlmRequest
from testing.loopback.base import LoopbackHttpServer, send_body, trickle
from testing.loopback.faults import FaultPlan

CHAT_PATH = "/v1/chat/completions"
# vLLM's ModelConfig.get_diff_sampling_param: the generation_config fields that become a served
# model's defaults (max_new_tokens as max_tokens), and vLLM's own neutral values otherwise
GENERATION_CONFIG_FIELDS = {
    "repetition_penalty": 1.0,
    "temperature": 1.0,
    "top_k": -1,
    "top_p": 1.0,
    "min_p": 0.0,
    "max_tokens": None,
}


class BadRequestError(ValueError):
    """The request is not one this server can answer: 400 with the reason."""


def decode_data_url(url: str) -> Image.Image:
    """A ``data:image/...;base64,`` URL as a loaded PIL image (no remote URLs: loopback only)."""
    if not url.startswith("data:image/") or ";base64," not in url:
        raise BadRequestError("only base64 data URLs of images are accepted")
    try:
        image = Image.open(io.BytesIO(base64.b64decode(url.split(";base64,", 1)[1], validate=True)))
        image.load()
    except (binascii.Error, OSError, ValueError) as exc:
        raise BadRequestError(f"cannot read the image: {exc}") from None
    return image


def _text(content: str | list) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


def schema_of(body: dict, honour: bool) -> dict | None:
    """The JSON schema the answer must follow, from either dialect (None when ignored)."""
    if not honour:
        return None
    if isinstance(body.get("structured_outputs"), dict) and "json" in body["structured_outputs"]:
        return body["structured_outputs"]["json"]
    fmt = body.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        return fmt["json_schema"]["schema"]
    return None


def to_request(body: dict, honour_structured: bool = True) -> VlmRequest:
    """The :class:`VlmRequest` a chat completion body asks for (one system and one user turn)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequestError("messages must be a non-empty list")
    system = next((_text(m["content"]) for m in messages if m.get("role") == "system"), None)
    users = [m for m in messages if m.get("role") == "user"]
    if len(users) != 1:
        raise BadRequestError(f"the loopback server answers one user turn, got {len(users)}")
    content = users[0]["content"]
    parts = [content] if isinstance(content, str) else content
    images = [
        decode_data_url(p["image_url"]["url"]) for p in parts if isinstance(p, dict) and p.get("type") == "image_url"
    ]
    return VlmRequest(
        id=uuid.uuid4().hex,
        prompt=_text(content),
        images=images,
        system=system,
        schema=schema_of(body, honour_structured),
        max_tokens=body.get("max_tokens"),
    )


def effective_sampling(body: dict, generation_config: dict) -> dict:
    """What vLLM decodes a chat request with: each field as sent, else the model's
    generation_config's, else vLLM's neutral value."""
    defaults = {**generation_config}
    if "max_new_tokens" in defaults:
        defaults["max_tokens"] = defaults.pop("max_new_tokens")
    return {k: body[k] if k in body else defaults.get(k, neutral) for k, neutral in GENERATION_CONFIG_FIELDS.items()}


def _error(status: int, message: str) -> tuple[int, dict]:
    """vLLM's error shape."""
    return status, {
        "error": {"message": message, "type": "BadRequestError" if status == 400 else "Error", "code": status}
    }


class OpenAICompatibleServer(LoopbackHttpServer):
    """Serve ``engine`` as an OpenAI-compatible chat server on 127.0.0.1; a context manager.

    ``version``: what ``GET /version`` answers (None: 404, as on servers without it, so clients
    fall back to ``/v1/models``). ``served_model`` defaults to the engine's model."""

    def __init__(
        self,
        engine: VlmEngine,
        served_model: str | None = None,
        honour_structured: bool = True,
        api_key: str | None = None,
        plan: FaultPlan | None = None,
        version: str | None = "0.0.0-loopback",
        owned_by: str = "panelforge-loopback",
        generation_config: dict | None = None,
    ):
        self.engine = engine
        self.served_model = served_model or engine.config.model
        self.honour_structured = honour_structured
        self.api_key = api_key
        self.plan = plan or FaultPlan()
        self.version = version
        self.owned_by = owned_by
        self.generation_config = generation_config or {}
        self.bodies: list[dict] = []  # every chat body received, as sent
        self.sampling: list[dict] = []  # what vLLM would decode each of them with
        self.authorizations: list[str | None] = []  # the Authorization header of every request
        self.in_flight = 0
        self.max_in_flight = 0
        self._count_lock = threading.Lock()
        self._engine_lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.address

    def _enter(self) -> None:
        with self._count_lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def _leave(self) -> None:
        with self._count_lock:
            self.in_flight -= 1

    def chat(self, body: dict) -> tuple[int, dict]:
        """Answer one chat completion body: (status, JSON)."""
        if body.get("model") != self.served_model:
            return _error(404, f"The model `{body.get('model')}` does not exist.")
        try:
            request = to_request(body, self.honour_structured)
        except (BadRequestError, KeyError, TypeError, AttributeError) as exc:
            return _error(400, f"bad chat request: {exc}")
        self.sampling.append(effective_sampling(body, self.generation_config))
        with self._engine_lock:
            (response,) = self.engine.generate([request])
        if response.error is not None:
            return _error(400, response.error)
        usage = {
            "prompt_tokens": response.prompt_tokens,
            "completion_tokens": response.completion_tokens,
            "total_tokens": response.prompt_tokens + response.completion_tokens,
        }
        return 200, {
            "id": f"chatcmpl-{request.id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.served_model,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": response.text}, "finish_reason": "stop"}
            ],
            "usage": usage,
        }

    def get(self, path: str) -> tuple[int, dict | None]:
        if path == "/health":
            return 200, None
        if path == "/version":
            return (200, {"version": self.version}) if self.version else _error(404, "Not Found")
        if path == "/v1/models":
            model = {"id": self.served_model, "object": "model", "created": 0, "owned_by": self.owned_by}
            return 200, {"object": "list", "data": [model]}
        return _error(404, "Not Found")

    def start(self) -> Self:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _reply(self, status: int, payload: dict | None, fault=None) -> None:
                body = b"" if payload is None else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                send_body(self, body, fault)

            def _authorized(self) -> bool:
                header = self.headers.get("Authorization")
                server.authorizations.append(header)
                if server.api_key is None or header == f"Bearer {server.api_key}":
                    return True
                self._reply(*_error(401, "Unauthorized"))
                return False

            def do_GET(self) -> None:  # noqa: N802 - http.server API
                if self._authorized():
                    server.plan.record("GET", self.path, faulty=False)
                    self._reply(*server.get(self.path))

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if not self._authorized():
                    return
                if self.path != CHAT_PATH:
                    return self._reply(*_error(404, "Not Found"))
                server._enter()
                try:
                    self._chat(raw)
                finally:
                    server._leave()

            def _chat(self, raw: bytes) -> None:
                try:
                    body = json.loads(raw)
                    prompt = _text(next(m["content"] for m in body["messages"] if m.get("role") == "user"))
                except (ValueError, KeyError, TypeError, StopIteration, AttributeError) as exc:
                    return self._reply(*_error(400, f"bad JSON body: {exc}"))
                server.bodies.append(body)
                fault = server.plan.record("POST", f"{CHAT_PATH} {prompt}")
                if fault is not None and fault.kind == "status":
                    if fault.retry_after is not None:
                        self.send_response(fault.status)
                        self.send_header("Retry-After", str(fault.retry_after))
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    return self._reply(*_error(fault.status, "injected fault"))
                if fault is not None and fault.kind == "trickle":
                    status, payload = server.chat(body)
                    return trickle(self, status, json.dumps(payload).encode(), fault.interval)
                if fault is not None and fault.kind == "body":
                    self.send_response(fault.status)
                    self.send_header("Content-Length", str(len(fault.body or b"")))
                    self.end_headers()
                    return send_body(self, fault.body or b"")
                self._reply(*server.chat(body), fault=fault)

        return self._serve(Handler, "openai-loopback")
