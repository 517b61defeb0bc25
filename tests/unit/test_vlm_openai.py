"""The OpenAI-compatible engine against the loopback chat server: first with a scripted engine
behind it (the wire format, every sampling field, retries, outages, the whole-request deadline,
per-request errors, the key), then with the tiny real Qwen2.5-VL behind it (images in, text and
token counts out, the frame check against a server with another pixel band, the canary)."""

from __future__ import annotations

import dataclasses
import json
import logging
import time

import pytest
from PIL import Image

from pipelines.core.stage import StageInputError
from pipelines.vlm.engine import EngineConfig, Sampling, VlmOutage, VlmRequest, provenance
from pipelines.vlm.openai_http import OpenAIEngine
from testing.loopback.faults import Fault, FaultPlan
from testing.loopback.openai_server import OpenAICompatibleServer
from testing.vlm import ScriptedEngine

# The processor's own defaults, so the model frames below are the ones in library-facts §2.
CONFIG = EngineConfig(model="scripted", min_pixels=56 * 56, max_pixels=14 * 14 * 4 * 1280)
SCHEMA = {
    "type": "object",
    "properties": {"panels": {"type": "array", "items": {"type": "string"}}},
    "required": ["panels"],
}
KEY = "sk-loopback-5ecret-key"


def client(server: OpenAICompatibleServer, **kwargs) -> OpenAIEngine:
    """The engine under test; the frame check is on only where a test is about it (the scripted
    engine behind most servers does not count image tokens)."""
    config = kwargs.pop("config", CONFIG)
    defaults = {"retry_delay_s": 0.01, "timeout_s": 10.0, "check_frame": False}
    return OpenAIEngine(config, server.url, **(defaults | kwargs))


def echo(request: VlmRequest) -> str:
    """Answers the prompt back, so each response can be matched to its request by hand."""
    return f"answer to {request.prompt}"


@pytest.fixture
def scripted() -> ScriptedEngine:
    return ScriptedEngine(echo, CONFIG)


def test_request_and_response_shape(scripted):
    """What goes on the wire: the system turn, images as PNG data URLs before the text, the
    served model name, sampling and max_tokens; what comes back: text, usage, model frames."""
    red = Image.new("RGB", (400, 300), (200, 10, 10))  # width 400, height 300
    tall = Image.new("L", (768, 1024), 77)
    config = EngineConfig(
        model="Qwen/Qwen2.5-VL-7B-Instruct",
        min_pixels=56 * 56,
        max_pixels=14 * 14 * 4 * 1280,
        sampling=Sampling(temperature=0.2, top_p=0.9, top_k=20, min_p=0.05, seed=7, repetition_penalty=1.05),
    )
    request = VlmRequest("r1", "find the panels", [red, tall], system="be terse", schema=SCHEMA, max_tokens=64)
    with OpenAICompatibleServer(scripted, served_model="qwen-vl") as server:
        engine = OpenAIEngine(config, server.url, served_model="qwen-vl", retry_delay_s=0.01, check_frame=False)
        (response,) = engine.generate([request])
        engine.close()

    (body,) = server.bodies
    assert body["model"] == "qwen-vl"
    assert body["messages"][0] == {"role": "system", "content": "be terse"}
    user = body["messages"][1]
    assert user["role"] == "user"
    assert [p["type"] for p in user["content"]] == ["image_url", "image_url", "text"]
    assert user["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert user["content"][2]["text"] == "find the panels"
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["seed"]) == (64, 0.2, 0.9, 7)
    assert (body["top_k"], body["min_p"], body["repetition_penalty"]) == (20, 0.05, 1.05)
    assert body["structured_outputs"] == {"json": SCHEMA}
    assert "response_format" not in body

    (seen,) = scripted.requests  # what the engine behind the server got
    assert (seen.prompt, seen.system, seen.schema, seen.max_tokens) == ("find the panels", "be terse", SCHEMA, 64)
    assert [im.size for im in seen.images] == [(400, 300), (768, 1024)]
    assert seen.images[0].getpixel((5, 5)) == (200, 10, 10)  # PNG: the pixels arrive unchanged
    assert seen.images[1].getpixel((5, 5)) == 77

    assert response.id == "r1"
    assert response.error is None
    assert response.text == "answer to find the panels"
    # the scripted engine counts words: 3 in the prompt, 5 in the answer ("answer to find the panels")
    assert (response.prompt_tokens, response.completion_tokens) == (3, 5)
    # library-facts §2: (h, w) 300x400 -> 308x392, 1024x768 -> 1036x756; sizes are (w, h)
    assert response.image_sizes == [(392, 308), (756, 1036)]


