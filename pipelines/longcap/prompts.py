"""The LongCAP prompt and the JSON contract of its answer.

The model sees the figure, its caption, the context PanelForge assembled from the article and
the acronyms the article itself defines. It answers atomic features (each with where it came
from, whether it is visual, and whether the image supports it), a feasibility verdict, the
refined long caption, and the acronyms it used. Nothing it says is taken on trust: the stage's
guards check the refined caption against the caption and the context (pipelines/longcap/guards.py).

The schema is bounded (at most 16 features of 200 characters, a 3,000-character caption, 12
acronyms) and the answer budget is sized from it (``pipelines.vlm.budget``: 10,066 tokens),
so an answer the schema allows is never cut inside the object. The bounds leave room for the
prompt (image, caption, 1,024 tokens of context) in a 16,384-token context: 3,000 characters is
more than a 512-token text encoder reads of the long caption anyway.
"""

from __future__ import annotations

from pipelines.core.fingerprints import fingerprint
from pipelines.vlm.budget import answer_budget
from pipelines.vlm.prompt import Prompt
from pipelines.vlm.prompts import SYSTEM

SUPPORTED, NOT_VISIBLE, UNVERIFIABLE = "SUPPORTED", "NOT_VISIBLE", "UNVERIFIABLE"
FEASIBLE, NOT_FEASIBLE = "FEASIBLE", "NOT_FEASIBLE"

MAX_FEATURES, MAX_ACRONYMS = 16, 12
LONGCAP_SCHEMA = {
    "type": "object",
    "properties": {
        "features": {
            "type": "array",
            "maxItems": MAX_FEATURES,
            "items": {
                "type": "object",
                "properties": {
                    "text": {"type": "string", "maxLength": 200},
                    "source": {"type": "string", "enum": ["caption", "context"]},
                    "visual": {"type": "boolean"},
                    "status": {"type": "string", "enum": [SUPPORTED, NOT_VISIBLE, UNVERIFIABLE]},
                },
                "required": ["text", "source", "visual", "status"],
                "additionalProperties": False,
            },
        },
        "verdict": {"type": "string", "enum": [FEASIBLE, NOT_FEASIBLE]},
        "long_caption": {"type": "string", "maxLength": 3000},
        "acronyms": {
            "type": "array",
            "maxItems": MAX_ACRONYMS,
            "items": {
                "type": "object",
                "properties": {
                    "short": {"type": "string", "maxLength": 16},
                    "long": {"type": "string", "maxLength": 100},
                },
                "required": ["short", "long"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["features", "verdict", "long_caption", "acronyms"],
    "additionalProperties": False,
}

LONGCAP = Prompt(
    "longcap",
    "Write a long caption for this figure. Its caption:\n{caption}\n\nContext from the article:\n"
    "{context}\n\nAcronyms the article defines:\n{acronyms}\n\n"
    "List the atomic facts (at most 16) the caption and the context state about this figure. "
    "For each: its text, its source (caption or context), whether it is visual, and its status: "
    "SUPPORTED if the image shows it, NOT_VISIBLE if it is visual but not shown, UNVERIFIABLE if it "
    "cannot be seen in an image. Then say whether a longer caption is FEASIBLE (the image supports "
    "the added facts) or NOT_FEASIBLE, and write the long caption: the original caption's facts, "
    "plus the SUPPORTED context facts, with acronyms expanded as the article defines them. Copy "
    "numbers, units and names exactly; add nothing that is not in the caption or the context. "
    'Answer as JSON: {{"features": [{{"text": "...", "source": "caption", "visual": true, '
    '"status": "SUPPORTED"}}], "verdict": "FEASIBLE", "long_caption": "...", "acronyms": '
    '[{{"short": "...", "long": "..."}}]}}.',
    LONGCAP_SCHEMA,
    max_tokens=answer_budget(LONGCAP_SCHEMA),
    system=SYSTEM,
)

PROMPT_VERSION = fingerprint({"system": SYSTEM, "longcap": [LONGCAP.template, LONGCAP.schema, LONGCAP.max_tokens]})
