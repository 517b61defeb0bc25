"""Find the panels of compound figures with DAB-DETR, batched on Ray Data like the embeddings.

Preprocessing keeps the aspect ratio: each figure is resized so its longest side is
``input_size`` (bilinear), pasted at the top-left of an ``input_size`` x ``input_size`` canvas,
and a pixel mask marks the real pixels (the DETR convention: padding at the right and bottom,
zeros after normalisation). Figures are never squashed, so a tall strip of panels keeps its
panels' shapes.

The box frame: DETR-family models predict normalised (cx, cy, w, h) relative to the *visible*
image, not the padded canvas. Their sine position embedding is normalised by the extent of the
mask (``modeling_dab_detr.py``, facebookresearch/detr#286), so a model sees the same positions
whether or not padding surrounds the image, and the image processors they were trained with
normalise the targets by the resized image's own size. :func:`to_original` therefore scales the
boxes by the figure's own width and height (exact; the resize factor cancels out), and training
(``train.py``) writes its targets in the same frame through :func:`to_model`, its exact inverse.

Classes come from the checkpoint's ``id2label``: the panel class is the one named ``subfigure``
or ``panel`` (Open-PMC-18M's checkpoint is ``{0: "nothing", 1: "subfigure"}``: its panels are
class 1), a panel-label glyph class the one named ``panel_label``; see :func:`class_map`.
Post-processing is sigmoid scores, top ``max_panels`` of the panel class (and of the glyph
class when ``labels == 2``), the score threshold. No NMS is applied here: overlapping and nested
boxes are resolved by ``postprocess.finalize``. Open-PMC-18M's own inference (480 x 480 squash,
score > 0.2, their NMS at IoU 0.2) is kept as :func:`openpmc_detect`, a named baseline for the
benchmark only.

Production loads weights by hub id (optionally a revision) or local directory, the Hugging Face
cache before the network, and a local folder never through it (``pipelines.compute.weights``). Configs
saved by transformers 4.x name their backbone as a string (``"backbone": "resnet50"`` with
``backbone_kwargs``), which transformers 5 would look up on the hub; :func:`model_config` turns
it into an explicit timm backbone config with the same ``out_indices`` and ``output_stride``
(DC5). :func:`check_weights` is the cheap set-up check that fails in one line before any Ray
worker starts. Tests and the demo pass ``synthetic=True``: a tiny DAB-DETR built from a config
in code with seeded weights, on the CPU in float32, marked ``synthetic`` in its
``model_label``. On a GPU the model runs under bf16 (or fp16) autocast unless ``dtype`` says
otherwise.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from pipelines.compute.weights import IMAGENET_MEAN, IMAGENET_STD, Weights
from pipelines.core.stage import Progress
from pipelines.images.boxes import Box, Panel
from pipelines.images.decode import decode_image
from pipelines.images.tensors import normalized

DEFAULT_MODEL = "vector-institute/pmc-18m-dab-detr"
SETTING = "PANELFORGE_PANEL_DETECTOR"  # the setting that names the weights, in every loading error
DTYPES = ("auto", "float32", "bfloat16", "float16")
PANEL_NAMES = ("panel", "subfigure")  # id2label names of the panel class
LABEL_NAMES = ("panel_label", "subfigure_label")  # ... and of the panel-label glyph class
# Open-PMC-18M's inference (openpmcvl/dab_detr/biomedica_inference.py): 480 x 480 squash,
# batches of 128, score > 0.2 among the top 100 (query, class) pairs, their NMS at IoU 0.2
OPENPMC_SIZE, OPENPMC_BATCH, OPENPMC_THRESHOLD, OPENPMC_NMS_IOU, OPENPMC_TOP_K = 480, 128, 0.2, 0.2, 100


@dataclass(frozen=True)
class DetectorConfig:
    model: str = DEFAULT_MODEL  # hub id or local directory
    revision: str | None = None
    synthetic: bool = False  # a randomly initialised model built in code (tests, demo, benchmarks)
    architecture: str = "tiny"  # synthetic only: "tiny", or "full" (the published ResNet-50 DC5 at real size)
    input_size: int = 800  # longest side after resizing; the padded frame is input_size x input_size
    threshold: float = 0.5
    dtype: str = "auto"  # auto: bf16 (fp16 without bf16 support) autocast on GPU, fp32 on CPU
    max_panels: int = 50  # top-k per class
    labels: int = 1  # 1: panels; 2: panels + panel-label glyphs (the model must have that class)
    panel_class: int | None = None  # None: the class id2label names subfigure/panel; else this index
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
        return f"{self.model}@{self.revision}" if self.revision else self.model


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


def to_tensors(pixels: np.ndarray, frames: list[Frame], device="cpu"):
    """(n, S, S, 3) uint8 -> ``pixel_values`` (n, 3, S, S) float32 normalised with the ImageNet
    mean/std, zero outside the figure, and ``pixel_mask`` (n, S, S) int64, 1 on the figure; both
    built on ``device`` (the uint8 pixels are what crosses to it: ``pipelines.images.tensors``)."""
    import torch

    values = normalized(pixels, IMAGENET_MEAN, IMAGENET_STD, divide_by=255, device=device)
    mask = torch.zeros((values.shape[0], *values.shape[2:]), dtype=torch.int64, device=values.device)
    for i, frame in enumerate(frames):
        x, y = frame.offset
        mask[i, y : y + frame.resized[1], x : x + frame.resized[0]] = 1
    return values.mul_(mask[:, None]), mask


def to_original(boxes: np.ndarray, frame: Frame) -> np.ndarray:
    """Normalised (cx, cy, w, h) relative to the visible (resized, unpadded) image -> (x1, y1,
    x2, y2) float original pixels. The visible image is the whole figure resized, so the scale
    from model frame to figure is the figure's own width and height: padding and resize factor
    play no part (see the module docstring for why the model's frame is the visible image)."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    w, h = frame.width, frame.height
    cx, cy, bw, bh = boxes[:, 0] * w, boxes[:, 1] * h, boxes[:, 2] * w, boxes[:, 3] * h
    return np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], 1)


