"""Grounded boxes from model text, in original pixels.

Qwen2.5-VL answers ``bbox_2d`` in absolute pixels of the image *as the processor resized it*
(``smart_resize``: sides rounded to a multiple of 28, area brought into the configured pixel
band), so a box maps back to the original by the two scale factors. Qwen2-VL and Qwen3-VL
answer on a 0–1000 grid relative to the image. Getting this wrong shifts every box of a
non-square image, silently.
"""

from __future__ import annotations

import ast
import json
import math
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

from pipelines.vlm.engine import FAMILIES, QWEN2_5_VL, QWEN2_VL, QWEN3_VL, EngineConfig

MAX_ASPECT = 200  # the processor refuses images more elongated than this


def smart_resize(
    height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56, max_pixels: int = 14 * 14 * 4 * 1280
) -> tuple[int, int]:
    """The processor's resize (``transformers`` ``qwen2_vl`` ``smart_resize``): returns the
    resized (height, width), both multiples of ``factor``, area within [min_pixels, max_pixels]."""
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise ValueError(f"aspect ratio over {MAX_ASPECT}: {height}x{width}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def model_frame(width: int, height: int, config: EngineConfig) -> tuple[int, int]:
    """The (width, height) the model sees for an image of ``width`` x ``height``."""
    h, w = smart_resize(height, width, config.patch_factor, config.min_pixels, config.max_pixels)
    return w, h


# --- reading the model's JSON ---------------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n`]*\n?(.*?)(?:```|\Z)", re.DOTALL)
_MAX_STARTS = 32  # JSON start positions tried in one answer: bounds the work on long garbage
_MAX_CHARS = 100_000  # answers are bounded by max_tokens; anything longer is not a model answer
_NOTHING_COMPLETE = "answer cut off before its first complete item"


@dataclass
class ParsedAnswer:
    """A model answer read as JSON. ``value`` None means nothing usable and ``error`` says why;
    ``truncated`` means the answer was cut off (by ``max_tokens``) and ``value`` holds only the
    complete items of its outermost list, so a caller can record that some may be missing."""

    value: object | None
    error: str | None
    truncated: bool = False


def parse_json(text: str) -> ParsedAnswer:
    """The JSON in a model answer, however it is wrapped.

    Structured outputs guarantee bare JSON, but a backend without them (or a model that ignores
    them) answers in a ```json fence, after a sentence of prose, as several objects one after
    the other, or cut off at ``max_tokens``. Each form is read here, in one place, and nothing
    raises: one odd answer must not crash the batch it came in."""
    if not isinstance(text, str) or not text.strip():
        return ParsedAnswer(None, "empty answer")
    if len(text) > _MAX_CHARS:
        return ParsedAnswer(None, f"answer of {len(text)} characters is too long to be read")
    cut_off: ParsedAnswer | None = None
    for candidate in [*_fenced_blocks(text), text]:
        read = _read(candidate)
        if read is not None and read.value is not None:
            return read
        cut_off = cut_off or read
    if cut_off is not None:
        return cut_off
    if "{" not in text and "[" not in text:
        return ParsedAnswer(None, "no JSON in answer")
    return ParsedAnswer(None, "no valid JSON in answer")


def _fenced_blocks(text: str) -> list[str]:
    """Contents of Markdown code fences, an unterminated last one included (cut-off answers)."""
    return [m.group(2) for m in _FENCE.finditer(text) if m.group(2).strip()]


def _loads(candidate: str) -> object | None:
    """``json.loads``, then the two cheap repairs that cannot change a valid answer's meaning:
    trailing commas dropped, and Python-literal syntax (single quotes, None) read by
    ``ast.literal_eval``, which evaluates literals only. None when nothing reads as a list or object."""
    for attempt in (candidate, _drop_trailing_commas(candidate)):
        try:
            value = json.loads(attempt)
        except (ValueError, RecursionError):
            continue
        return value if isinstance(value, dict | list) else None
    if "'" in candidate:
        try:
            with warnings.catch_warnings():  # "invalid escape sequence" in a model's string is not ours to report
                warnings.simplefilter("ignore")
                value = ast.literal_eval(candidate.strip())
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
        return value if isinstance(value, dict | list) else None
    return None


def _structural(text: str, start: int = 0, quotes: str = '"') -> Iterator[tuple[int, str, bool]]:
    """Each character from ``start`` with whether it is structure (outside any string), so the
    repairs below never mistake a bracket or comma inside a caption's quoted text for JSON's own.
    ``quotes``: the characters that open a string (``"\'`` for Python-literal answers)."""
    quote: str | None = None
    escaped = False
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
            yield i, ch, False
        elif ch in quotes:
            quote = ch
            yield i, ch, False
        else:
            yield i, ch, True


def _drop_trailing_commas(candidate: str) -> str:
    """Commas right before a closing bracket, outside strings, removed."""
    out: list[str] = []
    for _, ch, structure in _structural(candidate):
        if structure and ch in "}]":
            while out and out[-1].isspace():
                out.pop()
            if out and out[-1] == ",":
                out.pop()
        out.append(ch)
    return "".join(out)


def _read(candidate: str) -> ParsedAnswer | None:
    """The whole text as JSON, else the first list or object inside prose, else the first one
    that was cut off (salvaged). Several objects in a row (``{..}\\n{..}``, a Qwen habit when
    asked for a list) are returned as a list. A bracketed span that fails to parse is skipped
    whole: an object nested in invalid JSON is a fragment, not the answer."""
    whole = _loads(candidate)
    if whole is not None:
        return ParsedAnswer(whole, None)
    decoder = json.JSONDecoder()
    cut_off: ParsedAnswer | None = None
    pos = 0
    for _ in range(_MAX_STARTS):
        start = _next_start(candidate, pos)
        if start is None:
            break
        try:
            value, end = decoder.raw_decode(candidate, start)
        except (ValueError, RecursionError):
            span, closed = _balanced_span(candidate, start)
            if closed:
                value = _loads(span)
                if value is not None:
                    return ParsedAnswer(value, None)
                pos = start + len(span)
                continue
            salvaged = _salvage_truncated(candidate[start:])
            if salvaged is not None and (salvaged.value is not None or salvaged.error == _NOTHING_COMPLETE):
                return salvaged  # stop: any later bracket lies inside the cut-off JSON, a fragment
            cut_off = cut_off or salvaged
            pos = start + 1
            continue
        if isinstance(value, dict):
            run = [value, *_following_objects(candidate, end, decoder)]
            return ParsedAnswer(run if len(run) > 1 else value, None)
        return ParsedAnswer(value, None)
    return cut_off


def _next_start(text: str, pos: int) -> int | None:
    starts = [i for i in (text.find("{", pos), text.find("[", pos)) if i >= 0]
    return min(starts) if starts else None


def _following_objects(text: str, pos: int, decoder: json.JSONDecoder) -> list[dict]:
    """Objects that follow at ``pos``, separated only by whitespace or commas."""
    found: list[dict] = []
    while len(found) < 10_000:
        while pos < len(text) and (text[pos].isspace() or text[pos] == ","):
            pos += 1
        if pos >= len(text) or text[pos] != "{":
            break
        try:
            value, pos = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError):
            break
        if not isinstance(value, dict):
            break
        found.append(value)
    return found


