"""The vision-language model engine as a resource: one interface, the backend chosen per profile.

==============  =======================================  ==========================================
backend         where the model runs                     when
==============  =======================================  ==========================================
transformers    in the run's process (one GPU, or CPU)   demo and tests (a tiny random model), one GPU
openai          any OpenAI-compatible server             ``vllm serve`` / SGLang you run yourself
ray             vLLM in Ray Data actors on the cluster   production backfills (``PANELFORGE_RAY_ADDRESS``)
==============  =======================================  ==========================================

``synthetic`` builds a tiny randomly initialised Qwen2.5-VL (tokenizer and processor made in
code, no download) into the lake once and uses it; everything mined with it is marked
``synthetic``. The server's API key is a secret: it comes from ``PANELFORGE_VLM_API_KEY`` as an
``EnvVar`` and never appears in configuration or logs.

An engine that cannot be reached (``VlmOutage``: connection refused, requests past their
deadline or 5xx after the engine's own retries, dead Ray actors) fails the step, which Dagster
retries ``outage_retries`` times, ``outage_retry_delay_s`` apart (``PANELFORGE_OUTAGE_RETRIES``,
``PANELFORGE_OUTAGE_RETRY_DELAY``, shared with the PMC source and NCBI); no item is marked failed.
"""

from __future__ import annotations

from dagster import ConfigurableResource

from pipelines.vlm.engine import QWEN2_5_VL, QWEN2_VL, QWEN3_VL, EngineConfig, Sampling, VlmEngine
from resources.settings import DEFAULT_VLM, VLM_BACKENDS

BACKENDS = VLM_BACKENDS  # DEFAULT_VLM is the 7B model; Qwen/Qwen2.5-VL-72B-Instruct for the paper's quality


def family_of(model: str) -> str:
    """The grounding convention of a model, from its name (Qwen2.5-VL: resized pixels;
    Qwen2-VL and Qwen3-VL: a 0–1000 grid)."""
    name = model.lower().replace("_", "").replace("-", "").replace(".", "")
    if "qwen3vl" in name:
        return QWEN3_VL
    if "qwen25vl" in name:
        return QWEN2_5_VL
    if "qwen2vl" in name:
        return QWEN2_VL
    return QWEN2_5_VL


class VlmEngineResource(ConfigurableResource):
    """Model, revision, dtype, pixel band and sampling are configuration; ``family`` empty means
    inferred from the model's name."""

    backend: str = "transformers"
    model: str = DEFAULT_VLM
    revision: str | None = None
    family: str = ""
    dtype: str = "bfloat16"
    min_pixels: int = 256 * 28 * 28
    max_pixels: int = 1280 * 28 * 28
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    # a cap on every answer, above each prompt's own budget (LongCAP's, the largest, is 10,066
    # tokens: pipelines/longcap/prompts.py) and below vLLM's 16,384-token context; the tiny
    # synthetic model, which never stops on its own, runs with 48
    max_tokens: int = 12288
    seed: int = 0
    synthetic: bool = False
    # a step that found the engine unreachable is retried this often, this long apart
    outage_retries: int = 0
    outage_retry_delay_s: float = 300.0
    # transformers: "auto" = every visible GPU (the model sharded across them when there are
    # several), else one device ("cuda:1", "cpu")
    device: str = "auto"
    batch_size: int = 8
    # openai: timeout_s is one request's deadline, whole; a silent server costs (retries + 1) x it
    base_url: str | None = None
    api_key: str | None = None
    concurrency: int = 8
    timeout_s: float = 120.0
    retries: int = 2
    structured: str = "structured_outputs"
    check_frame: bool = True  # refuse a server whose pixel band differs (pipelines/vlm/frame_check.py)
    # ray
    ray_address: str | None = None
    replicas: int = 1
    tensor_parallel_size: int = 1
    accelerator_type: str | None = None
    vllm_env: str = "pip"

    def engine_config(self, model: str | None = None) -> EngineConfig:
        model = model or self.model
        return EngineConfig(
            model=model,
            revision=self.revision,
            family=self.family or family_of(model),
            dtype=self.dtype,
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
            sampling=Sampling(
                temperature=self.temperature,
                top_p=self.top_p,
                top_k=self.top_k,
                min_p=self.min_p,
                repetition_penalty=self.repetition_penalty,
                max_tokens=self.max_tokens,
                seed=self.seed,
            ),
            synthetic=self.synthetic,
        )

    def check_weights(self) -> None:
        """The weights are where ``model`` says, found without the network (online, the hub has
        the id): checked before an engine starts, so a wrong path fails here in one line naming
        ``PANELFORGE_VLM_MODEL`` and the ``hf download`` command, not minutes later inside Ray."""
        from pipelines.vlm.hf import vlm_weights

        vlm_weights(self.model, self.revision).config_file()

    def engine(self, cache_dir: str | None = None) -> VlmEngine:
        """A started engine (close it, or use it as a context manager). ``cache_dir``: where the
        tiny synthetic model is built once (a local directory)."""
        if self.backend not in BACKENDS:
            raise ValueError(f"VLM backend must be one of {BACKENDS}, not {self.backend!r}")
        if self.synthetic:
            if self.backend != "transformers":
                raise ValueError("the synthetic tiny model runs only on the transformers backend")
            if cache_dir is None:
                raise ValueError("a synthetic engine needs a cache directory for its tiny model")
            from pipelines.vlm.tiny import tiny_model_dir

            config = self.engine_config(str(tiny_model_dir(cache_dir)))
        else:
            config = self.engine_config()
            if self.backend != "openai":  # a served model is the server's business
                self.check_weights()
        if self.backend == "transformers":
            from pipelines.vlm.hf import TransformersEngine

            return TransformersEngine(config, device=self.device, batch_size=self.batch_size)
        if self.backend == "openai":
            if not self.base_url:
                raise ValueError("the openai backend needs base_url (PANELFORGE_VLM_URL)")
            from pipelines.vlm.openai_http import OpenAIEngine

            return OpenAIEngine(
                config,
                self.base_url,
                api_key=self.api_key,
                concurrency=self.concurrency,
                timeout_s=self.timeout_s,
                retries=self.retries,
                structured=self.structured,
                check_frame=self.check_frame,
            )
        from pipelines.vlm.ray_llm import RayVllmEngine, RayVllmSettings, runtime_env_for

        settings = RayVllmSettings(
            address=self.ray_address,
            concurrency=self.replicas,
            tensor_parallel_size=self.tensor_parallel_size,
            accelerator_type=self.accelerator_type,
            batch_size=self.batch_size,
            runtime_env=runtime_env_for(self.vllm_env),
        )
        return RayVllmEngine(config, settings)
