"""Long captions as plain functions: each figure's caption and article context (:func:`caption_items`),
the request that asks the model for a long caption (:func:`longcap_request`), and what is kept of
its answer (:func:`refine`: the model's caption only when every guard passes, else the original
with the reason). The stage (``pipelines/longcap/stages.py``) runs them in the model-stage loop.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass

from PIL import Image

from pipelines.core.figures import image_refs
from pipelines.core.fingerprints import fingerprint
from pipelines.core.lake import Lake
from pipelines.core.schemas import TABLES, Table
from pipelines.core.stage import StageInputError
from pipelines.longcap.acronyms import find_definitions, used_acronyms
from pipelines.longcap.context import Context, assemble_context
from pipelines.longcap.guards import check_refinement, fit_long_caption, fold
from pipelines.longcap.prompts import FEASIBLE, LONGCAP
from pipelines.longcap.tokens import TextTokenizer
from pipelines.text.captions import caption_of, normalize_caption
from pipelines.vlm.engine import VlmRequest, VlmResponse
from pipelines.vlm.grounding import parse_json

_COLUMNS = TABLES[Table.LONG_CAPTIONS].names
_EMPTY_LONG_CAPTION = dict.fromkeys(_COLUMNS)


@dataclass(frozen=True)
class LongCapSettings:
    """``tokenizer``: the text encoder that will train on the captions (``openclip``,
    ``hf:<id or path>``, ``tiny``), ``budget`` its context in tokens (512: BMC-LongCLIP);
    ``context_budget``: the article context sent to the model, in the same tokens."""

    tokenizer: str = "openclip"
    budget: int = 512
    context_budget: int = 1024
    figures_per_batch: int = 16
    require_canary: bool = True

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class CaptionItem:
    """One figure image: its caption, the context assembled for it and the acronyms in play."""

    ref: dict
    caption: str
    context: Context
    used: dict[str, str]
    undefined: list[str]
    fingerprint: str
    image: Image.Image | None = None

    @property
    def key(self) -> str:
        return f"{self.ref['pmcid']}/{self.ref['image_file']}"


def caption_items(
    lake: Lake, release: str, shard: str, tokenizer: TextTokenizer, context_budget: int, settings: str
) -> list[CaptionItem]:
    """Every figure image of the partition with its caption and context; ``settings`` (the
    stage's settings fingerprint) goes into each item's fingerprint."""
    figures = lake.read_table(Table.FIGURES, release, shard)
    articles = lake.read_table(Table.ARTICLES, release, shard)
    if figures is None or articles is None:
        raise StageInputError(f"release {release} shard {shard} is not parsed yet: materialize `parsed_articles`")
    mentions = lake.read_table(Table.MENTIONS, release, shard)
    by_figure: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in mentions.to_pylist() if mentions is not None else []:
        by_figure[(row["pmcid"], row["fig_id"])].append(row)
    article = {a["pmcid"]: a for a in articles.to_pylist()}
    definitions: dict[str, dict] = {}
    figures = figures.to_pylist()
    captions = {(f["pmcid"], f["fig_id"]): normalize_caption(caption_of(f)) for f in figures}
    items = []
    for ref in image_refs(lake, release, shard, figures):
        pmcid, fig_id = ref["pmcid"], ref["fig_id"]
        a = article.get(pmcid, {})
        if pmcid not in definitions:
            full_text = "\n".join(t for t in (a.get("title"), a.get("abstract"), a.get("body_text")) if t)
            definitions[pmcid] = find_definitions(full_text)
        caption = captions[(pmcid, fig_id)]
        used, undefined = used_acronyms(caption, definitions[pmcid])
        context = assemble_context(
            caption,
            a.get("title"),
            a.get("abstract"),
            sorted(by_figure[(pmcid, fig_id)], key=lambda m: m["paragraph_index"] or 0),
            None,
            tokenizer,
            context_budget,
            fig_id=fig_id,
        )
        fp = fingerprint({"sha256": ref["sha256"], "caption": caption, "context": context.text, "settings": settings})
        items.append(CaptionItem(ref, caption, context, used, undefined, fp))
    return items


def needs_model(item: CaptionItem) -> bool:
    """A figure without a caption, or whose only context is its caption, keeps its caption."""
    return bool(item.caption) and item.context.sources != ["caption"]


def longcap_request(item: CaptionItem) -> VlmRequest:
    acronyms = "\n".join(f"{short}: {long}" for short, long in item.used.items()) or "(none in the caption)"
    return LONGCAP.request(
        f"{item.key}|longcap", [item.image], caption=item.caption, context=item.context.text, acronyms=acronyms
    )


@dataclass
class CaptionRows:
    """Makes the figures' ``long_captions`` rows with the stage's tokenizer, budget and provenance."""

    tokenizer: TextTokenizer
    budget: int
    provenance: dict

    def row(
        self,
        item: CaptionItem,
        status: str,
        reason: str | None,
        answer: dict | None,
        refined: str | None = None,
        failures: list[str] | None = None,
    ) -> dict:
        tokenizer, ref = self.tokenizer, item.ref
        fit = fit_long_caption(item.caption, refined, tokenizer, self.budget) if item.caption else None
        long_caption, cut = (fit.text, fit.cut) if fit else ("", False)
        if fit and refined is not None and not fit.refined:  # the refinement did not fit: the caption ships
            status, reason = "fallback", fit.note
        elif fit and fit.note:
            reason = f"{reason}; {fit.note}" if reason else fit.note
        acronyms = {s: {"long": long, "source": "article"} for s, long in item.used.items()}
        for a in (answer or {}).get("acronyms") or []:
            if isinstance(a, dict) and a.get("short") not in acronyms and a.get("short") in item.undefined:
                acronyms[a["short"]] = {"long": a.get("long"), "source": "model"}
        tokens_before = tokenizer.count(item.caption) if item.caption else 0
        tokens_after = tokenizer.count(long_caption) if long_caption else 0
        row = {
            **_EMPTY_LONG_CAPTION,
            **self.provenance,
            "pmcid": ref["pmcid"],
            "fig_id": ref["fig_id"],
            "image_file": ref["image_file"],
            "caption": item.caption,
            "long_caption": long_caption,
            "status": status,
            "reason": reason,
            "verdict": (answer or {}).get("verdict"),
            "features": json.dumps((answer or {}).get("features")) if answer else None,
            "acronyms": json.dumps(acronyms, sort_keys=True),
            "context_sources": item.context.sources,
            "context_tokens": item.context.tokens,
            "tokens_before": tokens_before,
            "tokens_after": tokens_after,
            "cut": cut,
            "gained_context": status == "refined" and tokens_after > tokens_before,
            "guard_failures": failures or [],
            "tokenizer": tokenizer.name,
            "fingerprint": item.fingerprint if status != "error" else None,
        }
        return {k: v for k, v in row.items() if k in _COLUMNS}

    def refine(self, item: CaptionItem, response: VlmResponse) -> dict:
        """The model's long caption if every guard passes, else the original with the reason."""
        if response.error:
            return self.row(item, "fallback", f"request failed: {response.error}", None)
        parsed = parse_json(response.text or "")
        answer = parsed.value if isinstance(parsed.value, dict) and not parsed.truncated else None
        refined = answer.get("long_caption") if answer else None
        if answer is None or not isinstance(refined, str):
            why = parsed.error or ("answer cut off" if parsed.truncated else "no long_caption in the answer")
            return self.row(item, "fallback", f"unusable answer: {why}", None)
        if answer.get("verdict") != FEASIBLE:
            return self.row(item, "fallback", f"model verdict: {answer.get('verdict')}", answer)
        failures = check_refinement(item.caption, refined, item.context.text, tokenizer=self.tokenizer)
        failures += acronym_failures(answer, item)
        if failures:
            return self.row(item, "fallback", "guards rejected the refinement", answer, None, failures)
        return self.row(item, "refined", None, answer, refined)


def acronym_failures(answer: dict, item: CaptionItem) -> list[str]:
    """The model may expand only what the article does not define, and must not redefine what it does."""
    failures = []
    for a in answer.get("acronyms") or []:
        if not isinstance(a, dict):
            continue
        short, long = a.get("short"), a.get("long")
        if short in item.used and fold(long or "") != fold(item.used[short]):
            failures.append(f"acronym {short} expanded as {long!r}; the article defines {item.used[short]!r}")
    return failures