def to_model(boxes: np.ndarray, frame: Frame) -> np.ndarray:
    """(x1, y1, x2, y2) original pixels -> normalised (cx, cy, w, h) relative to the visible
    image: the frame of the model's predictions and of its training targets."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    w, h = frame.width, frame.height
    x1, y1, x2, y2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    return np.stack([(x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h], 1)


def pixel_box(box: np.ndarray, width: int, height: int) -> Box | None:
    """Round a float (x1, y1, x2, y2) to ints (x2, y2 exclusive), clamp to the image; None if empty."""
    x1, y1, x2, y2 = (int(round(float(v))) for v in box)
    x1, x2 = max(0, min(width, x1)), max(0, min(width, x2))
    y1, y2 = max(0, min(height, y1)), max(0, min(height, y2))
    return (x1, y1, x2, y2) if x2 > x1 and y2 > y1 else None


# -- classes and postprocessing ----------------------------------------------------------


@dataclass(frozen=True)
class Classes:
    """Which model class indices hold panels and (optionally) panel-label glyphs."""

    panel: int = 0
    label: int | None = None


def class_names(labels: int) -> dict[int, str]:
    """``id2label`` of the models PanelForge builds and trains: 0 panel, 1 panel_label."""
    return {0: "panel", 1: "panel_label"} if labels == 2 else {0: "panel"}


def class_map(id2label: dict, labels: int = 1, panel_class: int | None = None) -> Classes:
    """The panel class (and the glyph class when ``labels == 2``) from a checkpoint's
    ``id2label``: the class named ``subfigure`` or ``panel`` (any case), unless ``panel_class``
    names it. Models whose classes were never named (transformers' ``LABEL_0``, ``LABEL_1``, as
    PanelForge exported them before naming its classes) follow PanelForge's order, 0 panel and 1
    panel_label. Anything else is an error: reading the wrong class gives confident nonsense."""
    names = {int(k): str(v).strip().lower() for k, v in id2label.items()}
    unnamed = all(name == f"label_{i}" for i, name in names.items())
    if panel_class is not None:
        if panel_class not in names:
            raise ValueError(f"panel_class={panel_class} but the model's classes are {dict(sorted(names.items()))}")
        panel = panel_class
    else:
        found = [i for i, name in sorted(names.items()) if name in PANEL_NAMES]
        if len(found) != 1 and not (unnamed and 0 in names):
            raise ValueError(
                f"cannot tell which class is a panel: the model's classes are {dict(sorted(names.items()))} "
                f"(expected one named {' or '.join(PANEL_NAMES)}); set panel_class"
            )
        panel = found[0] if found else 0
    if labels == 1:
        return Classes(panel)
    found = [i for i, name in sorted(names.items()) if name in LABEL_NAMES and i != panel]
    if not found and unnamed and 1 in names and panel != 1:
        found = [1]
    if not found:
        raise ValueError(
            f"labels=2 asks for panel-label boxes but the model has no panel-label class "
            f"(its classes are {dict(sorted(names.items()))}); use labels=1"
        )
    return Classes(panel, found[0])


@dataclass
class Detections:
    """Raw thresholded detections of one figure, best first: panels and panel-label glyphs."""

    panels: list[Panel] = field(default_factory=list)
    label_boxes: list[Panel] = field(default_factory=list)


def _numpy(x) -> np.ndarray:
    return np.asarray(x.float().cpu() if hasattr(x, "cpu") else x, dtype=np.float64)


def postprocess(
    logits, pred_boxes, frames: list[Frame], threshold: float, max_panels: int = 50, classes: Classes | None = None
) -> list[Detections]:
    """``logits`` (n, Q, C) and ``pred_boxes`` (n, Q, 4; normalised cxcywh relative to each
    visible image), tensors or arrays -> per-figure detections in original pixels. Per class:
    sigmoid, top ``max_panels`` queries, score >= ``threshold``. ``classes`` says which class
    gives panels and which (if any) label boxes; by default 0 and, when the model has it, 1."""
    logits, pred_boxes = _numpy(logits), _numpy(pred_boxes)
    if classes is None:
        classes = Classes(0, 1 if logits.shape[2] > 1 else None)
    scores = 1.0 / (1.0 + np.exp(-logits))
    out = []
    for i, frame in enumerate(frames):
        found: dict[int, list[Panel]] = {}
        for cls in {classes.panel, classes.label} - {None}:
            s = scores[i, :, cls]
            top = np.argsort(-s, kind="stable")[:max_panels]
            top = top[s[top] >= threshold]
            found[cls] = []
            for q, xyxy in zip(top, to_original(pred_boxes[i, top], frame), strict=True):
                box = pixel_box(xyxy, frame.width, frame.height)
                if box is not None:
                    found[cls].append(Panel(box=box, score=float(s[q])))
        labels = found[classes.label] if classes.label is not None else []
        out.append(Detections(panels=found[classes.panel], label_boxes=labels))
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
        id2label=class_names(num_labels),
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
    """The production architecture at real size, random weights: DAB-DETR with a ResNet-50 DC5
    backbone (timm, output stride 16, as ``IDEA-Research/dab-detr-resnet-50-dc5`` and Open-PMC-18M's
    checkpoint have it), 300 queries, 6+6 layers."""
    from transformers import DabDetrConfig

    return DabDetrConfig(backbone_config=timm_backbone("resnet50", output_stride=16), id2label=class_names(num_labels))


def timm_backbone(name: str, out_indices=(1, 2, 3, 4), output_stride: int | None = None, num_channels: int = 3) -> dict:
    """An explicit timm backbone config: random weights (the checkpoint brings them), nothing
    looked up on the hub. DAB-DETR's encoder reads the last of ``out_indices``."""
    return {
        "model_type": "timm_backbone",
        "backbone": name,
        "num_channels": num_channels,
        "features_only": True,
        "use_pretrained_backbone": False,
        "out_indices": list(out_indices),
        "output_stride": output_stride,
    }


