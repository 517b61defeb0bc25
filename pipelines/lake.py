"""Where the README documents ``Lake``; the code lives in :mod:`pipelines.core.lake`.

Kept so that documented imports keep working; PanelForge's own modules import :mod:`pipelines.core.lake`
(``[tool.importlinter]`` forbids them this path)."""

from pipelines.core.lake import *  # noqa: F403
