"""Figure items: one reference per resolved figure image of a partition, with where its bytes lie
in the raw tars. Every stage that reads figure images (embeddings, panels, pairs, long captions)
starts from these. Whether an image is usable is decided once, when the article is parsed (the one
decoder's rule, :mod:`pipelines.images.decode`, recorded in ``figures.image_errors``): a refused
image's reference carries that reason as ``image_error``, and every stage records it for the image
instead of decoding it again."""

from __future__ import annotations

from pipelines.core.lake import Lake


def raw_locations(lake: Lake, release: str, shard: str) -> dict[tuple[str, str], dict]:
    """Where each raw file of the partition lies, by (pmcid, file name)."""
    files = lake.read_table("raw_files", release, shard)
    return {(f["pmcid"], f["name"]): f for f in (files.to_pylist() if files is not None else [])}


def image_refs(lake: Lake, release: str, shard: str, figures: list[dict] | None = None) -> list[dict]:
    """One reference per resolved figure image of the partition (where it lies in the raw tars);
    ``figures``: the partition's figure rows when the caller has them already."""
    if figures is None:
        figures = lake.require("figures", release, shard).to_pylist()
    by_name = raw_locations(lake, release, shard)
    refs = []
    for fig in figures:
        errors = fig.get("image_errors") or []
        for index, name in enumerate(fig["image_files"] or []):
            raw = by_name[(fig["pmcid"], name)]
            refs.append(
                {
                    "pmcid": fig["pmcid"],
                    "fig_id": fig["fig_id"],
                    "image_file": name,
                    "sha256": raw["sha256"],
                    "tar_path": raw["tar_path"],
                    "offset": raw["offset"],
                    "size": raw["size"],
                }
                | ({"image_error": errors[index]} if index < len(errors) and errors[index] else {})
            )
    return refs
