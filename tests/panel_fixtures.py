"""Tiny COCO-format panel datasets, raw tars and checkpoints in the published format for the
detector tests."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

PUBLISHED = json.loads((Path(__file__).parent / "data" / "published" / "pmc-18m-dab-detr.config.json").read_text())
# the same format at reduced size: a 0.4M-parameter timm ResNet, still output stride 16
REDUCED = {
    **PUBLISHED,
    "backbone": "test_resnet",
    "hidden_size": 64,
    "encoder_layers": 1,
    "decoder_layers": 2,
    "num_hidden_layers": 1,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "num_queries": 20,
}
COLOURS = [(200, 30, 30), (30, 160, 60), (40, 60, 200), (220, 160, 20), (120, 40, 160), (20, 150, 160)]


def make_coco(folder: Path, n: int = 12, seed: int = 0) -> dict:
    """``n`` white figures of 1-3 coloured panels side by side or stacked, each with a small black
    label glyph in its top-left corner: category 1 the panels, 2 the glyphs. Returns the JSON."""
    rng = np.random.default_rng(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    for i in range(n):
        width, height = int(rng.integers(120, 220)), int(rng.integers(100, 200))
        image = Image.new("RGB", (width, height), (255, 255, 255))
        draw = ImageDraw.Draw(image)
        k, horizontal = int(rng.integers(1, 4)), bool(rng.integers(0, 2))
        span = (width if horizontal else height) // k
        for j in range(k):
            if horizontal:
                x1, y1, x2, y2 = j * span + 4, 6, (j + 1) * span - 4, height - 6
            else:
                x1, y1, x2, y2 = 6, j * span + 4, width - 6, (j + 1) * span - 4
            draw.rectangle((x1, y1, x2 - 1, y2 - 1), fill=COLOURS[(i + j) % len(COLOURS)])
            draw.rectangle((x1 + 2, y1 + 2, x1 + 9, y1 + 11), fill=(0, 0, 0))
            for category, (bx1, by1, bx2, by2) in ((1, (x1, y1, x2, y2)), (2, (x1 + 2, y1 + 2, x1 + 10, y1 + 12))):
                annotations.append(
                    {
                        "id": len(annotations) + 1,
                        "image_id": i + 1,
                        "category_id": category,
                        "bbox": [bx1, by1, bx2 - bx1, by2 - by1],
                        "area": (bx2 - bx1) * (by2 - by1),
                        "iscrowd": 0,
                    }
                )
        name = f"fig{i:03d}.png"
        image.save(folder / "images" / name)
        images.append({"id": i + 1, "file_name": name, "width": width, "height": height})
    gt = {
        "images": images,
        "annotations": annotations,
        "categories": [{"id": 1, "name": "panel"}, {"id": 2, "name": "panel_label"}],
    }
    (folder / "annotations.json").write_text(json.dumps(gt))
    return gt


def write_tar(lake_root: Path, relative: str, members: list[tuple[str, bytes]]) -> list[dict]:
    """A raw tar in the lake with ``members``; returns refs {image_file, tar_path, offset, size}."""
    path = lake_root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    refs = []
    with tarfile.open(path) as tar:
        for info in tar.getmembers():
            refs.append({"image_file": info.name, "tar_path": relative, "offset": info.offset_data, "size": info.size})
    return refs


def write_checkpoint(folder: Path, published: dict, seed: int = 0):
    """A checkpoint as the hub holds it: weights of the architecture ``published`` describes (seeded
    random), and ``published`` itself as config.json. Returns the model written."""
    import torch
    from transformers import DabDetrForObjectDetection

    from pipelines.panels.detector import model_config

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = DabDetrForObjectDetection(model_config(published)).eval()
    model.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(published, indent=2))
    return model
