"""Panel2Patch mining as plain functions: what one partition's figures are (:func:`figure_items`),
what a result depends on (:func:`inputs_fingerprint`), and what the model makes of a batch of
decoded figures (:func:`mine`): the global pair, the panels (reconciled with Set-of-Mark
proposals), each panel's text, the panel pairs with descriptions, and mark-guided regions.

The stage (``pipelines/mining/stages.py``) runs these in the model-stage loop; tests and
benchmarks call them directly.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field

from PIL import Image

from pipelines.core.figures import image_refs
from pipelines.core.fingerprints import fingerprint
from pipelines.core.lake import Lake
from pipelines.core.schemas import TABLES, Table
from pipelines.images.boxes import Box, Panel, iou
from pipelines.mining.markers import detect_markers
from pipelines.mining.phrases import MarkerPhrase, find_marker_phrases
from pipelines.mining.regions import TAU_DEFAULT, fuse_regions
from pipelines.mining.som import IMAGE, panel_views, propose_panels, reconcile
from pipelines.mining.text import gate, panel_texts
from pipelines.text.captions import caption_of, normalize_caption, split_caption
from pipelines.text.pairing import NONE
from pipelines.vlm import prompts
from pipelines.vlm.engine import VlmRequest
from pipelines.vlm.grounding import parse_boxes, parse_json
from pipelines.vlm.metering import Meter, MeteredEngine

GLOBAL, PANEL, REGION = "global", "panel", "region"
LEVELS = (GLOBAL, PANEL, REGION)


@dataclass(frozen=True)
class MiningSettings:
    """``som_views``: Set-of-Mark proposals per figure (the full image plus random rescaled
    crops; 0 turns SoM off). ``region_concepts``: the global concepts whose panels get region
    mining; None keeps the paper's gate (no region mining on charts, tables, diagrams, graphs
    and formulae: see ``text.gate``). ``tau``: the fusion distance (normalised by the panel
    diagonal) within which a model box must lie of a marker.
    ``figures_per_batch`` bounds memory: decoded images of one batch at a time."""

    som_views: int = 3
    describe_panels: bool = True
    describe_regions: bool = True
    regions: bool = True
    region_concepts: tuple[str, ...] | None = None
    tau: float = TAU_DEFAULT
    max_region_panels: int = 8
    figures_per_batch: int = 16
    seed: int = 0
    require_canary: bool = True

    def as_dict(self) -> dict:
        return asdict(self)


_EMPTY_PAIR = dict.fromkeys(TABLES[Table.PAIRS].names)


def _key(item: dict) -> str:
    return f"{item['pmcid']}/{item['image_file']}"


def figure_items(lake: Lake, release: str, shard: str) -> list[dict]:
    """One item per figure image with what mining needs: raw location, caption, concept label,
    panels (original pixels) and the caption split by panel."""
    figures = lake.require(Table.FIGURES, release, shard).to_pylist()
    panels = lake.require(Table.PANELS, release, shard)
    panel_captions = lake.require(Table.PANEL_CAPTIONS, release, shard)
    concepts = lake.read_table(Table.FIGURE_CONCEPTS, release, shard)
    concept = {(c["pmcid"], c["image_file"]): c["global_concept"] for c in (concepts.to_pylist() if concepts else [])}
    by_image: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in panels.to_pylist():
        by_image[(row["pmcid"], row["image_file"])].append(row)
    texts: dict[tuple[str, str], dict[int, dict]] = defaultdict(dict)
    for row in panel_captions.to_pylist():
        texts[(row["pmcid"], row["image_file"])][row["panel_index"]] = row
    captions = {(f["pmcid"], f["fig_id"]): caption_of(f) for f in figures}
    items = []
    for ref in image_refs(lake, release, shard, figures):
        key = (ref["pmcid"], ref["image_file"])
        image_panels = sorted(by_image.get(key, []), key=lambda p: p["panel_index"])
        items.append(
            {
                **ref,
                "caption": normalize_caption(captions[(ref["pmcid"], ref["fig_id"])]),
                "concept": concept.get(key),
                "panels": image_panels,
                "panel_captions": texts.get(key, {}),
            }
        )
    return items


def inputs_fingerprint(item: dict, settings: str) -> str:
    """What a figure's mined pairs depend on: its image, caption, panels and their texts, and the
    stage's settings fingerprint (engine, prompts, settings, version)."""
    return fingerprint(
        {
            "sha256": item["sha256"],
            "caption": item["caption"],
            "panels": [(p["x1"], p["y1"], p["x2"], p["y2"], p["label"]) for p in item["panels"]],
            "texts": sorted((i, r["text"], r["label"]) for i, r in item["panel_captions"].items()),
            "settings": settings,
        }
    )


