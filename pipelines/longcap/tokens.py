"""The target text encoder's tokenizer: counts, budgets and sentence-boundary cuts.

LongCAP measures everything (the context sent to the VLM, the caption before and after, the
padding wasted in the encoder's window) in the tokens of the text encoder the captions are for:
OpenCLIP's BPE at 77 tokens, or a long-context Hugging Face encoder such as BioClinical
ModernBERT for BMC-LongCLIP. Counts include the start and end tokens, because that is what
fills the encoder's window.

Cuts happen at sentence boundaries so that a caption is never truncated mid-claim; only when
the first sentence alone is over budget is it cut at a word boundary, and the result says so.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from pipelines.core.errors import StageInputError
from pipelines.core.provenance import public_model_name
from pipelines.text.captions import normalize_caption

# Words whose trailing period is not a sentence end (compared lowercased, without the period).
ABBREVIATIONS = frozenset(
    """fig figs figure suppl supp sup eq eqs eqn ref refs no nos vol vols pp p al approx ca cf vs
    resp dr prof mr mrs ms st inc ltd co corp jr sr sp spp subsp var viz ext est dept univ
    incl max avg conc""".split()
)
# A candidate boundary: terminal punctuation, closing quotes/brackets, white space, and a
# sentence-like start (capital, digit, opening bracket or quote).
_BOUNDARY = re.compile(r"[.!?]+[\"')\]]*\s+(?=[A-Z0-9(\[\"'])")
# The last word before a period (with internal periods kept, so "e.g" and "i.e" are one word).
_LAST_WORD = re.compile(r"([A-Za-z][A-Za-z.]*)\.[\"')\]]*$")
# A "sentence" that is only a panel or figure label: "(A).", "A.", "(B-D).", "Figure 1.", "Fig. 2A."
_LABEL_ONLY = re.compile(
    r"^(?:[(\[]?\s*(?:[A-Za-z]|\d{1,2}|[ivx]{1,4})(?:\s*[-,]\s*(?:[A-Za-z]|\d{1,2}))*\s*[)\]]?"
    r"|(?:Fig(?:ure)?s?\.?|Supplementary\s+Fig(?:ure)?\.?)\s*S?\d+[A-Za-z]?)\s*[.:]?$",
    re.IGNORECASE,
)


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` (normalised), such that ``" ".join`` gives the text back.

    Periods that do not end a sentence: abbreviations ("Fig. 2", "e.g.", "et al.", "vs."),
    initials and abbreviated genera ("J. Smith", "Y. pestis"), decimals ("0.05", no space
    follows), and a period after a bare panel or figure label ("(A). Western blot").
    """
    text = normalize_caption(text)
    if not text:
        return []
    sentences: list[str] = []
    start = 0
    for match in _BOUNDARY.finditer(text):
        candidate = text[start : match.end()].strip()
        if _continues(candidate, match.group()):
            continue
        sentences.append(candidate)
        start = match.end()
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def _continues(candidate: str, boundary: str) -> bool:
    """Whether the period closing ``candidate`` is not a sentence end."""
    if not boundary.startswith(".") or boundary.startswith(".."):
        return False
    if _LABEL_ONLY.match(candidate):
        return True
    last = _LAST_WORD.search(candidate)
    if last is None:
        return False
    word = last.group(1)
    if "." in word:  # e.g, i.e, U.S
        return True
    if len(word) == 1 and word.isupper():  # initials, abbreviated genus
        return True
    return word.lower() in ABBREVIATIONS


@dataclass(frozen=True)
class Cut:
    """A text fitted to a budget. ``mid_sentence``: the first sentence alone was over budget,
    so it was cut at a word boundary (the stage records it; the caption lost part of a claim)."""

    text: str
    cut: bool
    mid_sentence: bool = False


class TextTokenizer:
    """A text encoder's tokenizer. Subclasses give ``ids`` (untruncated, with special tokens)."""

    name: str = "tokenizer"
    context_length: int = 77

    def ids(self, text: str) -> list[int]:
        raise NotImplementedError

    def count(self, text: str) -> int:
        """Tokens as the encoder sees them, start and end tokens included, before truncation."""
        return len(self.ids(text))

    def fits(self, text: str, budget: int) -> bool:
        return self.count(text) <= budget

    def cut_at(self, text: str, budget: int) -> Cut:
        """The longest run of whole leading sentences that fits ``budget`` tokens."""
        text = normalize_caption(text)
        if self.fits(text, budget):
            return Cut(text, False)
        sentences = split_sentences(text)
        k = _longest_prefix(len(sentences), lambda n: self.fits(" ".join(sentences[:n]), budget))
        if k > 0:
            return Cut(" ".join(sentences[:k]), True)
        words = sentences[0].split(" ") if sentences else []
        k = _longest_prefix(len(words), lambda n: self.fits(" ".join(words[:n]), budget))
        return Cut(" ".join(words[:k]), True, mid_sentence=True)

    def cut(self, text: str, budget: int) -> tuple[str, bool]:
        """``(text, was_cut)``; see :meth:`cut_at` for whether a sentence had to be cut."""
        result = self.cut_at(text, budget)
        return result.text, result.cut

    def padding_share(self, texts: Iterable[str], context_length: int | None = None) -> float:
        """Share of the encoder's window that is padding over ``texts`` (LongCAP's "tokens
        wasted": short captions leave most of a 77-token window empty). 0.0 for no texts."""
        length = context_length or self.context_length
        used = [min(self.count(t), length) for t in texts]
        if not used:
            return 0.0
        return sum(length - u for u in used) / (length * len(used))


