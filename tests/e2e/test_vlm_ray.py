"""The Ray Data LLM backend on a CPU-only Ray started in this process.

vLLM is not installed here and its engine stage would wait forever for a GPU, so it never runs:
the processor is built and inspected, our preprocess/postprocess run in Ray Data on rows shaped
like the vLLM stage's (column names from Ray 2.60's installed source), Ray's chat-template stage
runs on the tiny offline model (the prompt the other backends send, from the pinned revision),
and a full ``generate`` shows that a cluster without vLLM fails with a setup error rather than an
outage or a hang.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipelines.compute.ray_pool import is_outage
from pipelines.vlm.engine import EngineConfig, Sampling, VlmOutage, VlmRequest
from pipelines.vlm.prompts import PANELS, SYSTEM
from pipelines.vlm.ray_llm import (
    VLLM_VERSION,
    RayVllmEngine,
    RayVllmSettings,
    engine_kwargs,
    finalize,
    pinned_chat_template,
    postprocess,
    preprocess,
    processor_config,
    request_row,
    runtime_env_for,
)
from resources.vlm import VlmEngineResource

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data.llm")  # needs aiohttp

REPO = Path(__file__).resolve().parents[2]


def _picture(width: int = 40, height: int = 30) -> Image.Image:
    pixels = np.random.default_rng(7).integers(0, 255, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


# (a) the processor configuration


def test_processor_config_carries_every_engine_kwarg():
    config = EngineConfig(model="org/vlm-72b", revision="abc123", dtype="float16", min_pixels=3136, max_pixels=50176)
    settings = RayVllmSettings(
        concurrency=2,
        tensor_parallel_size=4,
        accelerator_type="H100",
        batch_size=8,
        max_model_len=8192,
        limit_images=2,
        enable_prefix_caching=False,
        gpu_memory_utilization=0.8,
        structured_backend="xgrammar",
        runtime_env={"py_executable": "/opt/vllm/bin/python"},
        should_continue_on_error=False,
    )
    pc = processor_config(config, settings)
    assert type(pc).__name__ == "vLLMEngineProcessorConfig"
    assert pc.model_source == "org/vlm-72b"
    assert (pc.batch_size, pc.concurrency, pc.accelerator_type) == (8, 2, "H100")
    assert pc.runtime_env == {"py_executable": "/opt/vllm/bin/python"}
    assert pc.should_continue_on_error is False
    assert pc.prepare_multimodal_stage == {
        "enabled": True,
        "model_config_kwargs": {
            "limit_mm_per_prompt": {"image": 2},
            "revision": "abc123",
            "tokenizer_revision": "abc123",
        },
        "chat_template_content_format": "openai",
        "apply_sys_msg_formatting": True,
    }
    assert pc.chat_template_stage == {"enabled": True, "chat_template": None}  # None: no template was passed
    assert (pc.tokenize_stage, pc.detokenize_stage) == (False, False)
    assert pc.engine_kwargs == {
        "tensor_parallel_size": 4,
        "max_model_len": 8192,
        "limit_mm_per_prompt": {"image": 2},
        "mm_processor_kwargs": {"min_pixels": 3136, "max_pixels": 50176},
        "enable_prefix_caching": False,
        "gpu_memory_utilization": 0.8,
        "dtype": "float16",
        "revision": "abc123",
        "tokenizer_revision": "abc123",
        "structured_outputs_config": {"backend": "xgrammar"},
        "task_type": "generate",  # added by the config's validator
    }


def test_defaults_pin_vllm_through_pip_and_leave_vllm_defaults_alone():
    config = EngineConfig()  # Qwen2.5-VL-7B, no revision, the 256..1280 visual-token band
    settings = RayVllmSettings()
    kwargs = engine_kwargs(config, settings)
    assert "revision" not in kwargs and "structured_outputs_config" not in kwargs  # vLLM's own defaults
    assert kwargs["mm_processor_kwargs"] == {"min_pixels": 256 * 28 * 28, "max_pixels": 1280 * 28 * 28}
    assert settings.runtime_env == {"pip": {"packages": ["vllm==0.29.0"], "pip_check": False}}
    assert VLLM_VERSION == "0.29.0"
    engine = RayVllmEngine(config, settings)
    assert engine.backend_version() == f"vllm 0.29.0 (ray data llm {ray.__version__})"
    assert engine.info()["backend"] == "ray-vllm"
    image = RayVllmEngine(config, RayVllmSettings(runtime_env=None))
    assert image.backend_version() == f"vllm (version set by the worker image) (ray data llm {ray.__version__})"


def test_the_vllm_env_setting_becomes_the_llm_stages_runtime_env(tmp_path):
    assert runtime_env_for("pip") == {"pip": {"packages": ["vllm==0.29.0"], "pip_check": False}}
    assert runtime_env_for("image") is None
    assert runtime_env_for("/opt/vllm-venv/bin/python") == {"py_executable": "/opt/vllm-venv/bin/python"}
    with pytest.raises(ValueError, match="absolute path"):
        runtime_env_for("vllm")
    # the weights as a user's downloaded folder (the engine checks them before it starts)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    resource = VlmEngineResource(backend="ray", model=str(tmp_path), vllm_env="/opt/vllm-venv/bin/python")
    engine = resource.engine()
    assert engine.settings.runtime_env == {"py_executable": "/opt/vllm-venv/bin/python"}
    assert engine.backend_version().startswith("vllm (version set by the worker image)")


@pytest.mark.parametrize(
    "bad", [{"concurrency": 0}, {"tensor_parallel_size": 0}, {"limit_images": 0}, {"gpu_memory_utilization": 1.5}]
)
def test_settings_refuse_nonsense(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        RayVllmSettings(**bad)


# (b) the processor, built and inspected (never executed)


def test_processor_stages_in_order_with_our_engine_kwargs(local_ray):
    config = EngineConfig(model="Qwen/Qwen2.5-VL-7B-Instruct")
    settings = RayVllmSettings(tensor_parallel_size=1, accelerator_type="H100", batch_size=4)
    processor = RayVllmEngine(config, settings).processor()
    assert processor.list_stage_names() == ["PrepareMultimodalStage", "ChatTemplateStage", "vLLMEngineStage"]
    engine = processor.get_stage_by_name("vLLMEngineStage")
    kwargs = engine.fn_constructor_kwargs
    assert kwargs["model"] == "Qwen/Qwen2.5-VL-7B-Instruct"
    assert kwargs["should_continue_on_error"] is True
    # Ray adds the task type and the single-GPU executor; everything else is ours, unchanged
    assert kwargs["engine_kwargs"] == {
        **engine_kwargs(config, settings),
        "task_type": "generate",
        "distributed_executor_backend": "uni",
    }
    assert engine.map_batches_kwargs["num_gpus"] == 1
    assert engine.map_batches_kwargs["accelerator_type"] == "H100"
    for stage in processor.stages.values():  # vLLM reaches every stage through the runtime env
        assert stage.map_batches_kwargs["runtime_env"] == {"pip": {"packages": ["vllm==0.29.0"], "pip_check": False}}
    parse = processor.get_stage_by_name("PrepareMultimodalStage").fn_constructor_kwargs
    assert parse["model_config_kwargs"] == {"limit_mm_per_prompt": {"image": 1}, "model": "Qwen/Qwen2.5-VL-7B-Instruct"}
    assert (parse["chat_template_content_format"], parse["apply_sys_msg_formatting"]) == ("openai", True)


# (c) preprocess and postprocess, run in Ray Data


def test_preprocess_in_ray_data_builds_messages_and_sampling(local_ray):
    picture = _picture(40, 30)
    config = EngineConfig(
        sampling=Sampling(
            temperature=0.2, top_p=0.9, top_k=40, min_p=0.1, max_tokens=300, seed=5, repetition_penalty=1.1
        )
    )
    requests = [
        VlmRequest("fig-1", "Find the panels.", [picture], system=SYSTEM, schema=PANELS.schema),
        VlmRequest("fig-2", "Describe.", max_tokens=64),
    ]
    rows = ray.data.from_items([request_row(r, config) for r in requests]).map(preprocess).take_all()
    by_id = {row["id"]: row for row in rows}
    assert set(by_id) == {"fig-1", "fig-2"}

    first = by_id["fig-1"]
    assert first["images"] is None  # the PNG travels in the message, not twice
    messages = first["messages"]  # exactly: a string beside a list keeps the row out of Arrow
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == SYSTEM
    image_part, text_part = messages[1]["content"]
    assert text_part == {"type": "text", "text": "Find the panels."}
    assert set(image_part) == {"type", "image_url"} and image_part["type"] == "image_url"
    prefix = "data:image/png;base64,"
    url = image_part["image_url"]["url"]
    assert url.startswith(prefix)
    decoded = Image.open(io.BytesIO(base64.b64decode(url[len(prefix) :])))
    assert decoded.size == (40, 30)
    assert np.array_equal(np.asarray(decoded.convert("RGB")), np.asarray(picture))  # lossless
    params = first["sampling_params"]
    assert {k: v for k, v in params.items() if k != "structured_outputs"} == {  # every field: none left to vLLM
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.1,
        "max_tokens": 300,
        "seed": 5,
        "repetition_penalty": 1.1,
    }
    assert json.loads(params["structured_outputs"]["json"]) == PANELS.schema

    second = by_id["fig-2"]
    assert second["messages"] == [{"role": "user", "content": "Describe."}]
    assert second["sampling_params"]["max_tokens"] == 64  # the request's override
    assert not second["sampling_params"].get("structured_outputs")  # absent, or null when Arrow filled it


def _vllm_row(request_id: str, **fields) -> dict:
    """A row as the vLLM and detokenize stages leave it. Names from Ray 2.60:
    ray/llm/_internal/batch/stages/vllm_engine_stage.py:151-161 (vLLMOutputData: prompt,
    prompt_token_ids, num_input_tokens, generated_tokens, generated_text, num_generated_tokens),
    :729-736 (success: request_id, batch_uuid, time_taken_llm, params, __inference_error__ ""),
    :771-786 (failure: the same defaults with num_input_tokens 0 and the error message),
    tokenize_stage.py:145-148 (DetokenizeStage rewrites generated_text)."""
    return {
        "id": request_id,
        "prompt": "<|im_start|>user\n...",
        "prompt_token_ids": None,
        "generated_tokens": [],
        "request_id": 0,
        "batch_uuid": "b",
        "time_taken_llm": 0.5,
        "params": "",
        "__inference_error__": "",
        **fields,
    }


def test_postprocess_in_ray_data_records_text_tokens_and_errors(local_ray):
    from ray.llm._internal.batch.stages.base import wrap_postprocess

    ok = _vllm_row(
        "fig-1",
        generated_text='{"panels": []}',
        num_input_tokens=321,
        num_generated_tokens=7,
        generated_tokens=[1, 2, 3, 4, 5, 6, 7],
    )
    failed = _vllm_row(
        "fig-2",
        generated_text="",
        num_input_tokens=0,
        num_generated_tokens=0,
        __inference_error__="ValueError: The decoder prompt (length 17000) is longer than the maximum model length",
    )
    # exactly what the processor does after its stages (Processor.__init__ / __call__), then ours
    wrapped = wrap_postprocess(postprocess, "__data", include_error_column=True)
    rows = ray.data.from_items([{"__data": ok}, {"__data": failed}]).map(wrapped).map(finalize).take_all()
    by_id = {row["id"]: row for row in rows}
    assert by_id["fig-1"] == {
        "id": "fig-1",
        "text": '{"panels": []}',
        "prompt_tokens": 321,
        "completion_tokens": 7,
        "error": None,
    }
    assert by_id["fig-2"] == {
        "id": "fig-2",
        "text": None,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "error": "ValueError: The decoder prompt (length 17000) is longer than the maximum model length",
    }


def test_responses_follow_request_order_with_model_frames():
    config = EngineConfig()  # Qwen2.5-VL: factor 28, 200704..1003520 pixels
    engine = RayVllmEngine(config, RayVllmSettings())
    requests = [VlmRequest("a", "x", [Image.new("RGB", (400, 300))]), VlmRequest("b", "y"), VlmRequest("c", "z")]
    rows = [  # as finalize leaves them, in the order Ray happened to return them; "c" lost
        {"id": "b", "text": None, "prompt_tokens": 0, "completion_tokens": 0, "error": "boom"},
        {"id": "a", "text": "{}", "prompt_tokens": 10, "completion_tokens": 2, "error": None},
    ]
    a, b, c = engine._responses(requests, rows)
    assert (a.id, a.text, a.prompt_tokens, a.completion_tokens, a.error) == ("a", "{}", 10, 2, None)
    # 400x300 = 120000 px is under min_pixels: scaled up by sqrt(200704/120000) = 1.2933, each side
    # rounded up to a multiple of 28: 300*1.2933 = 388.0 -> 392, 400*1.2933 = 517.3 -> 532
    assert a.image_sizes == [(532, 392)]
    assert (b.text, b.error) == (None, "boom")
    assert c.text is None and c.error == "no output row from the Ray pipeline"


def test_requests_over_the_image_limit_are_refused_without_touching_ray():
    engine = RayVllmEngine(EngineConfig(), RayVllmSettings(limit_images=1, address="127.0.0.1:9"))
    two = VlmRequest("two", "compare", [Image.new("RGB", (56, 56)), Image.new("RGB", (56, 56))])
    (response,) = engine.generate([two])  # no other request: the pipeline never starts
    assert response.text is None
    assert response.error == "more than 1 image(s) in one request (RayVllmSettings.limit_images)"
    assert response.image_sizes == [(56 * 8, 56 * 8), (56 * 8, 56 * 8)]  # 56x56 scaled up to 448x448 = 200704
    with pytest.raises(ValueError, match="unique"):
        engine.generate([VlmRequest("x", "p"), VlmRequest("x", "q")])


# failures: outage or setup error


def test_outage_classification_on_real_ray_exceptions():
    from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError, RayTaskError

    assert is_outage(ActorDiedError())
    assert is_outage(GetTimeoutError("Timed out while starting actors."))
    assert is_outage(ConnectionError("could not reach the GCS"))
    try:  # an outage wrapped by Ray Data in another exception
        try:
            raise ActorDiedError()
        except ActorDiedError as inner:
            raise RuntimeError("dataset execution failed") from inner
    except RuntimeError as outer:
        assert is_outage(outer)
    assert not is_outage(RayActorError(error_msg="creation task failed", actor_init_failed=True))
    assert not is_outage(ValueError("a bug of ours"))
    assert not is_outage(RayTaskError("fn", "traceback", KeyError("messages")))


def test_generate_without_vllm_in_the_workers_is_a_setup_error_not_an_outage(local_ray):
    """Runs the whole pipeline: PrepareMultimodalStage's actor imports vLLM in its constructor,
    fails, and generate says what to fix instead of retrying forever or hanging."""
    engine = RayVllmEngine(EngineConfig(), RayVllmSettings(runtime_env=None, start_timeout_s=120))
    with pytest.raises(RuntimeError, match="could not start") as caught:
        engine.generate([VlmRequest("fig-1", "Find the panels.", [_picture()])])
    assert not isinstance(caught.value, VlmOutage)
    assert "vLLM is not installed" in str(caught.value) or "vllm" in str(caught.value)


# (d) Ray's chat-template stage on the tiny model: the other backends' prompt, the pinned revision


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from pipelines.vlm.tiny import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("models"))


def _render(model: str, messages: list[dict], chat_template: str | None = None) -> str:
    """What Ray 2.60's ChatTemplateStage makes of one row (its UDF, run in this process)."""
    from ray.llm._internal.batch.stages.chat_template_stage import ChatTemplateUDF

    udf = ChatTemplateUDF("__data", ["messages"], model=model, chat_template=chat_template)

    async def run():
        return [row async for row in udf.udf([{udf.IDX_IN_BATCH_COLUMN: 0, "messages": messages}])]

    return asyncio.run(run())[0]["prompt"]


