"""Where the README documents ``crop_gate``, ``GateSettings``; the code lives in :mod:`pipelines.images.gate`.

Kept so that documented imports keep working; PanelForge's own modules import :mod:`pipelines.images.gate`
(``[tool.importlinter]`` forbids them this path)."""

from pipelines.images.gate import *  # noqa: F403
