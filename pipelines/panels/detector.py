"""Find the panels of compound figures with DAB-DETR, batched on Ray Data like the embeddings.

Preprocessing keeps the aspect ratio: each figure is resized so its longest side is
``input_size`` (bilinear), pasted at the top-left of an ``input_size`` x ``input_size`` canvas,
and a pixel mask marks the real pixels (the DETR convention: padding at the right and bottom,
zeros after normalisation). Figures are never squashed, so a tall strip of panels keeps its
panels' shapes. The model predicts boxes as normalised (cx, cy, w, h) in that square padded
frame; :func:`to_original` maps them back to the figure's own pixels through the per-axis scale
(exact, rounding aside) and clamps them to the figure. Training (``train.py``) uses the same
frame through :func:`to_model`, its exact inverse.

Post-processing is sigmoid scores, top ``max_panels`` per class, the score threshold. Class 0
is a panel, class 1 (when ``labels == 2``) a panel-label glyph, returned separately. No NMS is
applied here: overlapping and nested boxes are resolved by ``postprocess.finalize``. The
Open-PMC-18M path (480 x 480 squash, NMS at IoU 0.2) is kept as :func:`openpmc_detect`, a
named baseline for the benchmark only.

Production loads weights by hub id (optionally a revision) or local directory, offline first;
tests and the demo pass ``synthetic=True``: a tiny DAB-DETR built from a config in code with
seeded weights, on the CPU in float32, marked ``synthetic`` in its ``model_label``. On a GPU
the model runs under bf16 (or fp16) autocast unless ``dtype`` says otherwise.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np
from PIL import Image

from pipelines.concepts.decode import decode_image
from pipelines.concepts.dinov2 import IMAGENET_MEAN, IMAGENET_STD, ModelUnavailableError, from_pretrained_offline_first
from pipelines.panels.types import Box, Panel
from pipelines.provenance import public_model_name
from pipelines.stage import Progress

DEFAULT_MODEL = "vector-institute/pmc-18m-dab-detr"
PANEL_CLASS, LABEL_CLASS = 0, 1  # model class indices; COCO category_id = index + 1
DTYPES = ("auto", "float32", "bfloat16", "float16")
OPENPMC_SIZE, OPENPMC_BATCH, OPENPMC_NMS_IOU = 480, 128, 0.2


@dataclass(frozen=True)
class DetectorConfig:
    model: str = DEFAULT_MODEL  # hub id or local directory
    revision: str | None = None
    synthetic: bool = False  # a randomly initialised model built in code (tests, demo, benchmarks)
    architecture: str = "tiny"  # synthetic only: "tiny", or "full" (DabDetrConfig defaults, ResNet-50)
    input_size: int = 800  # longest side after resizing; the padded frame is input_size x input_size
    threshold: float = 0.5
    dtype: str = "auto"  # auto: bf16 (fp16 without bf16 support) autocast on GPU, fp32 on CPU
    max_panels: int = 50  # top-k per class
    labels: int = 1  # 1: panel; 2: panel + panel-label glyph
    device: str | None = None  # None: cuda when available, else cpu (synthetic: always cpu)

    def __post_init__(self):
        if self.labels not in (1, 2):
            raise ValueError(f"labels must be 1 (panel) or 2 (panel + panel_label), not {self.labels}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, not {self.dtype!r}")
        if self.synthetic and self.architecture not in ("tiny", "full"):
            raise ValueError(f"architecture must be 'tiny' or 'full', not {self.architecture!r}")

    @property
    def model_label(self) -> str:
        if self.synthetic:
            return f"synthetic-{self.architecture}-dab-detr"
        name = public_model_name(self.model)  # never a local directory's path (it is provenance)
        return f"{name}@{self.revision}" if self.revision else name


# -- preprocessing ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """Where a figure sits in the padded model input: resized to ``resized`` (w, h) and pasted at
    ``offset`` (x, y) in a ``padded`` (w, h) canvas."""

    width: int
    height: int
    resized: tuple[int, int]
    padded: tuple[int, int]
    offset: tuple[int, int] = (0, 0)

    @property
    def scale(self) -> tuple[float, float]:
        """Per-axis scale from original to resized pixels (equal up to rounding)."""
        return self.resized[0] / self.width, self.resized[1] / self.height


def frame_for(width: int, height: int, input_size: int) -> Frame:
    """Longest side -> ``input_size`` (aspect ratio kept), padded to a square at the bottom/right."""
    if width <= 0 or height <= 0:
        raise ValueError(f"empty image {width}x{height}")
    scale = input_size / max(width, height)
    resized = (max(1, min(input_size, round(width * scale))), max(1, min(input_size, round(height * scale))))
    return Frame(width, height, resized, (input_size, input_size))


def prepare_image(image: Image.Image, input_size: int) -> tuple[np.ndarray, Frame]:
    """Resize (bilinear, aspect kept) and pad an RGB image: ((S, S, 3) uint8 with zero padding, frame)."""
    frame = frame_for(image.width, image.height, input_size)
    canvas = np.zeros((frame.padded[1], frame.padded[0], 3), dtype=np.uint8)
    resized = image.convert("RGB").resize(frame.resized, Image.Resampling.BILINEAR)
    x, y = frame.offset
    canvas[y : y + frame.resized[1], x : x + frame.resized[0]] = np.asarray(resized, dtype=np.uint8)
    return canvas, frame


def to_tensors(pixels: np.ndarray, frames: list[Frame]):
    """(n, S, S, 3) uint8 -> ``pixel_values`` (n, 3, S, S) float32 normalised with the ImageNet
    mean/std, zero outside the figure, and ``pixel_mask`` (n, S, S) int64, 1 on the figure."""
    import torch

    mean = np.asarray(IMAGENET_MEAN, dtype=np.float32)
    std = np.asarray(IMAGENET_STD, dtype=np.float32)
    values = (np.asarray(pixels, dtype=np.float32) / 255.0 - mean) / std
    mask = np.zeros(values.shape[:3], dtype=np.int64)
    for i, frame in enumerate(frames):
        x, y = frame.offset
        mask[i, y : y + frame.resized[1], x : x + frame.resized[0]] = 1
    values *= mask[..., None]
    return torch.from_numpy(values.transpose(0, 3, 1, 2).copy()), torch.from_numpy(mask)


def to_original(boxes: np.ndarray, frame: Frame) -> np.ndarray:
    """Normalised (cx, cy, w, h) in the padded frame -> (x1, y1, x2, y2) float original pixels."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    (pw, ph), (ox, oy), (sx, sy) = frame.padded, frame.offset, frame.scale
    cx, cy, w, h = boxes[:, 0] * pw, boxes[:, 1] * ph, boxes[:, 2] * pw, boxes[:, 3] * ph
    return np.stack([(cx - w / 2 - ox) / sx, (cy - h / 2 - oy) / sy, (cx + w / 2 - ox) / sx, (cy + h / 2 - oy) / sy], 1)


