"""Where the README documents ``assign_captions``; the code lives in :mod:`pipelines.text.pairing`.

Kept so that documented imports keep working; PanelForge's own modules import :mod:`pipelines.text.pairing`
(``[tool.importlinter]`` forbids them this path)."""

from pipelines.text.pairing import *  # noqa: F403