LEGACY_BACKBONE_KEYS = ("backbone", "backbone_kwargs", "use_timm_backbone", "use_pretrained_backbone")


def model_config(data: dict):
    """A ``DabDetrConfig`` from a config.json's contents, with the backbone made explicit.

    transformers 4.x saved a timm backbone as ``"backbone": "resnet50"``, ``"use_timm_backbone":
    true`` and ``"backbone_kwargs": {"in_chans": 3, "out_indices": [1, 2, 3, 4],
    "output_stride": 16}`` (16 is DC5: the last stage dilated instead of strided), with
    ``"backbone_config": null``. transformers 5 reads such a string by asking the hub whether it is
    a repository (a network call, and a ``ConnectError`` offline) and otherwise builds a timm
    config from ``backbone_kwargs`` as they are. Here the same config is written explicitly
    (``in_chans`` becomes ``num_channels``; no kwargs, 4.x filled them from ``dilation``), and a
    kwarg a timm backbone config has no field for is refused rather than dropped."""
    from transformers import DabDetrConfig

    data = dict(data)
    backbone = data.get("backbone")
    if data.get("backbone_config") is None and isinstance(backbone, str):
        if not data.get("use_timm_backbone", True):
            raise ValueError(f"the config names a transformers backbone {backbone!r} without its backbone_config")
        kwargs = dict(data.get("backbone_kwargs") or {})
        if not kwargs:  # 4.x's defaults when no kwargs were given
            kwargs = {
                "in_chans": 3,
                "out_indices": [1, 2, 3, 4],
                **({"output_stride": 16} if data.get("dilation") else {}),
            }
        explicit = timm_backbone(
            backbone,
            out_indices=kwargs.pop("out_indices", (1, 2, 3, 4)),
            output_stride=kwargs.pop("output_stride", None),
            num_channels=kwargs.pop("in_chans", data.get("num_channels", 3)),
        )
        kwargs.pop("features_only", None)
        if kwargs:
            raise ValueError(f"backbone_kwargs {sorted(kwargs)} have no field in a timm backbone config")
        data["backbone_config"] = explicit
    for key in LEGACY_BACKBONE_KEYS:
        data.pop(key, None)
    return DabDetrConfig.from_dict(data)