def to_model(boxes: np.ndarray, frame: Frame) -> np.ndarray:
    """(x1, y1, x2, y2) original pixels -> normalised (cx, cy, w, h) in the padded frame."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    (pw, ph), (ox, oy), (sx, sy) = frame.padded, frame.offset, frame.scale
    x1, y1, x2, y2 = boxes[:, 0] * sx + ox, boxes[:, 1] * sy + oy, boxes[:, 2] * sx + ox, boxes[:, 3] * sy + oy
    return np.stack([(x1 + x2) / 2 / pw, (y1 + y2) / 2 / ph, (x2 - x1) / pw, (y2 - y1) / ph], 1)


def pixel_box(box: np.ndarray, width: int, height: int) -> Box | None:
    """Round a float (x1, y1, x2, y2) to ints (x2, y2 exclusive), clamp to the image; None if empty."""
    x1, y1, x2, y2 = (int(round(float(v))) for v in box)
    x1, x2 = max(0, min(width, x1)), max(0, min(width, x2))
    y1, y2 = max(0, min(height, y1)), max(0, min(height, y2))
    return (x1, y1, x2, y2) if x2 > x1 and y2 > y1 else None


# -- postprocessing --------------------------------------------------------------------------


@dataclass
class Detections:
    """Raw thresholded detections of one figure, best first: panels and panel-label glyphs."""

    panels: list[Panel] = field(default_factory=list)
    label_boxes: list[Panel] = field(default_factory=list)


def postprocess(logits, pred_boxes, frames: list[Frame], threshold: float, max_panels: int = 50) -> list[Detections]:
    """``logits`` (n, Q, C) and ``pred_boxes`` (n, Q, 4; normalised cxcywh in the padded frame),
    tensors or arrays -> per-figure detections in original pixels. Per class: sigmoid, top
    ``max_panels`` queries, score >= ``threshold``. Class 0 gives panels, class 1 label boxes."""
    logits = np.asarray(logits.float().cpu() if hasattr(logits, "cpu") else logits, dtype=np.float64)
    pred_boxes = np.asarray(pred_boxes.float().cpu() if hasattr(pred_boxes, "cpu") else pred_boxes, dtype=np.float64)
    scores = 1.0 / (1.0 + np.exp(-logits))
    out = []
    for i, frame in enumerate(frames):
        found: list[list[Panel]] = [[], []]
        for cls in range(min(2, scores.shape[2])):
            s = scores[i, :, cls]
            top = np.argsort(-s, kind="stable")[:max_panels]
            top = top[s[top] >= threshold]
            for q, xyxy in zip(top, to_original(pred_boxes[i, top], frame), strict=True):
                box = pixel_box(xyxy, frame.width, frame.height)
                if box is not None:
                    found[cls].append(Panel(box=box, score=float(s[q])))
        out.append(Detections(panels=found[PANEL_CLASS], label_boxes=found[LABEL_CLASS]))
    return out


# -- the model -------------------------------------------------------------------------------


def tiny_dab_detr_config(num_labels: int = 1):
    """A DAB-DETR small enough for CPU tests (0.5M parameters): a 4-stage basic ResNet of width
    16-128, 1 encoder and 2 decoder layers of width 64, 20 queries."""
    from transformers import DabDetrConfig, ResNetConfig

    backbone = ResNetConfig(
        embedding_size=16,
        hidden_sizes=[16, 32, 64, 128],
        depths=[1, 1, 1, 1],
        layer_type="basic",
        out_features=["stage4"],
    )
    return DabDetrConfig(
        backbone_config=backbone,
        num_labels=num_labels,
        num_queries=20,
        encoder_layers=1,
        decoder_layers=2,
        hidden_size=64,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
    )


def full_dab_detr_config(num_labels: int = 1):
    """DAB-DETR's default architecture (ResNet-50, 300 queries, 6+6 layers), random weights."""
    from transformers import DabDetrConfig

    return DabDetrConfig(num_labels=num_labels)


