"""The production VLM backend: vLLM on a Ray cluster through Ray Data LLM.

``build_processor`` chains Ray Data stages: our ``preprocess`` (a request row -> OpenAI chat
``messages`` and vLLM ``sampling_params``), PrepareMultimodalStage (vLLM parses the messages and
decodes the images), ChatTemplateStage (transformers, CPU), vLLMEngineStage (the GPU actors), then
our ``postprocess`` (the vLLM output columns -> one response).

The same prompt as the other backends, from the same revision: Ray 2.60's chat-template,
tokenize and detokenize stages take a model id and no revision (``stages/configs.py``), so they
would load the repository's newest files whatever ``revision`` pins. The chat template of the
pinned revision is therefore read here and handed to the chat-template stage, and the tokenize
and detokenize stages are off: the vLLM engine tokenizes the prompt and detokenizes the answer
itself, with its tokenizer at ``tokenizer_revision`` (as ``vllm serve`` does). vLLM's message
parser renders content in the ``"openai"`` format (a list of image and text parts, as the
transformers backend passes them), not Ray's default ``"string"``, which joins the image
placeholder and the text with a newline the other backends never put there.

vLLM is never imported here and is not a dependency of this project: its wheels pin other torch
and transformers versions than ours. It lives in the Ray workers' environment, which
``RayVllmSettings.runtime_env`` describes (see ``docs/vlm-backends.md``). Because the driver never
loads vLLM, it cannot know which vLLM version the workers run unless the runtime environment
pins it; ``backend_version`` reports the pin, or says that it is unknown.

Column names come from Ray 2.60's installed source (``ray/llm/_internal/batch/stages``):
``vllm_engine_stage.py`` ``vLLMOutputData`` (``generated_text``, ``num_input_tokens``,
``num_generated_tokens``) and ``_generate_with_error_handling`` (``__inference_error__``), and
``base.py`` ``wrap_postprocess``: rows whose ``__inference_error__`` is set *bypass* the
user's postprocess and come out as the whole row, so ``generate`` maps them itself.
"""

from __future__ import annotations

import base64
import io
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from PIL import Image

from pipelines.compute.ray_pool import actor_init_failed, is_outage
from pipelines.vlm.engine import EngineConfig, VlmEngine, VlmOutage, VlmRequest, VlmResponse
from pipelines.vlm.grounding import model_frame

log = logging.getLogger(__name__)

# The vLLM that Ray 2.60's own ``ray[llm]`` extra pins (ray-2.60.0.dist-info/METADATA:
# ``vllm[audio]==0.29.0``): the version its vLLM stage was written and tested against.
VLLM_VERSION = "0.29.0"
ERROR_COLUMN = "__inference_error__"  # ray/llm/_internal/batch/stages/vllm_engine_stage.py
OUTPUT_COLUMNS = ("id", "text", "prompt_tokens", "completion_tokens", "error")


def default_runtime_env() -> dict:
    """vLLM installed by Ray into a per-node virtualenv for the LLM stages only.

    Ray's pip plugin clones the node's Python environment and installs the packages on top
    (``ray/_private/runtime_env/virtualenv_utils.py``), so vLLM's torch/transformers pins replace
    ours in the clone and never in the project's environment. It needs ``virtualenv`` on the
    nodes (``ray[llm]`` brings it) and PyPI access from them; clusters without either use a
    worker image or ``py_executable`` instead (docs/vlm-backends.md)."""
    return {"pip": {"packages": [f"vllm=={VLLM_VERSION}"], "pip_check": False}}


def runtime_env_for(vllm_env: str) -> dict | None:
    """The LLM stages' ``runtime_env`` for ``PANELFORGE_VLLM_ENV``: ``pip`` → the default above,
    ``image`` → None (the worker image has vLLM), an absolute path → that Python
    (``py_executable``: a second venv in the worker image, see deploy/docker/Dockerfile.gpu)."""
    if vllm_env == "pip":
        return default_runtime_env()
    if vllm_env == "image":
        return None
    if vllm_env.startswith("/"):
        return {"py_executable": vllm_env}
    raise ValueError(f"vllm_env must be pip, image or an absolute path to a Python, got {vllm_env!r}")


