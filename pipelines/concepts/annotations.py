"""People annotate clusters once; the votes are validated, resolved and then label every image.

Annotation files are CSVs, one per annotator: filled copies of the template the review step
writes, ``cluster_id, n_images, panel_type, global_concept, local_concepts, notes, model_version,
fingerprint`` (local concepts separated by ``;``). Local labels are normalised (lower case, no
whitespace, no dashes) before they are checked against the taxonomy and counted. Each field is
decided by strict majority of the annotators who filled it; a tie is flagged for re-review, never
broken silently.

Cluster ids mean nothing outside the model they come from, so every row names the concept-model
version and the cluster's fingerprint (``<members>:<hash>`` of the model's sample, see
``pipelines.concepts.model``). A file made for another version, or without those columns, is
refused; a cluster whose fingerprint differs from the model's (same version, other clusters: a
changed sample, library or machine) keeps its labels but is flagged in ``fingerprint_mismatch``.
"""

from __future__ import annotations

import csv
import io
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.core.errors import StageInputError
from pipelines.core.taxonomy import Taxonomy, normalize_label

TAXONOMY_FILE = Path(__file__).with_name("taxonomy.json")
FIELDS = ("panel_type", "global_concept", "local_concepts")
TEMPLATE_COLUMNS = [
    "cluster_id",
    "n_images",
    "panel_type",
    "global_concept",
    "local_concepts",
    "notes",
    "model_version",
    "fingerprint",
]


class AnnotationError(StageInputError, ValueError):
    """One or more annotation rows are invalid; the message names every file and line."""


@dataclass
class Vote:
    annotator: str
    cluster_id: int
    panel_type: str | None
    global_concept: str | None
    local_concepts: frozenset[str]
    mismatch: str | None = None  # why the row's fingerprint is not the model's cluster's


def fingerprint_mismatch(annotated: str, current: str) -> str | None:
    """None when the fingerprints agree, else what differs (size first, then the members)."""
    if annotated == current:
        return None
    if not annotated:
        return f"no fingerprint recorded; the model's cluster is {current}"
    size, model_size = annotated.split(":", 1)[0], current.split(":", 1)[0]
    if size != model_size:
        return f"annotated a cluster of {size} sample images ({annotated}), the model's has {model_size} ({current})"
    return f"annotated other images ({annotated}) than the model's cluster of the same size ({current})"


def _template_hint(version: str) -> str:
    return (
        f"fill the template concept_review writes for the current model, review/{version}/annotations_template.csv "
        "(it records the model version and each cluster's fingerprint), looking at that folder's contact sheets"
    )


def read_annotations(
    files: dict[str, str], taxonomy: Taxonomy, k: int, version: str, fingerprints: dict[int, str] | None = None
) -> list[Vote]:
    """Parse ``{file name: CSV text}``; rows with nothing filled in are skipped (not annotated).

    ``version`` is the current concept model's: a file made for another (or naming none) is an
    error. ``fingerprints`` (cluster id -> fingerprint, from the model) mark the votes of clusters
    that differ from what the annotator saw; empty or None (a model saved without them) skips that
    check.
    """
    problems: list[str] = []
    votes: list[Vote] = []
    panel = {p.lower(): p for p in taxonomy.panel_types}
    concepts = {c.lower(): c for c in taxonomy.global_concepts}
    locals_ = taxonomy.local_index()
    fingerprints = fingerprints or {}
    for name, text in sorted(files.items()):
        annotator = Path(name).stem
        reader = csv.DictReader(io.StringIO(text))
        missing = {"cluster_id", *FIELDS} - set(reader.fieldnames or [])
        if missing:
            problems.append(f"{name}: missing columns {sorted(missing)}")
            continue
        unversioned = {"model_version", "fingerprint"} - set(reader.fieldnames or [])
        if unversioned:
            problems.append(
                f"{name}: no {' or '.join(sorted(unversioned))} column, so it cannot say which clusters it "
                f"describes; {_template_hint(version)}"
            )
            continue
        rows = list(enumerate(reader, start=2))
        made_for = sorted({(row["model_version"] or "").strip() for _, row in rows} - {version})
        if made_for:
            named = ", ".join(repr(v) if v else "none (an empty model_version)" for v in made_for)
            problems.append(
                f"{name}: made for concept model {named}, but the current model is {version!r}; cluster ids of "
                f"another model mean other clusters: {_template_hint(version)}"
            )
            continue
        seen: set[int] = set()
        for line, row in rows:
            where = f"{name}:{line}"
            try:
                cluster = int((row["cluster_id"] or "").strip())
            except ValueError:
                problems.append(f"{where}: cluster_id {row['cluster_id']!r} is not a number")
                continue
            if not 0 <= cluster < k:
                problems.append(f"{where}: cluster_id {cluster} is outside 0..{k - 1}")
                continue
            if cluster in seen:
                problems.append(f"{where}: cluster {cluster} annotated twice")
                continue
            seen.add(cluster)
            p, g = (row["panel_type"] or "").strip(), (row["global_concept"] or "").strip()
            raw_locals = [x for x in (row["local_concepts"] or "").split(";") if x.strip()]
            if not (p or g or raw_locals):
                continue
            if p and p.lower() not in panel:
                problems.append(f"{where}: unknown panel type {p!r}")
            if g and g.lower() not in concepts:
                problems.append(f"{where}: unknown global concept {g!r}")
            unknown = [x for x in raw_locals if normalize_label(x) not in locals_]
            if unknown:
                problems.append(f"{where}: unknown local concepts {unknown}")
            current = fingerprints.get(cluster)
            votes.append(
                Vote(
                    annotator,
                    cluster,
                    panel.get(p.lower()) if p else None,
                    concepts.get(g.lower()) if g else None,
                    frozenset(normalize_label(x) for x in raw_locals),
                    fingerprint_mismatch((row["fingerprint"] or "").strip(), current) if current else None,
                )
            )
    if problems:
        raise AnnotationError("invalid annotations:\n" + "\n".join(problems))
    return votes


