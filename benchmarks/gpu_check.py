"""``make gpu-check``: every production architecture at real size, random weights, on this machine's GPU.

For a lent GPU without network: each model is built from a copy of its published config
(``tests/data/published``) with random weights, written in its published format and loaded
through PanelForge's own loader, then timed on the sample's figures:

* ``dinov2``: DINOv2-L (``facebook/dinov2-large``) through :class:`pipelines.concepts.dinov2.Embedder`
  (bf16 autocast), batches of 64 prepared 224 px figures: images/s;
* ``detector``: Open-PMC-18M's DC5 DAB-DETR through :class:`pipelines.panels.detector.Detector` at
  800 px, batches of 8: figures/s in process (``detect``, its CPU resize included), and on
  prepared batches as its Ray actor runs it (``batched_figures_per_second``);
* ``vlm_3b`` / ``vlm_7b``: Qwen2.5-VL-3B / 7B-Instruct in bf16 through the transformers backend
  (:class:`resources.vlm.VlmEngineResource`), batches of 8 figures, 64 new tokens each: tokens/s
  (the tokenizer is the tiny model's: random weights answer nonsense, the compute is the real one);
* ``clip_train``: ViT-L-14 training steps with BIOMEDICA's settings (fp32, gradient
  checkpointing, AdamW 0.9/0.95, weight decay 0.2, clipping 1.0, OpenCLIP's ``ClipLoss``) at the
  largest per-GPU batch :mod:`pipelines.training.memory` says fits this GPU: samples/s, and the
  measured peak memory against the estimate.

Both image models are timed in turns against their inputs as built before (NumPy on the host, the
float32 batch copied: ``benchmarks/model_inputs.py``), and the outputs of the two are compared.
Each writes ``benchmarks/results/gpu_<name>.json``: the card, throughput, peak memory
(``torch.cuda.max_memory_allocated``) and mean GPU utilisation (``nvidia-smi`` every 0.2 s).
Without a GPU it says so in one line and exits with status 2. ``--dry-run`` runs the same code
on the CPU with every model at reduced size (what the tests run).

    python -m benchmarks.gpu_check [--only dinov2,clip_train] [--dry-run] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from benchmarks.record import write_results
from benchmarks.training import GpuSampler

RESULTS = Path(__file__).parent / "results"
DESCRIPTIONS = {
    "dinov2": "DINOv2-L (random weights) through the embedder, bf16 autocast, batches of 64 at 224 px",
    "detector": "Open-PMC-18M's DC5 DAB-DETR (random weights) through the detector at 800 px, batches of 8",
    "vlm_3b": "Qwen2.5-VL-3B-Instruct (random weights, bf16) through the transformers backend, 8 figures",
    "vlm_7b": "Qwen2.5-VL-7B-Instruct (random weights, bf16) through the transformers backend, 8 figures",
    "clip_train": "ViT-L-14 training steps with BIOMEDICA's settings at the largest batch the estimate fits",
}
CHECKS = tuple(DESCRIPTIONS)
SAMPLE_FIGURES = 16
NO_GPU = "gpu-check needs a CUDA GPU and none is visible here (torch.cuda.is_available() is False)"


class Run:
    """One check's device, timing spans and GPU sampler."""

    def __init__(self, dry_run: bool):
        self.dry_run = dry_run
        self.device = torch.device("cpu" if dry_run else "cuda")
        self.sampler = GpuSampler(not dry_run)
        self.spans: list[tuple[float, float]] = []

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def timed(self, step: Callable[[], int], repeats: int, record: bool = True) -> tuple[int, float]:
        """Run ``step`` (returning how many items it did) ``repeats`` times; (items, seconds).
        ``record=False``: a baseline's timing, whose spans the GPU utilisation leaves out."""
        items, seconds = 0, 0.0
        for _ in range(repeats):
            self.sync()
            start = time.perf_counter()
            items += step()
            self.sync()
            end = time.perf_counter()
            if record:
                self.spans.append((start, end))
            seconds += end - start
        return items, seconds

    def in_turns(self, step: Callable[[], int], baseline: Callable[[], int], repeats: int, rounds: int = 2):
        """Items per second of ``step`` and of ``baseline``, timed in turns, ``rounds`` of
        ``repeats`` each, the best round of each kept; only ``step`` counts for the utilisation."""
        best = {"step": 0.0, "baseline": 0.0}
        with self.sampler:
            for _ in range(rounds):
                for name, fn in (("baseline", baseline), ("step", step)):
                    n, seconds = self.timed(fn, repeats, record=name == "step")
                    best[name] = max(best[name], n / seconds)
        return best["step"], best["baseline"]

    def reset_peak(self) -> None:
        """From here on the peak is the check's own (not that of writing its checkpoint)."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)

    def memory(self) -> dict:
        if self.device.type != "cuda":
            return {"peak_allocated_gb": None, "why_null": "CPU dry run"}
        return {
            "peak_allocated_gb": round(torch.cuda.max_memory_allocated(self.device) / 1e9, 2),
            "peak_reserved_gb": round(torch.cuda.max_memory_reserved(self.device) / 1e9, 2),
            "total_gb": round(torch.cuda.get_device_properties(self.device).total_memory / 1e9, 2),
        }


def figures(n: int = SAMPLE_FIGURES):
    from benchmarks.embeddings import sample_images
    from pipelines.images.decode import decode_image

    out = []
    for data in sample_images():
        image, _ = decode_image(data)
        if image is not None:
            out.append(image)
        if len(out) == n:
            break
    return out


# ----------------------------------------------------------------------------------- the checks


def check_dinov2(run: Run, tmp: Path) -> dict:
    from benchmarks.model_inputs import BASELINE, host_normalized
    from pipelines.concepts.dinov2 import Embedder, EmbedderConfig, prepare
    from testing.published import published_config, write_dinov2

    config = published_config("dinov2-large")
    if run.dry_run:
        config.update(hidden_size=32, num_hidden_layers=2, num_attention_heads=2)
    write_dinov2(tmp / "dinov2-large", config)
    run.reset_peak()
    embedder = Embedder(EmbedderConfig(model=str(tmp / "dinov2-large"), device=run.device.type))
    batch = 4 if run.dry_run else 64
    pixels = np.stack([prepare(im, embedder.resize, False) for im in figures()])
    pixels = np.concatenate([pixels] * (-(-batch // len(pixels))))[:batch]
    processor = embedder.processor

    def before_vectors() -> np.ndarray:
        values = host_normalized(pixels, processor.image_mean, processor.image_std, processor.rescale_factor)
        return embedder.forward(values.to(embedder.device))

    def before() -> int:
        return len(before_vectors())

    # also the warm-up of both paths: the vectors they give (float16; bf16 autocast on a GPU)
    difference = np.abs(embedder.embed(pixels).astype(np.float32) - before_vectors().astype(np.float32)).max()
    per_second, baseline = run.in_turns(lambda: len(embedder.embed(pixels)), before, 2 if run.dry_run else 10)
    params = sum(p.numel() for p in embedder.model.parameters())
    return {"model": "facebook/dinov2-large (random weights)", "params": params, "batch": batch,
            "images_per_second": round(per_second, 1), "baseline": BASELINE,
            "baseline_images_per_second": round(baseline, 1), "speedup": round(per_second / baseline, 2),
            "max_abs_difference_from_baseline": float(difference)}  # fmt: skip


def check_detector(run: Run, tmp: Path) -> dict:
    from benchmarks.model_inputs import BASELINE, host_detector_inputs
    from pipelines.panels.detector import Detector, DetectorConfig, postprocess, prepare_image, to_tensors
    from tests.panel_fixtures import PUBLISHED, REDUCED, write_checkpoint

    write_checkpoint(tmp / "pmc-18m-dab-detr", REDUCED if run.dry_run else PUBLISHED)
    size = 256 if run.dry_run else 800
    run.reset_peak()
    detector = Detector(DetectorConfig(model=str(tmp / "pmc-18m-dab-detr"), input_size=size, device=run.device.type))
    images = figures(4 if run.dry_run else SAMPLE_FIGURES)
    batch = 2 if run.dry_run else 8
    prepared = [prepare_image(im, size) for im in images]
    batches = [
        (np.stack([p for p, _ in prepared[i : i + batch]]), [f for _, f in prepared[i : i + batch]])
        for i in range(0, len(prepared), batch)
    ]

    def model_side() -> int:  # what the Ray actor runs: prepared uint8 batches in, panels out
        return sum(len(detector.detect_pixels(pixels, frames)) for pixels, frames in batches)

    def host_forward(pixels: np.ndarray, frames: list) -> tuple[torch.Tensor, torch.Tensor]:
        values, mask = host_detector_inputs(pixels, frames)
        return detector.forward(values, mask)  # forward copies them to the GPU

    def before() -> int:  # the same post-processing as detect_pixels, on the baseline's outputs
        done = 0
        for pixels, frames in batches:
            logits, boxes = host_forward(pixels, frames)
            postprocess(logits, boxes, frames, detector.config.threshold, detector.config.max_panels, detector.classes)
            done += len(frames)
        return done

    model_side(), before()  # warm-up
    pixels, frames = batches[0]
    new, old = detector.forward(*to_tensors(pixels, frames, detector.device)), host_forward(pixels, frames)
    difference = max(float((a - b).abs().max()) for a, b in zip(new, old, strict=True))  # logits and boxes
    per_second, baseline = run.in_turns(model_side, before, 1 if run.dry_run else 5)
    # the in-process convenience, its CPU resize included (what this check has always measured)
    n, seconds = run.timed(lambda: len(detector.detect(images, batch_size=batch)), 1 if run.dry_run else 5, False)
    params = sum(p.numel() for p in detector.model.parameters())
    return {"model": "Open-PMC-18M DAB-DETR DC5 (random weights)", "params": params, "input_size": size,
            "batch": batch, "figures_per_second": round(n / seconds, 2), "baseline": BASELINE,
            "batched_figures_per_second": round(per_second, 2),
            "baseline_batched_figures_per_second": round(baseline, 2), "speedup": round(per_second / baseline, 2),
            "max_abs_difference_from_baseline": difference}  # fmt: skip


def check_vlm(run: Run, tmp: Path, name: str) -> dict:
    from pipelines.vlm.prompt import Prompt
    from resources.vlm import VlmEngineResource
    from testing.published import QWEN_REDUCED, QWEN_REDUCED_VISION, published_config, reduced, write_qwen2_5_vl

    config = published_config(name)
    if run.dry_run:
        config = reduced(config, QWEN_REDUCED, QWEN_REDUCED_VISION, [2, 3, 3])
    dtype = "float32" if run.dry_run else "bfloat16"
    folder = write_qwen2_5_vl(tmp / name, config, dtype=dtype, device=run.device.type)
    run.reset_peak()
    band = {"min_pixels": 64 * 28 * 28, "max_pixels": 128 * 28 * 28} if run.dry_run else {}
    resource = VlmEngineResource(
        backend="transformers", model=str(folder), dtype=dtype, device=run.device.type, batch_size=8, **band
    )
    new_tokens = 4 if run.dry_run else 64
    images = figures(2 if run.dry_run else 8)
    probe = Prompt("gpu_check", "Describe the figure.", schema=None, max_tokens=new_tokens)  # free text: throughput
    requests = [probe.request(f"f{i}", [im]) for i, im in enumerate(images)]
    with resource.engine() as engine:
        engine.generate(requests[:1])  # warm-up
        done: list = []

        def step() -> int:
            done[:] = engine.generate(requests)
            return sum(r.completion_tokens or 0 for r in done)

        with run.sampler:
            tokens, seconds = run.timed(step, 1 if run.dry_run else 3)
        params = sum(p.numel() for p in engine.model.parameters())
    prompt = sum(r.prompt_tokens or 0 for r in done)
    return {"model": f"Qwen/{name} layout (random weights, {dtype})", "params": params, "batch": len(requests),
            "max_new_tokens": new_tokens, "prompt_tokens_per_batch": prompt,
            "new_tokens_per_second": round(tokens / seconds, 1),
            "requests_per_second": round(len(requests) * (1 if run.dry_run else 3) / seconds, 2)}  # fmt: skip


def check_clip_train(run: Run, tmp: Path) -> dict:
    import open_clip
    from open_clip.loss import ClipLoss

    from pipelines.training import memory
    from pipelines.training.clip import ClipTrainConfig

    recipe = ClipTrainConfig(train_data=["-"], run_dir="-")
    model_cfg = open_clip.get_model_config(recipe.model)
    if run.dry_run:
        model_cfg = {"embed_dim": 32, "vision_cfg": {**model_cfg["vision_cfg"], "layers": 2, "width": 64},
                     "text_cfg": {**model_cfg["text_cfg"], "width": 64, "heads": 2, "layers": 2}}  # fmt: skip
    arch = memory.open_clip_architecture(recipe.model, model_cfg)
    gpu_bytes = 2e9 if run.dry_run else float(torch.cuda.get_device_properties(run.device).total_memory)
    batch = memory.max_batch(arch, gpu_bytes, recipe.precision, recipe.grad_checkpointing, 1, 1, recipe.local_loss)
    estimate = memory.estimate(arch, batch, recipe.precision, recipe.grad_checkpointing, 1, 1, recipe.local_loss)
    (tmp / "clip").mkdir()
    (tmp / "clip" / "open_clip_config.json").write_text(json.dumps({"model_cfg": model_cfg, "preprocess_cfg": {}}))
    model = open_clip.create_model(f"local-dir:{tmp / 'clip'}", device=run.device)
    model.set_grad_checkpointing(recipe.grad_checkpointing)
    model.output_dict = True
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=recipe.lr, betas=(recipe.beta1, recipe.beta2), weight_decay=recipe.wd
    )
    loss_fn = ClipLoss(local_loss=recipe.local_loss, gather_with_grad=recipe.gather_with_grad)
    size = model_cfg["vision_cfg"]["image_size"]
    context = model_cfg["text_cfg"].get("context_length", 77)
    out_of_memory = []
    # the estimate's batch; if the GPU disagrees, 90% and 80% of it (recorded: the estimate was too low)
    for tried in [b for b in dict.fromkeys((batch, batch * 9 // 10, batch * 8 // 10)) if b > 0]:
        used = min(tried, 4) if run.dry_run else tried
        images = torch.randn(used, 3, size, size, device=run.device)
        texts = torch.randint(0, 49408, (used, context), device=run.device)

        def step(images=images, texts=texts, used=used) -> int:
            out = model(images, texts)
            loss = loss_fn(out["image_features"], out["text_features"], out["logit_scale"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip_norm)
            optimizer.step()
            return used

        try:
            step()  # warm-up: the optimizer's states exist from here on, as in a run
            with run.sampler:
                n, seconds = run.timed(step, 2 if run.dry_run else 3)  # a step of ~2,000 ViT-L samples takes seconds
            break
        except torch.OutOfMemoryError:
            out_of_memory.append(tried)
            del images, texts
            optimizer.zero_grad(set_to_none=True)
            run.reset_peak()
    else:
        raise RuntimeError(f"out of memory at every batch tried: {out_of_memory}")
    return {"model": f"{recipe.model} (random weights)", "precision": recipe.precision,
            "grad_checkpointing": recipe.grad_checkpointing, "batch_per_gpu": used,
            "largest_batch_estimated": batch, "out_of_memory_at": out_of_memory,
            "estimate_gb": round(memory.estimate(arch, used, recipe.precision, recipe.grad_checkpointing, 1, 1,
                                                 recipe.local_loss).total / 1e9, 2),
            "estimate": estimate.describe(), "samples_per_second": round(n / seconds, 1)}  # fmt: skip


RUNNERS: dict[str, Callable[[Run, Path], dict]] = {
    "dinov2": check_dinov2,
    "detector": check_detector,
    "vlm_3b": lambda run, tmp: check_vlm(run, tmp, "qwen2.5-vl-3b-instruct"),
    "vlm_7b": lambda run, tmp: check_vlm(run, tmp, "qwen2.5-vl-7b-instruct"),
    "clip_train": check_clip_train,
}


def card() -> str:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(CHECKS), help=f"comma-separated subset of {','.join(CHECKS)}")
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, every model at reduced size")
    parser.add_argument("--out", default=str(RESULTS), help="folder for gpu_<name>.json")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - set(CHECKS))
    if unknown:
        parser.error(f"unknown checks {unknown}; known: {', '.join(CHECKS)}")
    if not args.dry_run and not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    failed = []
    for name in names:
        run = Run(args.dry_run)
        if run.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(run.device)
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f"gpu-check-{name}-") as tmp:
            try:
                found = RUNNERS[name](run, Path(tmp))
            except Exception as exc:  # noqa: BLE001 - one check's failure is its result, the others still run
                found = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
                failed.append(name)
        result = {
            "benchmark": f"{name}: {DESCRIPTIONS[name]}",
            "baseline": "none: absolute numbers of the card named in device",
            "check": name,
            "device": card() if run.device.type == "cuda" else "cpu",
            "dry_run": args.dry_run,
            **found,
            "memory": run.memory(),
            "gpu_utilisation": run.sampler.summary(run.device, run.spans),
            "wall_seconds": round(time.perf_counter() - started, 1),
        }
        write_results(out / f"gpu_{name}.json", result, indent=1)
        print(json.dumps(result))
        del run
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
