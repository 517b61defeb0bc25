"""The frame check: proof, before a run, that a remote server resizes images with our pixel band.

Every grounded box is mapped back to original pixels with the model frame this engine computes
from ``EngineConfig.min_pixels``/``max_pixels`` (``grounding.model_frame``); a server resizes
with its own processor settings. A ``vllm serve`` started without ``--mm-processor-kwargs`` uses
the checkpoint's band (Qwen2.5-VL: 3,136 to 12,845,056 pixels, not our 200,704 to 1,003,520), so
every large figure is seen bigger than we assume and every box comes back scaled wrong, without
an error. The answer to "which band" is in the prompt token counts the server reports: an image
costs (height / factor) x (width / factor) visual tokens after the resize. Three probe images,
one below ``min_pixels``, one inside the band and one above ``max_pixels``, go out with the same
text; differences of their prompt tokens cancel the text and each image's fixed markers
(``<|vision_start|>``/``<|vision_end|>``), and must equal the differences of their visual tokens
under our band. Backend-independent: it only calls ``generate``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from PIL import Image

from pipelines.vlm.engine import EngineConfig, VlmRequest, VlmResponse
from pipelines.vlm.grounding import model_frame
from pipelines.vlm.prompt import Prompt

PROBE_PROMPT = "Reply with OK."
PROBE = Prompt("frame_probe", PROBE_PROMPT, None, max_tokens=1)  # no schema: the answer is not read
_GREY = (128, 128, 128)


@dataclass(frozen=True)
class Probe:
    """A square probe image and what it tests."""

    what: str
    side: int


@dataclass
class FrameResult:
    passed: bool
    reason: str
    measured: dict = field(default_factory=dict)  # probe side -> prompt tokens at the server


def probes(config: EngineConfig) -> list[Probe]:
    """Below ``min_pixels`` (half its side), inside the band (the geometric mean of the bounds)
    and above ``max_pixels`` (one and a half times its side); never smaller than one patch."""
    factor = config.patch_factor
    small = max(factor, math.isqrt(config.min_pixels) // 2)
    inside = max(factor, round(math.sqrt(math.sqrt(config.min_pixels * config.max_pixels))))
    large = math.ceil(math.sqrt(config.max_pixels) * 1.5)
    return [Probe("min_pixels", small), Probe("inside", inside), Probe("max_pixels", large)]


def visual_tokens(width: int, height: int, config: EngineConfig) -> int:
    """Visual tokens of a ``width`` x ``height`` image under ``config``'s band: one per factor x
    factor block of the resized image (patch_size² patches, merged spatial_merge_size² at a time)."""
    w, h = model_frame(width, height, config)
    return (w // config.patch_factor) * (h // config.patch_factor)


def band_flags(config: EngineConfig) -> str:
    kwargs = json.dumps({"min_pixels": config.min_pixels, "max_pixels": config.max_pixels})
    return f"--mm-processor-kwargs '{kwargs}'"


def check_frame(config: EngineConfig, generate: Callable[[Sequence[VlmRequest]], list[VlmResponse]]) -> FrameResult:
    """Send the probes through ``generate`` and judge the server's prompt tokens. Only
    :class:`VlmOutage` propagates (the server is down: retry later)."""
    sent = probes(config)
    requests = [PROBE.request(f"frame-probe-{p.side}", [Image.new("RGB", (p.side, p.side), _GREY)]) for p in sent]
    responses = generate(requests)
    for probe, response in zip(sent, responses, strict=True):
        if response.error is not None:
            return FrameResult(False, f"the server refused a {probe.side}x{probe.side} probe image: {response.error}")
    measured = {p.side: r.prompt_tokens for p, r in zip(sent, responses, strict=True)}
    if not all(measured.values()):
        return FrameResult(
            False, "the server reports no prompt token counts (usage.prompt_tokens), so its frame cannot be checked"
        )
    expected = {p.side: visual_tokens(p.side, p.side, config) for p in sent}
    wrong = []
    for a, b in zip(sent, sent[1:], strict=False):
        got, want = measured[b.side] - measured[a.side], expected[b.side] - expected[a.side]
        if got != want:
            bound = a.what if a.what != "inside" else b.what
            wrong.append(
                f"a {b.side}x{b.side} image costs {got:+d} prompt tokens against a {a.side}x{a.side} one, "
                f"where {bound}={getattr(config, bound)} gives {want:+d}"
            )
    if wrong:
        return FrameResult(False, "; ".join(wrong), measured)
    band = f"min_pixels={config.min_pixels}, max_pixels={config.max_pixels}"
    return FrameResult(True, f"the server resizes with {band}", measured)


def require_frame(
    config: EngineConfig, generate: Callable[[Sequence[VlmRequest]], list[VlmResponse]], where: str
) -> FrameResult:
    """The frame check at the start of a run: refuses to go on (a person must restart the server
    or change the band) when the server at ``where`` resizes otherwise."""
    from pipelines.core.stage import StageInputError

    result = check_frame(config, generate)
    if not result.passed:
        raise StageInputError(
            f"the VLM server {where} does not resize images with this engine's pixel band, so every box would "
            f"be scaled wrong: {result.reason}. Start the server with the same band (vLLM: `vllm serve ... "
            f"{band_flags(config)}`; SGLang: the same min_pixels/max_pixels for its image processor), or set "
            "the engine's min_pixels/max_pixels to the server's; a server that reports no token counts can "
            "skip the check with check_frame=False on the vlm resource (docs/vlm-backends.md)"
        )
    return result
