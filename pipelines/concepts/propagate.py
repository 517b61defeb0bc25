"""Label every image through the concept model: nearest cluster, then that cluster's labels."""

from __future__ import annotations

import numpy as np

from pipelines.concepts.model import ConceptModel, decode_vector


def propagate(embeddings: list[dict], model: ConceptModel, version: str, labels: dict[int, dict]) -> list[dict]:
    """One ``figure_concepts`` row per embedding row. Status: ``labeled``; ``partly_labeled``
    (a field tied); ``stale_annotation`` (labels made for a cluster whose fingerprint differs from
    the model's); ``unannotated_cluster``; ``no_embedding`` (the image could not be embedded)."""
    with_vector = [r for r in embeddings if r["vector"]]
    clusters, distances = (
        model.assign(np.stack([decode_vector(r["vector"], r["dim"]) for r in with_vector]))
        if with_vector
        else (np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32))
    )
    assigned = {id(r): (int(c), float(d)) for r, c, d in zip(with_vector, clusters, distances, strict=True)}
    rows = []
    for row in embeddings:
        out = {
            "pmcid": row["pmcid"],
            "fig_id": row["fig_id"],
            "image_file": row["image_file"],
            "sha256": row["sha256"],
            "model_version": version,
            "cluster_id": None,
            "distance": None,
            "panel_type": None,
            "global_concept": None,
            "local_concepts": [],
            "label_status": "no_embedding",
            "synthetic": row["synthetic"],
        }
        if id(row) in assigned:
            cluster, distance = assigned[id(row)]
            out.update(cluster_id=cluster, distance=distance)
            label = labels.get(cluster)
            if label is None:
                out["label_status"] = "unannotated_cluster"
            else:
                out.update(
                    panel_type=label["panel_type"],
                    global_concept=label["global_concept"],
                    local_concepts=list(label["local_concepts"]),
                    label_status=_status(label),
                )
        rows.append(out)
    return rows


def _status(label: dict) -> str:
    if label.get("fingerprint_mismatch"):
        return "stale_annotation"
    return "partly_labeled" if label["ties"] else "labeled"
