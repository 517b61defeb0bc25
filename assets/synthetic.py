"""What the synthetic profile (``make demo``, ``make ui``) changes in the training and evaluation
assets: the tiny local models the tests use instead of published weights, and demo sizes (a few
CPU steps) for every setting a person left at its production default, so each asset can be
clicked in the demo's UI and finishes in seconds. What they produce is marked synthetic."""

from __future__ import annotations

from typing import Any, TypeVar

from dagster import Config

from pipelines.training import tiny

SettingsT = TypeVar("SettingsT", bound=Config)


def synthetic_settings(config: SettingsT, sizes: dict[str, Any]) -> SettingsT:
    """``config`` with ``sizes`` in place of every setting still at its class default (a value a
    person set in the launchpad is kept)."""
    defaults = type(config)()
    return config.model_copy(update={k: v for k, v in sizes.items() if getattr(config, k) == getattr(defaults, k)})


def synthetic_models(lake_path: str) -> tuple[str, str]:
    """The tiny OpenCLIP model (``local-dir:``) and tiny ModernBERT (a folder) under ``lake_path``,
    built once; their folders carry the synthetic marker."""
    return f"local-dir:{tiny.tiny_clip_dir(lake_path)}", str(tiny.tiny_text_tower_dir(lake_path))
