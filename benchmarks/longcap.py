"""LongCAP: tokens wasted in the text encoder's window (padding share) at 77 and 512 tokens, and
the VLM cost per figure of the LONGCAP prompt, with a projection to 24M figures.

LongCAP reports the padding share falling from 55% to 2.2% once captions are enriched (as quoted
in the "Long captions" issue). What can be measured here, with the OpenCLIP tokenizer:

* (a) ``caption``: the original captions, at 77 and 512 tokens.
* (b) ``enriched_upper_bound``: the deterministic text PanelForge assembles for each figure (the
  caption, then the article context that fits the stage's ``context_budget``: citing paragraphs,
  title, abstract; ``assemble_context``), labels removed and cut to 512 tokens at sentence
  boundaries (``tokenizer.cut``). A refinement keeps only the facts the image supports, so this is
  an UPPER bound on what a long caption can reach (a lower bound on the padding share), not what
  a model wrote.
* (c) ``stage_long_caption``: the ``long_captions`` the stage wrote in a synthetic run (tiny random
  Qwen2.5-VL on the CPU, the demo's settings). The random model's answers are never usable JSON
  within the demo's answer cap, so every figure falls back to its original caption: these equal
  (a) by construction and are NOT LongCAP's "after".

Each on the sample's figure images and on the sample replicated ``--replicate`` times with
distinct keys: a padding share is a mean over texts, so replication only checks that the
computation is stable and how long it takes at that size (the word cache of OpenCLIP's BPE makes
repeated text cheap; the time is a lower bound for distinct text).

(d) VLM cost per figure of the LONGCAP prompt: prompt tokens measured at the run's reduced pixel
band, and at the production band with image tokens exact (``model_frame``: w/28 x h/28 + 2 per
image) and text tokens from the tiny tokenizer (an approximation of Qwen's); completion tokens
between the tiny model's capped answers and the prompt's budget; CPU seconds of the tiny model
(labelled, not GPU seconds); a projection to 24M figures with the throughputs ASSUMED in
benchmarks/vlm_cost.py (its ``h100_hours``, shared with the mining benchmark).

    python -m benchmarks.longcap [--shards 000 001 002 003] [--replicate 50] [--figures 24000000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from benchmarks.record import write_results
from benchmarks.vlm_cost import (
    DECODE_TPS,
    FORMULA,
    PREFILL_TPS,
    PRODUCTION,
    Recorder,
    assumption,
    chars_per_token,
    h100_hours,
    image_tokens,
    production_prompt_tokens,
    summary,
)
from pipelines.core.schemas import Table
from pipelines.core.stage import Partition
from pipelines.longcap.prompts import LONGCAP
from pipelines.longcap.stages import LongCapSettings, LongCapStage
from pipelines.longcap.tokens import TextTokenizer, load_tokenizer
from pipelines.vlm.engine import EngineConfig, Sampling
from pipelines.vlm.grounding import model_frame

RESULTS = Path(__file__).parent / "results" / "longcap.json"
MARKDOWN = Path(__file__).parent / "results" / "longcap.md"
RELEASE = "2026"
SHARDS = ("000", "001", "002", "003")
WINDOWS = (77, 512)
LONGCAP_REPORTED = {"before": 0.55, "after": 0.022, "source": "LongCAP, as quoted in the 'Long captions' issue"}
NOTE = "synthetic tiny random model; CPU; seconds are not GPU seconds"
SETTINGS = LongCapSettings(tokenizer="openclip", budget=512, context_budget=1024)

# The labels assemble_context puts around its blocks (pipelines/longcap/context.py ``_render``).
_LABEL = re.compile(r"^(?:Caption|Article title|Abstract|Sections): ")
_MENTION = re.compile(r"^- (?:\([^()]*\) )?")


def prose(context: str) -> str:
    """The assembled context as running text: labels, block headers and section tags removed,
    so that its tokens are the facts' tokens only (the caption comes first, as assembled)."""
    lines = []
    for line in context.split("\n"):
        if line.strip() == "Text citing the figure:":
            continue
        line = _MENTION.sub("", _LABEL.sub("", line.strip()))
        if line:  # a title has no final period: give it one, so the cut sees it as a sentence
            lines.append(line if line.endswith((".", "!", "?")) else line + ".")
    return " ".join(lines)


