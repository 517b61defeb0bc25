"""Panel2Patch mining cost: tokens and seconds per figure and per prompt, batching, the
pre-filter, prefix caching and a projection to 24M figures.

**Synthetic tiny random model on the CPU**: the stage runs end to end on the sample release
(every shard) with the tiny Qwen2.5-VL of ``pipelines.vlm.tiny`` (0.4M parameters, random
weights) through ``TransformersEngine``. Its seconds are not GPU seconds and its answers are not
Qwen's (their length is capped at ``--max-tokens``); what carries over to a real model is the
*shape* of the work: requests per figure and per prompt, which figures the pre-filter spares, the
image sizes the prompts show, the fixed text of every prompt.

Runs (panels stage first, a fresh lake per run so nothing is reused):

* ``baseline``: engine ``batch_size`` 1 on ``--shards`` (every shard by default; per shard
  timings are kept), the run
  every figure below comes from.
* Batching: the first ``--replay`` mining requests of the baseline (stage order: mixed prompts,
  images and grammars) replayed at batch 1 and at ``--batch-size`` 8, ``--rounds`` rounds with
  the batch sizes alternating (other processes on the shared CPUs weigh on both alike), median
  kept: the same work, so seconds per request compare directly. A whole shard at batch 8 made the
  earlier version overrun 10 minutes under load. All at the reduced pixel band
  ``--min-tokens``/``--max-image-tokens`` (64-256 visual tokens).
* Pre-filter: measured per-request costs (per prompt) x the requests that would have been sent
  without it (``som_views`` PANELS requests for every figure image; one LOCATE_REGION request per
  panel of every figure that passes the concept gate and has a caption, up to
  ``max_region_panels``): an **estimate** from measured per-request costs.
* Prefix caching: computed with the tiny model's tokenizer, not measured (the transformers
  backend has none). ``strict``: the longest token prefix common to all requests of a prompt,
  cut at the first image token (what vLLM ``enable_prefix_caching`` can reuse: images come
  before the text in the chat turn); ``fixed_text``: system turn + chat scaffolding + the
  template's literal text (image tokens excluded), an upper bound on prefill saved.
* Characters per text token of the tiny tokenizer on the prompts' text (measured); Qwen's own
  ratio is not measured (no tokenizer files here) and no source was found, so it is "unknown".
* Projection: requests per figure (measured, with the pre-filter) x tokens per request at the
  production pixel band (256-1280 visual tokens): image tokens exact from ``model_frame`` on the
  real sizes of every image sent; text tokens from the tiny tokenizer (an approximation of
  Qwen's). GPU-hours = prefill tokens / prefill tok/s + decode tokens / decode tok/s, both
  **assumed** (``--prefill-tps``, ``--decode-tps``), next to Panel2Patch's ~2,900 H100-hours.

    python -m benchmarks.mining [--shards 000 001 002] [--replay 128] [--batch-size 8]
        [--figures 24000000] [--prefill-tps 20000] [--decode-tps 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

from benchmarks.mining_report import markdown
from benchmarks.record import write_results
from benchmarks.vlm_cost import (
    DECODE_TPS,
    FORMULA,
    PATCH,
    PREFILL_TPS,
    PRODUCTION,
    Record,
    Recorder,
    assumption,
    chars_per_token,
    h100_hours,
    image_tokens,
    production_prompt_tokens,
    summary,
)
from pipelines.core.lake import Lake
from pipelines.core.schemas import Table
from pipelines.core.stage import Partition
from pipelines.mining.stages import MiningSettings, MiningStage
from pipelines.mining.text import gate
from pipelines.vlm import prompts
from pipelines.vlm.engine import EngineConfig, Sampling, VlmRequest
from pipelines.vlm.grounding import model_frame

RESULTS = Path(__file__).parent / "results" / "mining.json"
MARKDOWN = Path(__file__).parent / "results" / "mining.md"
RELEASE = "2026"
SHARDS = ("000", "001", "002", "003")
BASELINE_SHARDS = SHARDS
TIMING_CAVEAT = (
    "CPU seconds on this shared 2-core machine vary ~10x with other processes' load (see load averages): "
    "earlier runs of the same baseline (every shard, batch 1) took 654 s at a load average of 6-9 and 77 s at ~1.5; "
    "shard by shard (batch 1, stage wall "
    "seconds) under load: 000: 15 figure images, 123 requests, 76 s; 001: 23, 217, 60 s; 002: 28, 175, 90 s; "
    "003: 62, 560, 46 s. The earlier full run overran 10 minutes because of its batch-8 stage run on shard 000 "
    "under such load, not because of shard 003; batching is now measured by an alternating replay"
)
LEFT_OUT_NOTE = "shards not in --shards (the default runs every shard)"
PANEL2PATCH_H100_HOURS = 2900
NOTE = "synthetic tiny random model; CPU; seconds are not GPU seconds"


def prepare_lake(root: Path, shards: Sequence[str]) -> Lake:
    from pipelines.panels.stages import PanelSettings, PanelStage
    from testing.pipeline import sample_lake

    lake = sample_lake(root, RELEASE)
    for shard in shards:
        PanelStage(PanelSettings()).run(lake, Partition(RELEASE, shard))
    return lake


def run_mining(
    root: Path, model: Path, config: EngineConfig, batch_size: int, settings: MiningSettings, shards, keep: int = 0
) -> dict:
    """The stage on every shard with a fresh lake; records, figure rows and counters."""
    from pipelines.vlm.hf import TransformersEngine

    lake = prepare_lake(root, shards)
    with TransformersEngine(config, device="cpu", batch_size=batch_size) as engine:
        recorder = Recorder(engine, keep=keep)
        stage = MiningStage(recorder, settings)
        results, walls, spans = [], {}, {}
        for shard in shards:
            began, first = time.perf_counter(), len(recorder.records)
            results.append(stage.run(lake, Partition(RELEASE, shard)))
            walls[shard], spans[shard] = time.perf_counter() - began, (first, len(recorder.records))
    per_shard = {shard: lake.read_table(Table.MINING_FIGURES, RELEASE, shard).to_pylist() for shard in shards}
    figures = [row for shard in shards for row in per_shard[shard]]
    return {
        "lake": lake,
        "records": recorder.records,
        "kept": recorder.kept,
        "figures": figures,
        "results": results,
        "wall": sum(walls.values()),
        "walls": walls,
        "spans": spans,
        "mined": {shard: sum(1 for f in rows if f["status"] == "mined") for shard, rows in per_shard.items()},
    }


def replay(config: EngineConfig, requests: Sequence[VlmRequest], batch_sizes: Sequence[int], rounds: int) -> dict:
    """The same mining requests (in the stage's order: mixed prompts, images and grammars) sent
    through one engine per batch size, ``rounds`` times, the batch sizes alternating (1, 8, 1, 8,
    ...) so that other processes on the shared CPUs weigh on both alike. One untimed request first
    in each engine, so model loading and first-call set-up are left out."""
    from pipelines.vlm.hf import TransformersEngine

    engines = {b: TransformersEngine(config, device="cpu", batch_size=b) for b in batch_sizes}
    walls: dict[int, list[float]] = defaultdict(list)
    tokens: dict[int, tuple[int, int, int]] = {}
    try:
        for engine in engines.values():
            engine.generate(list(requests[:1]))
        for _ in range(rounds):
            for batch_size, engine in engines.items():
                began = time.perf_counter()
                responses = engine.generate(list(requests))
                walls[batch_size].append(time.perf_counter() - began)
                done = [r for r in responses if not r.error]
                tokens[batch_size] = (
                    len(requests) - len(done),
                    sum(r.prompt_tokens for r in done),
                    sum(r.completion_tokens for r in done),
                )
    finally:
        for engine in engines.values():
            engine.close()
    out = {}
    for batch_size in batch_sizes:
        errors, prompt_tokens, completion_tokens = tokens[batch_size]
        out[f"batch_{batch_size}"] = {
            "requests": len(requests),
            "errors": errors,
            "wall_seconds_per_round": [round(w, 2) for w in walls[batch_size]],
            "seconds_per_request": round(statistics.median(walls[batch_size]) / len(requests), 4),
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
        }
    out["requests_by_prompt"] = dict(sorted(Counter(prompts.name_of(r.prompt) for r in requests).items()))
    first, *rest = batch_sizes
    for batch_size in rest:
        out[f"batch_{batch_size}"][f"seconds_per_request_over_batch_{first}"] = round(
            out[f"batch_{batch_size}"]["seconds_per_request"] / out[f"batch_{first}"]["seconds_per_request"], 3
        )
    return out


def counters(run: dict) -> dict:
    """The stage's own counters summed over shards (per_prompt merged)."""
    totals: Counter = Counter()
    per_prompt: dict[str, Counter] = defaultdict(Counter)
    for result in run["results"]:
        for key in ("images", "vlm_requests", "prompt_tokens", "completion_tokens", "vlm_seconds", "prefilter_none"):
            totals[key] += result.counts[key]
        for name, values in json.loads(result.counts["per_prompt"]).items():
            per_prompt[name].update(values)
    out = {k: round(v, 3) if isinstance(v, float) else v for k, v in totals.items()}
    out["per_prompt"] = {
        name: {k: round(v, 3) if isinstance(v, float) else v for k, v in sorted(values.items())}
        for name, values in sorted(per_prompt.items())
    }
    return out


def work(run: dict) -> list[Record]:
    """The mining requests (the canary is sent once per run, not per figure)."""
    return [r for r in run["records"] if r.prompt != "canary"]


def per_figure(run: dict) -> dict:
    """Per figure (``mining_figures``): requests, tokens, seconds; and per figure and prompt
    (from the records) over the figures that sent that prompt."""
    mined = [f for f in run["figures"] if f["status"] == "mined"]
    out = {
        "figures": len(mined),
        "all_prompts": {
            key: summary([f[key] for f in mined], 4 if key == "seconds" else 2)
            for key in ("vlm_requests", "prompt_tokens", "completion_tokens", "seconds")
        },
        "per_prompt": {},
    }
    by: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    for r in work(run):
        c = by[r.prompt][r.figure]
        c["requests"] += 1
        c["prompt_tokens"] += r.prompt_tokens
        c["completion_tokens"] += r.completion_tokens
        c["seconds"] += r.seconds
    for name, figures in sorted(by.items()):
        entry = {"figures_sending": len(figures), "share_of_figures": round(len(figures) / max(1, len(mined)), 4)}
        for key in ("requests", "prompt_tokens", "completion_tokens", "seconds"):
            entry[key] = summary([c[key] for c in figures.values()], 4 if key == "seconds" else 2)
        out["per_prompt"][name] = entry
    return out


def per_request(run: dict) -> dict:
    by: dict[str, list[Record]] = defaultdict(list)
    for r in work(run):
        by[r.prompt].append(r)
    return {
        name: {
            "requests": len(rs),
            "prompt_tokens": summary([r.prompt_tokens for r in rs]),
            "completion_tokens": summary([r.completion_tokens for r in rs]),
            "seconds": summary([r.seconds for r in rs], 4),
            "images_per_request": round(sum(len(r.image_sizes) for r in rs) / len(rs), 3),
        }
        for name, rs in sorted(by.items())
    }


def throughput(run: dict) -> dict:
    rs = work(run)
    seconds = sum(r.seconds for r in rs)
    tokens = sum(r.prompt_tokens + r.completion_tokens for r in rs)
    return {
        "requests": len(rs),
        "vlm_seconds": round(seconds, 2),
        "stage_wall_seconds": round(run["wall"], 2),
        "requests_per_vlm_second": round(len(rs) / seconds, 3),
        "requests_per_wall_second": round(len(rs) / run["wall"], 3),
        "tokens_per_vlm_second": round(tokens / seconds, 1),
    }


# ---- pre-filter -----------------------------------------------------------------------------


def unfiltered_requests(lake: Lake, shards: Sequence[str], settings: MiningSettings) -> dict[str, int]:
    """Requests of the pre-filtered prompts with no pre-filter: SoM views for every figure image;
    one region request per panel (the figure itself when it has fewer than two) of every figure
    whose concept passes the gate and that has a caption."""
    from pipelines.mining.mine import figure_items

    som = regions = 0
    for shard in shards:
        for item in figure_items(lake, RELEASE, shard):
            som += settings.som_views
            if item["caption"] and gate(item["concept"], settings.region_concepts):
                panels = len(item["panels"])
                regions += min(panels, settings.max_region_panels) if panels >= 2 else 1
    return {"panels": som, "locate_region": regions}


def prefilter(run: dict, settings: MiningSettings, shards: Sequence[str]) -> dict:
    mined = [f for f in run["figures"] if f["status"] == "mined"]
    flags = Counter(f["prefilter"] for f in mined)
    rs = work(run)
    by: dict[str, list[Record]] = defaultdict(list)
    for r in rs:
        by[r.prompt].append(r)
    would = unfiltered_requests(run["lake"], shards, settings)

    def cost(records: list[Record]) -> dict:
        return {
            "requests": len(records),
            "prompt_tokens": sum(r.prompt_tokens for r in records),
            "completion_tokens": sum(r.completion_tokens for r in records),
            "seconds": sum(r.seconds for r in records),
        }

    measured = cost(rs)
    without = dict(measured)
    per_prompt = {}
    for name, n in would.items():
        sent = by.get(name, [])
        if not sent:
            continue
        unit = {k: v / len(sent) for k, v in cost(sent).items()}
        per_prompt[name] = {"sent": len(sent), "without_prefilter": n, "per_request": _round(unit, 4)}
        for key in without:
            without[key] += unit[key] * (n - len(sent))
    return {
        "note": "cost without the pre-filter is an ESTIMATE: measured mean per-request cost of each prompt x "
        "the requests it would have sent (SoM: som_views per figure image; regions: one locate_region per "
        "panel passing the concept gate, figures with a caption); describe_region and describe_panel unchanged",
        "figures": len(mined),
        "prefilter_values": dict(sorted(flags.items())),
        "share_skipping_som": round(sum(1 for f in mined if "som" not in f["prefilter"]) / len(mined), 4),
        "share_skipping_regions": round(sum(1 for f in mined if "regions" not in f["prefilter"]) / len(mined), 4),
        "share_skipping_both": round(flags["none"] / len(mined), 4),
        "per_prompt": per_prompt,
        "with_prefilter": _round(measured, 2),
        "without_prefilter_estimate": _round(without, 2),
        "ratio_without_over_with": {k: round(without[k] / measured[k], 3) for k in measured if measured[k]},
    }


def _round(d: dict, digits: int) -> dict:
    return {k: round(v, digits) if isinstance(v, float) else v for k, v in d.items()}


# ---- prefix caching -------------------------------------------------------------------------


def _chat(processor, system: str | None, n_images: int, text: str) -> str:
    """The engine's chat turn as text (``TransformersEngine._messages``: images before text)."""
    content = [{"type": "image"} for _ in range(n_images)] + [{"type": "text", "text": text}]
    messages = [{"role": "user", "content": content}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _common_prefix(rows: list[list[int]]) -> int:
    n = min(len(r) for r in rows)
    for i in range(n):
        if any(r[i] != rows[0][i] for r in rows):
            return i
    return n


def prefix_share(run: dict, processor, production: dict) -> dict:
    """Prompt tokens an engine with prefix caching would compute once, per prompt: a computation
    with the tiny tokenizer, not a measurement."""
    tok = processor.tokenizer
    image_pad = tok.convert_tokens_to_ids("<|image_pad|>")
    by: dict[str, list[Record]] = defaultdict(list)
    for r in work(run):
        by[r.prompt].append(r)
    out, totals = {}, Counter()
    for name, rs in sorted(by.items()):
        ids = [
            tok(_chat(processor, r.system, 1 if r.image_sizes else 0, r.text), add_special_tokens=False)["input_ids"]
            for r in rs
        ]
        strict = _common_prefix(ids)
        if image_pad in ids[0][:strict]:
            strict = ids[0].index(image_pad)
        template = prompts.PROMPTS[name]
        empty = template.template.format(**{f: "" for f in _fields(template.template)})
        fixed_ids = tok(_chat(processor, rs[0].system, len(rs[0].image_sizes), empty), add_special_tokens=False)
        fixed = sum(1 for t in fixed_ids["input_ids"] if t != image_pad)
        measured = sum(r.prompt_tokens for r in rs)
        prod = sum(production[id(r)] for r in rs)
        out[name] = {
            "requests": len(rs),
            "strict_prefix_tokens": strict,
            "fixed_text_tokens": fixed,
            "strict_share_measured_band": round(strict * len(rs) / measured, 4),
            "fixed_text_share_measured_band": round(fixed * len(rs) / measured, 4),
            "strict_share_production_band": round(strict * len(rs) / prod, 4),
            "fixed_text_share_production_band": round(fixed * len(rs) / prod, 4),
        }
        totals.update({"strict": strict * len(rs), "fixed": fixed * len(rs), "measured": measured, "production": prod})
    return {
        "note": "COMPUTED, not measured (the transformers backend has no prefix cache): tokens with the tiny "
        "model's tokenizer, image tokens excluded from the prefix. strict = longest token prefix shared by all "
        "requests of a prompt, up to the first image token: what vLLM enable_prefix_caching can reuse, since "
        "images precede the text in the turn (vLLM reuses whole KV blocks, e.g. 16 tokens, so slightly less). "
        "fixed_text = system turn + chat scaffolding + the template's literal text: an upper bound on prefill "
        "saved, reachable only if that text preceded the image and the variable fields",
        "per_prompt": out,
        "strict_share_measured_band": round(totals["strict"] / totals["measured"], 4),
        "fixed_text_share_measured_band": round(totals["fixed"] / totals["measured"], 4),
        "strict_share_production_band": round(totals["strict"] / totals["production"], 4),
        "fixed_text_share_production_band": round(totals["fixed"] / totals["production"], 4),
    }


def _fields(template: str) -> list[str]:
    import string

    return [f for _, f, _, _ in string.Formatter().parse(template) if f]


def text_density(run: dict, processor) -> dict:
    """Characters per token of the tiny tokenizer on the text of every mining request, per prompt."""
    by: dict[str, list[str]] = defaultdict(list)
    for r in work(run):
        by[r.prompt].append(r.text)
    systems = sorted({r.system for r in work(run) if r.system})
    every = [t for texts in by.values() for t in texts] + systems
    return {
        "note": "MEASURED on the prompts' text with the tiny model's byte-level BPE (vocabulary of a few hundred "
        "tokens, trained on our prompts' words): not Qwen's tokenizer (151k vocabulary), whose characters per "
        "token on this text are unknown here (no source found); text tokens in this file are the tiny "
        "tokenizer's and so likely overstate Qwen's",
        "all": chars_per_token(every, processor.tokenizer),
        "per_prompt": {name: chars_per_token(texts, processor.tokenizer) for name, texts in sorted(by.items())},
    }


# ---- projection -----------------------------------------------------------------------------


def projection(run: dict, production: dict, figures_total: int, prefill_tps: float, decode_tps: float) -> dict:
    mined = [f for f in run["figures"] if f["status"] == "mined"]
    n = len(mined)
    by: dict[str, list[Record]] = defaultdict(list)
    for r in work(run):
        by[r.prompt].append(r)
    per_prompt, prefill, decode_low, decode_high = {}, 0.0, 0.0, 0.0
    for name, rs in sorted(by.items()):
        images = [image_tokens(*model_frame(w, h, PRODUCTION)) for r in rs for w, h in r.image_sizes]
        text = [r.prompt_tokens - sum(image_tokens(w, h) for w, h in r.frames) for r in rs]
        prompt_tokens = statistics.fmean(production[id(r)] for r in rs)
        measured_out = statistics.fmean(r.completion_tokens for r in rs)
        budget = prompts.PROMPTS[name].max_tokens
        per_figure = len(rs) / n
        per_prompt[name] = {
            "requests_per_figure": round(per_figure, 4),
            "image_tokens_per_image_production": summary(images, 1),
            "text_tokens_per_request_tiny_tokenizer": summary(text, 1),
            "prompt_tokens_per_request_production": round(prompt_tokens, 1),
            "completion_tokens_per_request": {"tiny_measured_capped": round(measured_out, 1), "prompt_budget": budget},
        }
        prefill += per_figure * prompt_tokens
        decode_low += per_figure * measured_out
        decode_high += per_figure * budget

    return {
        "figures": figures_total,
        "measured_on_figures": n,
        "note": "requests per figure measured on the sample WITH the pre-filter; image tokens per image exact "
        "(smart_resize/model_frame at 256-1280 x 28^2 on the real size of every image sent: figure views, panel "
        "and region crops); text tokens from the tiny tokenizer, only an approximation of Qwen's; completion "
        "tokens unknown for a real model: bounded by the tiny model's (capped) answers and by each prompt's budget",
        "per_prompt": per_prompt,
        "prompt_tokens_per_figure_production": round(prefill, 1),
        "completion_tokens_per_figure": {
            "tiny_measured_capped": round(decode_low, 1),
            "prompt_budget": round(decode_high, 1),
        },
        "formula": FORMULA,
        "assumption": assumption(prefill_tps, decode_tps),
        "low_completion": h100_hours(prefill, decode_low, figures_total, prefill_tps, decode_tps),
        "budget_completion": h100_hours(prefill, decode_high, figures_total, prefill_tps, decode_tps),
        "panel2patch_reference": {
            "h100_hours": PANEL2PATCH_H100_HOURS,
            "model": "Qwen2.5-VL-72B",
            "note": "as reported for Panel2Patch; a 72B model costs roughly 10x a 7B per token",
        },
    }


# ---- where the time goes ----------------------------------------------------------------------


def shard_times(run: dict) -> dict:
    """Per shard: figure images mined, requests, stage wall seconds (where the time goes)."""
    out = {}
    for shard, (first, last) in run["spans"].items():
        records = [r for r in run["records"][first:last] if r.prompt != "canary"]
        out[shard] = {
            "figures": run["mined"][shard],
            "requests": len(records),
            "requests_by_prompt": dict(sorted(Counter(r.prompt for r in records).items())),
            "stage_wall_seconds": round(run["walls"][shard], 2),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", nargs="+", default=list(BASELINE_SHARDS), help="shards of the batch-1 baseline")
    parser.add_argument("--batch-size", type=int, default=8, help="batch size of the replay compared with batch 1")
    parser.add_argument("--replay", type=int, default=128, help="mining requests replayed at batch 1 and batch 8")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the replay (median kept)")
    parser.add_argument("--som-views", type=int, default=3)
    parser.add_argument("--figures-per-batch", type=int, default=8)
    parser.add_argument("--min-tokens", type=int, default=64, help="measured band: min visual tokens per image")
    parser.add_argument("--max-image-tokens", type=int, default=256, help="measured band: max visual tokens")
    parser.add_argument("--max-tokens", type=int, default=24, help="answer cap of the tiny model")
    parser.add_argument("--figures", type=int, default=24_000_000)
    parser.add_argument("--prefill-tps", type=float, default=PREFILL_TPS)
    parser.add_argument("--decode-tps", type=float, default=DECODE_TPS)
    args = parser.parse_args()
    import torch
    import transformers
    from transformers import AutoProcessor

    from pipelines.vlm.tiny import tiny_model_dir

    torch.set_num_threads(os.cpu_count() or 1)
    began, load_at_start = time.perf_counter(), [round(x, 2) for x in os.getloadavg()]
    settings = MiningSettings(som_views=args.som_views, figures_per_batch=args.figures_per_batch)
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_model_dir(Path(tmp) / "vlm")
        config = EngineConfig(
            model=str(model),
            synthetic=True,
            dtype="float32",
            min_pixels=args.min_tokens * PATCH * PATCH,
            max_pixels=args.max_image_tokens * PATCH * PATCH,
            sampling=Sampling(max_tokens=args.max_tokens),
        )
        run = run_mining(Path(tmp) / "baseline", model, config, 1, settings, args.shards, keep=args.replay)
        print("baseline", throughput(run), flush=True)
        batching = replay(config, run["kept"], [1, args.batch_size], args.rounds)
        print("replay", batching, flush=True)
        processor = AutoProcessor.from_pretrained(model)
        production = {id(r): production_prompt_tokens(r) for r in work(run)}
        result = {
            "benchmark": "Panel2Patch mining cost per figure and prompt, batching, pre-filter, prefix caching, "
            "projection to 24M figures",
            "note": NOTE,
            "model": "tiny random Qwen2.5-VL (pipelines.vlm.tiny, 0.4M parameters, seed 0)",
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "release": RELEASE,
            "shards": args.shards,
            "shards_left_out": [s for s in SHARDS if s not in args.shards],
            "shards_left_out_why": LEFT_OUT_NOTE,
            "timing_caveat": TIMING_CAVEAT,
            "load_average_1_5_15_at_start": load_at_start,
            "figures": sum(1 for f in run["figures"] if f["status"] == "mined"),
            "settings": settings.as_dict(),
            "measured_band_visual_tokens": [args.min_tokens, args.max_image_tokens],
            "production_band_visual_tokens": [PRODUCTION.min_pixels // PATCH**2, PRODUCTION.max_pixels // PATCH**2],
            "answer_cap_tokens": args.max_tokens,
            "baseline": {"batch_size": 1, "throughput": throughput(run), "counts": counters(run)},
            "per_shard": shard_times(run),
            "batching": {
                "note": f"the first {len(run['kept'])} mining requests of the baseline (stage order: mixed prompts, "
                f"images, grammars) replayed at batch 1 and at batch {args.batch_size}, {args.rounds} alternating "
                "rounds, median seconds; the earlier claim (demo profile note) was 6.6x slower at batch 8; "
                "CPU, 2 cores, tiny model: says nothing about batching on a GPU",
                **batching,
            },
            "per_figure": per_figure(run),
            "per_request": per_request(run),
            "prefilter": prefilter(run, settings, args.shards),
            "prefix_caching": prefix_share(run, processor, production),
            "text_chars_per_token": text_density(run, processor),
            "projection_24m": projection(run, production, args.figures, args.prefill_tps, args.decode_tps),
        }
    result["seconds_total"] = round(time.perf_counter() - began, 1)
    result["load_average_1_5_15_at_end"] = [round(x, 2) for x in os.getloadavg()]  # other processes share the CPUs
    write_results(RESULTS, result)
    MARKDOWN.write_text(markdown(result))
    print(json.dumps({k: v for k, v in result.items() if k not in ("per_request",)}, indent=2))


if __name__ == "__main__":
    main()
