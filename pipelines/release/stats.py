"""Release statistics in the spirit of BIOMEDICA's Table 7, with flat memory.

Lengths in characters and image sizes are exact in count, mean, min and max; quantiles and
histograms come from a seeded reservoir of ``reservoir`` values per field. Token lengths are
measured on a seeded sample of ``token_sample`` texts per field with OpenCLIP's CLIP BPE
tokenizer (``open_clip.tokenizer.SimpleTokenizer``, 49,408 tokens), whose vocabulary ships
inside the package, so it works offline and counts what a CLIP trainer will see; the share
above 75 tokens is the share truncated by CLIP's 77-token context (75 plus start and end).
Full texts are long (thousands of tokens, tens of milliseconds each in pure-Python BPE), so
their token sample is ``FULL_TEXT_TOKEN_SAMPLE``.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from pipelines.images.plots import figure_png

TOKENIZER = "OpenCLIP SimpleTokenizer (CLIP BPE, 49,408 tokens, open_clip_torch)"
CLIP_TEXT_TOKENS = 75
FULL_TEXT_TOKEN_SAMPLE = 200


@dataclass
class Reservoir:
    """Exact count/mean/min/max; a seeded uniform sample of values (and texts) for the rest."""

    size: int
    rng: np.random.Generator
    text_size: int = 0
    text: bool = False  # lengths of texts (characters), whether or not texts are kept for tokens
    count: int = 0
    total: float = 0.0
    low: float = float("inf")
    high: float = float("-inf")
    values: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)

    def add(self, value: float, text: str | None = None) -> None:
        self.count += 1
        self.total += value
        self.low, self.high = min(self.low, value), max(self.high, value)
        self._sample(self.values, self.size, value)
        if text is not None and self.text_size:
            self._sample(self.texts, self.text_size, text)

    def _sample(self, kept: list, capacity: int, item) -> None:
        """Reservoir sampling (Algorithm R): each of ``count`` items is kept with equal chance."""
        if len(kept) < capacity:
            kept.append(item)
            return
        slot = int(self.rng.integers(self.count))
        if slot < capacity:
            kept[slot] = item

    def summary(self) -> dict:
        if not self.count:
            return {"count": 0}
        q = np.percentile(self.values, [5, 25, 50, 75, 95])
        return {
            "count": self.count,
            "mean": round(self.total / self.count, 2),
            "min": self.low,
            "max": self.high,
            **{f"p{p}": round(float(v), 1) for p, v in zip((5, 25, 50, 75, 95), q, strict=True)},
        }


@dataclass
class ReleaseStats:
    reservoir: int = 100_000
    token_sample: int = 5_000
    seed: int = 0
    fields: dict[str, Reservoir] = field(default_factory=dict)
    counts: dict[str, Counter] = field(default_factory=lambda: {"concept": Counter(), "license": Counter()})

    def _field(self, name: str, text_sample: int = 0, text: bool = False) -> Reservoir:
        if name not in self.fields:
            rng = np.random.default_rng([self.seed, len(self.fields)])
            self.fields[name] = Reservoir(self.reservoir, rng, text_sample, text)
        return self.fields[name]

    def add_text(self, name: str, text: str, text_sample: int | None = None) -> None:
        sample = self.token_sample if text_sample is None else text_sample
        self._field(name, sample, text=True).add(len(text), text)

    def add_value(self, name: str, value: float) -> None:
        self._field(name).add(value)

    def add_sample(self, caption: str, meta: dict) -> None:
        self.add_text("caption", caption)
        for mention in meta["mentions"]:
            self.add_text("mention", mention)
        if meta["width"] and meta["height"]:
            self.add_value("image_width", meta["width"])
            self.add_value("image_height", meta["height"])
            self.add_value("image_area", meta["width"] * meta["height"])
        self.counts["concept"][meta["global_concept"] or "unlabeled"] += 1
        self.counts["license"][f"{meta['license_group']}: {meta['license_code']}"] += 1

    def result(self) -> dict:
        from pipelines.text.clip_bpe import simple_tokenizer

        tokenizer = simple_tokenizer()
        out: dict = {"tokenizer": TOKENIZER, "fields": {}, "counts": {k: dict(v) for k, v in self.counts.items()}}
        for name, res in sorted(self.fields.items()):
            entry = {"chars" if res.text else "value": res.summary()}
            if res.texts:
                lengths = np.array([len(tokenizer.encode(t)) for t in res.texts])
                entry["tokens"] = {
                    "sampled_texts": len(lengths),
                    "mean": round(float(lengths.mean()), 2),
                    "p50": float(np.percentile(lengths, 50)),
                    "p95": float(np.percentile(lengths, 95)),
                    "max": int(lengths.max()),
                    f"share_over_{CLIP_TEXT_TOKENS}": round(float((lengths > CLIP_TEXT_TOKENS).mean()), 4),
                }
            out["fields"][name] = entry
        return out

    def histograms(self, synthetic: str | None = None) -> dict[str, bytes]:
        """One PNG per field and one per count table. Lengths and sizes spanning a decade or more
        are binned on a log axis, narrower ones on a linear one (a log axis over 40-95 characters
        shows no tick a reader can use); counts per figure get one bar per whole number.
        ``synthetic`` (a footer line) marks every plot of a release holding synthetic parts."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        mark = " (synthetic)" if synthetic else ""
        pngs = {}
        for name, res in sorted(self.fields.items()):
            if not res.values:
                continue
            fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
            values = np.array(res.values, dtype=float)
            unit, what = field_unit(name, res.text)
            if unit == "pairs":
                ax.hist(values, bins=np.arange(-0.5, values.max() + 1.5), color="#4c72b0", rwidth=0.9)
                ax.xaxis.get_major_locator().set_params(integer=True)
            elif values.min() > 0 and values.max() >= LOG_SPAN * values.min():
                bins = log_bins(values)
                ax.hist(values, bins=bins, color="#4c72b0")
                ax.set_xscale("log")
                pad = np.sqrt(bins[1] / bins[0])  # half a bin either side, so the end bars clear the frame
                ax.set_xlim(bins[0] / pad, bins[-1] * pad)
            else:
                ax.hist(values, bins=linear_bins(values), color="#4c72b0")
            ax.set_xlabel(f"{what} ({unit})")
            ax.set_ylabel(
                HISTOGRAM_Y.get(unit, "samples") + ("" if res.count <= res.size else f" (sample of {res.size:,})")
            )
            ax.set_title(f"{name.replace('_', ' ')}: n = {res.count:,}{mark}")
            pngs[f"{name}.png"] = figure_png(fig, plt, synthetic)
        for name, counter in self.counts.items():
            if not counter:
                continue
            fig, ax = plt.subplots(figsize=(7, 0.35 * len(counter) + 1.6), dpi=100)
            labels, values = zip(*sorted(counter.items(), key=lambda kv: kv[1]), strict=True)
            ax.barh(labels, values, color="#55a868")
            ax.set_xlabel("samples (figures)")
            ax.set_title(f"samples per {name}{mark}")
            pngs[f"per_{name}.png"] = figure_png(fig, plt, synthetic)
        return pngs


