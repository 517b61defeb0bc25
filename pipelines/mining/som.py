"""Panels proposed by a VLM over several views of a figure, and reconciled with the panel stage.

Panel2Patch (§3.2) deconstructs a compound figure by asking a VLM for every panel and its printed
identifier on several views of the figure (the figure itself, random rescalings and crops), then
merging the boxes per identifier: a panel printed "B" is one panel however many views found it,
and the share of views that found it is its score. One view's misreading (a wrong box, a garbage
answer) is outvoted instead of becoming a panel.

Our panel stage already split every figure (layout analysis and a detector, the ``panels``
table); the VLM's panels are *reconciled* with that split, not substituted for it: the table's
geometry is kept, the VLM contributes printed labels the table lacks, and where the two disagree
the disagreement is reported (see :func:`reconcile`).

How the votes are merged (:func:`merge_views`):

1. every box is mapped back to original pixels by its view's offset and scale; a box touching an
   edge where a crop cut the figure is a cut panel and is left out (``dropped["cut by crop"]``);
2. labelled boxes are grouped by label (case-insensitive) and clustered by IoU >= ``MERGE_IOU``
   with the cluster's first box (views in order, the full figure first); a label is one panel, so
   only its cluster found by most views keeps it, the others' boxes count as unlabelled;
3. an unlabelled box joins the labelled cluster it overlaps most (IoU >= ``MERGE_IOU``), else an
   unlabelled cluster, else starts one: unlabelled boxes are merged among themselves;
4. a cluster becomes a panel: the coordinate-wise median of its boxes, score = distinct views
   that voted / views asked, label = its most common printed form;
5. ``postprocess.suppress`` drops a panel that duplicates a better-voted one (the same place read
   as "A" by some views and "B" by others), and the panels come in reading order.
"""

from __future__ import annotations

import hashlib
import random
import re
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from PIL import Image

from pipelines.images.boxes import SINGLE_PANEL_COVER, Box, Panel, iou, match_panels, reading_order, suppress
from pipelines.vlm import prompts
from pipelines.vlm.engine import VlmEngine, VlmRequest, VlmResponse
from pipelines.vlm.grounding import model_frame, parse_boxes, to_original

MERGE_IOU = 0.5  # two boxes of the same identifier from two views are one panel above this
CUT_MARGIN = 2.0  # view pixels: a box this close to a crop's cut edge was cut by the crop
MIN_CROP_SIDE = 56  # a crop narrower than two model patches shows nothing worth asking about
DEFAULT_SCALES = (0.6, 0.8, 1.25, 1.5)
DEFAULT_CROP_SHARE = 0.5
CROP_SIDE = (0.6, 0.9)  # a crop keeps this share of each side of the figure

VLM, DETECTOR = "vlm", "detector"
IMAGE = "image"  # a label read on the image by the panel stage (OCR, or the detector's label boxes)


# --- views -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class View:
    """What one request shows: ``image`` is the figure's region ``crop`` (original pixels)
    resized by ``scale`` (view pixels per original pixel, per axis), so a view pixel (u, v) is
    the original pixel (x1 + u / sx, y1 + v / sy)."""

    image: Image.Image
    crop: Box
    scale: tuple[float, float] = (1.0, 1.0)
    figure_size: tuple[int, int] = (0, 0)  # the original's (width, height): which crop edges are cuts

    @property
    def offset(self) -> tuple[int, int]:
        return self.crop[0], self.crop[1]

    def to_original(self, box: tuple[float, float, float, float]) -> tuple[float, float, float, float]:
        (ox, oy), (sx, sy) = self.offset, self.scale
        return ox + box[0] / sx, oy + box[1] / sy, ox + box[2] / sx, oy + box[3] / sy

    def cut_by_crop(self, box: tuple[float, float, float, float]) -> bool:
        """True when the box touches an edge of the view that is not an edge of the figure:
        the crop cut that panel, so its box is only part of the panel."""
        w, h = self.image.size
        fw, fh = self.figure_size
        x1, y1, x2, y2 = self.crop
        return (
            (x1 > 0 and box[0] <= CUT_MARGIN)
            or (y1 > 0 and box[1] <= CUT_MARGIN)
            or (x2 < fw and box[2] >= w - CUT_MARGIN)
            or (y2 < fh and box[3] >= h - CUT_MARGIN)
        )