def detector_weights(config: DetectorConfig) -> Weights:
    return Weights(SETTING, config.model, DEFAULT_MODEL, "panel detector, DAB-DETR", config.revision)


def read_model_config(path: Path, config: DetectorConfig):
    """:func:`model_config` of a config.json; a file that is not a DAB-DETR config is a
    one-line error naming the setting."""
    try:
        data = json.loads(Path(path).read_text())
        if data.get("model_type") != "dab-detr":
            raise ValueError(f"model_type is {data.get('model_type')!r}, not 'dab-detr'")
        return model_config(data)
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(f"{SETTING}={config.model!r}: {path} is not a usable DAB-DETR config: {exc}") from exc


def detector_classes(model_config, config: DetectorConfig) -> Classes:
    """:func:`class_map` of a model's config, errors naming the setting."""
    try:
        return class_map(model_config.id2label, config.labels, config.panel_class)
    except ValueError as exc:
        name = "the synthetic detector" if config.synthetic else f"{SETTING}={config.model!r}"
        raise ValueError(f"{name}: {exc}") from None


def check_weights(config: DetectorConfig) -> None:
    """The set-up check, before any worker starts: the weights are where the setting says (or,
    online, the hub has the id), the config reads without the network, and its classes include a
    panel class (and a glyph class when ``labels == 2``). Loads no weights; downloads at most the
    config.json of a hub id that is not cached. Raises ``ModelUnavailableError`` or
    ``ValueError``, one line each."""
    if config.synthetic:
        return
    path = detector_weights(config).config_file()
    detector_classes(read_model_config(path, config), config)


