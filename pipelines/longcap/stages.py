"""LongCAP and RegionMed-CLIP stages: hard-negative captions for region pairs, and long captions.

Both read what earlier stages wrote (the `pairs` table; the article's text and mentions) and
keep every original: a negative is a new row next to its pair, a long caption is a new column
next to the caption, which is always kept.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field

import numpy as np
from PIL import Image

from pipelines.acquire.rawstore import RawReader
from pipelines.concepts.decode import decode_image
from pipelines.concepts.shard import image_refs
from pipelines.lake import Lake
from pipelines.longcap.acronyms import find_definitions, used_acronyms
from pipelines.longcap.context import Context, assemble_context
from pipelines.longcap.guards import check_refinement, fit_long_caption, fold
from pipelines.longcap.negatives import negative_rows, vlm_negatives
from pipelines.longcap.prompts import FEASIBLE, LONGCAP, PROMPT_VERSION
from pipelines.longcap.tokens import TextTokenizer, load_tokenizer
from pipelines.mining.prompts import SYSTEM
from pipelines.mining.stages import MeteredEngine
from pipelines.panels.captions import normalize_caption
from pipelines.release.samples import caption_of
from pipelines.release.stats import _png
from pipelines.schemas import TABLES, Table
from pipelines.stage import (
    Check,
    Compute,
    Markdown,
    Partition,
    Preview,
    Progress,
    Stage,
    StageInputError,
    StageResult,
    chunks,
    fingerprint_unless_error,
    reusable_results,
)
from pipelines.vlm.canary import canary_check, require_structured_outputs
from pipelines.vlm.engine import VlmEngine, VlmRequest, VlmResponse, engine_fingerprint, fingerprint, provenance
from pipelines.vlm.grounding import parse_json

GPU_POOL = "gpu"
# What the stage makes of the same inputs, engine and prompt; a new version recomputes what earlier
# ones made. 2: the token budget cuts the refinement's added sentences, never the caption.
LONGCAP_VERSION = "2"


@dataclass
class NegativesStage(Stage):
    """Hard-negative captions for every region pair with text (RegionMed-CLIP): one attribute
    changed (laterality, location, count, colour, stain, modality, size) by rules, and by the VLM
    when an engine is given; each checked to contradict its positive."""

    engine: VlmEngine | None = None
    max_per_type: int = 1
    vlm_per_pair: int = 2
    seed: int = 0

    name = "pair_negatives"
    reads = (Table.PAIRS,)
    writes = (Table.PAIR_NEGATIVES,)

    @property
    def compute(self) -> Compute:  # type: ignore[override]
        return Compute(pool=GPU_POOL) if self.engine is not None else Compute()

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        pairs = lake.read_table(Table.PAIRS, partition.release, partition.shard)
        if pairs is None:
            raise StageInputError(
                f"release {partition.release} shard {partition.shard} has no pairs yet: materialize `pairs` first"
            )
        regions = [p for p in pairs.to_pylist() if p["level"] == "region" and (p["text"] or "").strip()]
        vlm, reasons = None, {}
        if self.engine is not None and regions:
            answer = vlm_negatives(self.engine, [(p["pair_id"], p["text"]) for p in regions], self.vlm_per_pair)
            vlm, reasons = answer.negatives, answer.reasons
        rows = negative_rows(regions, self.max_per_type, self.seed, vlm)
        lake.write_table(Table.PAIR_NEGATIVES, partition.release, partition.shard, rows)
        negated = {r["pair_id"] for r in rows}
        kinds = Counter(r["perturbation"] for r in rows)
        sources = Counter(r["source"] for r in rows)
        result = self.result(
            partition,
            ok=len(negated),
            skipped=len(regions) - len(negated),
            counts={
                "region_pairs": len(regions),
                "negatives": len(rows),
                **{f"perturbation_{k}": v for k, v in sorted(kinds.items())},
                **{f"source_{k}": v for k, v in sorted(sources.items())},
                "vlm_reasons": sum(len(v) for v in reasons.values()),
            },
            previews={"preview": Preview(rows, ["pair_id", "perturbation", "original_span", "replacement", "text"])},
            checks=[negatives_differ(rows, {p["pair_id"]: p["text"] for p in regions})],
        )
        return result


NEGATIVES_DIFFER = "negatives_differ_from_positive"


def negatives_differ(rows: list[dict], positives: dict[str, str]) -> Check:
    """No negative equals its positive (a negative that says the same is a false negative)."""
    same = [r["pair_id"] for r in rows if r["text"].strip().lower() == positives[r["pair_id"]].strip().lower()]
    return Check(
        NEGATIVES_DIFFER,
        passed=not same,
        description=f"{len(same)} of {len(rows)} negatives read like their positive",
        metadata={"same": same[:50]},
    )


# ---- long captions ------------------------------------------------------------------------------


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
class _Item:
    ref: dict
    caption: str
    context: Context
    used: dict[str, str]
    undefined: list[str]
    fingerprint: str
    image: Image.Image | None = None


@dataclass
class LongCapStage(Stage):
    """Every figure's caption enriched with its article's context (the paragraphs citing it, title,
    abstract; acronyms as the article defines them) by a VLM that must say which added facts the
    image shows, then checked by guards that do not trust it; the original caption always kept."""

    engine: VlmEngine
    settings: LongCapSettings = field(default_factory=LongCapSettings)
    actors: int = 0
    gpus_per_actor: float = 0.0

    name = "long_captions"
    reads = (Table.FIGURES, Table.ARTICLES, Table.MENTIONS, Table.RAW_FILES, Table.LONG_CAPTIONS)
    writes = (Table.LONG_CAPTIONS,)

    @property
    def compute(self) -> Compute:  # type: ignore[override]
        return Compute(ray_actors=self.actors, gpus_per_actor=self.gpus_per_actor, pool=GPU_POOL)

    def settings_fingerprint(self) -> str:
        return engine_fingerprint(
            self.engine, prompt=PROMPT_VERSION, settings=self.settings.as_dict(), version=LONGCAP_VERSION
        )

    def _known(self, lake: Lake, partition: Partition) -> dict[str, dict]:
        """Captions already refined from the same inputs and settings (a rerun, the previous release)."""
        known = reusable_results(lake, Table.LONG_CAPTIONS, partition, fingerprint_unless_error)
        return {fp: row for fp, (row, _) in known.items()}

    def _items(self, lake: Lake, partition: Partition, tokenizer: TextTokenizer) -> list[_Item]:
        release, shard = partition.release, partition.shard
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
        settings = self.settings_fingerprint()
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
                self.settings.context_budget,
                fig_id=fig_id,
            )
            fp = fingerprint(
                {"sha256": ref["sha256"], "caption": caption, "context": context.text, "settings": settings}
            )
            items.append(_Item(ref, caption, context, used, undefined, fp))
        return items

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        tokenizer = load_tokenizer(self.settings.tokenizer, self.settings.budget)
        self._provenance = provenance(self.engine, PROMPT_VERSION)
        items = self._items(lake, partition, tokenizer)
        known = self._known(lake, partition)
        engine = MeteredEngine(self.engine)
        rows, errors, carried, canary = [], [], 0, None
        todo = []
        for item in items:
            if item.fingerprint in known:
                rows.append({**known[item.fingerprint], "fig_id": item.ref["fig_id"]})
                carried += 1
            elif not item.caption or item.context.sources == ["caption"]:
                rows.append(self._row(item, tokenizer, "no_context", None, None))
            else:
                todo.append(item)
        if todo:
            canary = require_structured_outputs(self.engine, self.settings.require_canary)
        progress = Progress(f"long captions {partition}", len(todo), "figures")
        with RawReader(lake) as reader, progress.heartbeat():
            for chunk in chunks(todo, self.settings.figures_per_batch):
                ready = []
                for item in chunk:
                    ref = item.ref
                    image, reason = decode_image(reader.read(ref["tar_path"], ref["offset"], ref["size"]))
                    if image is None:
                        errors.append((f"{ref['pmcid']} {ref['image_file']}", reason))
                        rows.append(self._row(item, tokenizer, "error", reason, None))
                        continue
                    item.image = image
                    ready.append(item)
                progress.advance(len(chunk) - len(ready), unreadable=len(chunk) - len(ready))
                refined: dict[int, dict] = {}
                for index, response in engine.stream([self._request(item) for item in ready]):
                    refined[index] = self._refine(ready[index], response, tokenizer)
                    ready[index].image = None
                    progress.advance()  # a figure is done when its answer is back, not its whole batch
                rows.extend(refined[index] for index in range(len(ready)))
        rows = [{k: v for k, v in r.items() if k in _COLUMNS} for r in rows]
        lake.write_table(Table.LONG_CAPTIONS, partition.release, partition.shard, rows)
        return self._result(partition, rows, errors, carried, canary, engine, tokenizer)

    def _request(self, item: _Item) -> VlmRequest:
        acronyms = "\n".join(f"{short}: {long}" for short, long in item.used.items()) or "(none in the caption)"
        return VlmRequest(
            f"{item.ref['pmcid']}/{item.ref['image_file']}|longcap",
            LONGCAP.render(caption=item.caption, context=item.context.text, acronyms=acronyms),
            [item.image],
            system=SYSTEM,
            schema=LONGCAP.schema,
            max_tokens=LONGCAP.max_tokens,
        )

    def _row(
        self,
        item: _Item,
        tokenizer: TextTokenizer,
        status: str,
        reason: str | None,
        answer: dict | None,
        refined: str | None = None,
        failures: list[str] | None = None,
    ) -> dict:
        ref = item.ref
        fit = fit_long_caption(item.caption, refined, tokenizer, self.settings.budget) if item.caption else None
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
        return {
            **_EMPTY_LONG_CAPTION,
            **self._provenance,
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

    def _refine(self, item: _Item, response: VlmResponse, tokenizer: TextTokenizer) -> dict:
        """The model's long caption if every guard passes, else the original with the reason."""
        if response.error:
            return self._row(item, tokenizer, "fallback", f"request failed: {response.error}", None)
        parsed = parse_json(response.text or "")
        answer = parsed.value if isinstance(parsed.value, dict) and not parsed.truncated else None
        refined = answer.get("long_caption") if answer else None
        if answer is None or not isinstance(refined, str):
            why = parsed.error or ("answer cut off" if parsed.truncated else "no long_caption in the answer")
            return self._row(item, tokenizer, "fallback", f"unusable answer: {why}", None)
        if answer.get("verdict") != FEASIBLE:
            return self._row(item, tokenizer, "fallback", f"model verdict: {answer.get('verdict')}", answer)
        failures = check_refinement(item.caption, refined, item.context.text, tokenizer=tokenizer)
        failures += _acronym_failures(answer, item)
        if failures:
            return self._row(item, tokenizer, "fallback", "guards rejected the refinement", answer, None, failures)
        return self._row(item, tokenizer, "refined", None, answer, refined)

    def _result(self, partition, rows, errors, carried, canary, engine: MeteredEngine, tokenizer) -> StageResult:
        statuses = Counter(r["status"] for r in rows)
        m = engine.meter
        before = [r["tokens_before"] for r in rows if r["caption"]]
        after = [r["tokens_after"] for r in rows if r["caption"]]
        counts = {
            "images": len(rows),
            "carried": carried,
            **{f"status_{k}": v for k, v in sorted(statuses.items())},
            "vlm_requests": sum(m.requests.values()),
            "prompt_tokens": sum(m.prompt_tokens.values()),
            "completion_tokens": sum(m.completion_tokens.values()),
            "vlm_seconds": round(sum(m.seconds.values()), 3),
            "tokenizer": tokenizer.name,
            "median_tokens_before": float(np.median(before)) if before else 0.0,
            "median_tokens_after": float(np.median(after)) if after else 0.0,
            "synthetic": engine.config.synthetic,
        }
        if before:
            counts["token_lengths"] = Markdown(f"![tokens](data:image/png;base64,{token_histogram(before, after)})")
        result = self.result(
            partition,
            ok=len(rows) - len(errors) - carried,
            error=len(errors),
            skipped=carried,
            counts=counts,
            previews={"preview": Preview(rows, ["pmcid", "image_file", "status", "reason", "tokens_after"])},
            checks=[
                feasibility(rows),
                guard_rejections(rows),
                gained_context(rows),
                canary_check(LONGCAP_CANARY, canary),
            ],
        )
        result.errors = list(errors)
        result.version = fingerprint(sorted((r["pmcid"], r["image_file"], r["fingerprint"]) for r in rows))
        return result