def _balanced_span(text: str, start: int) -> tuple[str, bool]:
    """From ``start`` to where its bracket closes (ignoring brackets inside strings of either
    quote, for the repairs of :func:`_loads`), and whether it closes at all."""
    depth = 0
    for i, ch, structure in _structural(text, start, quotes="\"'"):
        if not structure:
            continue
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return text[start : i + 1], True
    return text[start:], False


def _salvage_truncated(candidate: str) -> ParsedAnswer | None:
    """An answer cut off mid-JSON, closed after the last complete item of its outermost list.

    Only whole items are kept: a box whose last number was cut could be any box. Returns None
    when the text does not look like cut-off JSON (its brackets were all closed)."""
    start = next((i for i, ch in enumerate(candidate) if ch in "{["), None)
    if start is None:
        return None
    stack: list[str] = []
    cut: tuple[int, list[str]] | None = None
    for i, ch, structure in _structural(candidate, start):
        if not structure:
            continue
        if ch in "{[":
            stack.append(ch)
        elif ch in "}]":
            if not stack or {"}": "{", "]": "["}[ch] != stack[-1]:
                return None  # mismatched brackets: not JSON that was merely cut short
            stack.pop()
            if not stack:
                return None  # the JSON closed: it was invalid, not truncated
            if stack[-1] == "[" and "[" not in stack[:-1]:
                cut = (i + 1, list(stack))
    if not stack:
        return None
    if cut is None:
        return ParsedAnswer(None, _NOTHING_COMPLETE, truncated=True)
    end, open_brackets = cut
    closing = "".join("]" if b == "[" else "}" for b in reversed(open_brackets))
    value = _loads(candidate[start:end] + closing)
    if value is None:
        return ParsedAnswer(None, "answer cut off and what came before is not valid JSON", truncated=True)
    return ParsedAnswer(value, None, truncated=True)