def _offset(box: Box, dx: int, dy: int) -> Box:
    return (box[0] + dx, box[1] + dy, box[2] + dx, box[3] + dy)


def _extractive(text: str | None, caption: str) -> bool:
    return bool(text) and normalize_caption(text) in caption


@dataclass
class MinedFigure:
    """One figure image while it is being mined."""

    item: dict
    image: Image.Image
    pairs: list[dict] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    parse_failures: int = 0
    prefilter: set[str] = field(default_factory=set)
    disagreement: dict | None = None
    panels: list[tuple[Panel, str]] = field(default_factory=list)  # (panel, source)
    label_sources: list[str | None] = field(default_factory=list)  # per panel: who read its label
    texts: dict[int, dict] = field(default_factory=dict)  # panel index -> text, source, extractive, match

    @property
    def key(self) -> str:
        return _key(self.item)


def figure_row(item: dict, fp: str, status: str, reasons: list[str], meter: Meter | None, figure) -> dict:
    """The figure's ``mining_figures`` row: what ran, what it cost, what went wrong."""
    levels = Counter(p["level"] for p in (figure.pairs if figure else []))
    costs = meter.of(_key(item)) if meter else dict.fromkeys(("vlm_requests", "prompt_tokens", "completion_tokens"), 0)
    return {
        "pmcid": item["pmcid"],
        "fig_id": item["fig_id"],
        "image_file": item["image_file"],
        "sha256": item["sha256"],
        "status": status,
        "reasons": list(reasons),
        "prefilter": "+".join(sorted(figure.prefilter)) if figure and figure.prefilter else "none",
        "n_panels": levels[PANEL],
        "n_regions": levels[REGION],
        "vlm_requests": costs["vlm_requests"],
        "parse_failures": figure.parse_failures if figure else 0,
        "prompt_tokens": costs["prompt_tokens"],
        "completion_tokens": costs["completion_tokens"],
        "seconds": costs.get("seconds", 0),
        "disagreement": json.dumps(figure.disagreement) if figure and figure.disagreement else None,
        "fingerprint": fp if status != "error" else None,
    }


def mine(figures: list[MinedFigure], engine: MeteredEngine, settings: MiningSettings) -> None:
    """Mine a batch of decoded figures: each figure's pairs, reasons and costs are filled in."""
    for figure in figures:
        figure.pairs.append(_global_pair(figure))
        _panels(figure, engine, settings)
        _texts(figure, engine)
    _panel_pairs(figures, engine, settings)
    if settings.regions:
        _regions(figures, engine, settings)


def _pair(figure: MinedFigure, level: str, box: Box, **fields) -> dict:
    item = figure.item
    panel_index, region_index = fields.get("panel_index"), fields.get("region_index")
    pair_id = _key(item)
    if panel_index is not None:
        pair_id += f"/p{panel_index:03d}"
    if region_index is not None:
        pair_id += f"/r{region_index:02d}"
    return {
        **_EMPTY_PAIR,
        "pair_id": pair_id,
        "pmcid": item["pmcid"],
        "fig_id": item["fig_id"],
        "image_file": item["image_file"],
        "level": level,
        "x1": box[0],
        "y1": box[1],
        "x2": box[2],
        "y2": box[3],
        **fields,
    }


def _global_pair(figure: MinedFigure) -> dict:
    caption = figure.item["caption"]
    return _pair(
        figure,
        GLOBAL,
        (0, 0, figure.image.width, figure.image.height),
        text=caption or None,
        text_source="caption" if caption else "none",
        extractive=bool(caption),
    )


# ---- panels -------------------------------------------------------------------------------


