"""The mining stage: every figure image of a (release, shard) turned into image–text pairs at
three levels — global (the figure, its caption), panel (a panel, its part of the caption) and
region (a marked area, the clause about it) — by reading the figure's own instructional design
with a vision-language model (Panel2Patch).

Cost is what decides the design. The paper spent ~2,900 H100-hours with a 72B model; most of
that is spent on prompts that cannot help. So every costly prompt sits behind a cheap
pre-filter: Set-of-Mark panel proposals only for figures whose caption or panels carry panel
identifiers, region prompts only for panels whose text names a marker ("arrows indicate…")
and whose concept label is photographic, the VLM text association only for panels the caption
split could not serve. Requests of a batch of figures go to the engine together (the engine
batches them; a shared system prompt is computed once by an engine with prefix caching).

What the model says is never trusted as is: boxes are parsed per model family and clipped to
their parent, texts said to come from the caption must occur in it, unparseable answers become
a recorded reason for that figure. Results are reused for an image whose inputs and settings
(engine, prompts, caption, panels) are unchanged, so a new prompt or model mines again only
what it affects, and a rerun redoes nothing.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field

from PIL import Image

from pipelines.acquire.rawstore import RawReader
from pipelines.concepts.decode import decode_image
from pipelines.concepts.shard import image_refs
from pipelines.lake import Lake
from pipelines.mining import prompts
from pipelines.mining.markers import detect_markers
from pipelines.mining.phrases import MarkerPhrase, find_marker_phrases
from pipelines.mining.regions import TAU_DEFAULT, fuse_regions
from pipelines.mining.som import IMAGE, panel_views, propose_panels, reconcile
from pipelines.mining.text import gate, panel_texts
from pipelines.panels.captions import normalize_caption, split_caption
from pipelines.panels.pairing import MATCHES, NONE
from pipelines.panels.types import Box, Panel
from pipelines.release.samples import caption_of
from pipelines.schemas import TABLES, Table
from pipelines.stage import (
    Check,
    Compute,
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
from pipelines.vlm.engine import (
    VlmEngine,
    VlmRequest,
    VlmResponse,
    engine_fingerprint,
    fingerprint,
    provenance,
)
from pipelines.vlm.grounding import parse_boxes, parse_json

GPU_POOL = "gpu"
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


@dataclass
class _Meter:
    """Tokens, seconds and parse failures per figure, whoever sent the request."""

    owner: str | None = None
    requests: Counter = field(default_factory=Counter)
    prompt_tokens: Counter = field(default_factory=Counter)
    completion_tokens: Counter = field(default_factory=Counter)
    seconds: Counter = field(default_factory=Counter)
    by_prompt: dict = field(default_factory=lambda: defaultdict(Counter))


class MeteredEngine(VlmEngine):
    """Wraps an engine to attribute every request's cost to its figure: requests sent inside
    ``for_figure`` belong to that figure; batched requests carry ``<figure key>|...`` ids."""

    def __init__(self, engine: VlmEngine):
        self.engine, self.config, self.backend = engine, engine.config, engine.backend
        self.meter = _Meter()

    def backend_version(self) -> str:
        return self.engine.backend_version()

    def info(self) -> dict:
        return self.engine.info()

    def generate(self, requests: Sequence[VlmRequest]) -> list[VlmResponse]:
        responses = self.engine.generate(requests)
        for request, response in zip(requests, responses, strict=True):
            self._count(request, response)
        return responses

    def stream(self, requests: Sequence[VlmRequest]) -> Iterator[tuple[int, VlmResponse]]:
        for index, response in self.engine.stream(requests):
            self._count(requests[index], response)
            yield index, response

    def _count(self, request: VlmRequest, response: VlmResponse) -> None:
        m = self.meter
        owner = m.owner or request.id.split("|", 1)[0]
        kind = prompts.name_of(request.prompt)
        m.requests[owner] += 1
        m.prompt_tokens[owner] += response.prompt_tokens
        m.completion_tokens[owner] += response.completion_tokens
        m.seconds[owner] += response.seconds
        for name, value in (
            ("requests", 1),
            ("prompt_tokens", response.prompt_tokens),
            ("completion_tokens", response.completion_tokens),
            ("seconds", response.seconds),
        ):
            m.by_prompt[kind][name] += value


_EMPTY_PAIR = dict.fromkeys(TABLES[Table.PAIRS].names)


def _key(item: dict) -> str:
    return f"{item['pmcid']}/{item['image_file']}"


def _items(lake: Lake, release: str, shard: str) -> list[dict]:
    """One item per figure image with what mining needs: raw location, caption, concept label,
    panels (original pixels) and the caption split by panel."""
    figures = lake.read_table(Table.FIGURES, release, shard)
    panels = lake.read_table(Table.PANELS, release, shard)
    panel_captions = lake.read_table(Table.PANEL_CAPTIONS, release, shard)
    if figures is None or panels is None or panel_captions is None:
        raise StageInputError(
            f"release {release} shard {shard} has no panels yet: materialize `panels` for this partition first"
        )
    figures = figures.to_pylist()
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


def _inputs_fingerprint(item: dict, settings: str) -> str:
    return fingerprint(
        {
            "sha256": item["sha256"],
            "caption": item["caption"],
            "panels": [(p["x1"], p["y1"], p["x2"], p["y2"], p["label"]) for p in item["panels"]],
            "texts": sorted((i, r["text"], r["label"]) for i, r in item["panel_captions"].items()),
            "settings": settings,
        }
    )


def _inside(box: Box, parent: Box) -> bool:
    return parent[0] <= box[0] < box[2] <= parent[2] and parent[1] <= box[1] < box[3] <= parent[3]


def _offset(box: Box, dx: int, dy: int) -> Box:
    return (box[0] + dx, box[1] + dy, box[2] + dx, box[3] + dy)


def _extractive(text: str | None, caption: str) -> bool:
    return bool(text) and normalize_caption(text) in caption


@dataclass
class _Figure:
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


@dataclass
class MiningStage(Stage):
    """Figure, panel and region image–text pairs mined with a vision-language model
    (Panel2Patch), with boxes in original pixels and every pair's provenance."""

    engine: VlmEngine
    settings: MiningSettings = field(default_factory=MiningSettings)
    actors: int = 0
    gpus_per_actor: float = 0.0

    name = "pairs"
    reads = (
        Table.FIGURES,
        Table.RAW_FILES,
        Table.FIGURE_CONCEPTS,
        Table.PANELS,
        Table.PANEL_CAPTIONS,
        Table.MINING_FIGURES,
        Table.PAIRS,
    )
    writes = (Table.PAIRS, Table.MINING_FIGURES)

    @property
    def compute(self) -> Compute:  # type: ignore[override]
        return Compute(ray_actors=self.actors, gpus_per_actor=self.gpus_per_actor, pool=GPU_POOL)

    # ---- provenance and reuse ---------------------------------------------------------------

    def settings_fingerprint(self) -> str:
        return engine_fingerprint(self.engine, prompts=prompts.PROMPT_VERSION, settings=self.settings.as_dict())

    def _known(self, lake: Lake, partition: Partition) -> dict[str, tuple[dict, list[dict]]]:
        """Figures already mined with the same inputs and settings, in this partition (a rerun)
        or the previous release, by fingerprint, with their pairs."""
        return reusable_results(lake, Table.MINING_FIGURES, partition, fingerprint_unless_error, Table.PAIRS)

    # ---- the run ------------------------------------------------------------------------------

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        release, shard = partition.release, partition.shard
        items = _items(lake, release, shard)
        settings_fp = self.settings_fingerprint()
        known = self._known(lake, partition)
        engine = MeteredEngine(self.engine)
        canary = None
        figure_rows, pair_rows, errors = [], [], []
        carried = 0
        todo = []
        for item in items:
            fp = _inputs_fingerprint(item, settings_fp)
            if fp in known:
                row, pairs = known[fp]
                figure_rows.append({**row, "fig_id": item["fig_id"], "status": "carried"})
                pair_rows.extend({**p, "fig_id": item["fig_id"]} for p in pairs)
                carried += 1
            else:
                todo.append((item, fp))
        if todo:
            canary = require_structured_outputs(self.engine, self.settings.require_canary)
        provenance_columns = provenance(self.engine, prompts.PROMPT_VERSION)
        progress = Progress(f"mining {partition}", len(todo), "figures")
        with RawReader(lake) as reader, progress.heartbeat():
            for chunk in chunks(todo, self.settings.figures_per_batch):
                figures = []
                for item, fp in chunk:
                    image, reason = decode_image(reader.read(item["tar_path"], item["offset"], item["size"]))
                    if image is None:
                        errors.append((_key(item), reason))
                        figure_rows.append(self._figure_row(item, fp, "error", [reason], engine, None))
                        continue
                    figures.append((_Figure(item, image), fp))
                self._mine([f for f, _ in figures], engine)
                for figure, fp in figures:
                    for pair in figure.pairs:
                        pair.update(provenance_columns)
                    pair_rows.extend(figure.pairs)
                    figure_rows.append(self._figure_row(figure.item, fp, "mined", figure.reasons, engine, figure))
                progress.advance(
                    len(chunk),
                    unreadable=len(chunk) - len(figures),
                    pairs=sum(len(f.pairs) for f, _ in figures),
                    vlm_requests=sum(engine.meter.requests.values()) - progress.counts["vlm_requests"],
                )
        lake.write_table(Table.MINING_FIGURES, release, shard, figure_rows)
        lake.write_table(Table.PAIRS, release, shard, pair_rows)
        return self._result(partition, figure_rows, pair_rows, errors, carried, canary, engine)

    def _figure_row(self, item, fp, status, reasons, engine: MeteredEngine, figure: _Figure | None) -> dict:
        m, key = engine.meter, _key(item)
        levels = Counter(p["level"] for p in (figure.pairs if figure else []))
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
            "vlm_requests": m.requests[key],
            "parse_failures": figure.parse_failures if figure else 0,
            "prompt_tokens": m.prompt_tokens[key],
            "completion_tokens": m.completion_tokens[key],
            "seconds": m.seconds[key],
            "disagreement": json.dumps(figure.disagreement) if figure and figure.disagreement else None,
            "fingerprint": fp if status != "error" else None,
        }

    def _mine(self, figures: list[_Figure], engine: MeteredEngine) -> None:
        for figure in figures:
            figure.pairs.append(self._global_pair(figure))
            self._panels(figure, engine)
            self._texts(figure, engine)
        self._panel_pairs(figures, engine)
        if self.settings.regions:
            self._regions(figures, engine)

    def _pair(self, figure: _Figure, level: str, box: Box, **fields) -> dict:
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

    def _global_pair(self, figure: _Figure) -> dict:
        caption = figure.item["caption"]
        return self._pair(
            figure,
            GLOBAL,
            (0, 0, figure.image.width, figure.image.height),
            text=caption or None,
            text_source="caption" if caption else "none",
            extractive=bool(caption),
        )

    # ---- panels -------------------------------------------------------------------------------

    def _panels(self, figure: _Figure, engine: MeteredEngine) -> None:
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
        if self.settings.som_views > 0 and (labelled or printed or len(table) >= 2):
            figure.prefilter.add("som")
            views = panel_views(figure.image, self.settings.som_views, self.settings.seed)
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
                (r.panel, sources[r.detector_index] if r.detector_index is not None else r.source)
                for r in merged.panels
            ]
            figure.label_sources = [r.label_source for r in merged.panels]
        else:
            figure.panels = list(zip(table, sources, strict=True))
            figure.label_sources = [IMAGE if p.label else None for p in table]

    def _texts(self, figure: _Figure, engine: MeteredEngine) -> None:
        """Each panel's text: the caption split first, the model only for what it left."""
        item = figure.item
        if len(figure.panels) < 2:
            return
        split = split_caption(item["caption"])
        engine.meter.owner = figure.key
        try:
            texts = panel_texts([panel for panel, _ in figure.panels], item["caption"], split, engine)
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

    def _panel_pairs(self, figures: list[_Figure], engine: MeteredEngine) -> None:
        requests, owners = [], []
        for figure in figures:
            if len(figure.panels) < 2:
                continue  # a single panel is the figure itself: its pair is the global one
            for index, (panel, source) in enumerate(figure.panels):
                text = figure.texts.get(index, {})
                pair = self._pair(
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
                if self.settings.describe_panels:
                    requests.append(
                        VlmRequest(
                            f"{figure.key}|describe_panel|{index}",
                            prompts.DESCRIBE_PANEL.render(text=text.get("text") or figure.item["caption"] or ""),
                            [figure.image.crop(panel.box)],
                            system=prompts.SYSTEM,
                            schema=prompts.DESCRIBE_PANEL.schema,
                            max_tokens=prompts.DESCRIBE_PANEL.max_tokens,
                        )
                    )
                    owners.append((figure, pair))
        self._describe(requests, owners, engine, "panel description")

    def _describe(self, requests: list[VlmRequest], owners: list, engine: MeteredEngine, what: str) -> None:
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

    def _region_targets(self, figure: _Figure) -> list[tuple[int, Panel, list[MarkerPhrase]]]:
        """(panel index, panel, the marker phrases about it) for the panels worth a region prompt."""
        if not gate(figure.item["concept"], self.settings.region_concepts):
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
        for index, (panel, _) in enumerate(figure.panels[: self.settings.max_region_panels]):
            own = find_marker_phrases(figure.texts.get(index, {}).get("text") or "")
            if own or preface:
                targets.append((index, panel, own or preface))
        return targets

    def _regions(self, figures: list[_Figure], engine: MeteredEngine) -> None:
        """Mark-guided regions: the model boxes what each marker phrase refers to, markers are
        found in the crop, and a model box survives only near a marker (dual-path fusion)."""
        requests, jobs = [], []
        for figure in figures:
            for index, panel, phrases in self._region_targets(figure):
                figure.prefilter.add("regions")
                crop = figure.image.crop(panel.box)
                for n, phrase in enumerate(phrases):
                    requests.append(
                        VlmRequest(
                            f"{figure.key}|locate_region|{index}.{n}",
                            prompts.LOCATE_REGION.render(phrase=phrase.clause, marker=phrase.marker),
                            [crop],
                            system=prompts.SYSTEM,
                            schema=prompts.LOCATE_REGION.schema,
                            max_tokens=prompts.LOCATE_REGION.max_tokens,
                        )
                    )
                    jobs.append((figure, index, panel, crop, phrase))
        if not requests:
            return
        boxes: dict[tuple[int, int], list] = defaultdict(list)
        phrases_of: dict[tuple[int, int], list[MarkerPhrase]] = defaultdict(list)
        context: dict[tuple[int, int], tuple[_Figure, Panel, Image.Image]] = {}
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
            regions = fuse_regions([b.box for b, _, _ in found], markers, crop.size, tau=self.settings.tau)
            index = slot[1]
            for n, region in enumerate(regions):
                phrase, frame_box, frame = self._phrase_for(region, found, phrases_of[slot])
                box = _offset(region.box, panel.box[0], panel.box[1])
                pair = self._pair(
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
                if self.settings.describe_regions:
                    describe.append(
                        VlmRequest(
                            f"{figure.key}|describe_region|{index}.{n}",
                            prompts.DESCRIBE_REGION.render(),
                            [crop.crop(region.box)],
                            system=prompts.SYSTEM,
                            schema=prompts.DESCRIBE_REGION.schema,
                            max_tokens=prompts.DESCRIBE_REGION.max_tokens,
                        )
                    )
                    owners.append((figure, pair))
        self._describe(describe, owners, engine, "region description")

    @staticmethod
    def _phrase_for(region, found: list, phrases: list[MarkerPhrase]):
        """The phrase (and model box) a fused region came from: the model box it kept, else the
        first phrase naming the region's marker kind, else the first phrase."""
        from pipelines.panels.postprocess import iou

        best = max(found, key=lambda f: iou(f[0].box, region.box), default=None)
        if best is not None and iou(best[0].box, region.box) > 0:
            return best[1], best[0].frame_box, best[2]
        same = [p for p in phrases if p.marker == region.marker]
        return (same or phrases or [None])[0], None, None

    # ---- result -------------------------------------------------------------------------------

    def _result(self, partition, figures, pairs, errors, carried, canary, engine: MeteredEngine) -> StageResult:
        levels = Counter(p["level"] for p in pairs)
        sources = Counter(f"{p['level']}_{p['text_source']}" for p in pairs)
        panels = [p for p in pairs if p["level"] == PANEL]
        matches = Counter(p["text_match"] or NONE for p in panels)
        readers = Counter(p["label_source"] or "none" for p in panels)
        conflicts = sum(len(json.loads(f["disagreement"])["label_conflicts"]) for f in figures if f["disagreement"])
        m = engine.meter
        requests = sum(m.requests.values())
        mined = [f for f in figures if f["status"] == "mined"]
        result = self.result(
            partition,
            ok=len(mined),
            error=len(errors),
            skipped=carried,
            counts={
                "images": len(figures),
                "carried": carried,
                **{f"pairs_{level}": levels[level] for level in LEVELS},
                **{f"text_{k}": v for k, v in sorted(sources.items())},
                **{f"panel_match_{m}": matches[m] for m in MATCHES},
                **{f"panel_label_from_{k}": v for k, v in sorted(readers.items())},
                "label_conflicts": conflicts,
                "vlm_requests": requests,
                "prompt_tokens": sum(m.prompt_tokens.values()),
                "completion_tokens": sum(m.completion_tokens.values()),
                "vlm_seconds": round(sum(m.seconds.values()), 3),
                "prefilter_none": sum(1 for f in mined if f["prefilter"] == "none"),
                "per_prompt": json.dumps({k: dict(v) for k, v in m.by_prompt.items()}, sort_keys=True),
                "engine": f"{engine.backend} {engine.config.model}",
                "synthetic": engine.config.synthetic,
            },
            previews={
                "preview": Preview(
                    pairs, ["pair_id", "level", "x1", "y1", "x2", "y2", "text_source", "text", "description"]
                )
            },
            checks=[
                boxes_inside_parent(figures, pairs),
                extractive_share(pairs),
                parse_failure_rate(figures),
                canary_check(CANARY, canary),
            ],
        )
        result.errors = list(errors)
        result.version = fingerprint(sorted((f["pmcid"], f["image_file"], f["fingerprint"]) for f in figures))
        return result


BOXES_INSIDE, EXTRACTIVE, PARSE_FAILURES, CANARY = (
    "pair_boxes_inside_parent",
    "caption_texts_extractive",
    "vlm_parse_failure_rate",
    "structured_outputs_canary",
)
MIN_EXTRACTIVE = 0.99
MAX_PARSE_FAILURES = 0.1


def boxes_inside_parent(figures: list[dict], pairs: list[dict]) -> Check:
    """Panels inside their figure image, regions inside their panel."""
    panel_box = {
        (p["pmcid"], p["image_file"], p["panel_index"]): (p["x1"], p["y1"], p["x2"], p["y2"])
        for p in pairs
        if p["level"] == PANEL
    }
    image_box = {
        (p["pmcid"], p["image_file"]): (p["x1"], p["y1"], p["x2"], p["y2"]) for p in pairs if p["level"] == GLOBAL
    }
    bad = []
    for p in pairs:
        box = (p["x1"], p["y1"], p["x2"], p["y2"])
        image = image_box.get((p["pmcid"], p["image_file"]))
        parent = image
        if p["level"] == REGION:
            parent = panel_box.get((p["pmcid"], p["image_file"], p["panel_index"]), image)
        if parent is None or not _inside(box, parent):
            bad.append(p["pair_id"])
    return Check(
        BOXES_INSIDE,
        passed=not bad,
        description=f"{len(bad)} of {len(pairs)} pair boxes outside their parent (figure, or panel for regions)",
        metadata={"bad": bad[:50]},
    )


def extractive_share(pairs: list[dict]) -> Check:
    """Texts said to come from the caption must occur in it."""
    derived = [p for p in pairs if p["text_source"] in ("caption", "caption_split", "vlm") and p["text"]]
    extractive = sum(1 for p in derived if p["extractive"])
    share = extractive / len(derived) if derived else 1.0
    return Check(
        EXTRACTIVE,
        passed=share >= MIN_EXTRACTIVE,
        description=f"{extractive} of {len(derived)} caption-derived texts occur verbatim in their caption "
        f"({share:.1%}; at least {MIN_EXTRACTIVE:.0%} expected)",
        metadata={"share": share, "texts": len(derived)},
    )


def parse_failure_rate(figures: list[dict]) -> Check:
    mined = [f for f in figures if f["status"] == "mined"]
    requests = sum(f["vlm_requests"] for f in mined)
    failures = sum(f["parse_failures"] for f in mined)
    rate = failures / requests if requests else 0.0
    return Check(
        PARSE_FAILURES,
        passed=rate <= MAX_PARSE_FAILURES,
        description=f"{failures} of {requests} model answers could not be used ({rate:.1%}; at most "
        f"{MAX_PARSE_FAILURES:.0%} expected)",
        blocking=False,
        metadata={"rate": rate, "requests": requests},
    )