# --- boxes in original pixels ---------------------------------------------------------------

BOX_KEYS = ("bbox_2d", "bbox")
GRID = 1000  # Qwen2-VL and Qwen3-VL ground on a 0-1000 grid


@dataclass(frozen=True)
class GroundedBox:
    """A box the model answered, in original pixels (ints, clipped to the image, x2/y2
    exclusive), with the numbers as answered kept for provenance. ``clipped``: the answer
    reached beyond the image edge, a hint the model's localisation was loose."""

    box: tuple[int, int, int, int]
    frame_box: tuple[float, float, float, float]
    label: str | None = None
    fields: dict = field(default_factory=dict)
    clipped: bool = False


def to_original(
    box: tuple[float, float, float, float], family: str, size: tuple[int, int], frame: tuple[int, int]
) -> tuple[float, float, float, float]:
    """``box`` as answered by a model of ``family`` for an image of ``size`` (width, height)
    that the processor showed the model as ``frame`` (width, height), in original pixels."""
    width, height = size
    if family == QWEN2_5_VL:
        sx, sy = width / frame[0], height / frame[1]
    elif family in (QWEN2_VL, QWEN3_VL):
        sx, sy = width / GRID, height / GRID
    else:
        raise ValueError(f"model family must be one of {FAMILIES}, not {family!r}")
    x1, y1, x2, y2 = box
    return x1 * sx, y1 * sy, x2 * sx, y2 * sy


def parse_boxes(
    value_or_text: object,
    family: str,
    size: tuple[int, int],
    frame: tuple[int, int],
    list_key: str | None = None,
    box_key: str = "bbox_2d",
) -> tuple[list[GroundedBox], str | None]:
    """The boxes of a model answer (raw text or its parsed JSON) in original pixels, and why any
    were lost (None when every item gave a box).

    The answer may be ``{list_key: [items]}``, a bare list of items (Qwen often drops the
    wrapper), or one item; an item is an object with a box under ``box_key`` (or ``bbox_2d`` /
    ``bbox``) or a bare list of four numbers. Unreadable items are dropped and counted rather
    than failing the answer: the good boxes of a partly wrong answer are still worth keeping."""
    if family not in FAMILIES:
        raise ValueError(f"model family must be one of {FAMILIES}, not {family!r}")
    if min(*size, *frame) <= 0:
        return [], f"image size {size} or model frame {frame} is empty"
    truncated = False
    value = value_or_text
    if isinstance(value_or_text, str):
        parsed = parse_json(value_or_text)
        if parsed.value is None:
            return [], parsed.error
        value, truncated = parsed.value, parsed.truncated
    items, error = _items(value, list_key, box_key)
    if items is None:
        return [], error
    boxes: list[GroundedBox] = []
    dropped: dict[str, int] = {}
    for item in items:
        grounded, why = _grounded(item, family, size, frame, box_key)
        if grounded is None:
            dropped[why] = dropped.get(why, 0) + 1
        else:
            boxes.append(grounded)
    return boxes, _reason(len(items), dropped, truncated)