def image_sha(image: Image.Image) -> str:
    """The hash of the pixels (and mode and size), so that views depend on the image, not on
    the file it came from."""
    digest = hashlib.sha256(f"{image.mode}:{image.size}".encode())
    digest.update(image.tobytes())
    return digest.hexdigest()


def panel_views(
    image: Image.Image,
    n_views: int,
    seed: int,
    scales: Sequence[float] = DEFAULT_SCALES,
    crop_share: float = DEFAULT_CROP_SHARE,
) -> list[View]:
    """The full figure, then ``n_views - 1`` random views: each picks a scale from ``scales``
    and, with probability ``crop_share``, a crop keeping 60-90 % of each side. The same image,
    seed and settings always give the same views, so a rerun asks the same questions."""
    if n_views < 1:
        raise ValueError(f"n_views must be at least 1, not {n_views}")
    if image.mode not in ("RGB", "L"):
        image = image.convert("RGB")
    width, height = image.size
    views = [View(image, (0, 0, width, height), (1.0, 1.0), (width, height))]
    rng = random.Random(f"{seed}:{image_sha(image)}:{tuple(scales)}:{crop_share}")
    for _ in range(n_views - 1):
        scale = rng.choice(list(scales)) if scales else 1.0
        crop = _random_crop(rng, width, height) if rng.random() < crop_share else (0, 0, width, height)
        views.append(_view(image, crop, scale))
    return views


def _random_crop(rng: random.Random, width: int, height: int) -> Box:
    cw, ch = (max(1, round(side * rng.uniform(*CROP_SIDE))) for side in (width, height))
    if cw < MIN_CROP_SIDE or ch < MIN_CROP_SIDE:
        return 0, 0, width, height
    x1, y1 = rng.randint(0, width - cw), rng.randint(0, height - ch)
    return x1, y1, x1 + cw, y1 + ch


def _view(image: Image.Image, crop: Box, scale: float) -> View:
    cw, ch = crop[2] - crop[0], crop[3] - crop[1]
    vw, vh = max(1, round(cw * scale)), max(1, round(ch * scale))
    region = image if crop == (0, 0, *image.size) else image.crop(crop)
    resized = region if (vw, vh) == (cw, ch) else region.resize((vw, vh), Image.Resampling.BICUBIC)
    return View(resized, crop, (vw / cw, vh / ch), image.size)


# --- proposals -------------------------------------------------------------------------------


@dataclass
class Proposals:
    """The merged panels and what each view answered.

    ``reasons[i]`` is None when view i was read in full, else why (some or all) of its answer was
    lost; ``counts[i]`` is how many boxes view i gave after mapping back (None: nothing read)."""

    panels: list[Panel]
    views: int
    reasons: list[str | None]
    counts: list[int | None]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    dropped: dict[str, int] = field(default_factory=dict)

    @property
    def failures(self) -> list[str]:
        return [f"view {i}: {r}" for i, r in enumerate(self.reasons) if r]

    @property
    def split_share(self) -> float:
        """The share of views (failed ones included) that found at least two panels: how
        consistently the VLM sees a compound figure."""
        return sum(1 for c in self.counts if c is not None and c >= 2) / self.views if self.views else 0.0


@dataclass(frozen=True)
class _Vote:
    view: int
    box: tuple[float, float, float, float]  # original pixels, not rounded
    label: str | None


def panel_requests(views: Sequence[View], key: str = "figure") -> list[VlmRequest]:
    return [prompts.PANELS.request(f"{key}/view{i}", [view.image]) for i, view in enumerate(views)]