def _unavailable(config: DetectorConfig, exc: Exception) -> ModelUnavailableError:
    return ModelUnavailableError(
        f"DAB-DETR weights {config.model!r} are not available (offline and not in the Hugging Face cache, "
        f"nor a local directory). Download them once (huggingface-cli download {config.model}) "
        "or set the detector model to a local directory."
    )


def build_model(config: DetectorConfig):
    """The model in float32 on the CPU, in eval mode: seeded random weights when synthetic (the
    global RNG is left alone), else the pretrained weights."""
    import torch
    from transformers import DabDetrForObjectDetection

    if config.synthetic:
        arch = tiny_dab_detr_config if config.architecture == "tiny" else full_dab_detr_config
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = DabDetrForObjectDetection(arch(config.labels))
    else:
        model = from_pretrained_offline_first(
            DabDetrForObjectDetection, config.model, lambda exc: _unavailable(config, exc), config.revision
        )
        if model.config.num_labels != config.labels:
            raise ValueError(
                f"{config.model!r} has {model.config.num_labels} classes but the detector config says "
                f"labels={config.labels}"
            )
    return model.eval()


def resolve_device(config: DetectorConfig):
    """(device, autocast dtype or None)."""
    import torch

    default = "cpu" if config.synthetic or not torch.cuda.is_available() else "cuda"
    device = torch.device(config.device or default)
    if device.type != "cuda" or config.dtype == "float32":
        return device, None
    if config.dtype == "auto":
        return device, torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return device, getattr(torch, config.dtype)


def load_detector(config: DetectorConfig):
    """Return ``(model, device, autocast dtype or None)``; the model is on the device, in eval mode."""
    model = build_model(config)
    device, dtype = resolve_device(config)
    return model.to(device), device, dtype