LOG_SPAN = 10  # a log axis only for values spanning at least a decade
HISTOGRAM_Y = {"pairs": "figures", "tokens": "texts", "characters": "texts", "px": "figures"}


def field_unit(name: str, text: bool) -> tuple[str, str]:
    """(unit, what is measured) of a statistics field, for its axis label."""
    words = name.replace("_", " ")
    if text:
        return "characters", f"{words} length"
    if name.endswith("_pairs_per_figure"):
        return "pairs", f"{name.split('_')[0]} pairs per figure"
    if "tokens" in name:
        return "tokens", words
    if name == "image_area":
        return "px", "image area (width x height)"
    if name.startswith("image_"):
        return "px", words
    return "value", words


def linear_bins(values: np.ndarray, edges: int = 40) -> np.ndarray:
    """Equal-width bin edges over the data (a single value gets a band of +-5% or +-0.5)."""
    low, high = float(values.min()), float(values.max())
    if high == low:
        pad = max(abs(low) * 0.05, 0.5)
        low, high = low - pad, high + pad
    return np.linspace(low, high, edges)


def log_bins(values: np.ndarray, edges: int = 40) -> np.ndarray:
    """Log-spaced bin edges from the smallest to the largest value, so the axis spans the data
    (a single value gets a band of x1.1 either side)."""
    low, high = float(values.min()), float(values.max())
    if high < low * 1.1:
        low, high = low / 1.1, high * 1.1
    return np.geomspace(low, high, edges)


def release_stats(samples, articles, reservoir: int = 100_000, token_sample: int = 5_000, seed: int = 0):
    """Statistics over included samples (``(caption, meta_json)`` pairs) and exported articles' body text."""
    stats = ReleaseStats(reservoir, token_sample, seed)
    for caption, meta_json in samples:
        stats.add_sample(caption, json.loads(meta_json))
    for body in articles:
        if body:
            stats.add_text("full_text", body, min(token_sample, FULL_TEXT_TOKEN_SAMPLE))
    return stats


PAIRS_PER_FIGURE_LEVELS = ("panel", "region")


def pair_stats(samples, figure_keys, reservoir: int = 100_000, token_sample: int = 5_000, seed: int = 0):
    """Statistics of the pair levels over included ``pair_samples`` rows (``level``, ``figure_key``,
    ``caption``, ``meta_json``) and the keys of the release's included figures: each level's text
    (characters, CLIP tokens), long captions' tokens before and after refinement (the long-caption
    stage's target tokenizer, as it recorded them), and pairs per released figure per level
    (figures without pairs count as 0, so the mean is over the release)."""
    stats = ReleaseStats(reservoir, token_sample, seed)
    per_figure: dict[str, Counter] = {level: Counter() for level in PAIRS_PER_FIGURE_LEVELS}
    for row in samples:
        level = row["level"]
        stats.add_text(f"{level}_text", row["caption"])
        if level in per_figure:
            per_figure[level][row["figure_key"]] += 1
        if level == "longcap":
            meta = json.loads(row["meta_json"])
            for name in ("tokens_before", "tokens_after"):
                if meta[name] >= 0:
                    stats.add_value(f"longcap_{name}", meta[name])
    for key in figure_keys:
        for level, counts in per_figure.items():
            stats.add_value(f"{level}_pairs_per_figure", counts.get(key, 0))
    return stats