def test_the_chat_template_stage_renders_the_prompt_of_the_transformers_backend(tiny_model):
    """vLLM's parser (PrepareMultimodalStage) turns [image_url part, text part] into the parts
    [{"type": "image"}, {"type": "text"}] with content format "openai", and into the string
    "<placeholder>\n<text>" with Ray's default "string" (vllm/entrypoints/chat_utils.py,
    _parse_chat_message_content_parts: wrap_dicts for "openai", else the placeholder and the
    text joined by "\n"). Rendered by the stage, the first is the prompt the transformers
    backend sends for the same request; the second has a newline the model never saw there."""
    from transformers import AutoProcessor

    from pipelines.vlm.hf import chat_messages

    request = VlmRequest("fig-1", "Find every panel.", [_picture()], system="Answer with JSON only.")
    system = {"role": "system", "content": "Answer with JSON only."}  # kept a string (apply_sys_msg_formatting)
    parsed_openai = [system, {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": request.prompt}]}]
    parsed_string = [
        system,
        {"role": "user", "content": "<|vision_start|><|image_pad|><|vision_end|>\n" + request.prompt},
    ]

    hf_prompt = AutoProcessor.from_pretrained(tiny_model).apply_chat_template(
        chat_messages(request), tokenize=False, add_generation_prompt=True
    )
    # the tiny model's chat template (pipelines/vlm/tiny.py CHAT_TEMPLATE), rendered by hand
    assert hf_prompt == (
        "<|im_start|>system\nAnswer with JSON only.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Find every panel.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert _render(str(tiny_model), parsed_openai) == hf_prompt
    assert _render(str(tiny_model), parsed_string) == hf_prompt.replace("<|vision_end|>", "<|vision_end|>\n")


def _fake_hub_cache(root: Path, model: Path, repo: str, revisions: dict[str, str]) -> Path:
    """A Hugging Face cache holding ``repo`` at two commits (refs/main -> the first), each a copy
    of the tiny model whose chat template starts with a marker of its revision."""
    cache = root / "hub"
    repo_dir = cache / f"models--{repo.replace('/', '--')}"
    for name, sha in revisions.items():
        snapshot = repo_dir / "snapshots" / sha
        shutil.copytree(model, snapshot)
        template = (snapshot / "chat_template.jinja").read_text()
        (snapshot / "chat_template.jinja").write_text("{{ '" + name + "|' }}" + template)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(revisions["main"])
    return cache


PINNED_CHECK = """
import json
from pipelines.vlm.engine import EngineConfig
from pipelines.vlm.ray_llm import RayVllmSettings, pinned_chat_template, processor_config
from tests.e2e.test_vlm_ray import _render

repo, pinned = "{repo}", "{pinned}"
config = EngineConfig(model=repo, revision=pinned, synthetic=True)
stage = processor_config(config, RayVllmSettings(runtime_env=None), pinned_chat_template(config)).chat_template_stage
messages = [{{"role": "user", "content": "Find every panel."}}]
print(json.dumps({{"ray_alone": _render(repo, messages), "pinned": _render(repo, messages, stage["chat_template"])}}))
"""


def test_the_pinned_revision_reaches_the_chat_template_stage(tiny_model, tmp_path):
    """Ray's chat-template stage takes a model id and no revision: alone, it renders the
    repository's newest template (refs/main). The processor hands it the pinned revision's.
    Offline, from a Hugging Face cache holding both (HF_HUB_CACHE is read at import: a subprocess)."""
    repo, revisions = "panelforge-test/tiny-vl", {"main": "a" * 40, "pinned": "b" * 40}
    cache = _fake_hub_cache(tmp_path, tiny_model, repo, revisions)
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    script = PINNED_CHECK.format(repo=repo, pinned=revisions["pinned"])
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    prompts = json.loads(done.stdout.strip().splitlines()[-1])
    user_turn = "<|im_start|>user\nFind every panel.<|im_end|>\n"
    assert prompts["ray_alone"].startswith("main|") and user_turn in prompts["ray_alone"]
    assert prompts["pinned"].startswith("pinned|") and user_turn in prompts["pinned"]


def test_no_pinned_revision_leaves_the_models_own_template(tiny_model):
    assert pinned_chat_template(EngineConfig(model=str(tiny_model), synthetic=True)) is None
