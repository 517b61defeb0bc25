"""The core every stage stands on: the lake (tables, commits), the table schemas, the stage contract
(partitions, results, progress, reuse), fingerprints, the raw-file store and figure items, licences,
folders built once atomically.

Nothing here imports another ``pipelines`` package (``[tool.importlinter]`` in pyproject.toml)."""
