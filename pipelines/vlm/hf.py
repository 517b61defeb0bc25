"""The in-process transformers backend: one model in this process, batched ``generate``.

It is the backend of tests, the demo and single-node runs, and the reference the other backends
are compared with. Requests are checked one by one before any batch is formed (images decoded,
aspect ratio within the processor's limit, schema compiled), so a corrupt image or a bad schema
becomes that request's error and the batch goes on without it. Good requests go through in
batches of ``batch_size``: memory is bounded by the batch, not by the number of requests.

Placement: ``device="auto"`` uses every visible GPU. With one, the model goes there; with
several, its layers are split across them (``device_map="auto"``, which needs the ``accelerate``
package): Qwen2.5-VL-72B in bf16 (~145 GB of weights) needs at least two 80 GB GPUs, and runs
one layer at a time (pipeline-style, no tensor parallelism), so for whole releases serve it with
vLLM instead (``openai`` or ``ray`` backend, ``tensor_parallel_size`` 4). A model that does not
fit the visible GPUs is refused, not offloaded to CPU memory. ``device="cuda:1"`` or ``"cpu"``
pins one device.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor, LogitsProcessor, LogitsProcessorList
from transformers.utils import logging as hf_logging

from pipelines.compute.weights import Weights, from_pretrained_offline_first
from pipelines.core.stage import StageInputError
from pipelines.vlm.engine import EngineConfig, VlmEngine, VlmRequest, VlmResponse, in_order
from pipelines.vlm.grounding import smart_resize
from pipelines.vlm.structured import JsonSchemaLogitsProcessor, SchemaError, compile_schema, ll_tokenizer
from pipelines.vlm.tiny import is_synthetic

VLM_SETTING = "PANELFORGE_VLM_MODEL"


def vlm_weights(model: str, revision: str | None = None) -> Weights:
    """The VLM setting as :class:`pipelines.compute.weights.Weights`: its one-line errors name the setting
    and the ``hf download`` command."""
    return Weights(VLM_SETTING, model, EngineConfig.model, "the vision-language model", revision)


IM_END = "<|im_end|>"


@dataclass
class _Prepared:
    """A request that passed the checks: RGB images, its schema's grammar, its token budget."""

    index: int
    request: VlmRequest
    images: list[Image.Image]
    grammar: str | None
    max_tokens: int


class _TokenBudget(LogitsProcessor):
    """Forces EOS on a sequence once it has generated its own ``max_tokens``: a batch runs to
    the longest budget, but each answer stops at its request's."""

    def __init__(self, budgets: Sequence[int], eos_token_id: int):
        self.budgets = list(budgets)
        self.eos = eos_token_id
        self.prompt_len: int | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.prompt_len is None:
            self.prompt_len = input_ids.shape[1]
        generated = input_ids.shape[1] - self.prompt_len
        for i, budget in enumerate(self.budgets):
            if generated >= budget:
                scores[i] = float("-inf")
                scores[i, self.eos] = 0.0
        return scores


def chat_messages(request: VlmRequest) -> list[dict]:
    """The chat turn the processor's template renders: the system prompt as a string, then the
    images before the text as content parts (what the Ray backend has vLLM's parser produce with
    content format "openai", and what the Qwen-VL chat template was trained on)."""
    content = [{"type": "image"} for _ in request.images] + [{"type": "text", "text": request.prompt}]
    messages = [{"role": "user", "content": content}]
    if request.system is not None:
        messages.insert(0, {"role": "system", "content": request.system})
    return messages


@dataclass(frozen=True)
class Placement:
    """Where the model goes: ``device`` takes the inputs (the first shard when split), and
    ``load_kwargs`` go to ``from_pretrained``."""

    device: str
    load_kwargs: dict
    devices: tuple[str, ...]  # every device holding part of the model

    @property
    def sharded(self) -> bool:
        return "device_map" in self.load_kwargs


def _has_accelerate() -> bool:
    return importlib.util.find_spec("accelerate") is not None


def placement(device: str, gpus: int) -> Placement:
    """``auto``: split across the ``gpus`` visible GPUs when there are several, else the one GPU,
    else the CPU; anything else is one device, as named."""
    if device == "auto" and gpus > 1:
        return Placement("cuda:0", {"device_map": "auto"}, tuple(f"cuda:{i}" for i in range(gpus)))
    if device == "auto":
        device = "cuda" if gpus == 1 else "cpu"
    return Placement(device, {}, (device,))


