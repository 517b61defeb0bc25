"""The configuration contract: environment variables and the resource profiles they select.

========================  ==============================================  ======================
variable                  meaning                                         default
========================  ==============================================  ======================
PANELFORGE_HOME           lake root, local path or fsspec URL             ./data
PANELFORGE_PMC_SOURCE     s3://..., https://..., ftp://..., file://...    s3://pmc-oa-opendata
PANELFORGE_RATE_LIMIT     requests/s against the source                   3 (ftp), 20 (cloud)
PANELFORGE_PROFILE        demo, local or cluster                          local
PANELFORGE_SHARDS         shards per release (fixed per deployment)       256 (demo: 4)
PANELFORGE_CONCURRENCY    parallel transfers per download run             4 (cluster: 8)
NCBI_EUTILS_URL           E-utilities base URL                            NCBI's
NCBI_EMAIL                contact e-mail sent to NCBI                     none
NCBI_API_KEY              secret: read at use, never config or logs       none (3 req/s)
PANELFORGE_DINOV2_MODEL   DINOv2 weights: model id or local directory     facebook/dinov2-large
PANELFORGE_SYNTHETIC      1: tiny random models, outputs marked           1 in demo, else 0
PANELFORGE_RAY_ADDRESS    Ray cluster address; unset starts Ray locally   unset
PANELFORGE_RAY_ACTORS     embedding actors (model replicas) per run       1
PANELFORGE_GPUS_PER_ACTOR GPUs per actor                                  0 (cluster: 1)
PANELFORGE_HF_REPO        Hugging Face dataset repository for releases    unset (upload refused)
HF_TOKEN                  secret: read at use, never config or logs       none
========================  ==============================================  ======================
"""

from __future__ import annotations

import os
from pathlib import Path

from pipelines.partitioning import DEFAULT_SHARDS

PROFILES = ("demo", "local", "cluster")
REPO = Path(__file__).resolve().parents[1]
DEMO_DIR = REPO / ".demo"


def profile() -> str:
    value = os.environ.get("PANELFORGE_PROFILE", "local")
    if value not in PROFILES:
        raise ValueError(f"PANELFORGE_PROFILE must be one of {PROFILES}, got {value!r}")
    return value


def n_shards() -> int:
    """Shards per release; changing it re-partitions everything, so set it once per lake."""
    default = 4 if profile() == "demo" else DEFAULT_SHARDS
    return int(os.environ.get("PANELFORGE_SHARDS", default))


def lake_home() -> str:
    return os.environ.get("PANELFORGE_HOME", "./data")


def pmc_source_url() -> str:
    if "PANELFORGE_PMC_SOURCE" in os.environ:
        return os.environ["PANELFORGE_PMC_SOURCE"]
    if profile() == "demo":  # the sample mirror that `make demo` builds, read from disk
        return (DEMO_DIR / "mirror" / "cloud").as_uri()
    return "s3://pmc-oa-opendata"


def rate_limit() -> float | None:
    value = os.environ.get("PANELFORGE_RATE_LIMIT")
    return float(value) if value else None


def concurrency() -> int:
    return int(os.environ.get("PANELFORGE_CONCURRENCY", 8 if profile() == "cluster" else 4))


def eutils_url() -> str:
    from pipelines.entrez.client import DEFAULT_EUTILS_URL

    return os.environ.get("NCBI_EUTILS_URL", DEFAULT_EUTILS_URL)


def ncbi_email() -> str | None:
    return os.environ.get("NCBI_EMAIL") or None


def dinov2_model() -> str:
    from pipelines.concepts.dinov2 import DEFAULT_MODEL

    return os.environ.get("PANELFORGE_DINOV2_MODEL", DEFAULT_MODEL)


def synthetic_models() -> bool:
    return os.environ.get("PANELFORGE_SYNTHETIC", "1" if profile() == "demo" else "0") == "1"


def ray_settings() -> dict:
    return {
        "address": os.environ.get("PANELFORGE_RAY_ADDRESS") or None,
        "actors": int(os.environ.get("PANELFORGE_RAY_ACTORS", 1)),
        "gpus_per_actor": float(os.environ.get("PANELFORGE_GPUS_PER_ACTOR", 1 if profile() == "cluster" else 0)),
    }


def hf_repo() -> str | None:
    return os.environ.get("PANELFORGE_HF_REPO") or None