def _majority(values: list) -> tuple[object | None, bool, float]:
    """(winner, tie, disagreement = 1 - winner share); None when nobody answered."""
    if not values:
        return None, False, 0.0
    counts = Counter(values).most_common()
    top = counts[0][1]
    tie = len(counts) > 1 and counts[1][1] == top
    return (None if tie else counts[0][0]), tie, 1 - top / len(values)


@dataclass
class Resolution:
    labels: dict[int, dict] = field(default_factory=dict)
    stats: dict[str, dict] = field(default_factory=dict)


def resolve(votes: list[Vote], taxonomy: Taxonomy) -> Resolution:
    """Majority per cluster and field; local concepts each need a majority of the cluster's annotators."""
    display = taxonomy.local_index()
    by_cluster: dict[int, list[Vote]] = defaultdict(list)
    for vote in votes:
        by_cluster[vote.cluster_id].append(vote)
    result = Resolution()
    disagreement: dict[str, list[float]] = {f: [] for f in FIELDS}
    for cluster, cluster_votes in sorted(by_cluster.items()):
        panel, panel_tie, panel_d = _majority([v.panel_type for v in cluster_votes if v.panel_type])
        concept, concept_tie, concept_d = _majority([v.global_concept for v in cluster_votes if v.global_concept])
        n = len(cluster_votes)
        label_counts = Counter(label for v in cluster_votes for label in v.local_concepts)
        chosen = sorted(display[label] for label, c in label_counts.items() if c * 2 > n)
        local_tie = any(c * 2 == n for c in label_counts.values())
        sets = Counter(v.local_concepts for v in cluster_votes)
        disagreement["panel_type"].append(panel_d)
        disagreement["global_concept"].append(concept_d)
        disagreement["local_concepts"].append(1 - sets.most_common(1)[0][1] / n)
        ties = [f for f, t in zip(FIELDS, (panel_tie, concept_tie, local_tie), strict=True) if t]
        mismatches = [f"{v.annotator}: {v.mismatch}" for v in cluster_votes if v.mismatch]
        result.labels[cluster] = {
            "cluster_id": cluster,
            "panel_type": panel,
            "global_concept": concept,
            "local_concepts": chosen,
            "annotators": n,
            "ties": ties,
            "fingerprint_mismatch": "; ".join(mismatches) or None,
        }
    for name, values in disagreement.items():
        if values:
            q1, _, q3 = (
                statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else (values[0], 0, values[0])
            )
            result.stats[name] = {
                "min": round(min(values), 4),
                "max": round(max(values), 4),
                "mean": round(statistics.fmean(values), 4),
                "median": round(statistics.median(values), 4),
                "iqr": round(q3 - q1, 4),
            }
    return result


def template_csv(cluster_sizes: dict[int, int], version: str, fingerprints: dict[int, str]) -> str:
    """One row per cluster: its size in the reviewed release, empty label fields, and the model
    version and cluster fingerprint the labels will be checked against."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(TEMPLATE_COLUMNS)
    for cluster in sorted(cluster_sizes):
        writer.writerow([cluster, cluster_sizes[cluster], "", "", "", "", version, fingerprints.get(cluster, "")])
    return out.getvalue()