_COLUMNS = TABLES[Table.LONG_CAPTIONS].names
_EMPTY_LONG_CAPTION = dict.fromkeys(_COLUMNS)


def _acronym_failures(answer: dict, item: _Item) -> list[str]:
    """The model may expand only what the article does not define, and must not redefine what it does."""
    failures = []
    for a in answer.get("acronyms") or []:
        if not isinstance(a, dict):
            continue
        short, long = a.get("short"), a.get("long")
        if short in item.used and fold(long or "") != fold(item.used[short]):
            failures.append(f"acronym {short} expanded as {long!r}; the article defines {item.used[short]!r}")
    return failures


def token_histogram(before: list[int], after: list[int]) -> str:
    """Token lengths of the captions before and after, as a base64 PNG."""
    import base64

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    bins = np.linspace(0, max(max(before), max(after), 1) + 1, 30)
    ax.hist(before, bins=bins, alpha=0.6, label="caption")
    ax.hist(after, bins=bins, alpha=0.6, label="long caption")
    ax.set_xlabel("tokens (text encoder's tokenizer)")
    ax.set_ylabel("figure images")
    ax.legend()
    return base64.b64encode(_png(fig, plt)).decode()


FEASIBILITY, GUARD_REJECTIONS, GAINED_CONTEXT, LONGCAP_CANARY = (
    "longcap_feasibility_rate",
    "longcap_guard_rejection_rate",
    "longcap_gained_context_share",
    "longcap_structured_outputs_canary",
)
MIN_FEASIBLE, MAX_GUARD_REJECTIONS, MIN_GAINED = 0.2, 0.5, 0.1