def propose_panels(engine: VlmEngine, image: Image.Image, views: Sequence[View], key: str = "figure") -> Proposals:
    """One PANELS request per view, in one ``generate`` call, merged by :func:`merge_views`.

    A view whose answer is an error or garbage is a recorded reason and casts no vote; the other
    views still count. ``VlmOutage`` from the engine is not caught: the run is retried."""
    requests = panel_requests(views, key)
    responses = {r.id: r for r in engine.generate(requests)}
    votes: list[_Vote] = []
    reasons: list[str | None] = []
    counts: list[int | None] = []
    dropped: Counter[str] = Counter()
    prompt_tokens = completion_tokens = 0
    for i, (view, request) in enumerate(zip(views, requests, strict=True)):
        response = responses.get(request.id)
        if response is not None:
            prompt_tokens += response.prompt_tokens
            completion_tokens += response.completion_tokens
        view_votes, reason, cut = _read_view(engine, i, view, response)
        dropped["cut by crop"] += cut
        reasons.append(reason)
        counts.append(None if view_votes is None else len(view_votes))
        votes.extend(view_votes or [])
    panels, merge_dropped = merge_views(votes, len(views), image.size)
    dropped.update(merge_dropped)
    return Proposals(
        panels, len(views), reasons, counts, prompt_tokens, completion_tokens, {k: v for k, v in dropped.items() if v}
    )


def _read_view(
    engine: VlmEngine, index: int, view: View, response: VlmResponse | None
) -> tuple[list[_Vote] | None, str | None, int]:
    """The votes of one view in original pixels (None when nothing could be read), why any were
    lost, and how many boxes the crop cut."""
    if response is None:
        return None, "no response for this view", 0
    if response.error or response.text is None:
        return None, f"request failed: {response.error or 'no text'}", 0
    family = engine.config.family
    size = view.image.size
    frame = tuple(response.image_sizes[0]) if response.image_sizes else model_frame(*size, engine.config)
    boxes, reason = parse_boxes(response.text, family, size, frame, list_key="panels")
    if not boxes and reason is not None:
        return None, reason, 0
    votes, cut = [], 0
    for grounded in boxes:
        x1, y1, x2, y2 = grounded.frame_box
        in_view = to_original((min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2)), family, size, frame)
        in_view = (max(0.0, in_view[0]), max(0.0, in_view[1]), min(size[0], in_view[2]), min(size[1], in_view[3]))
        if view.cut_by_crop(in_view):
            cut += 1
            continue
        votes.append(_Vote(index, view.to_original(in_view), normalize_label(grounded.label)))
    return votes, reason, cut


_LABEL_EDGES = re.compile(r"^[\s(\[{\"']+|[\s)\]}\"'.:,;]+$")
_PANEL_WORD = re.compile(r"^(?:panel|fig(?:ure)?\.?)\s+", re.IGNORECASE)


def normalize_label(label: str | None) -> str | None:
    """A printed identifier as the panel stage writes it: "(A)", "A.", "panel A" are all "A";
    "null", "none" and "" are no label."""
    if label is None:
        return None
    text = _LABEL_EDGES.sub("", _PANEL_WORD.sub("", str(label).strip()))
    text = _LABEL_EDGES.sub("", text)
    if not text or text.casefold() in ("null", "none", "n/a", "-"):
        return None
    return text


# --- per-identifier NMS ----------------------------------------------------------------------


@dataclass
class _Cluster:
    seed: tuple[float, float, float, float]
    members: list[_Vote] = field(default_factory=list)

    @property
    def views(self) -> set[int]:
        return {v.view for v in self.members}

    def overlap(self, box: tuple[float, float, float, float]) -> float:
        return _fiou(self.seed, box)


