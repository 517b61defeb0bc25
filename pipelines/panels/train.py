"""Train DAB-DETR on a COCO-format folder of compound figures, resumable, as an external job.

    python -m pipelines.panels.train --config config.json

The JSON config holds :class:`TrainConfig`'s fields (``detector`` holds
:class:`~pipelines.panels.detector.DetectorConfig`'s). Images go through the same
aspect-preserving resize-and-pad as inference (``detector.prepare_image``, with its pixel mask),
and targets through ``detector.to_model``: normalised by the visible (unpadded) image, the frame
DETR-family models predict in, so training and inference share one box frame. The loop is plain
PyTorch: AdamW (backbone at ``backbone_lr_factor`` x the learning rate), optional linear
warm-up, gradient clipping, DAB-DETR's own loss (sigmoid focal + L1 + GIoU with Hungarian
matching). Classes follow the model's own ``id2label`` (``detector.class_map``): category 1
(panel) -> the model's panel class (0 in the models PanelForge builds, 1 in Open-PMC-18M's
checkpoint when fine-tuning it), category 2 (panel_label) -> its glyph class when
``detector.labels == 2``, else dropped.

Everything goes to ``output_dir`` (a local path or an fsspec URL; launched, the run's folder in
the lake): ``checkpoints/ckpt-NNNNNNNN.pt`` every ``checkpoint_every`` steps and at the end
(model, optimizer, step, config, RNG state; written atomically and the last ``keep_checkpoints``
kept, by ``pipelines.launch``),
``metrics.jsonl`` (one line per logged step, then the evaluation), ``model/`` (the final
weights, loadable with ``DetectorConfig(model=<dir>)``) and ``report.json``. With
``resume`` (the default) a run continues from its latest checkpoint: the batch order is a
function of (seed, step) and the RNG state is restored, so a run killed and resumed gives the
same weights as one never interrupted; metric lines written after that checkpoint are dropped.

The module is a launched job like every other (``pipelines.launch.main``): under Dagster Pipes
its log lines, one message per logged step (``kind`` train, eval or real) and the final report
(nested values flattened: ``eval_map``) go to the Dagster run; run by hand they are printed.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipelines import launch
from pipelines.panels.detector import (
    Classes,
    DetectorConfig,
    Frame,
    build_model,
    detector_classes,
    prepare_image,
    resolve_device,
    to_model,
)


@dataclass
class TrainConfig(launch.JobConfig):
    train_dir: str
    output_dir: str
    val_dir: str | None = None
    steps: int = 1000
    batch_size: int = 8
    lr: float = 1e-4
    backbone_lr_factor: float = 0.1
    weight_decay: float = 1e-4
    warmup_steps: int = 0
    grad_clip: float = 0.1
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    log_every: int = 10
    seed: int = 0
    device: str | None = None  # None: cuda when available, else cpu
    num_workers: int = 0  # DataLoader processes decoding images
    resume: bool = True
    eval_batch_size: int = 8
    real_eval: str | None = None  # boxes.json of hand-boxed real figures (paths relative to its repository root)
    detector: DetectorConfig = field(default_factory=lambda: DetectorConfig(synthetic=True))

    JOB = "training"
    LAUNCH_FIELDS = {"output_dir": "run_dir"}  # launched: the run's folder in the lake

    @classmethod
    def coerce(cls, data: dict[str, Any]) -> dict[str, Any]:
        detector = data.pop("detector", None) or {}
        return {**data, "detector": DetectorConfig(**detector) if isinstance(detector, dict) else detector}

    @property
    def checkpoint_dir(self) -> str:
        return f"{self.output_dir.rstrip('/')}/checkpoints"

    def to_dict(self) -> dict:
        return asdict(self)


# -- data ------------------------------------------------------------------------------------


class CocoDataset:
    """The images and targets of a COCO folder, prepared exactly as for inference: category 1
    (panel) becomes ``classes.panel``, category 2 (panel_label) ``classes.label`` (dropped when
    None)."""

    def __init__(self, coco_dir: str, input_size: int, classes: Classes):
        from pipelines.panels.coco_eval import read_coco

        gt, self.fs, self.root = read_coco(coco_dir)
        self.images = sorted(gt["images"], key=lambda im: im["id"])
        self.input_size = input_size
        self.class_of = {1: classes.panel, **({2: classes.label} if classes.label is not None else {})}
        self.annotations: dict[int, list[dict]] = {}
        for ann in gt.get("annotations", []):
            if ann["category_id"] in self.class_of and not ann.get("iscrowd", 0):
                self.annotations.setdefault(ann["image_id"], []).append(ann)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[np.ndarray, Frame, np.ndarray, np.ndarray]:
        """(padded uint8 pixels, frame, class indices (k,), cxcywh boxes (k, 4) normalised by the
        visible image)."""
        from pipelines.images.decode import decode_image

        info = self.images[index]
        with self.fs.open(f"{self.root}/images/{info['file_name']}", "rb") as fh:
            image, error = decode_image(fh.read())
        if image is None:
            raise ValueError(f"training image {info['file_name']}: {error}")
        pixels, frame = prepare_image(image, self.input_size)
        anns = [a for a in self.annotations.get(info["id"], []) if a["bbox"][2] > 0 and a["bbox"][3] > 0]
        xyxy = np.array([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in anns)], dtype=np.float64)
        boxes = np.clip(to_model(xyxy, frame), 0.0, 1.0) if len(anns) else np.zeros((0, 4))
        classes = np.array([self.class_of[a["category_id"]] for a in anns], dtype=np.int64)
        return pixels, frame, classes, boxes


def batch_indices(step: int, batch_size: int, n: int, seed: int) -> list[int]:
    """The dataset indices of optimizer step ``step`` (0-based): consecutive slices of one seeded
    permutation per epoch, so the order depends only on (seed, step) and resuming needs no state."""
    out = []
    for position in range(step * batch_size, (step + 1) * batch_size):
        epoch, offset = divmod(position, n)
        out.append(int(np.random.default_rng([seed, epoch]).permutation(n)[offset]))
    return out


class _StepSampler:
    def __init__(self, start: int, stop: int, batch_size: int, n: int, seed: int):
        self.start, self.stop, self.batch_size, self.n, self.seed = start, stop, batch_size, n, seed

    def __iter__(self):
        for step in range(self.start, self.stop):
            yield batch_indices(step, self.batch_size, self.n, self.seed)

    def __len__(self) -> int:
        return max(0, self.stop - self.start)


def collate(items: list) -> dict:
    import torch

    from pipelines.panels.detector import to_tensors

    values, mask = to_tensors(np.stack([p for p, *_ in items]), [f for _, f, *_ in items])
    labels = [
        {"class_labels": torch.from_numpy(c), "boxes": torch.from_numpy(b.astype(np.float32)).reshape(-1, 4)}
        for _, _, c, b in items
    ]
    return {"pixel_values": values, "pixel_mask": mask, "labels": labels}


# -- output directory ------------------------------------------------------------------------


class Output:
    """The run's output directory on any fsspec filesystem; files are written atomically."""

    def __init__(self, url: str):
        import fsspec

        self.fs, root = fsspec.core.url_to_fs(str(url))
        self.root = root.rstrip("/")
        self.fs.makedirs(self.root, exist_ok=True)

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def write_bytes(self, relative: str, data: bytes) -> str:
        """Atomically, as every launched job writes (``pipelines.launch.atomic_write``)."""
        dest = self.path(relative)
        launch.atomic_write(self.fs.unstrip_protocol(dest), data)
        return dest

    def read_text(self, relative: str) -> str | None:
        path = self.path(relative)
        if not self.fs.exists(path):
            return None
        with self.fs.open(path, "rb") as fh:
            return fh.read().decode()

    def put_dir(self, local: Path, relative: str) -> str:
        dest = self.path(relative)
        self.fs.makedirs(dest, exist_ok=True)
        for file in sorted(local.iterdir()):
            self.fs.put_file(str(file), f"{dest}/{file.name}")
        return dest


