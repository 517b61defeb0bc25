"""Where the README documents ``split_caption``; the code lives in :mod:`pipelines.text.captions`.

Kept so that documented imports keep working; PanelForge's own modules import :mod:`pipelines.text.captions`
(``[tool.importlinter]`` forbids them this path)."""

from pipelines.text.captions import *  # noqa: F403
