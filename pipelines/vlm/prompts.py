"""Every prompt the mining stage sends, with the JSON schema its answer must follow.

Prompts live in one module so that their hash is the stage's prompt version: a changed prompt
changes ``PROMPT_VERSION``, which is stored with every pair and is part of the asset's code
version, so only what a prompt change affects is mined again. Each prompt begins with the same
system text, which an engine with prefix caching computes once.

Boxes are asked for as ``bbox_2d`` [x1, y1, x2, y2], the format Qwen-VL models were trained to
ground with; what the numbers mean (resized pixels or a 0–1000 grid) depends on the model
family and is resolved by ``pipelines.vlm.grounding``.
"""

from __future__ import annotations

from pipelines.core.fingerprints import fingerprint
from pipelines.vlm.prompt import Prompt

SYSTEM = (
    "You are an expert reader of biomedical figures. You answer with JSON only, copy text from the "
    "caption verbatim when asked to, and never invent content that is not in the image or the caption."
)

# Bounded so that constrained decoding cannot run on with endless digits (a model frame side
# is at most a few thousand pixels; the 0–1000 grid is below that)
_BOX = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9999}, "minItems": 4, "maxItems": 4}


PANELS = Prompt(
    "panels",
    "This image is (part of) a scientific figure made of panels. Find every panel. For each, give "
    "the identifier printed on it (such as A, b, 2 or ii, without brackets; null when none is "
    'printed) and its bounding box. Answer as JSON: {{"panels": [{{"label": "A", "bbox_2d": '
    "[x1, y1, x2, y2]}}]}}.",
    {
        "type": "object",
        "properties": {
            "panels": {
                "type": "array",
                "maxItems": 32,
                "items": {
                    "type": "object",
                    "properties": {"label": {"type": ["string", "null"], "maxLength": 12}, "bbox_2d": _BOX},
                    "required": ["label", "bbox_2d"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["panels"],
        "additionalProperties": False,
    },
    max_tokens=512,
    system=SYSTEM,
)

ASSOCIATE = Prompt(
    "associate",
    "Caption of the figure:\n{caption}\n\nThe figure has the panels {labels}. For each panel, copy "
    "verbatim the part of the caption that describes it (an empty string when none does). Answer as "
    'JSON: {{"panels": [{{"label": "A", "text": "..."}}]}}.',
    {
        "type": "object",
        "properties": {
            "panels": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "label": {"type": "string", "maxLength": 12},
                        "text": {"type": "string", "maxLength": 2000},
                    },
                    "required": ["label", "text"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["panels"],
        "additionalProperties": False,
    },
    max_tokens=1024,
    system=SYSTEM,
)

DESCRIBE_PANEL = Prompt(
    "describe_panel",
    "This is one panel of a scientific figure. What the caption says about it:\n{text}\n\nDescribe "
    'in one short sentence what the panel shows. Answer as JSON: {{"description": "..."}}.',
    {
        "type": "object",
        "properties": {"description": {"type": "string", "maxLength": 300}},
        "required": ["description"],
        "additionalProperties": False,
    },
    max_tokens=96,
    system=SYSTEM,
)

LOCATE_REGION = Prompt(
    "locate_region",
    'This is one panel of a scientific figure. Its caption says: "{phrase}". Give the bounding '
    "box of every region this refers to (the area the {marker} points at or encloses). Answer as "
    'JSON: {{"regions": [{{"bbox_2d": [x1, y1, x2, y2]}}]}}.',
    {
        "type": "object",
        "properties": {
            "regions": {
                "type": "array",
                "maxItems": 16,
                "items": {
                    "type": "object",
                    "properties": {"bbox_2d": _BOX},
                    "required": ["bbox_2d"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["regions"],
        "additionalProperties": False,
    },
    max_tokens=256,
    system=SYSTEM,
)

DESCRIBE_REGION = Prompt(
    "describe_region",
    "This is a region cut from a panel of a scientific figure. Describe in one short sentence what it "
    'shows. Answer as JSON: {{"description": "..."}}.',
    DESCRIBE_PANEL.schema,
    max_tokens=64,
    system=SYSTEM,
)

# The canary: its answer must be this exact JSON. Unconstrained, a model asked to greet does not
# answer {"canary": "<token>"}; if it does anyway, the schema was applied.
CANARY_TOKEN = "panelforge-structured-outputs-7f3a"
CANARY = Prompt(
    "canary",
    "Say hello in one word.",
    {
        "type": "object",
        "properties": {"canary": {"type": "string", "enum": [CANARY_TOKEN]}},
        "required": ["canary"],
        "additionalProperties": False,
    },
    max_tokens=32,
    system=SYSTEM,
)


def name_of(prompt: str) -> str:
    """Which prompt a rendered prompt text came from ("other" when none): costs per prompt."""
    for p in PROMPTS.values():
        if prompt.startswith(p.template.split("{", 1)[0]):
            return p.name
    return "other"


PROMPTS = {p.name: p for p in (PANELS, ASSOCIATE, DESCRIBE_PANEL, LOCATE_REGION, DESCRIBE_REGION, CANARY)}
PROMPT_VERSION = fingerprint(
    {"system": SYSTEM, **{p.name: [p.template, p.schema, p.max_tokens] for p in PROMPTS.values()}}
)