def _longest_prefix(n: int, fits: Callable[[int], bool]) -> int:
    """Largest ``k <= n`` with ``fits(k)``, by binary search (token counts grow with the
    prefix), then stepped down until it really fits, as merges can make counts non-monotone."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    while lo > 0 and not fits(lo):
        lo -= 1
    return lo


class OpenClipTokenizer(TextTokenizer):
    """OpenCLIP's ``SimpleTokenizer`` (OpenAI CLIP BPE); its vocabulary ships in the
    open-clip-torch wheel, so it works offline. Lowercases and cleans text like the encoder."""

    def __init__(self, context_length: int = 77):
        from pipelines.text.clip_bpe import simple_tokenizer

        self._tokenizer = simple_tokenizer(context_length)
        self.context_length = context_length
        self.name = f"openclip-bpe@{context_length}"

    def ids(self, text: str) -> list[int]:
        inner = self._tokenizer.encode(text)
        return [self._tokenizer.sot_token_id, *inner, self._tokenizer.eot_token_id]


class BackendTokenizer(TextTokenizer):
    """A ``tokenizers.Tokenizer`` object (the fast tokenizers' backend), post-processor included."""

    def __init__(self, tokenizer, name: str, context_length: int):
        self._tokenizer = tokenizer
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self.name = name
        self.context_length = context_length

    def ids(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=True).ids


TOKENIZER_SETTING = "PANELFORGE_TEXT_TOKENIZER"
DEFAULT_HF_TOKENIZER = "thomas-sounack/BioClinical-ModernBERT-base"  # BMC-LongCLIP's text tower


class TokenizerUnavailableError(StageInputError):
    """The tokenizer is neither local nor downloadable: a person must provide it."""


class HfTokenizer(TextTokenizer):
    """A Hugging Face tokenizer by hub id or local directory, loaded offline first."""

    def __init__(self, name_or_path: str, context_length: int, revision: str | None = None):
        from transformers import AutoTokenizer

        from pipelines.compute.weights import Weights, from_pretrained_offline_first

        what = "the text encoder's tokenizer"
        weights = Weights(TOKENIZER_SETTING, name_or_path, DEFAULT_HF_TOKENIZER, what, revision)

        def unavailable(exc: Exception) -> TokenizerUnavailableError:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            where = "no such folder" if weights.is_folder and not Path(name_or_path).is_dir() else "not available"
            return TokenizerUnavailableError(str(weights.error(f"{where} ({first})")).replace(
                f"{TOKENIZER_SETTING}={name_or_path!r}", f"{TOKENIZER_SETTING}='hf:{name_or_path}'"))  # fmt: skip

        self._tokenizer = from_pretrained_offline_first(AutoTokenizer, name_or_path, unavailable, revision)
        self.context_length = context_length
        self.name = f"hf:{public_model_name(name_or_path)}@{context_length}"  # provenance: never a local path

    def ids(self, text: str) -> list[int]:
        return self._tokenizer(text, add_special_tokens=True, truncation=False, verbose=False)["input_ids"]


# The tiny tokenizer's words; anything else is one [UNK], so counts are easy to compute by hand.
_TINY_WORDS = """the a an of and in to with for on at by from is are was were be as or that this these
cell cells figure fig panel scale bar image images mouse mice human tissue stained staining shown
control treated representative arrow arrows left right top bottom""".split()
TINY_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")


def tiny_backend():
    """A deterministic WordPiece built in code: lowercased, split on white space and punctuation
    (BERT's pre-tokenizer), ``[CLS] ... [SEP]``. Every word and every punctuation mark is one
    token, so a text's count is its words plus punctuation marks plus 2."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = {token: i for i, token in enumerate([*TINY_SPECIALS, *_TINY_WORDS])}
    tokenizer = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
    )
    return tokenizer


def tiny_tokenizer(context_length: int = 77) -> TextTokenizer:
    """The tiny tokenizer for tests (see :func:`tiny_backend`)."""
    return BackendTokenizer(tiny_backend(), f"tiny@{context_length}", context_length)


def load_tokenizer(spec: str, context_length: int) -> TextTokenizer:
    """``"openclip"``, ``"hf:<hub id or local directory>"`` or ``"tiny"``."""
    if spec == "openclip":
        return OpenClipTokenizer(context_length)
    if spec == "tiny":
        return tiny_tokenizer(context_length)
    if spec.startswith("hf:") and len(spec) > 3:
        return HfTokenizer(spec[3:], context_length)
    raise ValueError(f"unknown tokenizer {spec!r}: expected 'openclip', 'hf:<id or path>' or 'tiny'")
