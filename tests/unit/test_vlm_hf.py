"""The transformers engine on the tiny random Qwen-VL: batching, errors per request, image frames,
token counts, JSON-schema constrained decoding and the canary.

Expected frames are worked out by hand with smart_resize for the band used here
(min 3136 = 4 tokens of 28x28, max 50176 = 64 tokens):

* 400x300 (w x h), factor 28: rounded 392x308 = 120736 > 50176, so beta = sqrt(120000/50176)
  = 1.5465; w = floor(400/1.5465/28)*28 = floor(9.24)*28 = 252, h = floor(300/1.5465/28)*28
  = floor(6.93)*28 = 168. Grid 9x6 merged tokens = 54 <|image_pad|>.
* 40x30, factor 28: rounded 28x28 = 784 < 3136, so beta = sqrt(3136/1200) = 1.6166;
  w = ceil(40*1.6166/28)*28 = ceil(2.31)*28 = 84, h = ceil(30*1.6166/28)*28 = ceil(1.73)*28 = 56.
  Grid 3x2 = 6 <|image_pad|>.
* 400x300, factor 32 (Qwen3-VL): rounded 384x288 = 110592 > 50176; w = floor(258.65/32)*32 = 256,
  h = floor(193.99/32)*32 = 192.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import io
import json
import shutil
import threading
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from PIL import Image

from pipelines.core.stage import StageInputError
from pipelines.vlm.canary import run_canary
from pipelines.vlm.engine import EngineConfig, Sampling, VlmOutage, VlmRequest
from pipelines.vlm.grounding import model_frame
from pipelines.vlm.hf import TransformersEngine, placement
from pipelines.vlm.prompts import CANARY, CANARY_TOKEN, PANELS, SYSTEM
from pipelines.vlm.tiny import MARKER, build_tiny_model, is_synthetic, tiny_model_dir
from testing.vlm import ScriptedEngine

BAND = {"min_pixels": 3136, "max_pixels": 50176}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "qwen25", seed=0)


@pytest.fixture(scope="module")
def engine(tiny) -> TransformersEngine:
    return TransformersEngine(EngineConfig(model=str(tiny), synthetic=True, **BAND), device="cpu", batch_size=2)


def _noise(width: int, height: int, seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8))


def _corrupt() -> Image.Image:
    """A PNG cut after 200 bytes: PIL opens it (the header is fine) and fails only on decoding."""
    buffer = io.BytesIO()
    _noise(64, 64, 3).save(buffer, "PNG")
    return Image.open(io.BytesIO(buffer.getvalue()[:200]))


def _sha(path: Path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def _validates(text: str | None, schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (TypeError, json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def test_tiny_model_round_trips_through_auto_classes(tiny):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny)
    model = AutoModelForImageTextToText.from_pretrained(tiny)
    assert model.config.model_type == "qwen2_5_vl"
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    assert is_synthetic(tiny) and not is_synthetic(tiny.parent)
    assert json.loads((tiny / MARKER).read_text()) == {"synthetic": True, "family": "qwen2_5_vl", "seed": 0}
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    # the BPE learned our JSON: the canary answer (48 characters) takes far fewer tokens than bytes
    answer = json.dumps({"canary": CANARY_TOKEN})
    assert len(processor.tokenizer(answer)["input_ids"]) < 24


def test_tiny_model_is_deterministic(tiny, tmp_path):
    again = build_tiny_model(tmp_path / "again", seed=0)
    other = build_tiny_model(tmp_path / "other", seed=1)
    assert _sha(again) == _sha(tiny)
    assert _sha(other) != _sha(tiny)


def test_tiny_model_dir_builds_once_even_when_raced(tmp_path):
    found: list[Path] = []
    threads = [threading.Thread(target=lambda: found.append(tiny_model_dir(tmp_path))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(found) == 2 and found[0] == found[1] and is_synthetic(found[0])
    assert [p.name for p in tmp_path.iterdir()] == [found[0].name]  # no staging directory left behind
    stamp = (found[0] / "model.safetensors").stat().st_mtime_ns
    assert tiny_model_dir(tmp_path) == found[0]
    assert (found[0] / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt


def test_mixed_batch_fails_only_the_corrupt_request(engine):
    requests = [
        VlmRequest("big", "Describe the figure.", [_noise(400, 300, 1)], max_tokens=6),
        VlmRequest("corrupt", "Describe the figure.", [_corrupt()], max_tokens=6),
        VlmRequest("small", "Describe the figure.", [_noise(40, 30, 2)], max_tokens=6),
        VlmRequest("text", "Describe the figure.", max_tokens=4),
        VlmRequest("thin", "Describe the figure.", [Image.new("RGB", (201 * 2, 2))], max_tokens=4),
    ]
    big, corrupt, small, text, thin = engine.generate(requests)
    assert [r.id for r in (big, corrupt, small, text, thin)] == ["big", "corrupt", "small", "text", "thin"]
    assert corrupt.text is None and "truncated" in corrupt.error
    assert thin.text is None and "aspect" in thin.error
    for response in (big, small, text):
        assert response.error is None and isinstance(response.text, str)
        assert response.prompt_tokens > 0 and response.seconds > 0
    assert big.image_sizes == [(252, 168)] and small.image_sizes == [(84, 56)] and text.image_sizes == []
    assert big.image_sizes == [model_frame(400, 300, engine.config)]
    # same text; an image adds its <|image_pad|> tokens plus <|vision_start|> and <|vision_end|>
    assert big.prompt_tokens - text.prompt_tokens == 54 + 2
    assert small.prompt_tokens - text.prompt_tokens == 6 + 2
    # random weights rarely pick <|im_end|>, so each answer runs to its own budget
    assert (big.completion_tokens, small.completion_tokens, text.completion_tokens) == (6, 6, 4)


def test_qwen3_frames_use_factor_32(tmp_path):
    directory = build_tiny_model(tmp_path / "q3", family="qwen3_vl")
    config = EngineConfig(model=str(directory), family="qwen3_vl", synthetic=True, **BAND)
    [response] = TransformersEngine(config, device="cpu").generate(
        [VlmRequest("q3", "Describe.", [_noise(400, 300, 1)], max_tokens=2)]
    )
    assert response.error is None and response.image_sizes == [(256, 192)]


def test_engine_refuses_an_undeclared_synthetic_model(tiny):
    with pytest.raises(ValueError, match="synthetic"):
        TransformersEngine(EngineConfig(model=str(tiny), synthetic=False))


def test_engine_refuses_a_family_mismatch(tiny):
    with pytest.raises(ValueError, match="qwen2_5_vl model but the engine config says qwen3_vl"):
        TransformersEngine(EngineConfig(model=str(tiny), family="qwen3_vl", synthetic=True))


def test_info_is_marked_synthetic_and_float32_on_cpu(engine):
    info = engine.info()
    assert info["synthetic"] is True and info["backend"] == "transformers" and info["dtype"] == "float32"
    import transformers

    assert info["backend_version"] == transformers.__version__


def _bounded(schema: dict) -> dict:
    """PANELS with bounds on label length, coordinates and panel count. Unbounded integers let a
    model (this random one does) write digits until max_tokens; with bounds the grammar itself
    ends. Every answer valid for the bounded schema is valid for PANELS."""
    bounded = copy.deepcopy(schema)
    bounded["properties"]["panels"]["maxItems"] = 32
    item = bounded["properties"]["panels"]["items"]["properties"]
    item["bbox_2d"]["items"].update(minimum=0, maximum=9999)
    item["label"]["maxLength"] = 8
    return bounded


def test_schema_constrains_the_random_model(engine):
    free = engine.generate(
        [
            VlmRequest("canary", CANARY.render(), system=SYSTEM, max_tokens=CANARY.max_tokens),
            VlmRequest("panels", PANELS.render(), [_noise(400, 300, 1)], system=SYSTEM, max_tokens=48),
        ]
    )
    assert not _validates(free[0].text, CANARY.schema) and not _validates(free[1].text, PANELS.schema)
    canary, panels = engine.generate(
        [
            VlmRequest("canary", CANARY.render(), system=SYSTEM, schema=CANARY.schema, max_tokens=CANARY.max_tokens),
            VlmRequest("panels", PANELS.render(), [_noise(400, 300, 1)], system=SYSTEM, schema=_bounded(PANELS.schema)),
        ]
    )
    assert json.loads(canary.text) == {"canary": CANARY_TOKEN}
    assert _validates(panels.text, PANELS.schema), panels.text
    assert panels.completion_tokens < PANELS.max_tokens  # ended by the grammar, not by the budget


def test_invalid_schema_is_that_requests_error(engine):
    bad, good = engine.generate(
        [
            VlmRequest("bad", "hi", schema={"type": "object", "properties": 3}, max_tokens=4),
            VlmRequest("good", "hi", max_tokens=2),
        ]
    )
    assert bad.text is None and "schema" in bad.error
    assert good.error is None and good.completion_tokens == 2


def test_canary_passes_with_the_transformers_engine(engine):
    result = run_canary(engine)
    assert result.passed, result.reason
    assert json.loads(result.answer) == {"canary": CANARY_TOKEN}


class _SchemaIgnoringEngine(TransformersEngine):
    """A backend that drops ``schema``, like a server that ignores response_format."""

    def generate(self, requests):
        return super().generate([VlmRequest(r.id, r.prompt, r.images, r.system, None, r.max_tokens) for r in requests])


def test_canary_fails_when_the_schema_is_ignored(tiny):
    engine = _SchemaIgnoringEngine(EngineConfig(model=str(tiny), synthetic=True, **BAND), device="cpu")
    result = run_canary(engine)
    assert not result.passed and result.answer
    assert "does not apply JSON schemas" in result.reason


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("Hello", "not JSON"),
        ('{"canary": "hello"}', "schema was not enforced"),
        (RuntimeError("HTTP 400: bad schema"), "rejected the canary request: HTTP 400: bad schema"),
    ],
)
def test_canary_judges_hand_written_answers(answer, reason):
    engine = ScriptedEngine(lambda request: answer)
    result = run_canary(engine)
    assert not result.passed and reason in result.reason
    assert engine.requests[0].schema == CANARY.schema


def test_canary_lets_an_outage_through():
    class Down(ScriptedEngine):
        def generate(self, requests):
            raise VlmOutage("connection refused")

    with pytest.raises(VlmOutage):
        run_canary(Down(lambda request: ""))


def test_sampling_is_reproducible_by_seed(tiny):
    def answer(seed: int) -> str:
        sampling = Sampling(temperature=1.0, top_p=0.9, seed=seed)
        config = EngineConfig(model=str(tiny), synthetic=True, sampling=sampling, **BAND)
        [response] = TransformersEngine(config, device="cpu").generate([VlmRequest("s", "Say hello.", max_tokens=12)])
        return response.text

    first = answer(7)
    assert answer(7) == first
    assert answer(8) != first


def test_a_checkpoints_generation_config_does_not_change_the_answers(tiny, tmp_path):
    """``generate`` fills every field it is not given from the checkpoint's generation config.
    The same weights with a generation config like Qwen2.5-VL's (plus a strong min_p) must
    sample exactly the answers of the neutral one: every field comes from our Sampling."""
    shipped = tmp_path / "with-generation-config"
    shutil.copytree(tiny, shipped)
    generation = json.loads((shipped / "generation_config.json").read_text())
    generation.update(do_sample=True, temperature=0.1, top_k=1, top_p=0.001, min_p=0.5, repetition_penalty=1.3)
    (shipped / "generation_config.json").write_text(json.dumps(generation))

    def answers(model: Path) -> list[str]:
        sampling = Sampling(temperature=1.0, seed=11)
        config = EngineConfig(model=str(model), synthetic=True, sampling=sampling, **BAND)
        prompts = [VlmRequest(str(i), f"Describe panel {i}.", max_tokens=12) for i in range(3)]
        return [r.text for r in TransformersEngine(config, device="cpu").generate(prompts)]

    assert answers(shipped) == answers(tiny)


@pytest.mark.parametrize(
    ("device", "gpus", "expected"),
    [
        ("auto", 0, ("cpu", {}, ("cpu",))),
        ("auto", 1, ("cuda", {}, ("cuda",))),
        ("auto", 4, ("cuda:0", {"device_map": "auto"}, ("cuda:0", "cuda:1", "cuda:2", "cuda:3"))),
        ("cuda:1", 4, ("cuda:1", {}, ("cuda:1",))),
        ("cpu", 2, ("cpu", {}, ("cpu",))),
    ],
)
def test_placement_splits_across_every_visible_gpu_only_for_auto(device, gpus, expected):
    where = placement(device, gpus)
    assert (where.device, where.load_kwargs, where.devices) == expected


@pytest.fixture
def two_gpus(monkeypatch):
    """What torch reports on a node with two GPUs (there is none here)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is not None, reason="accelerate is installed")
