"""The Hugging Face Hub as a resource. The token arrives as ``EnvVar("HF_TOKEN")``: Dagster
resolves it in the run's process and shows only the variable's name."""

from __future__ import annotations

from dagster import ConfigurableResource


class HuggingFaceHubResource(ConfigurableResource):
    """``repo_id`` from ``PANELFORGE_HF_REPO`` (a dataset repository, created private by default)."""

    repo_id: str | None = None
    token: str | None = None
    private: bool = True

    def client(self):
        """An ``HfApi`` holding the token, or None without one (nothing can be uploaded)."""
        if not self.token:
            return None
        from huggingface_hub import HfApi

        return HfApi(token=self.token)