def _panels(figure: MinedFigure, engine: MeteredEngine, settings: MiningSettings) -> None:
    """The panels table's panels, reconciled with the model's Set-of-Mark proposals when the
    figure carries panel identifiers (in its caption or printed on its panels)."""
    item = figure.item
    table = [
        Panel(box=(p["x1"], p["y1"], p["x2"], p["y2"]), score=p["score"] or 1.0, label=p["label"])
        for p in item["panels"]
    ]
    sources = [p["method"] for p in item["panels"]]
    labelled = len(item["panel_captions"]) >= 2 and any(r["label"] for r in item["panel_captions"].values())
    printed = sum(1 for p in table if p.label) >= 2
    if settings.som_views > 0 and (labelled or printed or len(table) >= 2):
        figure.prefilter.add("som")
        views = panel_views(figure.image, settings.som_views, settings.seed)
        engine.meter.owner = figure.key
        try:
            proposals = propose_panels(engine, figure.image, views, key=f"{figure.key}|panels")
        finally:
            engine.meter.owner = None
        figure.parse_failures += len(proposals.failures)
        figure.reasons.extend(f"panels: {r}" for r in proposals.failures)
        merged = reconcile(proposals.panels, table, size=figure.image.size, split_share=proposals.split_share)
        figure.disagreement = {
            "decision": merged.decision,
            "agreement": round(merged.agreement, 4),
            "mean_iou": None if merged.mean_iou is None else round(merged.mean_iou, 4),
            "vlm_panels": len(proposals.panels),
            "vlm_only": len(merged.vlm_only),
            "detector_only": len(merged.detector_only),
            "label_conflicts": [list(c[2:]) for c in merged.label_conflicts],
        }
        figure.panels = [
            (r.panel, sources[r.detector_index] if r.detector_index is not None else r.source) for r in merged.panels
        ]
        figure.label_sources = [r.label_source for r in merged.panels]
    else:
        figure.panels = list(zip(table, sources, strict=True))
        figure.label_sources = [IMAGE if p.label else None for p in table]


def _texts(figure: MinedFigure, engine: MeteredEngine) -> None:
    """Each panel's text: the caption split first, the model only for what it left."""
    item = figure.item
    if len(figure.panels) < 2:
        return
    split = split_caption(item["caption"])
    engine.meter.owner = figure.key
    try:
        texts = panel_texts([panel for panel, _ in figure.panels], item["caption"], split, engine, figure.key)
    finally:
        engine.meter.owner = None
    for t in texts:
        if t.reason:
            figure.reasons.append(f"text panel {t.panel_index}: {t.reason}")
        figure.texts[t.panel_index] = {
            "text": t.text,
            "source": t.source,
            "extractive": t.extractive,
            "match": t.match,
            "count_agreement": t.count_agreement,
        }


def _panel_pairs(figures: list[MinedFigure], engine: MeteredEngine, settings: MiningSettings) -> None:
    requests, owners = [], []
    for figure in figures:
        if len(figure.panels) < 2:
            continue  # a single panel is the figure itself: its pair is the global one
        for index, (panel, source) in enumerate(figure.panels):
            text = figure.texts.get(index, {})
            pair = _pair(
                figure,
                PANEL,
                panel.box,
                panel_index=index,
                label=panel.label,
                label_source=figure.label_sources[index] if index < len(figure.label_sources) else None,
                text=text.get("text"),
                text_source=text.get("source") or "none",
                text_match=text.get("match") or NONE,
                count_agreement=text.get("count_agreement"),
                extractive=text.get("extractive"),
                score=panel.score,
                panel_source=source,
            )
            figure.pairs.append(pair)
            if settings.describe_panels:
                requests.append(
                    prompts.DESCRIBE_PANEL.request(
                        f"{figure.key}|describe_panel|{index}",
                        [figure.image.crop(panel.box)],
                        text=text.get("text") or figure.item["caption"] or "",
                    )
                )
                owners.append((figure, pair))
    _describe(requests, owners, engine, "panel description")


def _describe(requests: list[VlmRequest], owners: list, engine: MeteredEngine, what: str) -> None:
    if not requests:
        return
    for response, (figure, pair) in zip(engine.generate(requests), owners, strict=True):
        if response.error:
            figure.reasons.append(f"{what} {pair['pair_id']}: {response.error}")
            continue
        parsed = parse_json(response.text or "")
        value = parsed.value if isinstance(parsed.value, dict) else None
        description = value.get("description") if value else None
        if not isinstance(description, str) or not description.strip():
            figure.parse_failures += 1
            figure.reasons.append(f"{what} {pair['pair_id']}: {parsed.error or 'no description in answer'}")
            continue
        pair["description"] = description.strip()


# ---- regions ------------------------------------------------------------------------------


