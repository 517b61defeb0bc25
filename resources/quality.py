"""Quality thresholds and the concept taxonomy: what every asset check and label stage shares."""

from __future__ import annotations

from dagster import ConfigurableResource


class QualityResource(ConfigurableResource):
    """``max_error_rate`` (``PANELFORGE_MAX_ERROR_RATE``): the share of failed items above which
    a stage's blocking ``error_rate`` check fails; ``taxonomy`` (``PANELFORGE_TAXONOMY``): an
    extra JSON taxonomy merged into the shipped one."""

    max_error_rate: float = 0.05
    taxonomy: str | None = None