def load_pretrained(config: DetectorConfig):
    """The checkpoint's model in float32 on the CPU: from a local folder or the Hugging Face
    cache without the network (downloaded into the cache first when online and not cached),
    with the config made explicit by :func:`model_config`. Weights that leave part of the model
    uninitialised, or do not fit it, are an error, not a warning."""
    from transformers import DabDetrForObjectDetection

    folder = detector_weights(config).folder()
    model_cfg = read_model_config(folder / "config.json", config)
    model, info = DabDetrForObjectDetection.from_pretrained(
        str(folder), config=model_cfg, local_files_only=True, output_loading_info=True
    )
    bad = list(info.get("missing_keys") or []) + [str(m[0]) for m in info.get("mismatched_keys") or []]
    if bad:
        raise ValueError(
            f"{SETTING}={config.model!r}: its weights do not fit its config: {len(bad)} tensors missing or of "
            f"another shape (first: {sorted(bad)[0]})"
        )
    return model


def build_model(config: DetectorConfig):
    """The model in float32 on the CPU, in eval mode: seeded random weights when synthetic (the
    global RNG is left alone), else the pretrained weights (:func:`load_pretrained`). Its classes
    are checked against ``labels`` and ``panel_class`` here, where the model is built."""
    import torch
    from transformers import DabDetrForObjectDetection

    if config.synthetic:
        arch = tiny_dab_detr_config if config.architecture == "tiny" else full_dab_detr_config
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = DabDetrForObjectDetection(arch(config.labels))
    else:
        model = load_pretrained(config)
    detector_classes(model.config, config)
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
        self.classes = detector_classes(self.model.config, config)
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
        logits, boxes = self.forward(*to_tensors(pixels, frames, self.device))
        return postprocess(logits, boxes, frames, self.config.threshold, self.config.max_panels, self.classes)

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
    from pipelines.core.lake import Lake
    from pipelines.core.rawstore import RawReader

    pixels, widths, heights, errors = [], [], [], []
    with RawReader(Lake(lake_root)) as reader:
        for tar_path, offset, size in zip(batch["tar_path"], batch["offset"], batch["size"], strict=True):
            data = reader.read(str(tar_path), int(offset), int(size))  # a missing tar is an outage: raise
            image, error = decode_image(data)  # an image of no pixels is one of its reasons too
            if image is None:
                pixels.append(np.zeros((input_size, input_size, 3), dtype=np.uint8))
                widths.append(0), heights.append(0), errors.append(error)
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
    from pipelines.compute.ray_pool import actor_pool_batches

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


def openpmc_nms(boxes: np.ndarray, scores: np.ndarray, iou_max: float) -> list[int]:
    """Open-PMC-18M's greedy NMS (``process_detections`` in ``openpmcvl/dab_detr/utils.py``),
    class-agnostic, as they wrote it: take the highest score left, drop every remaining box whose
    IoU with it is not below ``iou_max``, repeat. Returns the kept indices, best first."""
    boxes, scores = np.asarray(boxes, dtype=np.float64).reshape(-1, 4), np.asarray(scores, dtype=np.float64)
    order = np.argsort(scores)
    kept: list[int] = []
    while order.size > 0:
        best, order = int(order[-1]), order[:-1]
        kept.append(best)
        lo = np.maximum(boxes[best, :2], boxes[order, :2])
        hi = np.minimum(boxes[best, 2:], boxes[order, 2:])
        inter = np.clip(hi - lo, 0, None).prod(axis=1)
        area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        with np.errstate(divide="ignore", invalid="ignore"):
            overlap = inter / (area[best] + area[order] - inter)
        order = order[overlap < iou_max]
    return kept


