"""Answer budgets sized from a JSON schema, so that a schema-valid answer always fits.

A prompt's ``max_tokens`` below what its schema allows cuts verbose answers inside the object:
the JSON never closes and the item falls back. :func:`answer_budget` is the length of the
longest answer the schema allows, in characters, as a model writes it with two-space
indentation (more whitespace than the in-process grammar's fixed ``", "``/``": "`` separators
allow, and what a server with free whitespace typically writes), plus the end-of-turn token.
Characters are counted as tokens: a byte-level BPE (Qwen's) never needs more than one token for
an ASCII character, and real text averages about four characters a token, so the budget holds
any such answer with room to spare. It needs a bounded schema: ``maxItems`` on every array,
``maxLength`` (or ``enum``) on every string, no properties beyond those listed.
"""

from __future__ import annotations

import json


class UnboundedSchemaError(ValueError):
    """The schema allows answers of any length: it has no budget."""


def longest_answer(schema: dict, where: str = "$") -> object:
    """The longest JSON value ``schema`` allows (every array full, every string at its longest)."""
    if "enum" in schema:
        return max(schema["enum"], key=lambda v: len(json.dumps(v)))
    types = schema.get("type")
    if isinstance(types, list):
        options = [longest_answer({**schema, "type": t}, where) for t in types]
        return max(options, key=lambda v: len(json.dumps(v)))
    if types == "object":
        if schema.get("additionalProperties", True) is not False:
            raise UnboundedSchemaError(f"{where}: an object without additionalProperties: false has no bound")
        return {name: longest_answer(sub, f"{where}.{name}") for name, sub in schema.get("properties", {}).items()}
    if types == "array":
        if "maxItems" not in schema:
            raise UnboundedSchemaError(f"{where}: an array without maxItems has no bound")
        return [longest_answer(schema.get("items", {}), f"{where}[]")] * schema["maxItems"]
    if types == "string":
        if "maxLength" not in schema:
            raise UnboundedSchemaError(f"{where}: a string without maxLength has no bound")
        return "x" * schema["maxLength"]
    if types == "boolean":
        return False
    if types == "null":
        return None
    if types in ("integer", "number"):
        if "minimum" not in schema or "maximum" not in schema:
            raise UnboundedSchemaError(f"{where}: a number without minimum and maximum has no bound")
        return max(schema["minimum"], schema["maximum"], key=lambda v: len(json.dumps(v)))
    raise UnboundedSchemaError(f"{where}: cannot bound a value of type {types!r}")


def answer_budget(schema: dict) -> int:
    """Tokens that hold any answer ``schema`` allows (see the module's docstring)."""
    return len(json.dumps(longest_answer(schema), indent=2, ensure_ascii=False)) + 1
