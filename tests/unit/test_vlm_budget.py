"""Answer budgets that hold every answer a schema allows: LongCAP's, and the engine's cap above them.

The longest LongCAP answer is written out here from the schema as read by hand (16 features of
200 characters with the longest enum values, a 3,000-character long caption, 12 acronyms of
16 + 100 characters), pretty-printed as a model may write it, and tokenized by a byte-level
BPE without merges: one token per byte, the most any byte-level BPE (Qwen's) can need for it.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from tokenizers import pre_tokenizers

from pipelines.longcap.negatives import NEGATIVES
from pipelines.longcap.prompts import LONGCAP
from pipelines.vlm.budget import UnboundedSchemaError, answer_budget, longest_answer
from pipelines.vlm.prompts import PROMPTS
from pipelines.vlm.ray_llm import RayVllmSettings
from resources.vlm import VlmEngineResource


def _longest_longcap_answer(caption_chars: int = 3000) -> dict:
    feature = {"text": "x" * 200, "source": "context", "visual": False, "status": "UNVERIFIABLE"}
    return {
        "features": [dict(feature) for _ in range(16)],
        "verdict": "NOT_FEASIBLE",
        "long_caption": "x" * caption_chars,
        "acronyms": [{"short": "x" * 16, "long": "x" * 100} for _ in range(12)],
    }


@pytest.fixture(scope="module")
def bytes_tokenizer():
    """Qwen2Tokenizer over the 256 byte symbols and no merges: every byte is one token."""
    from transformers import Qwen2Tokenizer

    vocab = {"<|endoftext|>": 0, **{c: i + 1 for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}}
    return Qwen2Tokenizer(vocab=vocab, merges=[])


def test_the_longest_longcap_answer_fits_its_budget(bytes_tokenizer):
    answer = _longest_longcap_answer()
    jsonschema.validate(answer, LONGCAP.schema)  # it is an answer the schema allows
    with pytest.raises(jsonschema.ValidationError):  # and no string of it could be longer
        jsonschema.validate(_longest_longcap_answer(3001), LONGCAP.schema)
    text = json.dumps(answer, indent=2)
    tokens = len(bytes_tokenizer(text)["input_ids"])
    assert tokens == len(text.encode())  # one token per byte: the worst a byte-level BPE can do
    assert tokens + 1 <= LONGCAP.max_tokens  # and the end-of-turn token
    # and the budget leaves a 16,384-token context room for the prompt: the image (at most
    # 1,280 visual tokens with the default band), 1,024 tokens of context, caption and instructions
    assert LONGCAP.max_tokens <= RayVllmSettings().max_model_len - 1280 - 1024 - 2048


def test_the_budget_of_a_small_schema_by_hand():
    number = {"type": ["integer", "null"], "minimum": -5, "maximum": 10000}  # "10000" is longer than "null"
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string", "maxLength": 3}, "b": {"type": "array", "maxItems": 2, "items": number}},
        "additionalProperties": False,
    }
    assert longest_answer(schema) == {"a": "xxx", "b": [10000, 10000]}
    # lines {, '  "a": "xxx",', '  "b": [', '    10000,', '    10000', '  ]', }: 1 + 13 + 8 + 10 + 9 + 3 + 1
    # characters and 6 newlines = 51, plus the end-of-turn token
    assert answer_budget(schema) == 51 + 1


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"type": "array", "items": {"type": "string", "maxLength": 2}}, r"\$: an array without maxItems"),
        (
            {"type": "object", "properties": {"s": {"type": "string"}}, "additionalProperties": False},
            r"\$\.s: a string",
        ),
        ({"type": "object", "properties": {}}, "additionalProperties"),
        ({"type": "integer", "minimum": 0}, "minimum and maximum"),
    ],
)
def test_an_unbounded_schema_has_no_budget(schema, where):
    with pytest.raises(UnboundedSchemaError, match=where):
        answer_budget(schema)


def test_the_engines_default_cap_is_above_every_prompts_budget():
    """The resource's max_tokens caps every answer; below a prompt's budget it would cut that
    prompt's answers (the old default, 512, cut LongCAP's to a third of its then 1,536)."""
    cap = VlmEngineResource().max_tokens
    budgets = {p.name: p.max_tokens for p in [*PROMPTS.values(), LONGCAP, NEGATIVES]}
    assert all(budget <= cap for budget in budgets.values()), budgets
    assert cap < RayVllmSettings().max_model_len
