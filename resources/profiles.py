"""Resources per profile (``PANELFORGE_PROFILE``): demo, local and cluster differ only in defaults."""

from __future__ import annotations

from resources import settings
from resources.compute import ModelsResource, RayResource
from resources.eutils import EutilsResource
from resources.hub import HuggingFaceHubResource
from resources.lake import LakeResource
from resources.pmc_source import PmcSourceResource


def build_resources() -> dict:
    settings.profile()  # validate early: a typo fails the code location load, not a run
    return {
        "lake": LakeResource(home=settings.lake_home()),
        "models": ModelsResource(dinov2=settings.dinov2_model(), synthetic=settings.synthetic_models()),
        "ray": RayResource(**settings.ray_settings()),
        "eutils": EutilsResource(base_url=settings.eutils_url(), email=settings.ncbi_email()),
        "hub": HuggingFaceHubResource(repo_id=settings.hf_repo()),
        "pmc_source": PmcSourceResource(
            url=settings.pmc_source_url(), rate_limit=settings.rate_limit(), concurrency=settings.concurrency()
        ),
    }