class Detector:
    """Holds the model once (per Ray actor) and detects panels in prepared figures."""

    def __init__(self, config: DetectorConfig, model=None):
        import torch

        self.config = config
        if model is None:
            self.model, self.device, self.dtype = load_detector(config)
        else:  # an in-memory model (training's evaluation)
            self.model = model
            self.device, self.dtype = next(model.parameters()).device, resolve_device(config)[1]
        self._torch = torch

    def forward(self, pixel_values, pixel_mask):
        """Raw model outputs (logits, pred_boxes) as float32 CPU tensors."""
        torch = self._torch
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                values, mask = pixel_values.to(self.device), pixel_mask.to(self.device)
                if self.dtype is not None:
                    with torch.autocast(self.device.type, dtype=self.dtype):
                        out = self.model(pixel_values=values, pixel_mask=mask)
                else:
                    out = self.model(pixel_values=values, pixel_mask=mask)
        finally:
            self.model.train(was_training)
        return out.logits.float().cpu(), out.pred_boxes.float().cpu()

    def detect_pixels(self, pixels: np.ndarray, frames: list[Frame]) -> list[Detections]:
        """``pixels``: (n, S, S, 3) uint8 from :func:`prepare_image`, with their frames."""
        if len(frames) == 0:
            return []
        logits, boxes = self.forward(*to_tensors(pixels, frames))
        return postprocess(logits, boxes, frames, self.config.threshold, self.config.max_panels)

    def detect(self, images: list[Image.Image], batch_size: int = 8) -> list[Detections]:
        """In-process convenience: prepare and detect RGB images, ``batch_size`` at a time."""
        out: list[Detections] = []
        for start in range(0, len(images), batch_size):
            prepared = [prepare_image(im, self.config.input_size) for im in images[start : start + batch_size]]
            out += self.detect_pixels(np.stack([p for p, _ in prepared]), [f for _, f in prepared])
        return out


# -- Ray Data: CPU decode tasks + an actor pool holding the model ----------------------------

REF_KEYS = ("tar_path", "offset", "size")


def _prepare_batch(batch: dict, lake_root: str, input_size: int) -> dict:
    """CPU stage: raw bytes -> decoded RGB -> resized and padded uint8, or an error for that image."""
    from pipelines.acquire.rawstore import RawReader
    from pipelines.lake import Lake

    pixels, widths, heights, errors = [], [], [], []
    with RawReader(Lake(lake_root)) as reader:
        for tar_path, offset, size in zip(batch["tar_path"], batch["offset"], batch["size"], strict=True):
            data = reader.read(str(tar_path), int(offset), int(size))  # a missing tar is an outage: raise
            image, error = decode_image(data)
            if image is not None and (image.width == 0 or image.height == 0):
                image, error = None, "empty image"
            if image is None:
                pixels.append(np.zeros((input_size, input_size, 3), dtype=np.uint8))
                widths.append(0), heights.append(0), errors.append(error or "undecodable image")
                continue
            canvas, _ = prepare_image(image, input_size)
            pixels.append(canvas)
            widths.append(image.width), heights.append(image.height), errors.append("")
    return {
        **dict(batch),
        "pixels": np.stack(pixels),
        "width": np.array(widths, dtype=np.int64),
        "height": np.array(heights, dtype=np.int64),
        "error": np.array(errors, dtype=object),
    }


def _panels_json(panels: list[Panel]) -> str:
    return json.dumps([[*p.box, round(p.score, 6)] for p in panels])


def _panels_from_json(text: str) -> list[Panel]:
    return [Panel(box=tuple(int(v) for v in row[:4]), score=float(row[4])) for row in json.loads(text or "[]")]


class _DetectActor:
    """GPU (or CPU) stage: the model is loaded once per actor."""

    def __init__(self, config: dict):
        self.detector = Detector(DetectorConfig(**config))

    def __call__(self, batch: dict) -> dict:
        ok = np.array([not e for e in batch["error"]], dtype=bool)
        panels, labels = [""] * len(ok), [""] * len(ok)
        if ok.any():
            index = np.flatnonzero(ok)
            frames = [
                frame_for(int(batch["width"][i]), int(batch["height"][i]), self.detector.config.input_size)
                for i in index
            ]
            for i, found in zip(index, self.detector.detect_pixels(batch["pixels"][ok], frames), strict=True):
                panels[i], labels[i] = _panels_json(found.panels), _panels_json(found.label_boxes)
        out = {k: v for k, v in batch.items() if k != "pixels"}
        out["panels"] = np.array(panels, dtype=object)
        out["label_boxes"] = np.array(labels, dtype=object)
        return out


