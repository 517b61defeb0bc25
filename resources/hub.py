"""The Hugging Face Hub as a resource. The token is read from ``HF_TOKEN`` at use time only: it
is no config field, so it never shows in the launchpad, run config or logs."""

from __future__ import annotations

from dagster import ConfigurableResource

from pipelines.release.hub import hub_token


class HuggingFaceHubResource(ConfigurableResource):
    """``repo_id`` from ``PANELFORGE_HF_REPO`` (a dataset repository, created private by default)."""

    repo_id: str | None = None
    private: bool = True

    def client(self):
        from huggingface_hub import HfApi

        return HfApi(token=hub_token())
