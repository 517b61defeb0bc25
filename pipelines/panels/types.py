"""What the panel methods share besides boxes (``pipelines.images.boxes``): their names."""

from __future__ import annotations

XYCUT, DETR, CONSENSUS = "xycut", "detr", "consensus"
METHODS = (XYCUT, DETR, CONSENSUS)
