"""JSON-schema constrained decoding for in-process transformers generation, with llguidance.

At every step each constrained sequence's matcher says which tokens keep the text a prefix of a
document valid for its schema; every other token's logit becomes -inf. Once the document is
complete the matcher allows only EOS, so the answer ends there instead of running on to
``max_tokens``. This is the same engine vLLM uses as its "guidance" backend, so the in-process
engine and the vLLM workers constrain answers the same way.

Separators are fixed to ``", "`` and ``": "`` with no other whitespace: that is how Qwen models
write JSON anyway, and free whitespace lets a weak (or random) model pad an answer with blanks
until it runs out of tokens.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import llguidance
import llguidance.hf
import llguidance.numpy
import torch
from llguidance import LLMatcher, LLTokenizer
from transformers import LogitsProcessor

JSON_OPTIONS = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}
_BITS = torch.arange(32, dtype=torch.int32)


class SchemaError(ValueError):
    """The schema cannot be compiled into a grammar: the request's error, not the batch's."""


def ll_tokenizer(hf_tokenizer, vocab_size: int, eos_token_id: int) -> LLTokenizer:
    """llguidance's view of the tokenizer; building it takes up to a second, so engines keep one.

    ``vocab_size`` is the width of the model's logits (real checkpoints pad the embedding past the
    tokenizer's size); ``eos_token_id`` is the token that ends a chat turn (``<|im_end|>``)."""
    return llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size, eos_token=eos_token_id)


def compile_schema(schema: dict) -> str:
    """The llguidance grammar of ``schema``; raises :class:`SchemaError` when it is not valid."""
    try:
        grammar = LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=JSON_OPTIONS)
    except (ValueError, TypeError) as exc:
        raise SchemaError(f"invalid JSON schema: {exc}") from exc
    error = LLMatcher.validate_grammar(grammar)
    if error:
        raise SchemaError(f"invalid JSON schema: {error}")
    return grammar


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(batch, ceil(V/32)) int32 words -> (batch, V) bool, True where the token is allowed.

    llguidance.torch's own applier is ``torch.compile``d, which needs a C compiler and seconds of
    compilation on a CPU-only machine; this unpacking is a few tensor ops and runs anywhere. The
    bitmask itself is allocated and filled by ``llguidance.numpy``: the same two functions as
    ``llguidance.torch``, whose import alone ``torch.compile``-decorates that applier and so loads
    TorchDynamo and Inductor (about 1.2 s of CPU in every process that mines or writes long captions)."""
    bits = (bitmask.unsqueeze(-1) >> _BITS) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


class JsonSchemaLogitsProcessor(LogitsProcessor):
    """Masks each sequence's logits to its own schema (``None``: that sequence is free).

    One matcher per sequence of the batch. The prompt length is taken from the first call, so
    a processor serves exactly one ``generate`` call. A sequence that has ended (EOS sampled) is
    no longer fed to its matcher: generate keeps padding finished rows while others run on."""

    def __init__(self, tokenizer: LLTokenizer, schemas: Sequence[dict | str | None], eos_token_id: int):
        self.eos = eos_token_id
        self.matchers: list[LLMatcher | None] = []
        for schema in schemas:
            if schema is None:
                self.matchers.append(None)
                continue
            grammar = schema if isinstance(schema, str) else compile_schema(schema)
            matcher = LLMatcher(tokenizer, grammar, log_level=0)
            if matcher.is_error():
                raise SchemaError(f"invalid JSON schema: {matcher.get_error()}")
            self.matchers.append(matcher)
        self.prompt_len: int | None = None
        self.done = [False] * len(self.matchers)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.prompt_len is None:
            self.prompt_len = input_ids.shape[1]
        elif input_ids.shape[1] > self.prompt_len:
            self._consume(input_ids[:, -1].tolist())
        rows = [i for i, m in enumerate(self.matchers) if m is not None and not self.done[i]]
        if not rows:
            return scores
        bitmask = llguidance.numpy.allocate_token_bitmask(len(rows), scores.shape[-1])
        for k, i in enumerate(rows):
            matcher = self.matchers[i]
            if matcher.is_error():  # cannot happen when every token came through the mask; end it
                bitmask[k] = 0
                bit = 1 << (self.eos % 32)
                bitmask[k, self.eos // 32] = bit - (1 << 32) if bit >= 1 << 31 else bit  # int32 words
            else:
                llguidance.numpy.fill_next_token_bitmask(matcher, bitmask, k)
        allowed = unpack_bitmask(torch.from_numpy(bitmask), scores.shape[-1]).to(scores.device)
        index = torch.tensor(rows, device=scores.device)
        scores[index] = scores[index].masked_fill(~allowed, float("-inf"))
        return scores

    def _consume(self, last_tokens: list[int]) -> None:
        for i, (matcher, token) in enumerate(zip(self.matchers, last_tokens, strict=True)):
            if self.done[i]:
                continue
            if token == self.eos:
                self.done[i] = True
            elif matcher is not None:
                matcher.consume_token(token)