def _asked(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["status"] in ("refined", "fallback")]


def feasibility(rows: list[dict]) -> Check:
    asked = _asked(rows)
    feasible = sum(1 for r in asked if r["verdict"] == FEASIBLE)
    rate = feasible / len(asked) if asked else 1.0
    return Check(
        FEASIBILITY,
        passed=rate >= MIN_FEASIBLE,
        description=f"{feasible} of {len(asked)} figures asked judged FEASIBLE by the model ({rate:.0%}; "
        f"at least {MIN_FEASIBLE:.0%} expected)",
        blocking=False,
        metadata={"rate": rate},
    )


def guard_rejections(rows: list[dict]) -> Check:
    feasible = [r for r in _asked(rows) if r["verdict"] == FEASIBLE]
    rejected = sum(1 for r in feasible if r["guard_failures"])
    rate = rejected / len(feasible) if feasible else 0.0
    reasons = Counter(f.split(":")[0] for r in feasible for f in r["guard_failures"])
    return Check(
        GUARD_REJECTIONS,
        passed=rate <= MAX_GUARD_REJECTIONS,
        description=f"{rejected} of {len(feasible)} feasible refinements rejected by the guards ({rate:.0%}; "
        f"at most {MAX_GUARD_REJECTIONS:.0%} expected)",
        blocking=False,
        metadata={"rate": rate, "reasons": dict(reasons.most_common(10))},
    )


def gained_context(rows: list[dict]) -> Check:
    with_caption = [r for r in rows if r["caption"]]
    gained = sum(1 for r in with_caption if r["gained_context"])
    share = gained / len(with_caption) if with_caption else 0.0
    return Check(
        GAINED_CONTEXT,
        passed=share >= MIN_GAINED,
        description=f"{gained} of {len(with_caption)} captions gained verified context ({share:.0%}; at least "
        f"{MIN_GAINED:.0%} expected)",
        blocking=False,
        metadata={"share": share},
    )
