"""Run a CLIP-style model (and a baseline checkpoint, in the same run) over evaluation datasets.

Embeddings are computed ``batch_size`` images or texts at a time (images decoded per batch), so
memory holds one batch of pixels plus the embeddings, however large the dataset. Every metric is
kept per item (``metrics``), so each number in the report carries a bootstrap 95% interval, and
the baseline's delta is a *paired* interval over the same items. An image that cannot be decoded
is a recorded error of its dataset and is left out for both models (it does not depend on the
model), so the two are always compared on the same items.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from pipelines.evaluation import metrics
from pipelines.evaluation.datasets import CLASSIFICATION, VQA, EvalDataset, ImageSource
from pipelines.images.decode import open_figure


@dataclass
class ClipModel:
    """An OpenCLIP model with its eval preprocess and tokenizer (``load_clip`` builds one)."""

    model: object
    preprocess: object
    tokenizer: object
    name: str
    device: str = "cpu"


def load_clip(spec: str, pretrained: str | None = None, name: str | None = None, device: str = "cpu") -> ClipModel:
    """``spec`` is an OpenCLIP model name (``ViT-L-14`` with ``pretrained``), ``hf-hub:...``, or
    ``local-dir:DIR`` (``open_clip_config.json`` + weights, as a training run exports ``model/``).

    A BMC-LongCLIP export has a Hugging Face text tower (BioClinical ModernBERT) that stock
    OpenCLIP 3.3 cannot build (``ModernBertModel`` rejects OpenCLIP's ``add_pooling_layer``), so
    the towers :mod:`pipelines.compute.hf_text` teaches OpenCLIP are enabled first; its
    tokenizer is read from the export's own folder, its text tower's config from
    ``hf_model_name`` (the Hugging Face cache, or the Hub when not offline)."""
    import open_clip

    from pipelines.compute.hf_text import enable_hf_text_towers

    enable_hf_text_towers()
    model, _, preprocess = open_clip.create_model_and_transforms(spec, pretrained=pretrained, device=device)
    model.eval()
    return ClipModel(model, preprocess, open_clip.get_tokenizer(spec), name or spec, device)


def decode(source: ImageSource):
    """A PIL RGB image by the pipeline's one decoder (``open_figure``: the same pixels the release
    was made from), or None when the bytes or file are not a usable image."""
    try:
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
    except OSError:
        return None
    return open_figure(data).image


def _normalize(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def embed_images(clip: ClipModel, images: Sequence[ImageSource], batch_size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """(L2-normalized embeddings of the decodable images, boolean mask of which ones decoded)."""
    import torch

    ok = np.zeros(len(images), dtype=bool)
    out = []
    for start in range(0, len(images), batch_size):
        decoded = [decode(src) for src in images[start : start + batch_size]]
        tensors = [clip.preprocess(img) for img in decoded if img is not None]
        ok[start : start + len(decoded)] = [img is not None for img in decoded]
        if tensors:
            with torch.no_grad():
                feats = clip.model.encode_image(torch.stack(tensors).to(clip.device))
            out.append(feats.float().cpu().numpy())
    dim = out[0].shape[1] if out else 0
    return _normalize(np.concatenate(out) if out else np.zeros((0, dim), np.float32)), ok


def embed_texts(clip: ClipModel, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
    """L2-normalized text embeddings (texts longer than the context are truncated by the tokenizer)."""
    import torch

    out = []
    for start in range(0, len(texts), batch_size):
        with torch.no_grad():
            tokens = clip.tokenizer(list(texts[start : start + batch_size])).to(clip.device)
            out.append(clip.model.encode_text(tokens).float().cpu().numpy())
    return _normalize(np.concatenate(out))


def _class_embeddings(clip: ClipModel, prompts: list[list[str]], batch_size: int) -> np.ndarray:
    """One embedding per class: the renormalized mean of its prompts' embeddings (CLIP's prompt
    ensembling, so no single template wording decides the class)."""
    flat = [p for group in prompts for p in group]
    emb = embed_texts(clip, flat, batch_size)
    bounds = np.cumsum([0] + [len(g) for g in prompts])
    return _normalize(np.stack([emb[a:b].mean(axis=0) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]))


def score_dataset(
    clip: ClipModel, ds: EvalDataset, batch_size: int = 64, ks: Sequence[int] = metrics.RETRIEVAL_KS
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Per-item metric values of ``ds`` on the decodable items, and the mask of those items."""
    image_emb, ok = embed_images(clip, ds.images, batch_size)
    idx = np.flatnonzero(ok)
    if ds.task == CLASSIFICATION:
        classes = _class_embeddings(clip, ds.class_prompts(), batch_size)
        return metrics.classification_metrics(image_emb @ classes.T, np.asarray(ds.labels)[idx]), ok
    if ds.task == VQA:
        prompts = [ds.item_prompts(i) for i in idx]
        emb = embed_texts(clip, [p for group in prompts for p in group], batch_size)
        bounds = np.cumsum([0] + [len(g) for g in prompts])
        scores = [emb[a:b] @ image_emb[j] for j, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))]
        return metrics.vqa_metrics(scores, [ds.labels[i] for i in idx]), ok
    text_emb = embed_texts(clip, [ds.texts[i] for i in idx], batch_size)
    return metrics.retrieval_metrics(image_emb, text_emb, ks), ok