def _items(value: object, list_key: str | None, box_key: str) -> tuple[list | None, str | None]:
    """The list of items in an answer, or None and why there is none."""
    if isinstance(value, list):
        return ([value] if _is_box(value) else value), None
    if not isinstance(value, dict):
        return None, f"answer is a {type(value).__name__}, not a list or an object"
    if list_key is not None and isinstance(value.get(list_key), list):
        return value[list_key], None
    if _box_of(value, box_key) is not None:
        return [value], None
    lists = [v for v in value.values() if isinstance(v, list)]
    if len(lists) == 1:  # the model named the list differently ("regions" for "panels")
        return lists[0], None
    wanted = f"a {list_key!r} list" if list_key else "a list of boxes"
    return None, f"answer has no {wanted} (keys: {sorted(map(str, value))[:8]})"


def _box_of(item: dict, box_key: str) -> object | None:
    for key in (box_key, *BOX_KEYS):
        if key in item:
            return item[key]
    return None


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _is_box(value: object) -> bool:
    return isinstance(value, list | tuple) and len(value) == 4 and all(_is_number(x) for x in value)


def _grounded(
    item: object, family: str, size: tuple[int, int], frame: tuple[int, int], box_key: str
) -> tuple[GroundedBox | None, str]:
    """One item as a box in original pixels, or None and the reason it was dropped."""
    label: str | None = None
    fields: dict = {}
    if isinstance(item, dict):
        raw = _box_of(item, box_key)
        if raw is None:
            return None, "no box"
        used = next(k for k in (box_key, *BOX_KEYS) if k in item)
        fields = {k: v for k, v in item.items() if k not in (used, "label")}
        label = _label(item.get("label"))
    else:
        raw = item
    if isinstance(raw, list | tuple) and len(raw) == 2 and all(_is_box_pair(p) for p in raw):
        raw = [*raw[0], *raw[1]]  # [[x1, y1], [x2, y2]]
    if not _is_box(raw):
        return None, "not four numbers"
    x1, y1, x2, y2 = (float(v) for v in raw)
    frame_box = (x1, y1, x2, y2)
    x1, x2 = min(x1, x2), max(x1, x2)
    y1, y2 = min(y1, y2), max(y1, y2)
    ox1, oy1, ox2, oy2 = (_round(v) for v in to_original((x1, y1, x2, y2), family, size, frame))
    width, height = size
    box = (max(0, ox1), max(0, oy1), min(width, ox2), min(height, oy2))
    if box[2] <= box[0] or box[3] <= box[1]:
        return None, "empty or outside the image"
    clipped = box != (ox1, oy1, ox2, oy2)
    return GroundedBox(box, frame_box, label, fields, clipped), ""


def _is_box_pair(p: object) -> bool:
    return isinstance(p, list | tuple) and len(p) == 2 and all(_is_number(x) for x in p)


def _label(value: object) -> str | None:
    """Labels come as "A", but also as 2 (a number) or "" (none printed)."""
    if isinstance(value, str):
        return value.strip() or None
    if _is_number(value):
        return str(int(value)) if float(value).is_integer() else str(value)
    return None


def _round(v: float) -> int:
    """Nearest pixel edge, halves up: an edge is a position between pixels, not a pixel."""
    return math.floor(v + 0.5)


def _reason(total: int, dropped: dict[str, int], truncated: bool) -> str | None:
    parts = []
    if truncated:
        parts.append("answer cut off (only its complete items were read)")
    if dropped:
        detail = ", ".join(f"{n} {why}" for why, n in sorted(dropped.items()))
        parts.append(f"dropped {sum(dropped.values())} of {total} items ({detail})")
    return "; ".join(parts) or None