def detect_images(
    lake,
    refs: list[dict],
    config: DetectorConfig,
    batch_size: int = 8,
    actors: int = 1,
    gpus_per_actor: float = 0,
    address: str | None = None,
    actor_resources: dict[str, float] | None = None,
) -> list[dict]:
    """Detect panels in ``refs`` (rows with ``tar_path``, ``offset``, ``size`` into the lake's raw
    tars, plus any identifying columns such as pmcid, fig_id, image_file, sha256, kept as given).

    Returns one row per ref, in input order, with its columns plus ``width``, ``height``,
    ``panels`` and ``label_boxes`` (lists of :class:`Panel`, empty on error) and ``error``
    (None, or why the image could not be decoded).
    """
    if not refs:
        return []
    from pipelines.concepts.embed import actor_pool_batches

    cfg = asdict(config)
    batches = actor_pool_batches(
        [{**ref, "_index": i} for i, ref in enumerate(refs)],
        _prepare_batch,
        {"lake_root": lake.url, "input_size": config.input_size},
        _DetectActor,
        {"config": cfg},
        batch_size,
        actors,
        gpus_per_actor,
        address,
        actor_resources,
    )
    rows: list[dict | None] = [None] * len(refs)
    progress = Progress("panel detection", len(refs), "images")
    with progress.heartbeat():
        for batch in batches:
            for j in range(len(batch["_index"])):
                i = int(batch["_index"][j])
                error = batch["error"][j] or None
                rows[i] = {
                    **refs[i],
                    "width": int(batch["width"][j]),
                    "height": int(batch["height"][j]),
                    "panels": _panels_from_json(batch["panels"][j]),
                    "label_boxes": _panels_from_json(batch["label_boxes"][j]),
                    "error": error,
                }
            progress.advance(len(batch["_index"]), failed=sum(1 for e in batch["error"] if e))
    return rows


# -- the Open-PMC-18M baseline ---------------------------------------------------------------


def openpmc_detect(
    detector: Detector,
    images: list[Image.Image],
    batch_size: int = OPENPMC_BATCH,
    size: int = OPENPMC_SIZE,
    nms_iou: float = OPENPMC_NMS_IOU,
) -> list[list[Panel]]:
    """Open-PMC-18M's inference path, kept as a named baseline for the benchmark: every figure
    squashed to ``size`` x ``size`` (aspect ratio lost, no mask), batches of ``batch_size``,
    boxes scaled back per axis, then class-agnostic NMS at IoU ``nms_iou``, which drops panels
    nested in or overlapping others by as little as 20%. Not used by the pipeline."""
    import torch
    from torchvision.ops import nms

    out: list[list[Panel]] = []
    cfg = detector.config
    for start in range(0, len(images), batch_size):
        chunk = images[start : start + batch_size]
        pixels = np.stack(
            [np.asarray(im.convert("RGB").resize((size, size), Image.Resampling.BILINEAR)) for im in chunk]
        )
        frames = [Frame(size, size, (size, size), (size, size)) for _ in chunk]
        values, mask = to_tensors(pixels, frames)
        logits, boxes = detector.forward(values, mask)
        scores = logits.sigmoid()[..., PANEL_CLASS]
        for i, im in enumerate(chunk):
            keep = torch.nonzero(scores[i] >= cfg.threshold).flatten()
            frame = Frame(im.width, im.height, (size, size), (size, size))
            xyxy = torch.from_numpy(to_original(boxes[i, keep].numpy(), frame)).float()
            kept = keep[nms(xyxy, scores[i, keep], nms_iou)] if len(keep) else keep
            panels = []
            for q in kept.tolist():
                box = pixel_box(to_original(boxes[i, q].numpy(), frame)[0], im.width, im.height)
                if box is not None:
                    panels.append(Panel(box=box, score=float(scores[i, q])))
            out.append(panels)
    return out


def decode_and_detect(detector: Detector, data: list[bytes], batch_size: int = 8) -> list[Detections | str]:
    """In-process path from encoded bytes (decode included): detections, or the decode error."""
    images, where, out = [], [], []
    for i, blob in enumerate(data):
        image, error = decode_image(blob)
        out.append((error or "undecodable image") if image is None else None)
        if image is not None:
            images.append(image), where.append(i)
    for i, found in zip(where, detector.detect(images, batch_size), strict=True):
        out[i] = found
    return out