@dataclass
class MetricRow:
    dataset: str
    task: str
    metric: str
    n: int
    value: float
    lo: float
    hi: float
    baseline: float | None = None
    baseline_lo: float | None = None
    baseline_hi: float | None = None
    delta: float | None = None
    delta_lo: float | None = None
    delta_hi: float | None = None
    synthetic: bool = False


@dataclass
class Report:
    model: str
    baseline: str | None
    rows: list[MetricRow] = field(default_factory=list)
    errors: list[tuple[str, str, str]] = field(default_factory=list)  # (dataset, item key, reason)
    settings: dict = field(default_factory=dict)

    def value(self, dataset: str, metric: str) -> MetricRow:
        return next(r for r in self.rows if r.dataset == dataset and r.metric == metric)

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "baseline": self.baseline,
            "settings": self.settings,
            "rows": [asdict(r) for r in self.rows],
            "errors": [list(e) for e in self.errors],
        }

    def markdown(self) -> str:
        """The report table: each value with its 95% interval, the baseline and the paired delta."""
        head = f"Model `{self.model}`" + (f" vs baseline `{self.baseline}`" if self.baseline else "")
        cols = ["dataset", "metric", "n", "model (95% CI)"]
        if self.baseline:
            cols += ["baseline (95% CI)", "delta (95% CI)"]
        lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for r in self.rows:
            name = f"{r.dataset} (synthetic)" if r.synthetic else r.dataset
            cells = [name, r.metric, str(r.n), _ci(r.value, r.lo, r.hi)]
            if self.baseline:
                cells += [
                    _ci(r.baseline, r.baseline_lo, r.baseline_hi),
                    _ci(r.delta, r.delta_lo, r.delta_hi, sign=True),
                ]
            lines.append("| " + " | ".join(cells) + " |")
        if self.errors:
            lines += ["", f"{len(self.errors)} items not evaluated (first 10):"]
            lines += [f"- {d} `{k}`: {reason}" for d, k, reason in self.errors[:10]]
        return "\n".join(lines)

    def plots(self) -> dict[str, bytes]:
        """One PNG per dataset: each metric with its interval, model and baseline side by side."""
        return {f"{_safe(d)}.png": _plot([r for r in self.rows if r.dataset == d], self) for d in self.datasets}

    def markdown_with_plots(self) -> str:
        """The table followed by the plots as data-URI images (for asset metadata)."""
        images = [
            f"![{name}](data:image/png;base64,{base64.b64encode(png).decode()})" for name, png in self.plots().items()
        ]
        return "\n\n".join([self.markdown(), *images])

    @property
    def datasets(self) -> list[str]:
        return list(dict.fromkeys(r.dataset for r in self.rows))


def _ci(value: float | None, lo: float | None, hi: float | None, sign: bool = False) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    fmt = "{:+.3f}" if sign else "{:.3f}"
    return f"{fmt.format(value)} [{fmt.format(lo)}, {fmt.format(hi)}]"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _plot(rows: list[MetricRow], report: Report) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipelines.images.plots import figure_png

    fig, ax = plt.subplots(figsize=(6, 0.5 + 0.45 * len(rows)), dpi=100)
    y = np.arange(len(rows))
    series = [(report.model, "value", "lo", "hi", 0.0)]
    if report.baseline:
        series = [
            (report.model, "value", "lo", "hi", -0.2),
            (report.baseline, "baseline", "baseline_lo", "baseline_hi", 0.2),
        ]
    for label, v, lo, hi, offset in series:
        vals = np.array([getattr(r, v) for r in rows], dtype=float)
        err = np.abs(np.array([[getattr(r, lo) for r in rows], [getattr(r, hi) for r in rows]], dtype=float) - vals)
        ax.barh(y + offset, vals, height=0.4 if report.baseline else 0.6, xerr=err, capsize=3, label=label)
    ax.set_yticks(y, [r.metric for r in rows])
    ax.set_xlim(0, 1)
    ax.set_title(rows[0].dataset + (" (synthetic)" if rows[0].synthetic else ""))
    ax.legend(fontsize=7)
    return figure_png(fig, plt)