def save_checkpoint(step: int, model, optimizer, config: TrainConfig) -> str:
    """The training state after ``step`` as the launched jobs' checkpoint (atomic, the newest
    ``config.keep_checkpoints`` kept); its URL."""
    import torch

    state = {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "config": config.to_dict(),
        "model_config": model.config.to_dict(),
        "rng": {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all()},
    }
    buffer = io.BytesIO()
    torch.save(state, buffer)
    url = launch.save_checkpoint(config.checkpoint_dir, step, buffer.getvalue(), "pt")
    launch.prune_checkpoints(config.checkpoint_dir, config.keep_checkpoints, upto=step)
    return url


def load_checkpoint(url: str) -> dict:
    import torch

    return torch.load(io.BytesIO(launch.read_bytes(url)), map_location="cpu", weights_only=False)


def export_model(out: Output, model, detector: DetectorConfig) -> str:
    """Final weights as a ``save_pretrained`` directory (plus the detector config used)."""
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        (Path(tmp) / "panelforge_detector.json").write_text(json.dumps(asdict(detector), indent=2) + "\n")
        return out.put_dir(Path(tmp), "model")


# -- the loop --------------------------------------------------------------------------------


def _metrics_lines(out: Output, upto: int) -> list[str]:
    """metrics.jsonl lines of training steps <= ``upto`` (a resumed run rewrites the rest)."""
    text = out.read_text("metrics.jsonl") or ""
    keep = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if record.get("kind") == "train" and record.get("step", math.inf) <= upto:
                keep.append(line)
    return keep