def _fiou(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _join(clusters: list[_Cluster], vote: _Vote) -> _Cluster | None:
    """The cluster the vote overlaps most (IoU >= MERGE_IOU), or None."""
    best = max(clusters, key=lambda c: c.overlap(vote.box), default=None)
    return best if best is not None and best.overlap(vote.box) >= MERGE_IOU else None


def merge_views(votes: Sequence[_Vote], n_views: int, size: tuple[int, int]) -> tuple[list[Panel], dict[str, int]]:
    """Steps 2-5 of the module doc. Returns the panels and counts of what was left out."""
    votes = sorted(votes, key=lambda v: v.view)  # the full figure seeds the clusters
    dropped: Counter[str] = Counter()
    labelled: dict[str, _Cluster] = {}
    loose: list[_Vote] = []
    by_label: dict[str, list[_Vote]] = {}
    for vote in votes:
        if vote.label is None:
            loose.append(vote)
        else:
            by_label.setdefault(vote.label.casefold(), []).append(vote)
    for key, group in by_label.items():
        clusters: list[_Cluster] = []
        for vote in group:
            (_join(clusters, vote) or _new(clusters, vote)).members.append(vote)
        best = max(clusters, key=lambda c: len(c.views))  # max keeps the first of equals
        labelled[key] = best
        for other in clusters:
            if other is not best:
                dropped["label elsewhere"] += len(other.members)
                loose.extend(replace(v, label=None) for v in other.members)
    unlabelled: list[_Cluster] = []
    for vote in sorted(loose, key=lambda v: v.view):
        target = _join(list(labelled.values()), vote) or _join(unlabelled, vote) or _new(unlabelled, vote)
        target.members.append(vote)
    panels = [_panel(c, n_views, size) for c in [*labelled.values(), *unlabelled]]
    panels = [p for p in panels if p.area > 0]
    kept = suppress(panels)
    if len(kept) < len(panels):
        dropped["duplicate of a better-voted panel"] += len(panels) - len(kept)
    return reading_order(kept), dict(dropped)


def _new(clusters: list[_Cluster], vote: _Vote) -> _Cluster:
    cluster = _Cluster(vote.box)
    clusters.append(cluster)
    return cluster


def _panel(cluster: _Cluster, n_views: int, size: tuple[int, int]) -> Panel:
    width, height = size
    edges = [round(statistics.median(m.box[k] for m in cluster.members)) for k in range(4)]
    box = (max(0, edges[0]), max(0, edges[1]), min(width, edges[2]), min(height, edges[3]))
    labels = Counter(m.label for m in cluster.members if m.label is not None)
    label = labels.most_common(1)[0][0] if labels else None  # ties: the first seen
    return Panel(box=box, score=round(len(cluster.views) / n_views, 4), label=label)


# --- reconciliation with the panel stage ----------------------------------------------------


@dataclass(frozen=True)
class ReconciledPanel:
    """A panel of the reconciled split. ``source`` "detector": the ``panels`` table's box
    (``detector_index``), with the VLM's label when the table had none; "vlm": the VLM's box,
    used only by the single-panel override (see :func:`reconcile`)."""

    panel: Panel
    source: str
    detector_index: int | None = None
    vlm_index: int | None = None
    iou: float | None = None
    label_source: str | None = None  # who read ``panel.label``: "image" (the panels table) or "vlm"


@dataclass
class Reconciled:
    panels: list[ReconciledPanel]
    matches: list[tuple[int, int, float]]  # (vlm index, detector index, IoU), IoU >= iou_min
    vlm_only: list[int]  # indices into the VLM panels
    detector_only: list[int]  # indices into the detector panels
    label_conflicts: list[tuple[int, int, str, str]]  # (vlm index, detector index, vlm label, detector label)
    mean_iou: float | None  # over the matches; None when nothing matched
    agreement: float  # sum of matched IoU / max(len(vlm), len(detector)); 1.0 when both are empty
    decision: str  # "detector" or "vlm_split" (the single-panel override)


def reconcile(
    vlm_panels: Sequence[Panel],
    detector_panels: Sequence[Panel],
    iou_min: float = 0.5,
    size: tuple[int, int] | None = None,
    split_share: float | None = None,
    min_score: float = 0.5,
) -> Reconciled:
    """The panel stage's split, with what the VLM adds and where the two disagree.

    Panels are matched one to one (``postprocess.match_panels``, Hungarian on IoU), a match
    counting from ``iou_min``. Every detector panel is kept with its box (the table's geometry
    is what crops are cut from). Its printed label, read on the image by the panel stage (OCR),
    is the first reader: the VLM's reading is the second opinion, taken only by a matched panel
    the table has no label for (``label_source="vlm"``); two different labels are a conflict,
    reported, the table's label kept.

    VLM-only panels are reported, not added: a box only the VLM saw is as likely a hallucination
    as a missed panel, and adding it would make the table and the crops disagree. One exception,
    ``decision="vlm_split"``: the detector found a single panel covering the figure
    (>= ``SINGLE_PANEL_COVER`` of ``size``), and at least half the views (``split_share``) found
    two or more panels, and at least two VLM panels were found by >= ``min_score`` of the views.
    A detector that missed the panel borders of a compound figure is its known failure, and
    consistent votes are the evidence; those VLM panels are then used, with ``source="vlm"``."""
    if _vlm_split(vlm_panels, detector_panels, size, split_share, min_score):
        chosen = [i for i, p in enumerate(vlm_panels) if p.score >= min_score]
        panels = [
            ReconciledPanel(vlm_panels[i], VLM, vlm_index=i, label_source=VLM if vlm_panels[i].label else None)
            for i in chosen
        ]
        overlaps = [iou(vlm_panels[i].box, detector_panels[0].box) for i in chosen]
        return Reconciled(panels, [], [], [0], [], None, _agreement(overlaps, vlm_panels, detector_panels), "vlm_split")
    matches = [(i, j, o) for i, j, o in match_panels(vlm_panels, detector_panels) if o >= iou_min]
    by_detector = {j: (i, o) for i, j, o in matches}
    panels, conflicts = [], []
    for j, det in enumerate(detector_panels):
        if j not in by_detector:
            panels.append(ReconciledPanel(det, DETECTOR, detector_index=j, label_source=IMAGE if det.label else None))
            continue
        i, overlap = by_detector[j]
        vlm_label = vlm_panels[i].label
        label = det.label or vlm_label
        if det.label and vlm_label and det.label.casefold() != vlm_label.casefold():
            conflicts.append((i, j, vlm_label, det.label))
        merged = Panel(box=det.box, score=det.score, label=label)
        source = IMAGE if det.label else (VLM if vlm_label else None)
        panels.append(
            ReconciledPanel(merged, DETECTOR, detector_index=j, vlm_index=i, iou=overlap, label_source=source)
        )
    matched_vlm = {i for i, _, _ in matches}
    overlaps = [o for _, _, o in matches]
    return Reconciled(
        panels=panels,
        matches=matches,
        vlm_only=[i for i in range(len(vlm_panels)) if i not in matched_vlm],
        detector_only=[j for j in range(len(detector_panels)) if j not in by_detector],
        label_conflicts=conflicts,
        mean_iou=sum(overlaps) / len(overlaps) if overlaps else None,
        agreement=_agreement(overlaps, vlm_panels, detector_panels),
        decision="detector",
    )


def _agreement(overlaps: Sequence[float], a: Sequence[Panel], b: Sequence[Panel]) -> float:
    most = max(len(a), len(b))
    return sum(overlaps) / most if most else 1.0


def _vlm_split(
    vlm_panels: Sequence[Panel],
    detector_panels: Sequence[Panel],
    size: tuple[int, int] | None,
    split_share: float | None,
    min_score: float,
) -> bool:
    if len(detector_panels) != 1 or size is None or split_share is None or split_share < 0.5:
        return False
    figure = size[0] * size[1]
    if figure <= 0 or detector_panels[0].area < SINGLE_PANEL_COVER * figure:
        return False
    return sum(1 for p in vlm_panels if p.score >= min_score) >= 2
