"""The configuration contract: every environment variable PanelForge reads, read here only.

``Settings.from_env`` reads and validates them once, naming the variable in every error, so
``PANELFORGE_SHARDS=0`` fails when the code location loads, not deep inside a run. Profiles
(``PANELFORGE_PROFILE``) only change defaults: the table is ``PROFILE_DEFAULTS``. Secrets
(``PANELFORGE_FTP_PASSWORD``, ``NCBI_API_KEY``, ``HF_TOKEN``) are not settings: they reach
resources as ``dagster.EnvVar`` (see ``resources/profiles.py``), so they are resolved in the
run's process and never appear in run configuration, the launchpad or logs.
"""

from __future__ import annotations

import json
import os
import tempfile
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.acquire.source import S3_GET_PER_PREFIX, SourcePolicy, source_policy
from pipelines.core.errors import StageInputError

PROFILES = ("demo", "local", "cluster")
REPO = Path(__file__).resolve().parents[1]
DEMO_DIR = REPO / ".demo"
DEFAULT_EUTILS_URL = "https://eutils.ncbi.nlm.nih.gov/entrez/eutils"
DEFAULT_DINOV2 = "facebook/dinov2-large"
DEFAULT_PANEL_DETECTOR = "vector-institute/pmc-18m-dab-detr"
SOURCE_SCHEMES = ("s3", "http", "https", "ftp", "file")

# What a profile changes; everything else has one default. Columns: demo, local, cluster.
PROFILE_DEFAULTS: dict[str, dict[str, object]] = {
    "PANELFORGE_SHARDS": {"demo": 4, "local": 256, "cluster": 256},
    "PANELFORGE_PMC_SOURCE": {
        "demo": (DEMO_DIR / "mirror" / "cloud").as_uri(),  # the sample mirror `make demo` builds
        "local": "s3://pmc-oa-opendata",
        "cluster": "s3://pmc-oa-opendata",
    },
    "PANELFORGE_CONCURRENCY": {"demo": 4, "local": 4, "cluster": 8},
    "PANELFORGE_SYNTHETIC": {"demo": True, "local": False, "cluster": False},
    "PANELFORGE_GPUS_PER_ACTOR": {"demo": 0.0, "local": 0.0, "cluster": 1.0},
    "PANELFORGE_LAUNCHER": {"demo": "subprocess", "local": "subprocess", "cluster": "ray"},
    "PANELFORGE_VLM_BACKEND": {"demo": "transformers", "local": "transformers", "cluster": "ray"},
    # a run's steps in its own process on the demo's one small machine, a process per step elsewhere
    "PANELFORGE_EXECUTOR": {"demo": "in_process", "local": "multiprocess", "cluster": "multiprocess"},
}
LAUNCHERS = ("subprocess", "ray", "kubernetes")
EXECUTORS = ("multiprocess", "in_process")  # Dagster's default executor's two modes (jobs/pools.py)
VLM_BACKENDS = ("transformers", "openai", "ray")  # where the mining model runs (resources/vlm.py)
DEFAULT_VLM = "Qwen/Qwen2.5-VL-7B-Instruct"  # where training and evaluation jobs run (resources/launcher.py)


class SettingsError(StageInputError, ValueError):
    """A variable has a value PanelForge cannot use; the message names it."""