def shares(texts: Sequence[str], tokenizer: TextTokenizer) -> dict:
    """Padding share and truncation at each window, with the token lengths behind them."""
    counts = [tokenizer.count(t) for t in texts]
    out: dict = {"texts": len(texts), "tokens": summary(counts, 1)}
    for window in WINDOWS:
        out[f"padding_share_{window}"] = round(tokenizer.padding_share(texts, window), 4)
        out[f"share_over_{window}"] = round(sum(c > window for c in counts) / max(1, len(counts)), 4)
    return out


def text_sets(rows: list[dict], items: dict, tokenizer: TextTokenizer, budget: int) -> dict[str, dict[str, str]]:
    """The three texts of every figure image with a caption, keyed by pmcid/image_file."""
    out: dict[str, dict[str, str]] = {"caption": {}, "enriched_upper_bound": {}, "stage_long_caption": {}}
    for row in rows:
        if not row["caption"]:
            continue
        key = f"{row['pmcid']}/{row['image_file']}"
        out["caption"][key] = row["caption"]
        out["stage_long_caption"][key] = row["long_caption"] or ""
        out["enriched_upper_bound"][key] = tokenizer.cut(prose(items[key].context.text), budget)[0]
    return out


def replicated(sets: dict[str, dict[str, str]], times: int) -> dict[str, dict[str, str]]:
    return {name: {f"{k}#{i:03d}": t for i in range(times) for k, t in texts.items()} for name, texts in sets.items()}


def padding(sets: dict[str, dict[str, str]], tokenizer: TextTokenizer) -> dict:
    out = {}
    for name, texts in sets.items():
        began = time.perf_counter()
        out[name] = shares(list(texts.values()), tokenizer)
        out[name]["seconds"] = round(time.perf_counter() - began, 3)
    return out


def run_stage(lake, config: EngineConfig, shards: Sequence[str], tokenizer: TextTokenizer) -> dict:
    """The stage on every shard (tiny model, batch 1 like the demo); its rows, items, records."""
    from pipelines.vlm.hf import TransformersEngine

    rows, items, walls, results = [], {}, {}, {}
    with TransformersEngine(config, device="cpu", batch_size=1) as engine:
        recorder = Recorder(engine)
        stage = LongCapStage(recorder, SETTINGS)
        for shard in shards:
            partition = Partition(RELEASE, shard)
            began = time.perf_counter()
            results[shard] = stage.run(lake, partition)
            walls[shard] = time.perf_counter() - began
            rows += lake.read_table(Table.LONG_CAPTIONS, RELEASE, shard).to_pylist()
            for item in stage._items(lake, partition, tokenizer):
                items[f"{item.ref['pmcid']}/{item.ref['image_file']}"] = item
    return {"rows": rows, "items": items, "walls": walls, "results": results, "records": recorder.records}


def stage_summary(run: dict) -> dict:
    rows = run["rows"]
    with_caption = [r for r in rows if r["caption"]]
    return {
        "figure_images": len(rows),
        "with_caption": len(with_caption),
        "statuses": dict(sorted(Counter(r["status"] for r in rows).items())),
        "reasons": dict(Counter((r["reason"] or "").split(":")[0] for r in rows if r["reason"]).most_common(5)),
        "long_caption_equals_caption": sum(1 for r in with_caption if r["long_caption"] == r["caption"]),
        "cut_to_budget": sum(1 for r in with_caption if r["cut"]),
        "stage_wall_seconds": {s: round(w, 2) for s, w in run["walls"].items()},
        "why_equal": "every LONGCAP answer of the tiny random model is unusable (random JSON cut off at the demo's "
        "answer cap of 48 tokens) or not FEASIBLE, so the stage keeps the original caption (status fallback), cut "
        "at sentence boundaries only where it is over the 512-token budget (cut_to_budget); figures without "
        "article context are not sent (status no_context) and keep it too",
    }