def evaluate(
    model: ClipModel,
    datasets: Sequence[EvalDataset],
    baseline: ClipModel | None = None,
    batch_size: int = 64,
    n_resamples: int = 1000,
    seed: int = 0,
    ks: Sequence[int] = metrics.RETRIEVAL_KS,
) -> Report:
    """Score ``model`` (and ``baseline``, on the same items) on every dataset; each metric gets a
    percentile bootstrap interval over items (``n_resamples`` draws, ``seed``), and the delta a
    paired one."""
    report = Report(
        model.name,
        baseline.name if baseline else None,
        settings={"batch_size": batch_size, "n_resamples": n_resamples, "seed": seed, "ks": list(ks)},
    )
    for ds in datasets:
        report.errors += [(ds.name, key, reason) for key, reason in ds.errors]
        if len(ds) == 0:
            continue
        values, ok = score_dataset(model, ds, batch_size, ks)
        report.errors += [(ds.name, ds.keys[i], "undecodable image") for i in np.flatnonzero(~ok)]
        base = score_dataset(baseline, ds, batch_size, ks)[0] if baseline else {}
        for metric, per_item in values.items():
            report.rows.append(_row(ds, metric, per_item, base.get(metric), n_resamples, seed))
    return report


def _row(
    ds: EvalDataset, metric: str, per_item: np.ndarray, base: np.ndarray | None, n_resamples: int, seed: int
) -> MetricRow:
    lo, hi = metrics.bootstrap_ci(per_item, n_resamples, seed)
    row = MetricRow(
        ds.name, ds.task, metric, int(per_item.size), float(per_item.mean()), lo, hi, synthetic=ds.synthetic
    )
    if base is not None:
        row.baseline = float(base.mean())
        row.baseline_lo, row.baseline_hi = metrics.bootstrap_ci(base, n_resamples, seed)
        row.delta, row.delta_lo, row.delta_hi = metrics.paired_bootstrap_delta(per_item, base, n_resamples, seed)
    return row


def write_report(lake, report: Report, release: str, run_id: str) -> dict[str, str]:
    """Store the report in the lake under ``models/eval/<release>/<run_id>/`` (JSON, Markdown and
    the plots); returns the paths by file name."""
    paths = {}
    files = {
        "report.json": json.dumps(report.to_json(), indent=1).encode(),
        "report.md": report.markdown().encode(),
        **report.plots(),
    }
    for name, payload in files.items():
        dest = lake.path("models", "eval", release, run_id, name)
        with lake.atomic_local_file(dest) as tmp:
            with open(tmp, "wb") as fh:
                fh.write(payload)
        paths[name] = dest
    return paths


def evaluate_release(
    lake,
    release: str,
    model: ClipModel,
    baseline: ClipModel | None = None,
    run_id: str = "latest",
    license_group: str = "commercial",
    extra: Sequence[EvalDataset] = (),
    share: float | None = None,
    key: str | None = None,
    limit: int | None = None,
    batch_size: int = 64,
    n_resamples: int = 1000,
    seed: int = 0,
) -> tuple[Report, dict[str, str]]:
    """The whole evaluation of one release: the held-out split (the recorded one, or a new one
    recorded when ``share`` is given and none is; another rule over a recorded one is refused),
    retrieval on its articles at figure, panel and region level
    (the subsets the release wrote; absent ones are skipped), long-caption retrieval from the
    newest release, plus ``extra`` benchmark datasets; the report is written to the lake."""
    from pipelines.core import heldout as splits
    from pipelines.evaluation.datasets import longcap_retrieval, release_pairs, subset_shards

    held = splits.evaluation_split(lake, release, share, key or splits.DEFAULT_KEY)
    datasets = [
        release_pairs(lake, release, subset, held.pmcids, limit=limit)
        for subset in (license_group, f"panel-{license_group}", f"region-{license_group}")
        if subset_shards(lake, release, subset)
    ]
    try:
        datasets.append(longcap_retrieval(lake, held.pmcids, license_group))
    except FileNotFoundError:
        pass
    datasets = [d for d in datasets if len(d)] + list(extra)
    report = evaluate(model, datasets, baseline, batch_size, n_resamples, seed)
    report.settings.update(
        {"release": release, "heldout_articles": len(held.pmcids), "heldout_rule": held.to_json()["rule"]}
    )
    return report, write_report(lake, report, release, run_id)
