"""Turn any figure file into an RGB image for a vision model, or a recorded reason why not.

PMC figures come in every mode PIL knows. Each is converted deliberately: CMYK to RGB with
PIL's profile-free conversion, palette and alpha images composited on white (figures are
drawn on white paper; black would invent a background), 16-bit and 32-bit grayscale scaled
to 8 bits by their actual range, animated GIFs by their first frame. Truncated files and
decompression bombs are refused with a reason, never half-decoded.
"""

from __future__ import annotations

import io
import warnings

from PIL import Image, ImageFile, UnidentifiedImageError

from pipelines.images.info import MAX_PIXELS

ImageFile.LOAD_TRUNCATED_IMAGES = False


def _on_white(image: Image.Image) -> Image.Image:
    rgba = image.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, rgba).convert("RGB")


def _high_bit_depth_to_rgb(image: Image.Image) -> Image.Image:
    low, high = image.getextrema()
    if high <= low:
        return Image.new("RGB", image.size, (255, 255, 255) if high else (0, 0, 0))
    scaled = image.point(lambda v: (v - low) * 255.0 / (high - low))  # stays in mode I/F
    return scaled.convert("L").convert("RGB")


def to_rgb(image: Image.Image) -> Image.Image:
    """An RGB copy of ``image`` by the rules above (first frame of animations)."""
    image.seek(0)
    mode = image.mode
    if mode == "RGB":
        return image.copy()
    if mode in ("RGBA", "LA", "PA") or (mode == "P" and "transparency" in image.info):
        return _on_white(image)
    if mode in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F"):
        return _high_bit_depth_to_rgb(image.convert("I") if mode.startswith("I;16") else image)
    return image.convert("RGB")  # L, 1, P without transparency, CMYK, YCbCr, LAB, HSV


def normalize_mode(im: Image.Image) -> Image.Image:
    """The image as ``L`` or ``RGB``: grey and colour images as they are, anything else by the
    decoding rules every stage shares (:func:`to_rgb`: transparency on
    white, 16-bit stretched, CMYK and palettes converted, first frame of animations)."""
    if im.mode in ("L", "RGB") and "transparency" not in im.info:
        return im
    return to_rgb(im)


def decode_image(data: bytes) -> tuple[Image.Image | None, str | None]:
    """Return ``(RGB image, None)`` or ``(None, reason)``; never raises on bad input."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                if image.width * image.height > MAX_PIXELS:
                    return None, f"decompression bomb refused: {image.width}x{image.height} pixels"
                image.load()
                return to_rgb(image), None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        return None, f"decompression bomb refused: {exc}"
    except UnidentifiedImageError:
        return None, "not an image PIL can identify"
    except (OSError, ValueError, SyntaxError) as exc:
        return None, f"undecodable image ({type(exc).__name__}: {exc})"