def train(config: TrainConfig) -> dict:
    """Train (or resume) and return the final report (also written to ``report.json``); log lines
    and metrics go through ``pipelines.launch`` (to Dagster when launched by Pipes)."""
    import torch

    out = Output(config.output_dir)
    det = config.detector
    torch.manual_seed(config.seed)
    device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    autocast = resolve_device(DetectorConfig(**{**asdict(det), "device": str(device)}))[1]

    model = build_model(det).to(device)
    backbone = [p for n, p in model.named_parameters() if "backbone" in n and p.requires_grad]
    rest = [p for n, p in model.named_parameters() if "backbone" not in n and p.requires_grad]
    optimizer = torch.optim.AdamW(
        [{"params": rest, "lr": config.lr, "base_lr": config.lr},
         {"params": backbone, "lr": config.lr * config.backbone_lr_factor,
          "base_lr": config.lr * config.backbone_lr_factor}],
        weight_decay=config.weight_decay,
    )  # fmt: skip

    start, resumed_from = 0, None
    checkpoint_path = launch.latest_checkpoint(config.checkpoint_dir) if config.resume else None
    if checkpoint_path is not None:
        state = load_checkpoint(checkpoint_path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"])
        if device.type == "cuda" and state["rng"]["cuda"]:
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        start = resumed_from = int(state["step"])
        launch.log(f"resumed from {checkpoint_path} at step {start}")
    metric_lines = _metrics_lines(out, start)

    dataset = CocoDataset(config.train_dir, det.input_size, detector_classes(model.config, det))
    if len(dataset) == 0:
        raise ValueError(f"{config.train_dir} has no images")
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=_StepSampler(start, config.steps, config.batch_size, len(dataset), config.seed),
        collate_fn=collate,
        num_workers=config.num_workers,
        generator=torch.Generator().manual_seed(config.seed),  # leaves the global RNG alone
    )
    launch.log(f"training {det.model_label} on {len(dataset)} images, steps {start}..{config.steps}, device {device}")
    model.train()
    step, last, began = start, {}, time.perf_counter()
    for batch in loader:
        warmup = min(1.0, (step + 1) / config.warmup_steps) if config.warmup_steps else 1.0
        for group in optimizer.param_groups:
            group["lr"] = group["base_lr"] * warmup
        labels = [{k: v.to(device) for k, v in t.items()} for t in batch["labels"]]
        values, mask = batch["pixel_values"].to(device), batch["pixel_mask"].to(device)
        with torch.autocast(device.type, dtype=autocast) if autocast else contextlib.nullcontext():
            output = model(pixel_values=values, pixel_mask=mask, labels=labels)
        loss = output.loss
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite loss {loss.item()} at step {step}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        step += 1
        last = {
            "kind": "train",
            "step": step,
            "loss": round(float(loss.detach()), 6),
            **{k: round(float(v.detach()), 6) for k, v in output.loss_dict.items()},
            "grad_norm": round(float(grad_norm), 6),
            "lr": optimizer.param_groups[0]["lr"],
            "seconds": round(time.perf_counter() - began, 3),
        }
        if step % config.log_every == 0 or step == config.steps:
            metric_lines.append(json.dumps(last))
            out.write_bytes("metrics.jsonl", ("\n".join(metric_lines) + "\n").encode())
            launch.report_progress(step, {k: v for k, v in last.items() if k not in ("kind", "step")}, "train")
        if step % config.checkpoint_every == 0 or step == config.steps:
            checkpoint_path = save_checkpoint(step, model, optimizer, config)
            launch.log(f"checkpoint {checkpoint_path}")

    model.eval()
    model_dir = export_model(out, model, det)
    report = {
        "model": det.model_label,
        "steps": step,
        "resumed_from": resumed_from,
        "final_loss": last.get("loss"),
        "checkpoint": checkpoint_path,
        "model_dir": model_dir,
        "seconds": round(time.perf_counter() - began, 3),
    }
    if config.val_dir:
        from pipelines.panels.coco_eval import evaluate_detector
        from pipelines.panels.detector import Detector

        report["eval"] = evaluate_detector(Detector(det, model=model), config.val_dir, config.eval_batch_size)
        metric_lines.append(json.dumps({"kind": "eval", "step": step, **report["eval"]}))
        out.write_bytes("metrics.jsonl", ("\n".join(metric_lines) + "\n").encode())
        launch.report_progress(step, report["eval"], "eval")
    if config.real_eval:
        report["real"] = evaluate_on_real_figures(Detector(det, model=model), config.real_eval)
        launch.report_progress(step, report["real"], "real")
    out.write_bytes("report.json", (json.dumps(report, indent=2) + "\n").encode())
    return report