def _region_targets(figure: MinedFigure, settings: MiningSettings) -> list[tuple[int, Panel, list[MarkerPhrase]]]:
    """(panel index, panel, the marker phrases about it) for the panels worth a region prompt."""
    if not gate(figure.item["concept"], settings.region_concepts):
        return []
    caption = figure.item["caption"]
    if not caption:
        return []
    targets = []
    if len(figure.panels) < 2:
        phrases = find_marker_phrases(caption)
        if phrases and figure.panels:
            targets.append((0, figure.panels[0][0], phrases))
        return targets
    preface = find_marker_phrases(split_caption(caption).preface)
    for index, (panel, _) in enumerate(figure.panels[: settings.max_region_panels]):
        own = find_marker_phrases(figure.texts.get(index, {}).get("text") or "")
        if own or preface:
            targets.append((index, panel, own or preface))
    return targets


def _regions(figures: list[MinedFigure], engine: MeteredEngine, settings: MiningSettings) -> None:
    """Mark-guided regions: the model boxes what each marker phrase refers to, markers are
    found in the crop, and a model box survives only near a marker (dual-path fusion)."""
    requests, jobs = [], []
    for figure in figures:
        for index, panel, phrases in _region_targets(figure, settings):
            figure.prefilter.add("regions")
            crop = figure.image.crop(panel.box)
            for n, phrase in enumerate(phrases):
                requests.append(
                    prompts.LOCATE_REGION.request(
                        f"{figure.key}|locate_region|{index}.{n}", [crop], phrase=phrase.clause, marker=phrase.marker
                    )
                )
                jobs.append((figure, index, panel, crop, phrase))
    if not requests:
        return
    boxes: dict[tuple[int, int], list] = defaultdict(list)
    phrases_of: dict[tuple[int, int], list[MarkerPhrase]] = defaultdict(list)
    context: dict[tuple[int, int], tuple[MinedFigure, Panel, Image.Image]] = {}
    for response, (figure, index, panel, crop, phrase) in zip(engine.generate(requests), jobs, strict=True):
        slot = (id(figure), index)
        context[slot] = (figure, panel, crop)
        phrases_of[slot].append(phrase)
        if response.error:
            figure.reasons.append(f"region panel {index}: {response.error}")
            continue
        found, reason = parse_boxes(
            response.text or "", engine.config.family, crop.size, response.image_sizes[0], list_key="regions"
        )
        if reason:
            figure.reasons.append(f"region panel {index}: {reason}")
            if not found:
                figure.parse_failures += 1
        boxes[slot].extend((b, phrase, response.image_sizes[0]) for b in found)
    describe, owners = [], []
    for slot, (figure, panel, crop) in context.items():
        markers = detect_markers(crop)
        found = boxes.get(slot, [])
        regions = fuse_regions([b.box for b, _, _ in found], markers, crop.size, tau=settings.tau)
        index = slot[1]
        for n, region in enumerate(regions):
            phrase, frame_box, frame = _phrase_for(region, found, phrases_of[slot])
            box = _offset(region.box, panel.box[0], panel.box[1])
            pair = _pair(
                figure,
                REGION,
                box,
                panel_index=index,
                region_index=n,
                text=phrase.clause if phrase else None,
                text_source="caption" if phrase else "none",
                extractive=_extractive(phrase.clause, figure.item["caption"]) if phrase else None,
                marker=region.marker,
                region_source=region.source,
                score=region.score,
                distance=region.distance,
                frame_box=list(frame_box) if frame_box else None,
                frame_width=frame[0] if frame else None,
                frame_height=frame[1] if frame else None,
            )
            figure.pairs.append(pair)
            if settings.describe_regions:
                describe.append(
                    prompts.DESCRIBE_REGION.request(
                        f"{figure.key}|describe_region|{index}.{n}", [crop.crop(region.box)]
                    )
                )
                owners.append((figure, pair))
    _describe(describe, owners, engine, "region description")


def _phrase_for(region, found: list, phrases: list[MarkerPhrase]):
    """The phrase (and model box) a fused region came from: the model box it kept, else the
    first phrase naming the region's marker kind, else the first phrase."""
    best = max(found, key=lambda f: iou(f[0].box, region.box), default=None)
    if best is not None and iou(best[0].box, region.box) > 0:
        return best[1], best[0].frame_box, best[2]
    same = [p for p in phrases if p.marker == region.marker]
    return (same or phrases or [None])[0], None, None
