"""OpenCV, as every stage's mask operations load it (connected components, the crop gate's erosion)."""

from __future__ import annotations

from functools import cache


@cache
def opencv():
    """OpenCV, imported on first use (every process that loads the code location imports the
    stages, and ``import cv2`` costs each ~0.1 s), with one thread: stages run one process per
    core (Ray actors, Dagster run workers, the benchmark's CPU clock), and OpenCV's own pool only
    made them spin against each other (about a quarter more CPU for the same labels, measured on
    the evaluation figures' masks). img2dataset does the same."""
    import cv2

    cv2.setNumThreads(1)
    return cv2