class TransformersEngine(VlmEngine):
    """A Qwen-VL checkpoint (hub id or local directory) run by transformers in this process."""

    backend = "transformers"

    def __init__(self, config: EngineConfig, device: str = "auto", batch_size: int = 4):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self._check_synthetic(config)
        self.placement = placement(device, torch.cuda.device_count() if torch.cuda.is_available() else 0)
        self.device = self.placement.device
        # Provenance records the dtype the weights really ran in (float32 on CPU, see _dtype).
        self.config = replace(config, dtype=self._dtype(config.dtype))
        self.batch_size = batch_size
        hf_logging.disable_progress_bar()  # per-shard bars would flood the run's logs

        weights = vlm_weights(config.model, config.revision)

        def unavailable(exc: Exception) -> StageInputError:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return StageInputError(str(weights.error(f"cannot be loaded ({first})")))

        self.processor = from_pretrained_offline_first(AutoProcessor, config.model, unavailable, config.revision)
        # The pixel band is set on the image processor itself: per-call min/max_pixels are deprecated.
        self.processor.image_processor.size = {"shortest_edge": config.min_pixels, "longest_edge": config.max_pixels}
        self.tokenizer = self.processor.tokenizer
        self.tokenizer.padding_side = "left"  # batched generate appends on the right of every row
        if self.placement.sharded and not _has_accelerate():
            raise StageInputError(
                f"splitting {config.model} across the {len(self.placement.devices)} visible GPUs needs the "
                "`accelerate` package (pip install accelerate); or pin one GPU (device=cuda:0), or serve the "
                "model with vLLM (backend openai or ray, docs/vlm-backends.md)"
            )
        load = partial(
            AutoModelForImageTextToText.from_pretrained,
            dtype=getattr(torch, self.config.dtype),
            **self.placement.load_kwargs,
        )
        model = from_pretrained_offline_first(
            SimpleNamespace(from_pretrained=load), config.model, unavailable, config.revision
        )
        self.model = self._placed(model)
        self.model.eval()
        self._check_family()
        self.patch_size = int(self.processor.image_processor.patch_size)
        self.eos_id = self.tokenizer.convert_tokens_to_ids(IM_END)
        self.pad_id = self.tokenizer.pad_token_id
        eos = self.model.generation_config.eos_token_id
        self.stop_ids = set(eos if isinstance(eos, list) else [eos]) | {self.eos_id}
        self._ll_tokenizer = None  # built on the first request with a schema (about a second)

    def _placed(self, model):
        """One device: moved there. Split: refused if accelerate had to put layers on the CPU or
        disk (a 72B model on too few GPUs), which would run orders of magnitude slower."""
        if not self.placement.sharded:
            return model.to(self.device)
        offloaded = sorted({str(d) for d in getattr(model, "hf_device_map", {}).values()} & {"cpu", "disk"})
        if offloaded:
            raise StageInputError(
                f"{self.config.model} does not fit the {len(self.placement.devices)} visible GPUs (layers were put "
                f"on {', '.join(offloaded)}): use more GPUs, or serve it with vLLM and tensor_parallel_size "
                "(backend openai or ray, docs/vlm-backends.md)"
            )
        return model

    @staticmethod
    def _check_synthetic(config: EngineConfig) -> None:
        """A tiny random model must be declared synthetic, or its output would pass for mined data."""
        if Path(config.model).is_dir() and is_synthetic(config.model) and not config.synthetic:
            raise ValueError(
                f"{config.model} is a synthetic (randomly initialised) model but the engine config says "
                "synthetic=False; set EngineConfig(synthetic=True) so everything it produces is marked"
            )

    def _dtype(self, configured: str) -> str:
        """The configured dtype on an accelerator; float32 on CPU whatever the config says, because
        CPU bfloat16/float16 matmuls are slow or missing for several ops and change greedy answers."""
        if self.device == "cpu":
            return "float32"
        if not isinstance(getattr(torch, configured, None), torch.dtype):
            raise ValueError(f"unknown dtype {configured!r}")
        return configured

    def _check_family(self) -> None:
        """The family decides how boxes are read; a mismatch would silently misplace every box."""
        model_type = self.model.config.model_type
        if model_type != self.config.family:
            raise ValueError(
                f"{self.config.model} is a {model_type} model but the engine config says {self.config.family}"
            )

    def backend_version(self) -> str:
        import transformers

        return transformers.__version__

    def close(self) -> None:
        self.model = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def generate(self, requests: Sequence[VlmRequest]) -> list[VlmResponse]:
        return in_order(self.stream(requests), len(requests))

    def stream(self, requests: Sequence[VlmRequest]) -> Iterator[tuple[int, VlmResponse]]:
        """Refused requests first, then each batch of ``batch_size`` as ``generate`` finishes it."""
        good: list[_Prepared] = []
        for index, request in enumerate(requests):
            prepared = self._prepare(index, request)
            if isinstance(prepared, VlmResponse):
                yield index, prepared
            else:
                good.append(prepared)
        for start in range(0, len(good), self.batch_size):
            batch = good[start : start + self.batch_size]
            for item, response in zip(batch, self._run_batch(batch), strict=True):
                yield item.index, response

    def _prepare(self, index: int, request: VlmRequest) -> _Prepared | VlmResponse:
        """Everything that can fail for one request alone fails here, before it joins a batch."""
        images = []
        for n, image in enumerate(request.images):
            try:
                if not isinstance(image, Image.Image):
                    raise TypeError(f"not a PIL image but {type(image).__name__}")
                image.load()  # PIL decodes lazily: a truncated file fails only now
                smart_resize(image.height, image.width, self.config.patch_factor)  # aspect ratio check
                images.append(image.convert("RGB"))
            except Exception as exc:  # noqa: BLE001 - any decoding failure is this request's error
                return VlmResponse(request.id, None, error=f"image {n}: {type(exc).__name__}: {exc}")
        grammar = None
        if request.schema is not None:
            try:
                grammar = compile_schema(request.schema)
            except SchemaError as exc:
                return VlmResponse(request.id, None, error=str(exc))
        max_tokens = self.config.max_tokens(request)
        return _Prepared(index, request, images, grammar, max_tokens)

    def _run_batch(self, batch: list[_Prepared]) -> list[VlmResponse]:
        started = time.perf_counter()
        texts = [
            self.processor.apply_chat_template(chat_messages(item.request), tokenize=False, add_generation_prompt=True)
            for item in batch
        ]
        images = [image for item in batch for image in item.images]
        inputs = self.processor(text=texts, images=images or None, padding=True, return_tensors="pt").to(self.device)
        budgets = [item.max_tokens for item in batch]
        processors = LogitsProcessorList([_TokenBudget(budgets, self.eos_id)])
        if any(item.grammar is not None for item in batch):
            grammars = [item.grammar for item in batch]
            processors.insert(0, JsonSchemaLogitsProcessor(self._tokenizer_for_schemas(), grammars, self.eos_id))
        with torch.inference_mode(), torch.random.fork_rng(devices=self._rng_devices()):
            torch.manual_seed(self.config.sampling.seed)
            output = self.model.generate(
                **inputs, max_new_tokens=max(budgets) + 1, logits_processor=processors, **self._sampling()
            )
        seconds = (time.perf_counter() - started) / len(batch)
        prompt_len = inputs["input_ids"].shape[1]
        prompt_tokens = inputs["attention_mask"].sum(dim=1).tolist()
        sizes = self._image_sizes(inputs.get("image_grid_thw"), [len(item.images) for item in batch])
        responses = []
        for row, item in enumerate(batch):
            completion = self._until_stop(output[row, prompt_len:].tolist())
            text = self.tokenizer.decode(completion, skip_special_tokens=True)
            responses.append(
                VlmResponse(
                    item.request.id,
                    text,
                    prompt_tokens=int(prompt_tokens[row]),
                    completion_tokens=len(completion),
                    seconds=seconds,
                    image_sizes=sizes[row],
                )
            )
        return responses

    def _tokenizer_for_schemas(self):
        if self._ll_tokenizer is None:
            vocab_size = self.model.get_output_embeddings().weight.shape[0]
            self._ll_tokenizer = ll_tokenizer(self.tokenizer, vocab_size, self.eos_id)
        return self._ll_tokenizer

    def _rng_devices(self) -> list:
        return [torch.device(d) for d in self.placement.devices if d.startswith("cuda")]

    def _sampling(self) -> dict:
        """generate() arguments of the configured sampling; temperature 0 means greedy. Every
        field is passed: ``generate`` fills the others from the checkpoint's generation config
        (Qwen2.5-VL's: top_k 1, top_p 0.001, repetition penalty 1.05), as vLLM does."""
        s = self.config.sampling
        common = {"repetition_penalty": s.repetition_penalty, "pad_token_id": self.pad_id}
        if s.temperature == 0:
            return {"do_sample": False, **common}
        top_k = s.top_k if s.top_k > 0 else None  # None: no top-k filter (0 would be a setting too)
        return {
            "do_sample": True,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": top_k,
            "min_p": s.min_p if s.min_p > 0 else None,
            **common,
        }

    def _until_stop(self, tokens: list[int]) -> list[int]:
        """The answer's tokens: everything before the first stop token (the rest is padding)."""
        for n, token in enumerate(tokens):
            if token in self.stop_ids:
                return tokens[:n]
        return tokens

    def _image_sizes(self, grid_thw: torch.Tensor | None, counts: list[int]) -> list[list[tuple[int, int]]]:
        """Each image's (width, height) as the model saw it: its patch grid times the patch size."""
        sizes: list[list[tuple[int, int]]] = []
        rows = grid_thw.tolist() if grid_thw is not None else []
        for count in counts:
            taken, rows = rows[:count], rows[count:]
            sizes.append([(w * self.patch_size, h * self.patch_size) for _, h, w in taken])
        return sizes