# A generation_config.json like Qwen2.5-VL's (repetition penalty 1.05, top_k 1; issue 20 §3):
# what vLLM fills in for every field a request does not send
QWEN25_VL_GENERATION_CONFIG = {"repetition_penalty": 1.05, "temperature": 0.1, "top_k": 1, "top_p": 0.001}


def test_every_sampling_field_is_sent_so_the_server_decodes_as_provenance_says(scripted):
    """Neutral values too: a vLLM server serving Qwen2.5-VL would otherwise decode with the
    checkpoint's repetition penalty 1.05 and top_k 1 while provenance records 1.0 and none."""
    loopback = OpenAICompatibleServer(scripted, generation_config=QWEN25_VL_GENERATION_CONFIG)
    with loopback as server, client(server) as engine:
        engine.generate([VlmRequest("a", "hello"), VlmRequest("b", "short", max_tokens=16)])
        recorded = json.loads(provenance(engine, "v1")["sampling"])
    assert recorded == {
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "max_tokens": 512,
        "seed": 0,
        "repetition_penalty": 1.0,
    }
    hello, short = sorted(server.bodies, key=lambda b: b["messages"][0]["content"][0]["text"])
    assert {k: hello[k] for k in recorded} == recorded  # the request's budget is the cap here
    assert {k: short[k] for k in recorded} == {**recorded, "max_tokens": 16}  # its own budget
    # what the server decoded with: nothing came from the checkpoint's generation config
    decoded = sorted(server.sampling, key=lambda s: s["max_tokens"])
    assert decoded == [
        {"repetition_penalty": 1.0, "temperature": 0.0, "top_k": -1, "top_p": 1.0, "min_p": 0.0, "max_tokens": 16},
        {"repetition_penalty": 1.0, "temperature": 0.0, "top_k": -1, "top_p": 1.0, "min_p": 0.0, "max_tokens": 512},
    ]
    assert hello["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]


@pytest.mark.parametrize("dialect", ["structured_outputs", "response_format"])
def test_both_structured_dialects_reach_the_engine_as_the_schema(scripted, dialect):
    with OpenAICompatibleServer(scripted) as server, client(server, structured=dialect) as engine:
        engine.generate([VlmRequest("a", "with schema", schema=SCHEMA), VlmRequest("b", "without")])
    with_schema = next(b for b in server.bodies if b["messages"][0]["content"][0]["text"] == "with schema")
    if dialect == "structured_outputs":
        assert with_schema["structured_outputs"] == {"json": SCHEMA}
    else:
        assert with_schema["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True},
        }
    schemas = {r.prompt: r.schema for r in scripted.requests}
    assert schemas == {"with schema": SCHEMA, "without": None}


def test_a_server_ignoring_the_parameter_drops_the_schema_silently(scripted):
    """The failure the canary exists for: the request is answered, the schema never applied."""
    with OpenAICompatibleServer(scripted, honour_structured=False) as server, client(server) as engine:
        (response,) = engine.generate([VlmRequest("a", "with schema", schema=SCHEMA)])
    assert response.error is None
    assert server.bodies[0]["structured_outputs"] == {"json": SCHEMA}
    assert scripted.requests[0].schema is None


def test_api_key_is_sent_as_bearer_and_never_leaks(scripted, caplog):
    caplog.set_level(logging.DEBUG)
    echoed = json.dumps({"error": {"message": f"bad image (key was {KEY})"}}).encode()
    plan = FaultPlan(
        faults=[
            Fault("rejected", kind="body", status=400, body=echoed),
            Fault("flaky", kind="body", status=503, body=echoed, times=1),
        ]
    )
    with OpenAICompatibleServer(scripted, api_key=KEY, plan=plan) as server:
        with client(server, api_key=KEY) as engine:
            responses = engine.generate(
                [VlmRequest("a", "fine"), VlmRequest("b", "rejected"), VlmRequest("c", "flaky")]
            )
            assert engine.backend_version() == "0.0.0-loopback"  # GETs carry the key too
            assert KEY not in repr(engine)
        assert set(server.authorizations) == {f"Bearer {KEY}"}
        with client(server, api_key="sk-wrong-key-42") as wrong, pytest.raises(VlmOutage) as outage:
            wrong.generate([VlmRequest("d", "fine")])

    assert [r.error is None for r in responses] == [True, False, True]
    assert responses[1].error.startswith("HTTP 400: bad image")
    assert KEY not in responses[1].error
    assert "401" in str(outage.value) and "API key" in str(outage.value)
    assert "sk-wrong-key-42" not in str(outage.value)
    assert not [r for r in caplog.records if KEY in r.getMessage()]


def test_two_503s_then_success_is_retried(scripted):
    plan = FaultPlan(faults=[Fault("/v1/chat/completions", status=503, times=2)])
    with OpenAICompatibleServer(scripted, plan=plan) as server, client(server, retries=4) as engine:
        (response,) = engine.generate([VlmRequest("a", "hello")])
    assert response.text == "answer to hello"
    assert plan.count("POST") == 3
    assert len(scripted.requests) == 1  # the engine behind saw only the one that got through


def test_429_and_a_dropped_answer_are_retried(scripted):
    plan = FaultPlan(
        faults=[Fault("busy", status=429, times=1), Fault("cut", kind="drop", status=200, fraction=0.3, times=1)]
    )
    with OpenAICompatibleServer(scripted, plan=plan) as server, client(server) as engine:
        responses = engine.generate([VlmRequest("a", "busy"), VlmRequest("b", "cut")])
    assert [r.text for r in responses] == ["answer to busy", "answer to cut"]
    assert plan.count("POST") == 4


def test_always_503_raises_outage_after_the_retries(scripted):
    plan = FaultPlan(faults=[Fault("/v1/chat/completions", status=503, times=1000)])
    with OpenAICompatibleServer(scripted, plan=plan) as server, client(server, retries=2, concurrency=1) as engine:
        with pytest.raises(VlmOutage, match="HTTP 503"):
            engine.generate([VlmRequest("a", "hello"), VlmRequest("b", "queued"), VlmRequest("c", "queued")])
    assert plan.count("POST") == 3  # the first attempt and two retries; the queued are never sent
    assert scripted.requests == []


def test_stopped_server_raises_outage(scripted):
    server = OpenAICompatibleServer(scripted).start()
    url = server.url
    server.stop()
    # more requests than workers: the queued ones are never sent, the call raises the cause
    with OpenAIEngine(CONFIG, url, retries=1, retry_delay_s=0.01, concurrency=2, check_frame=False) as engine:
        with pytest.raises(VlmOutage, match="ConnectionError"):
            engine.generate([VlmRequest(str(i), f"hello {i}") for i in range(5)])
        assert engine.backend_version() == "unknown"


def test_wrong_served_model_is_an_outage_without_retries(scripted):
    with OpenAICompatibleServer(scripted, served_model="other-model") as server, client(server) as engine:
        with pytest.raises(VlmOutage, match="404"):
            engine.generate([VlmRequest("a", "hello")])
    assert server.plan.count("POST") == 1


def test_rejected_requests_fail_alone(scripted):
    """A 400 from the server (injected, or the engine behind refusing the request), an
    unreadable 200 and an image the processor would refuse are each their request's error."""
    scripted.answer = lambda r: ValueError("image too small to read") if r.prompt == "engine says no" else echo(r)
    plan = FaultPlan(
        faults=[
            Fault("injected 400", status=400),
            Fault("garbled", kind="body", status=200, body=b'{"choices": []}'),
        ]
    )
    sliver = Image.new("RGB", (1000, 4))  # aspect 250 > 200: refused before sending
    requests = [
        VlmRequest("ok1", "first"),
        VlmRequest("inj", "injected 400"),
        VlmRequest("eng", "engine says no"),
        VlmRequest("bad", "garbled"),
        VlmRequest("thin", "sliver", [sliver]),
        VlmRequest("ok2", "last"),
    ]
    with OpenAICompatibleServer(scripted, plan=plan) as server, client(server) as engine:
        responses = engine.generate(requests)
    assert [r.id for r in responses] == ["ok1", "inj", "eng", "bad", "thin", "ok2"]
    assert responses[0].text == "answer to first" and responses[5].text == "answer to last"
    errors = {r.id: r.error for r in responses if r.error is not None}
    assert set(errors) == {"inj", "eng", "bad", "thin"}
    assert errors["inj"].startswith("HTTP 400")
    assert errors["eng"] == "HTTP 400: image too small to read"
    assert "malformed chat completion" in errors["bad"]
    assert "aspect ratio" in errors["thin"]
    assert all(r.text is None for r in responses if r.error)
    assert not [b for b in server.bodies if b["messages"][0]["content"][-1]["text"] == "sliver"]


def test_concurrency_is_bounded_and_order_kept(scripted):
    plan = FaultPlan(latency=0.05)  # requests overlap at the server while they wait
    prompts = [f"prompt {i}" for i in range(10)]
    with OpenAICompatibleServer(scripted, plan=plan) as server, client(server, concurrency=3) as engine:
        responses = engine.generate([VlmRequest(str(i), p) for i, p in enumerate(prompts)])
    assert 1 <= server.max_in_flight <= 3
    assert [r.text for r in responses] == [f"answer to prompt {i}" for i in range(10)]
    assert [r.id for r in responses] == [str(i) for i in range(10)]


def test_backend_version_falls_back_to_the_model_owner(scripted):
    with OpenAICompatibleServer(scripted, version=None, owned_by="sglang") as server, client(server) as engine:
        assert engine.backend_version() == "sglang"
        assert engine.info()["backend"] == "openai"
        assert engine.info()["backend_version"] == "sglang"


def test_a_trickling_server_is_cut_off_at_the_deadline_and_the_retry_goes_through(scripted):
    """The server sends its answer one byte a second (status line and headers included), so no
    socket read ever waits 2 s: a per-read timeout would wait out all ~300 bytes. The 2 s deadline
    bounds the whole request; the retry, on a fresh connection, gets the normal answer."""
    plan = FaultPlan(faults=[Fault("/v1/chat/completions", kind="trickle", interval=1.0, times=1)])
    with OpenAICompatibleServer(scripted, plan=plan) as server, client(server, timeout_s=2.0, retries=1) as engine:
        started = time.monotonic()
        (response,) = engine.generate([VlmRequest("a", "hello")])
        elapsed = time.monotonic() - started
    assert response.text == "answer to hello"
    assert plan.count("POST") == 2
    assert elapsed < 10  # ~2 s (the deadline) + the retry; unbounded, the first answer alone takes ~5 min


@pytest.mark.parametrize("interval", [1.0, 0.1, 0.02])  # cut in the status line, the headers, the body
def test_a_server_that_only_trickles_is_an_outage_within_the_deadline(scripted, interval):
    """Wherever the deadline cuts the answer (at 2 s: after 2 bytes of the status line, 20 bytes
    into ~75 bytes of headers, 100 bytes into ~380), the call is an outage, never a truncated
    answer taken for the server's (cut inside the headers, http.client sees an empty 200)."""
    plan = FaultPlan(faults=[Fault("/v1/chat/completions", kind="trickle", interval=interval, times=1000)])
    with OpenAICompatibleServer(scripted, plan=plan) as server, client(server, timeout_s=2.0, retries=0) as engine:
        started = time.monotonic()
        with pytest.raises(VlmOutage, match="no complete answer within the 2 s deadline"):
            engine.generate([VlmRequest("a", "hello")])
        elapsed = time.monotonic() - started
    assert elapsed < 10
    assert plan.count("POST") == 1


def test_unknown_dialect_is_refused():
    with pytest.raises(ValueError, match="structured"):
        OpenAIEngine(CONFIG, "http://127.0.0.1:9", structured="guided_json")


# ---- the tiny real model behind the server ------------------------------------------------------
# Its pixel band is kept small so the test is fast; client and server use the same band, as a real
# deployment must (--mm-processor-kwargs).
TINY_BAND = {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 256}


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> EngineConfig:
    from pipelines.vlm.tiny import build_tiny_model

    directory = build_tiny_model(tmp_path_factory.mktemp("tiny") / "qwen25vl")
    return EngineConfig(model=str(directory), synthetic=True, sampling=Sampling(max_tokens=8), **TINY_BAND)


@pytest.fixture(scope="module")
def tiny_engine(tiny_config):
    from pipelines.vlm.hf import TransformersEngine

    engine = TransformersEngine(tiny_config, device="cpu", batch_size=4)
    yield engine
    engine.close()


def test_tiny_model_answers_a_batch_with_images_over_http(tiny_engine, tiny_config):
    """Images go through the PNG data URL and the server's processor; the prompt tokens show the
    server saw each image at the size the client computed: a 400x300 image is 392x308 in the
    model frame, 11x14 merged patches of 28 pixels = 154 <|image_pad|> tokens, plus
    <|vision_start|> and <|vision_end|>."""
    landscape = Image.new("RGB", (400, 300), (30, 120, 200))
    requests = [
        VlmRequest("img", "Describe the figure.", [landscape]),
        VlmRequest("txt", "Describe the figure."),
        VlmRequest("two", "Describe the figure.", [landscape, landscape]),
    ]
    with OpenAICompatibleServer(tiny_engine) as server, client(server, config=tiny_config, concurrency=2) as engine:
        responses = engine.generate(requests)
        assert engine.backend_version() == "0.0.0-loopback"
    assert [r.error for r in responses] == [None, None, None]
    assert all(isinstance(r.text, str) for r in responses)
    assert all(1 <= r.completion_tokens <= 8 for r in responses)  # max_tokens=8 reached the model
    with_image, text_only, two_images = (r.prompt_tokens for r in responses)
    assert with_image - text_only == 154 + 2
    assert two_images - text_only == 2 * (154 + 2)
    assert responses[0].image_sizes == [(392, 308)]
    assert responses[1].image_sizes == []

    # greedy decoding: the answer over HTTP is the one the engine gives when called directly
    (direct,) = tiny_engine.generate([VlmRequest("img", "Describe the figure.", [landscape])])
    assert (responses[0].text, responses[0].prompt_tokens) == (direct.text, direct.prompt_tokens)


def test_the_frame_check_passes_when_the_server_has_the_same_band(tiny_engine, tiny_config):
    """Three probes before the first request: 28x28, 158x158 and 672x672 images cost 4, 36 and
    256 visual tokens under the tiny band (by hand: 28 -> 56x56, below min_pixels 3136, 2x2
    tokens; 158 -> 168x168, 6x6; 672 -> 448x448, above max_pixels 200704 shrunk by 1.5, 16x16)."""
    with (
        OpenAICompatibleServer(tiny_engine) as server,
        client(server, config=tiny_config, check_frame=True) as engine,
    ):
        (response,) = engine.generate([VlmRequest("txt", "Describe the figure.")])
        engine.generate([VlmRequest("again", "Describe the figure.")])  # checked once
    assert response.error is None
    assert engine.frame.passed, engine.frame.reason
    probes = [b["messages"][0]["content"][1]["text"] for b in server.bodies[:3]]
    assert probes == ["Reply with OK."] * 3 and len(server.bodies) == 5
    tokens = engine.frame.measured
    assert (tokens[158] - tokens[28], tokens[672] - tokens[158]) == (36 - 4, 256 - 36)


@pytest.mark.parametrize(
    ("server_band", "message"),
    [
        # max_pixels 50176: the 672x672 probe shrinks by 3 to 224x224, 8x8 = 64 tokens, not 256
        (
            {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 64},
            "a 672x672 image costs +28 prompt tokens against a 158x158 one, where max_pixels=200704 gives +220",
        ),
        # min_pixels 12544: the 28x28 probe grows by 4 to 112x112, 4x4 = 16 tokens, not 4
        (
            {"min_pixels": 112 * 112, "max_pixels": 28 * 28 * 256},
            "a 158x158 image costs +20 prompt tokens against a 28x28 one, where min_pixels=3136 gives +32",
        ),
    ],
)
def test_the_frame_check_refuses_a_server_with_another_band(tiny_config, server_band, message):
    """The server's processor resizes with another band: nothing would fail, every box would be
    scaled wrong. The first generate refuses to run and says which flag to start the server with."""
    from pipelines.vlm.hf import TransformersEngine

    server_config = dataclasses.replace(tiny_config, **server_band)
    with (
        TransformersEngine(server_config, device="cpu") as behind,
        OpenAICompatibleServer(behind) as server,
        client(server, config=tiny_config, check_frame=True) as engine,
    ):
        with pytest.raises(StageInputError) as refused:
            engine.generate([VlmRequest("fig", "Find the panels.")])
    assert message in str(refused.value)
    assert """--mm-processor-kwargs '{"min_pixels": 3136, "max_pixels": 200704}'""" in str(refused.value)
    assert len(server.bodies) == 3  # the probes only: no request of the run was sent


def test_the_frame_check_needs_token_counts(scripted):
    """A server that reports no usage cannot be checked: refused, naming the switch."""
    scripted.answer = echo
    plan = FaultPlan(
        faults=[
            Fault(
                "Reply with OK", kind="body", status=200, body=b'{"choices": [{"message": {"content": "OK"}}]}', times=3
            )
        ]
    )
    with OpenAICompatibleServer(scripted, plan=plan) as server, client(server, check_frame=True) as engine:
        with pytest.raises(StageInputError, match="reports no prompt token counts.*check_frame=False"):
            engine.generate([VlmRequest("a", "hello")])


@pytest.fixture(scope="module")
def canary_config(tiny_config) -> EngineConfig:
    """The engine's max_tokens caps every answer: 8 tokens cannot hold the canary's JSON (15
    tokens with the tiny tokenizer), so the canary runs under a cap that can."""
    return dataclasses.replace(tiny_config, sampling=Sampling(max_tokens=48))


@pytest.mark.parametrize("dialect", ["structured_outputs", "response_format"])
def test_canary_passes_when_the_server_honours_structured_outputs(canary_config, dialect):
    from pipelines.vlm.canary import run_canary
    from pipelines.vlm.hf import TransformersEngine

    with (
        TransformersEngine(canary_config, device="cpu") as behind,
        OpenAICompatibleServer(behind) as server,
        client(server, config=canary_config, structured=dialect) as engine,
    ):
        result = run_canary(engine)
    assert result.passed, result.reason
    assert result.answer == '{"canary": "panelforge-structured-outputs-7f3a"}'


def test_canary_fails_when_the_server_ignores_structured_outputs(canary_config):
    """An older server that drops the unknown parameter answers unconstrained; the random tiny
    model then does not produce the canary JSON, and the canary must say so."""
    from pipelines.vlm.canary import run_canary
    from pipelines.vlm.hf import TransformersEngine

    with (
        TransformersEngine(canary_config, device="cpu") as behind,
        OpenAICompatibleServer(behind, honour_structured=False) as server,
        client(server, config=canary_config) as engine,
    ):
        result = run_canary(engine)
    assert not result.passed
    assert result.answer != '{"canary": "panelforge-structured-outputs-7f3a"}'
    assert server.bodies[0]["structured_outputs"]["json"]["required"] == ["canary"]  # it was asked for