def evaluate_on_real_figures(detector, boxes_json: str) -> dict:
    """Panel recall/precision at IoU >= 0.5 on hand-boxed real figures, with the panels as the
    pipeline keeps them (``postprocess.finalize``)."""
    from pathlib import Path

    from pipelines.images.boxes import finalize
    from pipelines.images.decode import UnusableFigureError, open_figure
    from pipelines.panels.evaluate import load_eval_set, match_at_iou, recall_precision

    root = Path(boxes_json).resolve().parents[2]  # <repo>/sample/panels/boxes.json
    figures = load_eval_set(boxes_json, root)
    opened = [open_figure(Path(f["path"]).read_bytes()) for f in figures]
    if unusable := [f"{f['path']}: {o.reason}" for f, o in zip(figures, opened, strict=True) if o.image is None]:
        raise UnusableFigureError(f"hand-boxed figures the decoder refuses: {'; '.join(unusable)}")
    images = [o.image for o in opened]
    found = detector.detect(images)
    results = [
        match_at_iou([p.box for p in finalize(d.panels, f["width"], f["height"])], f["boxes"])
        for f, d in zip(figures, found, strict=True)
    ]
    return {"figures": len(figures), **recall_precision(results)}


def run(config: TrainConfig, job: launch.LaunchInfo) -> dict:
    """The launched job: train, then the report as the asset's metadata (``report.json`` is
    ``train``'s own, in the output folder)."""
    report = train(config)
    launch.report_final(launch.flat_metadata(report))
    return report


def main(argv: list[str] | None = None) -> dict:
    return launch.main(TrainConfig, run, argv, description=__doc__.splitlines()[0])


if __name__ == "__main__":
    main()