def test_several_gpus_without_accelerate_are_refused_at_start(tiny, two_gpus):
    with pytest.raises(StageInputError, match="needs the `accelerate` package.*pin one GPU.*vLLM"):
        TransformersEngine(EngineConfig(model=str(tiny), synthetic=True, **BAND))


class _Recorded:
    """Stands in for AutoModelForImageTextToText (no GPU here): records what from_pretrained
    gets, loads the real tiny model on the CPU, and reports the device map accelerate would."""

    def __init__(self, device_map: dict):
        self.device_map, self.calls = device_map, []

    def from_pretrained(self, model, **kwargs):
        from transformers import AutoModelForImageTextToText

        self.calls.append(kwargs)
        loaded = AutoModelForImageTextToText.from_pretrained(model, local_files_only=True)
        loaded.hf_device_map = self.device_map
        return loaded


def test_several_gpus_load_the_model_split_across_them(tiny, two_gpus, monkeypatch):
    import torch

    from pipelines.vlm import hf

    recorded = _Recorded({"model.visual": 0, "model.language_model": 1, "lm_head": 1})
    monkeypatch.setattr(hf, "_has_accelerate", lambda: True)
    monkeypatch.setattr(hf, "AutoModelForImageTextToText", recorded)
    engine = TransformersEngine(EngineConfig(model=str(tiny), synthetic=True, **BAND))
    assert recorded.calls == [{"dtype": torch.bfloat16, "device_map": "auto", "local_files_only": True}]
    assert engine.device == "cuda:0" and engine.info()["dtype"] == "bfloat16"
    assert engine._rng_devices() == [torch.device("cuda:0"), torch.device("cuda:1")]


def test_a_model_that_does_not_fit_the_gpus_is_refused_not_offloaded(tiny, two_gpus, monkeypatch):
    from pipelines.vlm import hf

    recorded = _Recorded({"model.visual": 0, "model.language_model": "cpu", "lm_head": "disk"})
    monkeypatch.setattr(hf, "_has_accelerate", lambda: True)
    monkeypatch.setattr(hf, "AutoModelForImageTextToText", recorded)
    with pytest.raises(StageInputError, match="does not fit the 2 visible GPUs .*on cpu, disk.*vLLM"):
        TransformersEngine(EngineConfig(model=str(tiny), synthetic=True, **BAND))