def openpmc_postprocess(
    logits,
    pred_boxes,
    sizes: list[tuple[int, int]],
    threshold: float = OPENPMC_THRESHOLD,
    nms_iou: float = OPENPMC_NMS_IOU,
) -> list[list[Panel]]:
    """Open-PMC-18M's post-processing of squashed-input outputs, ``sizes`` the figures' (width,
    height), step by step as ``biomedica_inference.py`` does it:

    * ``post_process_object_detection(threshold=0.2)`` of transformers: sigmoid, the top 100
      (query, class) pairs over *all* classes, score strictly above ``threshold``, boxes scaled
      by the figure's size. Their checkpoint's "nothing" class is never a training target, so in
      practice only class 1 (subfigure) passes; a pair of another class that passes is kept, as
      theirs keeps it;
    * their greedy class-agnostic NMS at IoU ``nms_iou`` (:func:`openpmc_nms`);
    * corners rounded and clamped to [0, width - 1] x [0, height - 1], the crop they save; a
      figure with no box left is kept whole (their ``subfig_0``), here with score 0.
    """
    probs, boxes = _numpy(logits), _numpy(pred_boxes)
    probs = 1.0 / (1.0 + np.exp(-probs))
    classes = probs.shape[2]
    out: list[list[Panel]] = []
    for i, (width, height) in enumerate(sizes):
        flat = probs[i].reshape(-1)
        top = np.argsort(-flat, kind="stable")[: min(OPENPMC_TOP_K, flat.size)]
        top = top[flat[top] > threshold]
        xyxy = to_original(boxes[i, top // classes], Frame(width, height, (width, height), (width, height)))
        panels = []
        for k in openpmc_nms(xyxy, flat[top], nms_iou):
            x1, y1, x2, y2 = (round(float(v)) for v in xyxy[k])
            x1, x2 = (max(0, min(v, width - 1)) for v in (x1, x2))
            y1, y2 = (max(0, min(v, height - 1)) for v in (y1, y2))
            panels.append(Panel(box=(x1, y1, x2, y2), score=float(flat[top[k]])))
        out.append(panels or [Panel(box=(0, 0, width, height), score=0.0)])
    return out


def openpmc_detect(
    detector: Detector,
    images: list[Image.Image],
    batch_size: int = OPENPMC_BATCH,
    size: int = OPENPMC_SIZE,
    threshold: float = OPENPMC_THRESHOLD,
    nms_iou: float = OPENPMC_NMS_IOU,
) -> list[list[Panel]]:
    """Open-PMC-18M's inference (``openpmcvl/dab_detr/biomedica_inference.py``), kept as a named
    baseline for the benchmark; not used by the pipeline. Every figure is squashed to ``size`` x
    ``size`` as their ``ConditionalDetrImageProcessor(size={"width": 480, "height": 480})`` does
    (PIL bilinear, aspect ratio lost, nothing padded, so the mask is all ones), normalised with
    the ImageNet mean and std, run in batches of ``batch_size``, and post-processed by
    :func:`openpmc_postprocess` (score > 0.2, their NMS at IoU 0.2). The detector's own
    threshold, ``max_panels`` and class map play no part."""
    out: list[list[Panel]] = []
    for start in range(0, len(images), batch_size):
        chunk = images[start : start + batch_size]
        pixels = np.stack(
            [np.asarray(im.convert("RGB").resize((size, size), Image.Resampling.BILINEAR)) for im in chunk]
        )
        values, mask = to_tensors(pixels, [Frame(size, size, (size, size), (size, size)) for _ in chunk])
        logits, boxes = detector.forward(values, mask)
        out += openpmc_postprocess(logits, boxes, [im.size for im in chunk], threshold, nms_iou)
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
