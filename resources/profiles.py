"""Resources per profile, in one place: what each asset talks to, built from :class:`Settings`.

Profiles only change defaults (``PROFILE_DEFAULTS`` in ``resources/settings.py``):

=====================  ===========================  ======================  ======================
resource               demo                         local                   cluster
=====================  ===========================  ======================  ======================
lake                   ./data, 4 shards             ./data, 256 shards      PANELFORGE_HOME (s3://)
pmc_source             sample mirror on disk        s3://pmc-oa-opendata    s3://pmc-oa-opendata (340/s, 64 in flight)
eutils                 recorded answers, loopback   NCBI                    NCBI (+ NCBI_API_KEY)
models                 tiny random (synthetic)      DINOv2 by id or path    DINOv2 by id or path
ray                    in-process, CPU              in-process, CPU         PANELFORGE_RAY_ADDRESS, 1 GPU/actor
hub                    dry runs only (no repo)      PANELFORGE_HF_REPO      PANELFORGE_HF_REPO
quality                max error rate 5%            5%                      5%
launcher               subprocess, CPU              subprocess              Ray (PANELFORGE_RAY_ADDRESS)
vlm                    tiny random Qwen2.5-VL, CPU  transformers (one GPU)  vLLM on Ray Data (Qwen2.5-VL-7B)
=====================  ===========================  ======================  ======================

Secrets are passed as ``EnvVar`` when set, so Dagster resolves them in the run's process and
shows only the variable's name.
"""

from __future__ import annotations

import os

from dagster import EnvVar

from resources.compute import ModelsResource, RayResource
from resources.eutils import EutilsResource
from resources.hub import HuggingFaceHubResource
from resources.lake import LakeResource
from resources.launcher import JobLauncherResource
from resources.pmc_source import PmcSourceResource
from resources.quality import QualityResource
from resources.settings import Settings
from resources.vlm import VlmEngineResource


def _secret(name: str) -> EnvVar | None:
    return EnvVar(name) if os.environ.get(name) else None


# The tiny random model answers nonsense at any length: short answers and a small pixel band
SYNTHETIC_VLM = {"max_tokens": 48, "min_pixels": 64 * 28 * 28, "max_pixels": 256 * 28 * 28, "dtype": "float32"}


def build_resources(settings: Settings | None = None) -> dict:
    settings = settings or Settings.from_env()
    return {
        "lake": LakeResource(home=settings.home, shards=settings.shards),
        "models": ModelsResource(
            dinov2=settings.dinov2_model,
            synthetic=settings.synthetic,
            panel_detector=settings.panel_detector,
            text_tokenizer=settings.text_tokenizer,
            text_context=settings.text_context,
        ),
        "ray": RayResource(
            address=settings.ray_address,
            actors=settings.ray_actors,
            gpus_per_actor=settings.gpus_per_actor,
            actor_resources=dict(settings.ray_actor_resources),
            outage_retries=settings.outage_retries,
            outage_retry_delay_s=settings.outage_retry_delay_s,
        ),
        "eutils": EutilsResource(
            base_url=settings.eutils_url,
            recorded=settings.eutils_recorded,
            email=settings.ncbi_email,
            api_key=_secret("NCBI_API_KEY"),
            outage_retries=settings.outage_retries,
            outage_retry_delay_s=settings.outage_retry_delay_s,
        ),
        "hub": HuggingFaceHubResource(repo_id=settings.hf_repo, token=_secret("HF_TOKEN")),
        "pmc_source": PmcSourceResource(
            url=settings.pmc_source,
            rate_limit=settings.source_policy().rate,
            concurrency=settings.source_policy().concurrency,
            hosts=settings.source_policy().hosts,
            rate_dir=settings.rate_dir,
            ftp_user=settings.ftp_user,
            ftp_password=_secret("PANELFORGE_FTP_PASSWORD"),
            outage_retries=settings.outage_retries,
            outage_retry_delay_s=settings.outage_retry_delay_s,
        ),
        "quality": QualityResource(max_error_rate=settings.max_error_rate, taxonomy=settings.taxonomy),
        "launcher": JobLauncherResource(
            backend=settings.launcher, gpus=settings.job_gpus, ray_address=settings.ray_address
        ),
        "vlm": VlmEngineResource(
            backend=settings.vlm_backend,
            model=settings.vlm_model,
            revision=settings.vlm_revision,
            synthetic=settings.synthetic,
            base_url=settings.vlm_url,
            api_key=_secret("PANELFORGE_VLM_API_KEY"),
            ray_address=settings.ray_address,
            replicas=settings.vlm_replicas,
            tensor_parallel_size=settings.vlm_tensor_parallel,
            vllm_env=settings.vllm_env,
            outage_retries=settings.outage_retries,
            outage_retry_delay_s=settings.outage_retry_delay_s,
            **SYNTHETIC_VLM if settings.synthetic else {},
        ),
    }
