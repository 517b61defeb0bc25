"""The Markdown page of the mining-cost benchmark (``benchmarks/results/mining.md``), from its JSON."""

from __future__ import annotations


def markdown(result: dict) -> str:
    base, bt = result["baseline"]["throughput"], result["batching"]
    b1, bn = bt["batch_1"], next(v for k, v in bt.items() if k.startswith("batch_") and k != "batch_1")
    mix = ", ".join(f"{n} {k}" for k, n in bt["requests_by_prompt"].items())
    per_round = ", ".join(
        f"{w8 / w1:.2f}" for w1, w8 in zip(b1["wall_seconds_per_round"], bn["wall_seconds_per_round"], strict=True)
    )
    ratio = next(v for k, v in bn.items() if k.startswith("seconds_per_request_over"))
    fig = result["per_figure"]["all_prompts"]
    pf, px, pj = result["prefilter"], result["prefix_caching"], result["projection_24m"]
    cpt = result["text_chars_per_token"]["all"]["chars_per_token"]
    shards = ", ".join(
        f"{s}: {v['figures']} figures, {v['requests']} requests, {v['stage_wall_seconds']:.0f} s"
        for s, v in result["per_shard"].items()
    )
    rows = [
        f"Timing caveat: {result['timing_caveat']}; load average (1, 5, 15 min) at start "
        f"{result['load_average_1_5_15_at_start']}, at end {result['load_average_1_5_15_at_end']}.",
        "",
        "**Mining** ([benchmarks/results/mining.json](benchmarks/results/mining.json)): the Panel2Patch stage on the "
        f"sample release, shards {', '.join(result['shards'])} ({result['figures']} figure images"
        + (f"; shard(s) {', '.join(result['shards_left_out'])} left out" if result["shards_left_out"] else "")
        + ") with the **synthetic tiny random model on the CPU** (seconds are not GPU seconds):",
        "",
        "| | value |",
        "|---|---|",
        f"| requests / prompt tokens / completion tokens per figure (mean, p50, p90), measured | "
        f"{fig['vlm_requests']['mean']}, {fig['vlm_requests']['p50']}, {fig['vlm_requests']['p90']} / "
        f"{fig['prompt_tokens']['mean']:.0f}, {fig['prompt_tokens']['p50']:.0f}, {fig['prompt_tokens']['p90']:.0f} / "
        f"{fig['completion_tokens']['mean']:.0f}, {fig['completion_tokens']['p50']:.0f}, "
        f"{fig['completion_tokens']['p90']:.0f} |",
        f"| baseline (engine batch 1), measured | {base['requests']} requests, {base['requests_per_vlm_second']} "
        f"requests/s; per shard: {shards} |",
        f"| seconds per request, the same {bn['requests']} requests ({mix}) at batch 8 vs 1, median of "
        f"{len(b1['wall_seconds_per_round'])} alternating rounds, measured | {bn['seconds_per_request']} vs "
        f"{b1['seconds_per_request']} (**{ratio}x** per request; the demo profile's note says 6.6x) |",
        f"| figures that skip SoM / regions / both, measured | {pf['share_skipping_som']:.0%} / "
        f"{pf['share_skipping_regions']:.0%} / {pf['share_skipping_both']:.0%} |",
        f"| requests, prompt tokens without / with the pre-filter (estimate) | "
        f"{pf['ratio_without_over_with']['requests']}x, {pf['ratio_without_over_with']['prompt_tokens']}x |",
        f"| prompt tokens a prefix cache can reuse, strict / fixed-text upper bound (computed) | "
        f"{px['strict_share_production_band']:.1%} / {px['fixed_text_share_production_band']:.1%} |",
        f"| characters per text token, tiny tokenizer (measured; Qwen's: unknown) | {cpt} |",
        f"| 24M figures, Qwen2.5-VL-7B, assumed {pj['assumption']['prefill_tps']:,.0f} / "
        f"{pj['assumption']['decode_tps']:,.0f} tok/s prefill/decode | "
        f"{pj['low_completion']['h100_hours']:,}-{pj['budget_completion']['h100_hours']:,} H100-hours "
        f"(Panel2Patch, 72B: ~{pj['panel2patch_reference']['h100_hours']:,}) |",
        "",
        "Measured: requests, tokens and CPU seconds per figure and per prompt, per shard, and the batch-8/batch-1 "
        f"replay (the same requests through one engine per batch size, rounds alternating; batch 8 / batch 1 per "
        f"round: {per_round}; on 2 CPU cores with a 0.4M-parameter model it says nothing about a GPU). Tokens per "
        "figure are at the reduced pixel band of the run (64-256 visual tokens per image); the projection "
        "recomputes image tokens exactly at the production band "
        f"(256-1280): {pj['prompt_tokens_per_figure_production']:,.0f} prompt tokens per figure.",
        "Estimated: the cost without the pre-filter (measured mean cost per request of each prompt times the "
        "requests that would have been sent). Computed, not measured: prefix-cache shares, with the tiny "
        "tokenizer (images come before the text in the turn, so only the system turn is a true shared prefix).",
        "Assumed: H100 throughputs (no GPU here); completion lengths are bounded between the tiny model's capped "
        "answers and each prompt's budget; text tokens are the tiny tokenizer's, whose vocabulary of a few hundred "
        f"tokens gives {cpt} characters per token, so text-token counts likely overstate Qwen's (Qwen's own "
        "ratio on this text is not measured and no source was found for it).",
    ]
    return "\n".join(rows) + "\n"
