"""Training throughput of the multi-level trainer (and OpenCLIP's step loop): samples/s, the share
of each step spent waiting for data, GPU utilisation and peak memory, against the compute ceiling.

* ``multilevel``: the real :class:`pipelines.training.multilevel.Trainer` (region-aware preset,
  figure + region levels every step, all loss terms on), once per ``--multilevel-workers`` value
  (DataLoader workers per level; 0 decodes in the training process). A step = getting its
  decoded batches (``Trainer.inputs``: waiting on the loaders, or decoding with 0 workers) +
  forward/backward/update (``Trainer.compute``). Stall share = data time / step time.
* ``openclip``: OpenCLIP's own model and ``ClipLoss`` fed by a ``torch.utils.data.DataLoader``
  over the same figure shards (``--workers`` processes decode), as ``open_clip_train`` does.
  Stall share = time waiting on the loader's next batch / step time.
* baseline ``ceiling`` (each, same run): the same model and step fed one pre-materialised batch
  from memory (no loader): the compute ceiling; ``loader_over_ceiling`` = fed samples/s over it.

Models: ``--model tiny`` (a small ViT built in code, what this CPU can run) or an OpenCLIP
architecture name with random weights (``ViT-B-16``, ``ViT-L-14`` on a GPU). GPU utilisation is
sampled every 0.2 s with ``nvidia-smi --query-gpu=utilization.gpu`` while the fed loop runs (null
without CUDA); peak memory is ``torch.cuda.max_memory_allocated`` on CUDA, the process's peak RSS
otherwise. Shards come from ``--figure-data``/``--region-data`` (release subset folders) or are
synthesised from ``sample/images`` (figures with two region crops each, boxes in figure pixels).

    python -m benchmarks.training                       # CPU, tiny model, < 2 minutes on 2 cores
    python -m benchmarks.training --device cuda --model ViT-B-16 --batch-size 256 --workers 8 --steps 50

Writes ``benchmarks/results/training.json`` (``--out`` for another path).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import torch

from benchmarks.record import write_results

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "training.json"
TINY = {
    "model_cfg": {
        "embed_dim": 64,
        "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "head_width": 32, "patch_size": 16},
        "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
    },
    "preprocess_cfg": {},
}


# ----------------------------------------------------------------------------------- inputs


def synthesise(root: Path, figures: int) -> dict[str, str]:
    """A figure subset and a region subset of the sample's JPEG figures: each figure with its left
    and right halves as regions (keys ``<fig>_p000_r00``/``_r01``, JSON boxes in figure pixels)."""
    import webdataset as wds
    from PIL import Image

    images = sorted((REPO / "sample" / "images").glob("*/*.jpg"))
    out = {"figure": root / "commercial", "region": root / "region-commercial"}
    for folder in out.values():
        folder.mkdir(parents=True)
    with (
        wds.TarWriter(str(out["figure"] / "panelforge-000000.tar")) as fig_sink,
        wds.TarWriter(str(out["region"] / "panelforge-000000.tar")) as reg_sink,
    ):
        for i in range(figures):
            data = images[i % len(images)].read_bytes()
            key = f"PMC{i}-fig1"
            fig_sink.write({"__key__": key, "jpg": data, "txt": f"figure {i} of stained cells".encode(), "json": b"{}"})
            image = Image.open(io.BytesIO(data)).convert("RGB")
            w, h = image.size
            for r, box in enumerate(((0, 0, w // 2, h), (w // 2, 0, w, h))):
                crop = io.BytesIO()
                image.crop(box).save(crop, "JPEG", quality=90)
                meta = json.dumps({"box": list(box), "figure_key": key, "description": f"half {r}"}).encode()
                side, other = ("left", "right") if r == 0 else ("right", "left")
                reg_sink.write({
                    "__key__": f"{key}_p000_r{r:02d}", "jpg": crop.getvalue(), "txt": f"the {side} half".encode(),
                    "json": meta, "neg.txt": f"the {other} half".encode(),
                })  # fmt: skip
    for folder in out.values():
        n = figures if folder.name == "commercial" else 2 * figures
        (folder / "sizes.json").write_text(json.dumps({"panelforge-000000.tar": n}))
    return {k: str(v) for k, v in out.items()}


def model_name(model: str, root: Path) -> str:
    """``tiny``: a local-dir: model folder written here (random weights); else the name as given."""
    if model != "tiny":
        return model
    folder = root / "tiny"
    folder.mkdir()
    (folder / "open_clip_config.json").write_text(json.dumps(TINY))
    return f"local-dir:{folder}"


# ----------------------------------------------------------------------------------- measuring


class GpuSampler:
    """``nvidia-smi`` utilisation every 0.2 s in a thread while the fed loop runs."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and shutil.which("nvidia-smi") is not None
        self.samples: list[tuple[float, float]] = []  # (perf_counter, percent)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
            )
            if out.returncode == 0 and out.stdout.strip():
                self.samples.append((time.perf_counter(), float(out.stdout.split()[0])))

    def __enter__(self) -> GpuSampler:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self.enabled:
            self._thread.join()

    def summary(self, device: torch.device, spans: list[tuple[float, float]]) -> dict:
        """Mean utilisation of the samples taken inside ``spans`` (the loader-fed steps)."""
        if device.type != "cuda":
            return {"mean_percent": None, "why_null": "no CUDA device in this run"}
        inside = [v for t, v in self.samples if any(a <= t <= b for a, b in spans)]
        if not inside:
            return {"mean_percent": None, "why_null": "nvidia-smi not found, or no sample fell in a fed step"}
        return {"mean_percent": round(sum(inside) / len(inside), 1), "samples": len(inside)}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory(device: torch.device) -> dict:
    if device.type == "cuda":
        return {"cuda_max_allocated_mib": round(torch.cuda.max_memory_allocated(device) / 2**20, 1)}
    return {"process_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def summarise(samples: list[int], data_s: list[float], step_s: list[float]) -> dict:
    """Samples/s over the whole loop, from the median step and from the fastest step (on a shared
    machine other processes' bursts slow random steps; the fastest is the nearest to an idle
    machine), and the share of step time spent waiting for data."""
    median = sorted(step_s)[len(step_s) // 2]
    return {
        "steps": len(step_s),
        "samples": sum(samples),
        "seconds": round(sum(step_s), 3),
        "samples_per_s": round(sum(samples) / sum(step_s), 2),
        "samples_per_s_median_step": round(samples[0] / median, 2),
        "samples_per_s_best_step": round(samples[0] / min(step_s), 2),
        "stall_share_best_step": round(data_s[step_s.index(min(step_s))] / min(step_s), 3),
        "stall_share": round(sum(data_s) / sum(step_s), 3),
    }


def ratios(fed: dict, ceiling: dict) -> dict:
    return {
        "loader_over_ceiling": round(fed["samples_per_s"] / ceiling["samples_per_s"], 3),
        "loader_over_ceiling_median_step": round(
            fed["samples_per_s_median_step"] / ceiling["samples_per_s_median_step"], 3
        ),
        "loader_over_ceiling_best_step": round(fed["samples_per_s_best_step"] / ceiling["samples_per_s_best_step"], 3),
    }


def _record(timings: dict[str, list], samples: int, data_s: float, step_s: float) -> None:
    timings["samples"].append(samples)
    timings["data"].append(data_s)
    timings["step"].append(step_s)


def step_samples(inputs) -> int:
    """Images a step encodes: each level's batch, the cross-level children and the ROI regions."""
    n = sum(b.images.shape[0] for b in inputs.levels.values())
    n += sum(b.images.shape[0] for b, _ in inputs.children.values() if b is not None)
    return n + (inputs.roi.boxes.shape[0] if inputs.roi is not None else 0)


def multilevel(args, data: dict[str, str], model: str, run: Path, workers: int) -> dict:
    """The trainer fed by its loaders (``workers`` per level), then the same compute on one step's
    inputs held in memory."""
    from pipelines.training.multilevel import MultilevelConfig, Trainer

    config = MultilevelConfig.from_dict({
        "preset": "region-aware", "run_dir": str(run), "model": model, "device": args.device,
        "figure_data": [data["figure"]], "region_data": [data["region"]], "batch_size": args.batch_size,
        "steps": 2 * args.steps + args.warmup_steps + 2, "warmup": 1, "curriculum": [], "resume": False,
        "region_features": args.region_features, "precision": args.precision, "workers": workers,
        "pretrained": "", "allow_random_init": True,  # throughput only: random weights, said so
    })  # fmt: skip
    config.validate()
    trainer = Trainer(config)
    trainer.resume()
    trainer.wrap()
    try:
        return _multilevel_loop(args, trainer, workers)
    finally:
        trainer.close()


def _multilevel_loop(args, trainer, workers: int) -> dict:
    device = trainer.device
    for _ in range(args.warmup_steps):
        trainer.train_step()
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    levels, weights, rng = trainer.plan()
    held = trainer.inputs(levels, weights, rng)  # one step's inputs, materialised once: the ceiling's
    fed_t: dict[str, list] = {"samples": [], "data": [], "step": []}
    held_t: dict[str, list] = {"samples": [], "data": [], "step": []}
    spans: list[tuple[float, float]] = []
    with GpuSampler(device.type == "cuda") as gpu:
        for _ in range(args.steps):  # fed and ceiling steps alternate, so both see the same machine
            t0 = time.perf_counter()
            levels, weights, rng = trainer.plan()
            inputs = trainer.inputs(levels, weights, rng)
            t1 = time.perf_counter()
            trainer.compute(inputs, weights)
            sync(device)
            _record(fed_t, step_samples(inputs), t1 - t0, time.perf_counter() - t0)
            spans.append((t0, time.perf_counter()))
            t0 = time.perf_counter()
            trainer.compute(held, weights)
            sync(device)
            _record(held_t, step_samples(held), 0.0, time.perf_counter() - t0)
    fed = summarise(fed_t["samples"], fed_t["data"], fed_t["step"])
    fed |= {"gpu_utilisation": gpu.summary(device, spans), "peak_memory": peak_memory(device)}
    ceiling = summarise(held_t["samples"], held_t["data"], held_t["step"])
    return {
        "fed": fed,
        "ceiling": ceiling,
        **ratios(fed, ceiling),
        "samples_per_step": step_samples(held),
        "trainable_params": trainer.params["trainable"],
        "workers_per_level": workers,
    }


def openclip_loop(args, data: dict[str, str], model_id: str) -> dict:
    """OpenCLIP's model and ClipLoss on a DataLoader of the figure shards, then on one held batch."""
    import open_clip
    import webdataset as wds
    from open_clip.loss import ClipLoss

    from pipelines.training.clip import subset_data

    device = torch.device(args.device)
    model, preprocess, _ = open_clip.create_model_and_transforms(model_id)
    model.to(device).train()
    tokenizer = open_clip.get_tokenizer(model_id)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    loss_fn = ClipLoss()
    pattern, _ = subset_data(data["figure"])
    dataset = (
        wds.WebDataset(pattern, resampled=True)  # endless, as open_clip_train --dataset-resampled
        .decode("pil")
        .to_tuple("jpg", "txt")
        .map_tuple(preprocess, lambda t: tokenizer([t])[0])
        .batched(args.batch_size)
    )
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=args.workers)

    def step(images: torch.Tensor, texts: torch.Tensor) -> None:
        out = model(images.to(device, non_blocking=True), texts.to(device, non_blocking=True))
        loss = loss_fn(*out[:3])  # image features, text features, logit scale
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    batches = iter(loader)
    for _ in range(args.warmup_steps):
        step(*next(batches))
    sync(device)
    held = next(batches)
    fed_t: dict[str, list] = {"samples": [], "data": [], "step": []}
    held_t: dict[str, list] = {"samples": [], "data": [], "step": []}
    for _ in range(args.steps):
        t0 = time.perf_counter()
        images, texts = next(batches)
        t1 = time.perf_counter()
        step(images, texts)
        sync(device)
        _record(fed_t, images.shape[0], t1 - t0, time.perf_counter() - t0)
        t0 = time.perf_counter()
        step(*held)
        sync(device)
        _record(held_t, held[0].shape[0], 0.0, time.perf_counter() - t0)
    fed = summarise(fed_t["samples"], fed_t["data"], fed_t["step"])
    ceiling = summarise(held_t["samples"], held_t["data"], held_t["step"])
    del batches, loader
    return {
        "fed": fed,
        "ceiling": ceiling,
        **ratios(fed, ceiling),
        "workers": args.workers,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny, or an OpenCLIP architecture (random weights)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=8, help="per level and step")
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers of the OpenCLIP loop")
    parser.add_argument(
        "--multilevel-workers", default="0,2", help="loader workers per level of the multi-level trainer, each a run"
    )
    parser.add_argument("--steps", type=int, default=16, help="timed steps (after the warm-up ones)")
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--figures", type=int, default=32, help="figures to synthesise when no data is given")
    parser.add_argument("--figure-data", help="a release figure subset folder (with sizes.json)")
    parser.add_argument("--region-data", help="the matching region subset folder")
    parser.add_argument("--region-features", default="crop", choices=("crop", "roi_pool", "roi_processor"))
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--skip-openclip", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    began, load_at_start = time.perf_counter(), [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.figure_data and args.region_data:
            data = {"figure": args.figure_data, "region": args.region_data}
        else:
            data = synthesise(root / "data", args.figures)
        model = model_name(args.model, root)
        result = {
            "benchmark": "multi-level trainer (and OpenCLIP step loop) throughput: loader-fed vs in-memory ceiling",
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "torch": torch.__version__,
                "device": args.device,
                "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            },
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "data": "given" if args.figure_data and args.region_data else "synthesised from sample/images",
            "load_average_1_5_15_at_start": load_at_start,
        }
        counts = [int(w) for w in args.multilevel_workers.split(",")]
        runs = {f"workers_{w}": multilevel(args, data, model, root / f"run-{w}", w) for w in counts}
        result["multilevel"] = runs
        result["multilevel_fed_over_workers_0"] = {
            name: {
                "samples_per_s": round(r["fed"]["samples_per_s"] / runs["workers_0"]["fed"]["samples_per_s"], 3),
                "samples_per_s_best_step": round(
                    r["fed"]["samples_per_s_best_step"] / runs["workers_0"]["fed"]["samples_per_s_best_step"], 3
                ),
            }
            for name, r in runs.items()
            if "workers_0" in runs
        }
        if not args.skip_openclip:
            result["openclip"] = openclip_loop(args, data, model)
    result["load_average_1_5_15_at_end"] = [round(x, 2) for x in os.getloadavg()]  # other processes share the CPUs
    result["seconds_total"] = round(time.perf_counter() - began, 1)
    result["note"] = (
        "Random weights (same compute as trained ones). The multi-level trainer runs once per loader-worker "
        "count (workers per level: the figure and the region level each have that many processes; 0 decodes "
        "in the training process, so its stall share is the decode share of a step); the ceiling repeats one "
        "materialised step. Fed and ceiling steps alternate so both see the same machine; on a shared "
        "CPU the best-step figures are the nearest to an idle machine. GPU numbers need --device cuda "
        "on a GPU machine."
    )
    write_results(args.out, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