@dataclass(frozen=True)
class Settings:
    """Every setting, validated. Build one with :meth:`from_env` (or directly, in tests)."""

    profile: str = "local"
    home: str = "./data"
    shards: int = 256
    pmc_source: str = "s3://pmc-oa-opendata"
    rate_limit: float | None = None
    concurrency: int = 4
    cloud_rps: float | None = None
    cloud_concurrency: int | None = None
    cloud_hosts: int = 1
    rate_dir: str = str(Path(tempfile.gettempdir()) / "panelforge-ratelimit")
    ftp_user: str = "anonymous"
    eutils_url: str = DEFAULT_EUTILS_URL
    eutils_recorded: bool = False  # demo profile, no NCBI_EUTILS_URL: recorded answers, never NCBI
    ncbi_email: str | None = None
    dinov2_model: str = DEFAULT_DINOV2
    panel_detector: str | None = DEFAULT_PANEL_DETECTOR
    synthetic: bool = False
    ray_address: str | None = None
    ray_actors: int = 1
    gpus_per_actor: float = 0.0
    ray_actor_resources: dict[str, float] = field(default_factory=dict)
    taxonomy: str | None = None
    hf_repo: str | None = None
    max_error_rate: float = 0.05
    gpu_slots: int = 1
    outage_retries: int = 3
    outage_retry_delay_s: float = 300.0
    automation_interval_s: int = 30
    executor: str = "multiprocess"

    launcher: str = "subprocess"
    job_gpus: int = 0
    vlm_backend: str = "transformers"
    vlm_model: str = DEFAULT_VLM
    vlm_revision: str | None = None
    vlm_url: str | None = None
    vlm_replicas: int = 1
    vlm_tensor_parallel: int = 1
    vllm_env: str = "pip"
    text_tokenizer: str = "openclip"
    text_context: int = 512

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = _Env(os.environ if environ is None else environ)
        profile = env.get("PANELFORGE_PROFILE") or "local"
        if profile not in PROFILES:
            raise SettingsError(f"PANELFORGE_PROFILE must be one of {PROFILES}, got {profile!r}")
        env.profile = profile
        return cls(
            profile=profile,
            home=env.get("PANELFORGE_HOME") or "./data",
            shards=env.integer("PANELFORGE_SHARDS", minimum=1),
            pmc_source=_source_url(env.text("PANELFORGE_PMC_SOURCE")),
            rate_limit=env.number("PANELFORGE_RATE_LIMIT", None, positive=True),
            concurrency=env.integer("PANELFORGE_CONCURRENCY", minimum=1),
            cloud_rps=env.number("PANELFORGE_CLOUD_RPS", None, positive=True),
            cloud_concurrency=_optional_integer(env, "PANELFORGE_CLOUD_CONCURRENCY"),
            cloud_hosts=env.integer("PANELFORGE_CLOUD_HOSTS", minimum=1, default=1),
            rate_dir=env.get("PANELFORGE_RATE_DIR") or cls.rate_dir,
            ftp_user=env.get("PANELFORGE_FTP_USER") or "anonymous",
            eutils_url=_http_url("NCBI_EUTILS_URL", env.get("NCBI_EUTILS_URL") or DEFAULT_EUTILS_URL),
            eutils_recorded=profile == "demo" and env.get("NCBI_EUTILS_URL") is None,
            ncbi_email=env.get("NCBI_EMAIL") or None,
            dinov2_model=env.get("PANELFORGE_DINOV2_MODEL") or DEFAULT_DINOV2,
            panel_detector=_detector(env.get("PANELFORGE_PANEL_DETECTOR")),
            synthetic=env.flag("PANELFORGE_SYNTHETIC"),
            ray_address=env.get("PANELFORGE_RAY_ADDRESS") or None,
            ray_actors=env.integer("PANELFORGE_RAY_ACTORS", minimum=1, default=1),
            gpus_per_actor=env.number("PANELFORGE_GPUS_PER_ACTOR", minimum=0.0),
            ray_actor_resources=_ray_resources(env.get("PANELFORGE_RAY_ACTOR_RESOURCES")),
            taxonomy=_existing_file("PANELFORGE_TAXONOMY", env.get("PANELFORGE_TAXONOMY")),
            hf_repo=env.get("PANELFORGE_HF_REPO") or None,
            max_error_rate=env.number("PANELFORGE_MAX_ERROR_RATE", 0.05, minimum=0.0, maximum=1.0),
            gpu_slots=env.integer("PANELFORGE_GPU_SLOTS", minimum=1, default=1),
            outage_retries=env.integer("PANELFORGE_OUTAGE_RETRIES", minimum=0, default=3),
            outage_retry_delay_s=env.number("PANELFORGE_OUTAGE_RETRY_DELAY", 300.0, minimum=0.0),
            automation_interval_s=env.integer("PANELFORGE_AUTOMATION_INTERVAL", minimum=1, default=30),
            executor=_one_of("PANELFORGE_EXECUTOR", env.text("PANELFORGE_EXECUTOR"), EXECUTORS),
            launcher=_one_of("PANELFORGE_LAUNCHER", env.text("PANELFORGE_LAUNCHER"), LAUNCHERS),
            job_gpus=env.integer("PANELFORGE_JOB_GPUS", minimum=0, default=0),
            vlm_backend=_one_of("PANELFORGE_VLM_BACKEND", env.text("PANELFORGE_VLM_BACKEND"), VLM_BACKENDS),
            vlm_model=env.get("PANELFORGE_VLM_MODEL") or DEFAULT_VLM,
            vlm_revision=env.get("PANELFORGE_VLM_REVISION") or None,
            vlm_url=_vlm_url(env),
            vlm_replicas=env.integer("PANELFORGE_VLM_REPLICAS", minimum=1, default=1),
            vlm_tensor_parallel=env.integer("PANELFORGE_VLM_TENSOR_PARALLEL", minimum=1, default=1),
            vllm_env=_vllm_env(env.get("PANELFORGE_VLLM_ENV") or "pip"),
            text_tokenizer=_tokenizer(env.get("PANELFORGE_TEXT_TOKENIZER") or "openclip"),
            text_context=env.integer("PANELFORGE_TEXT_CONTEXT", minimum=8, default=512),
        )._checked_source_policy()

    @property
    def is_cloud_bucket(self) -> bool:
        return urllib.parse.urlsplit(self.pmc_source).scheme == "s3"

    def source_policy(self) -> SourcePolicy:
        """The rate, in-flight requests and downloading hosts for ``pmc_source``: the AWS bucket
        has its own settings (``PANELFORGE_CLOUD_*``); mirrors keep the strict ones."""
        if self.is_cloud_bucket:
            rate = self.cloud_rps or self.rate_limit
            return source_policy(self.pmc_source, rate, self.cloud_concurrency, self.cloud_hosts)
        return source_policy(self.pmc_source, self.rate_limit, self.concurrency)

    def _checked_source_policy(self) -> Settings:
        """Refuse a cluster that could send one partitioned S3 prefix more than AWS documents it
        serves, and several hosts against a mirror whose limit is not per host."""
        if not self.is_cloud_bucket:
            if self.cloud_hosts > 1:
                raise SettingsError(
                    f"PANELFORGE_CLOUD_HOSTS={self.cloud_hosts} applies only to an s3:// source; "
                    f"{self.pmc_source} is downloaded by one host at a time"
                )
            return self
        policy = self.source_policy()
        if policy.cluster_rate > S3_GET_PER_PREFIX:
            raise SettingsError(
                f"PANELFORGE_CLOUD_HOSTS x PANELFORGE_CLOUD_RPS = {self.cloud_hosts} x {policy.rate:g} = "
                f"{policy.cluster_rate:g} requests/s exceeds S3's {S3_GET_PER_PREFIX} GET/s per prefix"
            )
        return self