def openclip_density(texts: Sequence[str], tokenizer: TextTokenizer) -> dict:
    """Characters per token of OpenCLIP's BPE (49k vocabulary, a real one, not Qwen's) on the same
    text: a measured reference for how much finer the tiny model's few-hundred-token BPE splits."""
    chars = sum(len(t) for t in texts)
    tokens = sum(tokenizer.count(t) - 2 for t in texts)  # without start and end tokens
    return {
        "texts": len(texts),
        "characters": chars,
        "tokens": tokens,
        "chars_per_token": round(chars / max(1, tokens), 3),
        "note": "OpenCLIP lowercases and drops some punctuation spacing; Qwen's ratio on this text is unknown",
    }


def cost(
    run: dict, figures_total: int, prefill_tps: float, decode_tps: float, processor, tokenizer: TextTokenizer
) -> dict:
    """Per LONGCAP request and per figure image, measured (CPU) and at the production band."""
    prefix = LONGCAP.template.split("{", 1)[0]
    records = [r for r in run["records"] if r.text.startswith(prefix)]  # the canary is not a figure's cost
    n_images = len(run["rows"])
    images_prod = [image_tokens(*model_frame(w, h, PRODUCTION)) for r in records for w, h in r.image_sizes]
    text = [r.prompt_tokens - sum(image_tokens(w, h) for w, h in r.frames) for r in records]
    production = [production_prompt_tokens(r) for r in records]
    per_figure = len(records) / max(1, n_images)
    prompt_prod = statistics.fmean(production) if production else 0.0
    measured_out = statistics.fmean(r.completion_tokens for r in records) if records else 0.0
    return {
        "requests": len(records),
        "figure_images": n_images,
        "requests_per_figure_image": round(per_figure, 4),
        "per_request": {
            "prompt_tokens_measured_band": summary([r.prompt_tokens for r in records], 1),
            "text_tokens_tiny_tokenizer": summary(text, 1),
            "image_tokens_production": summary(images_prod, 1),
            "prompt_tokens_production": summary(production, 1),
            "completion_tokens": {"tiny_measured_capped": round(measured_out, 1), "prompt_budget": LONGCAP.max_tokens},
            "cpu_seconds_tiny_model": summary([r.seconds for r in records], 4),
        },
        "text_characters_per_request": summary([len(r.text) for r in records], 1),
        "text_chars_per_token_tiny_tokenizer": chars_per_token([r.text for r in records], processor.tokenizer),
        "text_chars_per_token_openclip_bpe": openclip_density([r.text for r in records], tokenizer),
        "projection_24m": {
            "figures": figures_total,
            "note": "every figure image sent at the sample's rate (figures without article context are not sent); "
            "prompt tokens at the production band (256-1280 visual tokens, exact from model_frame) with text tokens "
            "from the tiny tokenizer (an approximation of Qwen's); completion between the tiny model's capped "
            "answers and the prompt's budget of 1536 tokens",
            "prompt_tokens_per_figure": round(per_figure * prompt_prod, 1),
            "completion_tokens_per_figure": {
                "tiny_measured_capped": round(per_figure * measured_out, 1),
                "prompt_budget": round(per_figure * LONGCAP.max_tokens, 1),
            },
            "formula": FORMULA,
            "assumption": assumption(prefill_tps, decode_tps),
            "low_completion": h100_hours(
                per_figure * prompt_prod, per_figure * measured_out, figures_total, prefill_tps, decode_tps
            ),
            "budget_completion": h100_hours(
                per_figure * prompt_prod, per_figure * LONGCAP.max_tokens, figures_total, prefill_tps, decode_tps
            ),
        },
    }


