"""What a model stage's requests cost, shared by the mining and long-caption benchmarks: every
request recorded through the stage's own metering (``pipelines.vlm.metering``), its tokens in
the production pixel band, and the projection of tokens to H100-hours at assumed throughputs."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from pipelines.vlm.engine import EngineConfig, VlmEngine, VlmRequest, VlmResponse
from pipelines.vlm.grounding import model_frame
from pipelines.vlm.metering import MeteredEngine

PREFILL_TPS, DECODE_TPS = 20_000, 2_000  # ASSUMED H100 throughputs (see ``assumption``)


PATCH = 28  # Qwen2.5-VL: 14 px patches merged 2x2 into one visual token


PRODUCTION = EngineConfig()  # Qwen2.5-VL's processor band: 256 to 1280 visual tokens per image


def image_tokens(width: int, height: int) -> int:
    """Tokens of one image in the model's frame: one per 28x28 block, plus vision start/end."""
    return (width // PATCH) * (height // PATCH) + 2


@dataclass
class Record:
    """One request as the engine saw it, with what the projection and prefix analysis need."""

    figure: str
    prompt: str
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    image_sizes: list[tuple[int, int]]  # original pixels of every image sent
    frames: list[tuple[int, int]]  # the same in the model's frame at the measured band
    text: str
    system: str | None


class Recorder(MeteredEngine):
    """The stage's own metering (``pipelines.vlm.metering``), keeping one ``Record`` per request
    too (the stage's counters are per figure and per prompt totals; percentiles per request
    need each one). The first ``keep`` mining requests are kept whole, to be replayed at another
    batch size."""

    def __init__(self, engine: VlmEngine, keep: int = 0):
        super().__init__(engine)
        self.records: list[Record] = []
        self.keep, self.kept = keep, []

    def record(self, request: VlmRequest, response: VlmResponse) -> None:
        super().record(request, response)
        if len(self.kept) < self.keep and request.prompt_name != "canary":
            self.kept.append(request)
        self.records.append(
            Record(
                figure=request.id.split("|", 1)[0] if "|" in request.id else "?",
                prompt=request.prompt_name or "other",
                prompt_tokens=response.prompt_tokens,
                completion_tokens=response.completion_tokens,
                seconds=response.seconds,
                image_sizes=[image.size for image in request.images],
                frames=list(response.image_sizes),
                text=request.prompt,
                system=request.system,
            )
        )


def summary(values: Sequence[float], digits: int = 2) -> dict:
    """mean, p50, p90 (nearest-rank free: statistics.quantiles' inclusive method), n."""
    if not values:
        return {"n": 0}
    values = sorted(values)
    deciles = statistics.quantiles(values, n=10, method="inclusive") if len(values) > 1 else [values[0]] * 9
    return {
        "n": len(values),
        "mean": round(statistics.fmean(values), digits),
        "p50": round(statistics.median(values), digits),
        "p90": round(deciles[8], digits),
    }


def chars_per_token(texts: Sequence[str], tokenizer) -> dict:
    """Characters per text token of ``tokenizer`` over ``texts`` (no chat scaffolding, no image
    tokens). The tiny model's BPE has a few hundred tokens, so it splits text much finer than
    Qwen's 151k vocabulary: its text-token counts overstate a real model's by roughly the ratio
    of the two figures, and Qwen's is not measured here."""
    chars = sum(len(t) for t in texts)
    tokens = sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    return {
        "texts": len(texts),
        "characters": chars,
        "tokens": tokens,
        "chars_per_token": round(chars / max(1, tokens), 3),
    }


def production_prompt_tokens(record: Record) -> int:
    """The request's prompt tokens at the production band: text tokens as measured (prompt tokens
    less the image tokens at the measured band) plus every image's tokens in the production frame."""
    measured_images = sum(image_tokens(w, h) for w, h in record.frames)
    production_images = sum(image_tokens(*model_frame(w, h, PRODUCTION)) for w, h in record.image_sizes)
    return record.prompt_tokens - measured_images + production_images


def h100_hours(
    prompt_tokens_per_figure: float,
    completion_tokens_per_figure: float,
    figures: int,
    prefill_tps: float,
    decode_tps: float,
) -> dict:
    """Prefill and decode tokens over ``figures`` and the H100-hours they take at the assumed
    throughputs (shared with benchmarks/longcap.py, so both stages are projected alike)."""
    total_in, total_out = prompt_tokens_per_figure * figures, completion_tokens_per_figure * figures
    return {
        "prefill_tokens": round(total_in),
        "decode_tokens": round(total_out),
        "h100_hours": round(total_in / prefill_tps / 3600 + total_out / decode_tps / 3600),
    }


FORMULA = (
    "h100_hours = figures x (prompt_tokens_per_figure / prefill_tps + completion_tokens_per_figure / decode_tps) / 3600"
)


def assumption(prefill_tps: float, decode_tps: float) -> dict:
    return {
        "prefill_tps": prefill_tps,
        "decode_tps": decode_tps,
        "what": "ASSUMED aggregate throughput of Qwen2.5-VL-7B (bf16) with vLLM on one H100, batched, not "
        "measured (no GPU here) and not sourced: public reports found (e.g. QwenLM/Qwen3-VL#1378, vllm#21873) "
        "are usage questions, not saturated H100 figures. prefill 20k tok/s ~ 40% of H100 bf16 dense peak "
        "(989 TFLOP/s) at ~2 x 7.6B FLOP per token plus the ViT; decode 2k tok/s aggregate at large batch. "
        "Scale linearly: hours are inversely proportional to both",
    }
