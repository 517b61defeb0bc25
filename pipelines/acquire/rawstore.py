"""Where the README documents ``read_raw_file``, ``RawReader``; the code lives in :mod:`pipelines.core.rawstore`.

Kept so that documented imports keep working; PanelForge's own modules import :mod:`pipelines.core.rawstore`
(``[tool.importlinter]`` forbids them this path)."""

from pipelines.core.rawstore import *  # noqa: F403