@dataclass(frozen=True)
class RayVllmSettings:
    """How the vLLM engines run on the cluster.

    ``runtime_env``: how vLLM reaches the workers. The default installs the pinned vLLM with
    Ray's pip plugin; ``None`` means the workers already have it (a worker image with vLLM,
    or ``{"py_executable": "/opt/vllm-venv/bin/python"}`` passed here). ``start_timeout_s``:
    how long the engine actors may take to start (model download and load included) before
    the run gives up as an outage, instead of waiting forever for GPUs that never come."""

    address: str | None = None
    concurrency: int = 1  # engine replicas (each tensor_parallel_size GPUs)
    tensor_parallel_size: int = 1
    accelerator_type: str | None = None  # e.g. "H100": Ray's accelerator_type resource
    batch_size: int = 16
    max_model_len: int = 16384
    limit_images: int = 1  # limit_mm_per_prompt["image"]
    enable_prefix_caching: bool = True  # every prompt begins with the same system text
    gpu_memory_utilization: float = 0.9
    structured_backend: str = "auto"  # vLLM StructuredOutputsConfig.backend
    runtime_env: dict | None = field(default_factory=default_runtime_env)
    should_continue_on_error: bool = True
    start_timeout_s: int = 1800

    def __post_init__(self) -> None:
        for name in ("concurrency", "tensor_parallel_size", "batch_size", "max_model_len", "limit_images"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")


def engine_kwargs(config: EngineConfig, settings: RayVllmSettings) -> dict:
    """vLLM ``EngineArgs`` fields. ``mm_processor_kwargs`` gives vLLM's image processor the same
    pixel band as ours, so the model frame (and so every grounded box) is the one
    ``grounding.model_frame`` computes. The structured-outputs backend is passed only when it
    is not vLLM's default ("auto"): ``EngineArgs`` keeps the dict as is and vLLM turns it into a
    ``StructuredOutputsConfig`` only when building ``VllmConfig``."""
    kwargs: dict = {
        "tensor_parallel_size": settings.tensor_parallel_size,
        "max_model_len": settings.max_model_len,
        "limit_mm_per_prompt": {"image": settings.limit_images},
        "mm_processor_kwargs": {"min_pixels": config.min_pixels, "max_pixels": config.max_pixels},
        "enable_prefix_caching": settings.enable_prefix_caching,
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "dtype": config.dtype,
    }
    kwargs.update(_revision_kwargs(config))
    if settings.structured_backend != "auto":
        kwargs["structured_outputs_config"] = {"backend": settings.structured_backend}
    return kwargs


def _revision_kwargs(config: EngineConfig) -> dict:
    """The pinned revision, for the weights and the tokenizer alike (vLLM's ``ModelConfig``)."""
    return {"revision": config.revision, "tokenizer_revision": config.revision} if config.revision else {}


def pinned_chat_template(config: EngineConfig) -> str | None:
    """The chat template of the pinned revision (None when no revision is pinned: the stage then
    reads the model's own, which is the one wanted). Read once on the driver, from a local
    directory or the Hugging Face cache first (``from_pretrained_offline_first``)."""
    if not config.revision:
        return None
    from transformers import AutoProcessor

    from pipelines.compute.weights import from_pretrained_offline_first
    from pipelines.core.stage import StageInputError

    def unavailable(exc: Exception) -> StageInputError:
        return StageInputError(
            f"the chat template of {config.model!r} at revision {config.revision!r} is neither in the Hugging Face "
            f"cache nor reachable ({exc})"
        )

    template = from_pretrained_offline_first(AutoProcessor, config.model, unavailable, config.revision).chat_template
    if not template:
        raise StageInputError(f"{config.model!r} at revision {config.revision!r} has no chat template")
    return template


def processor_config(config: EngineConfig, settings: RayVllmSettings, chat_template: str | None = None):
    """The ``vLLMEngineProcessorConfig`` (returned as such; imported lazily, as ray.data.llm
    pulls in aiohttp and pydantic models the rest of the project never needs). ``chat_template``:
    the pinned revision's (:func:`pinned_chat_template`), None for the model's own."""
    from ray.data.llm import vLLMEngineProcessorConfig

    return vLLMEngineProcessorConfig(
        model_source=config.model,
        engine_kwargs=engine_kwargs(config, settings),
        batch_size=settings.batch_size,
        concurrency=settings.concurrency,
        accelerator_type=settings.accelerator_type,
        runtime_env=settings.runtime_env,
        should_continue_on_error=settings.should_continue_on_error,
        # images need vLLM's multimodal parsing before the chat template (off by default); its
        # ModelConfig reads the same revision and image limit as the engine. "openai": content
        # stays a list of parts (no newline after the image); system messages stay strings
        prepare_multimodal_stage={
            "enabled": True,
            "model_config_kwargs": {
                "limit_mm_per_prompt": {"image": settings.limit_images},
                **_revision_kwargs(config),
            },
            "chat_template_content_format": "openai",
            "apply_sys_msg_formatting": True,
        },
        chat_template_stage={"enabled": True, "chat_template": chat_template},
        # these two stages cannot be given a revision: the engine tokenizes and detokenizes itself
        tokenize_stage=False,
        detokenize_stage=False,
    )


def png_bytes(image: Image.Image) -> bytes:
    """Lossless, so the workers see the pixels the caller had."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def request_row(request: VlmRequest, config: EngineConfig) -> dict:
    """A request as a flat Arrow-friendly row: images as PNG bytes, schema and sampling as JSON."""
    sampling = config.sampling.request_fields(config.max_tokens(request))
    return {
        "id": request.id,
        "system": request.system,
        "prompt": request.prompt,
        "images": [png_bytes(im) for im in request.images],
        "schema": json.dumps(request.schema) if request.schema is not None else None,
        "max_tokens": sampling["max_tokens"],
        "sampling": json.dumps(sampling),
    }


def _image_part(data: bytes) -> dict:
    # An OpenAI image_url part with a data URL: what vLLM's chat parser (PrepareMultimodalStage)
    # decodes itself, and a plain string, so the rows stay Arrow-serialisable.
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}}


def preprocess(row: dict) -> dict:
    """A request row -> ``messages`` (images before the text, as the Qwen-VL models were trained)
    and ``sampling_params``; ``structured_outputs`` only when the request has a schema."""
    # Text as plain strings, parts only where there are images. Ray Data stores rows as Arrow,
    # where a list of parts becomes a list of structs that stages get back as numpy arrays of
    # dicts, each part gaining the other parts' keys as nulls (ChatTemplateStage then renders
    # "<ndarray>"); a string beside a list cannot share one Arrow type, so such rows stay Python
    # objects. PrepareMultimodalStage (vLLM's parser) turns the parts into a string in any case.
    messages = []
    if row.get("system"):
        messages.append({"role": "system", "content": row["system"]})
    images = [_image_part(bytes(data)) for data in row.get("images") or []]
    text = row["prompt"]
    messages.append({"role": "user", "content": [*images, {"type": "text", "text": text}] if images else text})
    # every sampling field, neutral ones included, as the other backends send them
    params = {**json.loads(row["sampling"]), "max_tokens": int(row["max_tokens"])}
    if row.get("schema"):
        # as the JSON string (vLLM's StructuredOutputsParams.json is ``str | dict``): a dict would
        # become an Arrow struct, and rows with different schemas would be unified into one struct
        # type, every schema gaining the others' keys as nulls
        params["structured_outputs"] = {"json": row["schema"]}
    # the PNG bytes already travel inside the messages; don't carry them through every stage twice
    return {"id": row["id"], "messages": messages, "sampling_params": params, "images": None}


def postprocess(row: dict) -> dict:
    """The vLLM stage's output row (or an errored row) -> one response record."""
    error = row.get(ERROR_COLUMN) or None
    if error:
        return {"id": row["id"], "text": None, "prompt_tokens": 0, "completion_tokens": 0, "error": str(error)}
    return {
        "id": row["id"],
        "text": row["generated_text"],
        "prompt_tokens": int(row["num_input_tokens"]),
        "completion_tokens": int(row["num_generated_tokens"]),
        "error": None,
    }


def finalize(row: dict) -> dict:
    """Every output row to the same columns: errored rows skipped our ``postprocess``
    (Ray's ``wrap_postprocess``) and still hold the whole pipeline row."""
    if row.get(ERROR_COLUMN):
        return postprocess(row)
    return {name: row.get(name) for name in OUTPUT_COLUMNS}


class RayVllmEngine(VlmEngine):
    """vLLM engines as Ray Data actors: each ``generate`` call runs one dataset through
    ``build_processor``'s pipeline and waits for all of it (engines start per call, so give it
    large batches: a whole partition's requests)."""

    backend = "ray-vllm"

    def __init__(self, config: EngineConfig, settings: RayVllmSettings):
        self.config = config
        self.settings = settings
        self._chat_template: str | None = None

    def backend_version(self) -> str:
        import ray

        env = self.settings.runtime_env or {}
        pip = env.get("pip") or env.get("uv") or {}
        packages = pip.get("packages", []) if isinstance(pip, dict) else pip
        pins = [p for p in packages if isinstance(p, str) and p.replace(" ", "").startswith("vllm==")]
        # the workers' vLLM cannot be read from the driver without starting them
        vllm = pins[0].replace(" ", "").replace("==", " ") if pins else "vllm (version set by the worker image)"
        return f"{vllm} (ray data llm {ray.__version__})"

    def processor(self):
        """The Ray Data LLM processor (built, not run)."""
        from ray.data.llm import build_processor

        if self._chat_template is None:
            self._chat_template = pinned_chat_template(self.config)
        config = processor_config(self.config, self.settings, self._chat_template)
        return build_processor(config, preprocess=preprocess, postprocess=postprocess)

    def generate(self, requests: Sequence[VlmRequest]) -> list[VlmResponse]:
        if not requests:
            return []
        ids = [r.id for r in requests]
        if len(set(ids)) != len(ids):
            raise ValueError("request ids must be unique: responses are matched to requests by id")
        # a request over the image limit would fail vLLM's message parsing, which is not covered by
        # should_continue_on_error and so would fail the whole dataset: it is refused here instead
        limit = self.settings.limit_images
        refused = {r.id for r in requests if len(r.images) > limit}
        try:
            rows = self._run([request_row(r, self.config) for r in requests if r.id not in refused])
        except Exception as exc:
            if is_outage(exc):
                raise VlmOutage(f"Ray vLLM engine unavailable: {type(exc).__name__}: {exc}") from exc
            if actor_init_failed(exc):
                raise RuntimeError(
                    "a Ray vLLM stage could not start (is vLLM in the workers' environment? see "
                    f"RayVllmSettings.runtime_env and docs/vlm-backends.md): {exc}"
                ) from exc
            raise
        refusal = f"more than {limit} image(s) in one request (RayVllmSettings.limit_images)"
        rows += [{"id": i, "text": None, "prompt_tokens": 0, "completion_tokens": 0, "error": refusal} for i in refused]
        return self._responses(requests, rows)

    def _run(self, rows: list[dict]) -> list[dict]:
        if not rows:
            return []
        import ray

        from pipelines.compute.ray_pool import ensure_ray

        ensure_ray(self.settings.address)
        ds = self.processor()(ray.data.from_items(rows)).map(finalize)
        # fail after start_timeout_s instead of waiting forever for engine actors that cannot be
        # placed (no GPU of the requested type); the dataset carries its own copy of the context
        ds.context.wait_for_min_actors_s = self.settings.start_timeout_s
        return ds.take_all()

    def _responses(self, requests: Sequence[VlmRequest], rows: list[dict]) -> list[VlmResponse]:
        """Rows in request order; a request the pipeline dropped is an error, never a crash."""
        by_id = {row["id"]: row for row in rows}
        out = []
        for request in requests:
            sizes = [model_frame(im.width, im.height, self.config) for im in request.images]
            row = by_id.get(request.id)
            if row is None:
                out.append(
                    VlmResponse(request.id, None, image_sizes=sizes, error="no output row from the Ray pipeline")
                )
                continue
            out.append(
                VlmResponse(
                    request.id,
                    row["text"] if not row["error"] else None,
                    prompt_tokens=int(row["prompt_tokens"] or 0),
                    completion_tokens=int(row["completion_tokens"] or 0),
                    image_sizes=sizes,
                    error=row["error"] or None,
                )
            )
        return out
