"""Evaluation metrics as per-item numbers, so every metric gets a bootstrap interval the same way.

Each metric function returns one value per evaluated item (a 0/1 hit, or a score), never just a
mean: the report's number is the mean, and its 95% interval comes from resampling the items
(``bootstrap_ci``); a comparison against a baseline resamples the *same* items for both models
(``paired_bootstrap_delta``), which is what makes a small delta on a shared test set meaningful.

Ties are broken pessimistically: an item's rank is the number of *other* candidates scoring at
least as high as the correct one. A model that scores every candidate the same (a collapsed or
broken checkpoint) then gets R@1 = 0 instead of the lucky 1/N (or 1.0) that an index-order tie
break would hand it, and the result does not depend on the order of the gallery.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

RETRIEVAL_KS = (1, 10, 100)


def pessimistic_ranks(scores: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """0-based rank of each row's correct column: how many other columns score >= it."""
    scores = np.asarray(scores)
    rows = np.arange(scores.shape[0])
    target = scores[rows, correct][:, None]
    return (scores >= target).sum(axis=1) - 1


def retrieval_ranks(
    queries: np.ndarray, gallery: np.ndarray, correct: np.ndarray | None = None, block: int = 1024
) -> np.ndarray:
    """Ranks of each query's correct gallery item by dot product, ``block`` queries at a time, so
    memory holds ``block x len(gallery)`` scores rather than the full matrix (``correct`` defaults
    to the diagonal: query i pairs with gallery item i)."""
    n = queries.shape[0]
    correct = np.arange(n) if correct is None else np.asarray(correct)
    out = np.empty(n, dtype=np.int64)
    for start in range(0, n, block):
        stop = min(start + block, n)
        out[start:stop] = pessimistic_ranks(queries[start:stop] @ gallery.T, correct[start:stop])
    return out


def recall_hits(ranks: np.ndarray, k: int) -> np.ndarray:
    """Per-item 0/1: the correct item is among the top ``k``."""
    return (np.asarray(ranks) < k).astype(np.float64)


def retrieval_metrics(
    image_emb: np.ndarray, text_emb: np.ndarray, ks: Sequence[int] = RETRIEVAL_KS
) -> dict[str, np.ndarray]:
    """Per-item R@K both ways for one-to-one pairs (image i goes with text i)."""
    i2t = retrieval_ranks(image_emb, text_emb)
    t2i = retrieval_ranks(text_emb, image_emb)
    out = {f"image_to_text_R@{k}": recall_hits(i2t, k) for k in ks}
    out.update({f"text_to_image_R@{k}": recall_hits(t2i, k) for k in ks})
    return out


def classification_metrics(
    logits: np.ndarray, labels: np.ndarray, top: Sequence[int] = (1, 5)
) -> dict[str, np.ndarray]:
    """Per-item top-k accuracy of zero-shot classification (``logits``: items x classes)."""
    ranks = pessimistic_ranks(np.asarray(logits), np.asarray(labels))
    n_classes = np.asarray(logits).shape[1]
    names = {1: "accuracy"}
    # top-k with k >= the number of classes is always 1: not reported, it says nothing
    return {names.get(k, f"top{k}_accuracy"): recall_hits(ranks, k) for k in top if k == 1 or k < n_classes}


def vqa_metrics(choice_scores: Sequence[np.ndarray], answers: Sequence[int]) -> dict[str, np.ndarray]:
    """Closed VQA as classification: each question's own candidate answers are its classes, so the
    number of classes varies per item; per-item 0/1 accuracy."""
    hits = np.array(
        [
            float(pessimistic_ranks(np.asarray(s)[None, :], np.array([a]))[0] == 0)
            for s, a in zip(choice_scores, answers, strict=True)
        ]
    )
    return {"accuracy": hits}


def _bootstrap_indices(n: int, n_resamples: int, seed: int, chunk: int) -> Iterator[np.ndarray]:
    """Resample item indices, ``chunk`` resamples at a time (memory ``chunk x n``); the seed alone
    decides them, so two metrics of the same items resampled with one seed see the same draws."""
    rng = np.random.default_rng(seed)
    done = 0
    while done < n_resamples:
        size = min(chunk, n_resamples - done)
        yield rng.integers(0, n, size=(size, n))
        done += size


def _percentile_interval(stats: np.ndarray, confidence: float) -> tuple[float, float]:
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(stats, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def bootstrap_ci(
    values: np.ndarray, n_resamples: int = 1000, seed: int = 0, confidence: float = 0.95, chunk: int = 256
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-item ``values`` (items resampled with
    replacement). Empty input gives (nan, nan)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return float("nan"), float("nan")
    means = np.concatenate(
        [values[idx].mean(axis=1) for idx in _bootstrap_indices(values.size, n_resamples, seed, chunk)]
    )
    return _percentile_interval(means, confidence)


def paired_bootstrap_delta(
    values: np.ndarray,
    baseline: np.ndarray,
    n_resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    chunk: int = 256,
) -> tuple[float, float, float]:
    """Mean of ``values - baseline`` and its percentile interval, both models' per-item values
    resampled with the same indices (the items are shared, so their difficulty cancels)."""
    values = np.asarray(values, dtype=np.float64)
    baseline = np.asarray(baseline, dtype=np.float64)
    if values.shape != baseline.shape:
        raise ValueError(f"paired values differ in shape: {values.shape} vs {baseline.shape}")
    diff = values - baseline
    if diff.size == 0:
        return float("nan"), float("nan"), float("nan")
    lo, hi = bootstrap_ci(diff, n_resamples, seed, confidence, chunk)
    return float(diff.mean()), lo, hi