class _Env:
    """Typed, validated reads of one environment; profile defaults from ``PROFILE_DEFAULTS``."""

    def __init__(self, environ: Mapping[str, str]):
        self.environ, self.profile = environ, "local"

    def get(self, name: str) -> str | None:
        value = self.environ.get(name)
        return value.strip() if value is not None and value.strip() else None

    def _default(self, name: str, default: object) -> object:
        return PROFILE_DEFAULTS[name][self.profile] if name in PROFILE_DEFAULTS else default

    def text(self, name: str) -> str:
        return self.get(name) or str(self._default(name, ""))

    def integer(self, name: str, minimum: int, default: int | None = None) -> int:
        raw = self.get(name)
        if raw is None:
            return int(self._default(name, default))
        try:
            value = int(raw)
        except ValueError:
            raise SettingsError(f"{name} must be a whole number, got {raw!r}") from None
        if value < minimum:
            raise SettingsError(f"{name} must be at least {minimum}, got {value}")
        return value

    def number(
        self,
        name: str,
        default: float | None = 0.0,
        minimum: float | None = None,
        maximum: float | None = None,
        positive: bool = False,
    ) -> float | None:
        raw = self.get(name)
        if raw is None:
            value = self._default(name, default)
            return None if value is None else float(value)
        try:
            value = float(raw)
        except ValueError:
            raise SettingsError(f"{name} must be a number, got {raw!r}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise SettingsError(f"{name} must be a finite number, got {raw!r}")
        if positive and value <= 0:
            raise SettingsError(f"{name} must be greater than 0, got {raw!r}")
        if minimum is not None and value < minimum:
            raise SettingsError(f"{name} must be at least {minimum}, got {raw!r}")
        if maximum is not None and value > maximum:
            raise SettingsError(f"{name} must be at most {maximum}, got {raw!r}")
        return value

    def flag(self, name: str) -> bool:
        raw = self.get(name)
        if raw is None:
            return bool(self._default(name, False))
        if raw.lower() not in ("0", "1", "true", "false", "yes", "no"):
            raise SettingsError(f"{name} must be 1 or 0, got {raw!r}")
        return raw.lower() in ("1", "true", "yes")


def _optional_integer(env: _Env, name: str) -> int | None:
    return env.integer(name, minimum=1) if env.get(name) is not None else None


def _ray_resources(raw: str | None) -> dict[str, float]:
    """A JSON object of Ray custom resources per actor, e.g. ``{"a100": 1}``. Checked here because
    Ray would only refuse it inside a run, after the partition's images were read."""
    name = "PANELFORGE_RAY_ACTOR_RESOURCES"
    if raw is None:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        raise SettingsError(f'{name} must be a JSON object such as {{"gpu_like": 1}}, got {raw!r}') from None
    if not isinstance(value, dict):
        raise SettingsError(f'{name} must be a JSON object such as {{"gpu_like": 1}}, got {raw!r}')
    resources = {}
    for key, amount in value.items():
        if key in ("CPU", "GPU", "memory", "object_store_memory"):
            raise SettingsError(f"{name} names Ray's own resource {key!r}: use PANELFORGE_GPUS_PER_ACTOR for GPUs")
        if isinstance(amount, bool) or not isinstance(amount, int | float) or not 0 < amount < float("inf"):
            raise SettingsError(f"{name}: {key!r} must be a positive number, got {amount!r}")
        resources[str(key)] = float(amount)
    return resources


def _source_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in SOURCE_SCHEMES:
        raise SettingsError(f"PANELFORGE_PMC_SOURCE must start with one of {SOURCE_SCHEMES} ://, got {url!r}")
    if parts.username or parts.password:
        raise SettingsError(
            "PANELFORGE_PMC_SOURCE must not hold credentials: set PANELFORGE_FTP_USER and PANELFORGE_FTP_PASSWORD"
        )
    if parts.scheme == "file" and not parts.path:
        raise SettingsError(f"PANELFORGE_PMC_SOURCE names no directory: {url!r}")
    if parts.scheme != "file" and not parts.netloc:
        what = "bucket" if parts.scheme == "s3" else "host"
        raise SettingsError(f"PANELFORGE_PMC_SOURCE names no {what}: {url!r} (e.g. s3://pmc-oa-opendata)")
    return url


def _http_url(name: str, url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SettingsError(f"{name} must be an http(s):// URL, got {url!r}")
    return url


def _vlm_url(env: _Env) -> str | None:
    """The OpenAI-compatible server of the ``openai`` backend (``.../v1`` or its root)."""
    url = env.get("PANELFORGE_VLM_URL")
    if url is not None:
        url = _http_url("PANELFORGE_VLM_URL", url)
    elif env.text("PANELFORGE_VLM_BACKEND") == "openai":
        raise SettingsError(
            "PANELFORGE_VLM_BACKEND=openai needs PANELFORGE_VLM_URL (the server, e.g. http://host:8000)"
        )
    return url


def _tokenizer(spec: str) -> str:
    """The text encoder's tokenizer: ``openclip``, ``hf:<id or local path>`` or ``tiny``."""
    if spec in ("openclip", "tiny") or (spec.startswith("hf:") and len(spec) > 3):
        return spec
    raise SettingsError(f"PANELFORGE_TEXT_TOKENIZER must be openclip, tiny or hf:<id or path>, got {spec!r}")


def _vllm_env(spec: str) -> str:
    """How vLLM reaches the Ray workers: ``pip`` (Ray installs it), ``image`` (the workers have
    it) or the absolute path of a Python that has it (a second venv in the worker image); checked
    by the function that turns it into the LLM stages' ``runtime_env``."""
    from pipelines.vlm.ray_llm import runtime_env_for

    try:
        runtime_env_for(spec)
    except ValueError:
        raise SettingsError(
            f"PANELFORGE_VLLM_ENV must be pip, image or the absolute path of a Python, got {spec!r}"
        ) from None
    return spec


def _detector(value: str | None) -> str | None:
    """``none`` (or ``off``) runs the weight-free layout splitter alone."""
    if value is None:
        return DEFAULT_PANEL_DETECTOR
    return None if value.lower() in ("none", "off") else value


def _existing_file(name: str, path: str | None) -> str | None:
    if path is not None and not Path(path).is_file():
        raise SettingsError(f"{name} names no file: {path!r}")
    return path


def _one_of(name: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise SettingsError(f"{name} must be one of {choices}, got {value!r}")
    return value