def markdown(result: dict) -> str:
    s, r, c = result["sample"], result["replicated"], result["vlm_cost"]
    pj, req = c["projection_24m"], c["per_request"]

    def row(label: str, name: str) -> str:
        a, b = s[name], r[name]
        return (
            f"| {label} | {a['padding_share_77']:.1%} | {a['padding_share_512']:.1%} | {a['tokens']['p50']:.0f} | "
            f"{a['share_over_77']:.0%} | {b['padding_share_77']:.1%} / {b['padding_share_512']:.1%} |"
        )

    lines = [
        "**Long captions** ([benchmarks/results/longcap.json](benchmarks/results/longcap.json)): tokens wasted "
        f"(padding share of the text encoder's window, OpenCLIP BPE) on the sample's {s['caption']['texts']} "
        f"captioned figure images and on the sample replicated x{result['replicate']} "
        f"({r['caption']['texts']:,} texts); LongCAP reports {LONGCAP_REPORTED['before']:.0%} -> "
        f"{LONGCAP_REPORTED['after']:.1%}:",
        "",
        "| text | padding @77 | padding @512 | tokens p50 | over 77 | replicated @77 / @512 |",
        "|---|---|---|---|---|---|",
        row("(a) original caption", "caption"),
        row("(b) caption + assembled context, cut to 512 (upper bound)", "enriched_upper_bound"),
        row("(c) stage long caption, synthetic run (= caption, cut at 512)", "stage_long_caption"),
        "",
        f"LONGCAP VLM cost per request: {req['prompt_tokens_production']['mean']:,.0f} prompt tokens at the "
        f"production band (image {req['image_tokens_production']['mean']:,.0f}, exact; text "
        f"{req['text_tokens_tiny_tokenizer']['mean']:,.0f} from {c['text_characters_per_request']['mean']:,.0f} "
        f"characters, tiny tokenizer at {c['text_chars_per_token_tiny_tokenizer']['chars_per_token']} chars/token; "
        f"OpenCLIP's BPE gives {c['text_chars_per_token_openclip_bpe']['chars_per_token']} on the same text, Qwen's "
        "is unknown), completion "
        f"{req['completion_tokens']['tiny_measured_capped']:.0f} (tiny, capped) to {LONGCAP.max_tokens} (budget), "
        f"{req['cpu_seconds_tiny_model']['mean']:.2f} s on the CPU with the tiny model (not GPU seconds); "
        f"{c['requests_per_figure_image']} requests per figure image. 24M figures at assumed "
        f"{pj['assumption']['prefill_tps']:,.0f} / {pj['assumption']['decode_tps']:,.0f} tok/s prefill/decode: "
        f"{pj['low_completion']['h100_hours']:,}-{pj['budget_completion']['h100_hours']:,} H100-hours "
        "(Qwen2.5-VL-7B).",
        "",
        "Measured: (a), (c), token counts, CPU seconds, requests per figure. (b) is computed, an upper bound: a "
        "refinement keeps only the facts the image supports, so real long captions are shorter and waste more. "
        f"(c) equals (a) ({result['stage']['long_caption_equals_caption']} of {result['stage']['with_caption']}; "
        f"the other {result['stage']['cut_to_budget']} are captions over 512 tokens, cut at a sentence boundary) "
        "because the tiny random model's answers are never usable, so every figure keeps its caption: it is not "
        "LongCAP's after. At 77 tokens the sample's captions waste little because most are longer than the window "
        "(column 'over 77': truncated, their tail lost), unlike LongCAP's 55% before. The replicated set only "
        "checks that the shares are stable at "
        f"{r['caption']['texts']:,} texts ({r['caption']['seconds']:.1f} s for the captions). Assumed: H100 "
        "throughputs (as in benchmarks/mining.py); text tokens of the VLM prompt are the tiny tokenizer's, not "
        "Qwen's (whose chars/token here is unknown): at OpenCLIP's measured ratio the same text would be "
        f"~{c['text_characters_per_request']['mean'] / c['text_chars_per_token_openclip_bpe']['chars_per_token']:,.0f}"
        " tokens, so the projection's prefill is likely an overestimate. CPU seconds depend on other processes' "
        f"load on the shared 2 cores (load average at the end: {result['load_average_1_5_15_at_end']}).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", nargs="+", default=list(SHARDS))
    parser.add_argument("--replicate", type=int, default=50)
    parser.add_argument("--figures", type=int, default=24_000_000)
    parser.add_argument("--prefill-tps", type=float, default=PREFILL_TPS)
    parser.add_argument("--decode-tps", type=float, default=DECODE_TPS)
    args = parser.parse_args()
    import torch
    import transformers
    from transformers import AutoProcessor

    from pipelines.vlm.tiny import tiny_model_dir
    from resources.profiles import SYNTHETIC_VLM
    from testing.pipeline import sample_lake

    torch.set_num_threads(os.cpu_count() or 1)
    began = time.perf_counter()
    tokenizer = load_tokenizer(SETTINGS.tokenizer, SETTINGS.budget)
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_model_dir(Path(tmp) / "vlm")
        demo = {k: v for k, v in SYNTHETIC_VLM.items() if k != "batch_size"}
        config = EngineConfig(
            model=str(model),
            synthetic=True,
            dtype=demo["dtype"],
            min_pixels=demo["min_pixels"],
            max_pixels=demo["max_pixels"],
            sampling=Sampling(max_tokens=demo["max_tokens"]),
        )
        lake = sample_lake(Path(tmp), RELEASE)
        run = run_stage(lake, config, args.shards, tokenizer)
        processor = AutoProcessor.from_pretrained(model)
        sets = text_sets(run["rows"], run["items"], tokenizer, SETTINGS.budget)
        result = {
            "benchmark": "LongCAP padding share at 77 and 512 tokens (before, upper bound, synthetic stage output) "
            "and LONGCAP VLM cost per figure",
            "note": NOTE,
            "model": "tiny random Qwen2.5-VL (pipelines.vlm.tiny), the demo's settings (resources/profiles.py "
            "SYNTHETIC_VLM: answer cap 48 tokens, 64-256 visual tokens, batch 1)",
            "tokenizer": tokenizer.name,
            "settings": SETTINGS.as_dict(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "release": RELEASE,
            "shards": args.shards,
            "replicate": args.replicate,
            "longcap_reported": LONGCAP_REPORTED,
            "definitions": {
                "padding_share": "sum over texts of (window - min(tokens, window)) / (window x texts), tokens with "
                "start and end tokens (TextTokenizer.padding_share)",
                "caption": "(a) the original caption (MEASURED)",
                "enriched_upper_bound": "(b) caption + the context assemble_context fits in context_budget 1024, "
                "labels removed, cut to 512 at sentence boundaries: an UPPER bound on a refinement's length "
                "(COMPUTED, no model)",
                "stage_long_caption": "(c) the stage's long_caption in the synthetic run: the original caption for "
                "every figure (fallback), NOT LongCAP's after",
            },
            "stage": stage_summary(run),
            "sample": padding(sets, tokenizer),
            "replicated": padding(replicated(sets, args.replicate), tokenizer),
            "vlm_cost": cost(run, args.figures, args.prefill_tps, args.decode_tps, processor, tokenizer),
        }
    result["seconds_total"] = round(time.perf_counter() - began, 1)
    result["load_average_1_5_15_at_end"] = [round(x, 2) for x in os.getloadavg()]  # other processes share the CPUs
    write_results(RESULTS, result)
    MARKDOWN.write_text(markdown(result))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
