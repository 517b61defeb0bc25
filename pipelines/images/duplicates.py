"""The same figure image across articles: exact (same sha256) and near (dHash within a few bits).

Duplicates are recorded, never dropped: later stages decide (a reused figure in a correction
notice is legitimate; a copied figure in an unrelated article is worth a look). Near pairs are
found without comparing all pairs: the 64-bit hash is cut into ``max_distance + 1`` bands, and
two hashes within ``max_distance`` bits must agree on at least one band (pigeonhole).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from pipelines.images.info import hamming

NEAR_DISTANCE = 4


def _images(figures: Iterable[dict]) -> list[tuple[str, str, str, str | None, str | None]]:
    out = []
    for fig in figures:
        for i, name in enumerate(fig["image_files"] or []):
            sha = fig["sha256"][i] if fig["sha256"] else None
            phash = fig["phash"][i] if fig["phash"] else None
            out.append((fig["pmcid"], fig["fig_id"], name, sha, phash))
    return out


def find_duplicates(figures: Iterable[dict], max_distance: int = NEAR_DISTANCE) -> list[dict]:
    """Rows for every pair of images in different articles that are exact or near duplicates."""
    images = _images(figures)
    rows: list[dict] = []
    exact_pairs: set[tuple[int, int]] = set()
    by_sha: dict[str, list[int]] = defaultdict(list)
    for index, (_, _, _, sha, _) in enumerate(images):
        if sha:
            by_sha[sha].append(index)
    for members in by_sha.values():
        for a in members:
            for b in members:
                if a < b and images[a][0] != images[b][0]:
                    exact_pairs.add((a, b))
    bands = max_distance + 1
    width = 64 // bands
    buckets: dict[tuple[int, int], list[int]] = defaultdict(list)
    for index, (*_, phash) in enumerate(images):
        if phash:
            value = int(phash, 16)
            for band in range(bands):
                shift = band * width
                mask = (1 << (64 - shift if band == bands - 1 else width)) - 1
                buckets[(band, (value >> shift) & mask)].append(index)
    near_pairs: dict[tuple[int, int], int] = {}
    for members in buckets.values():
        for i, a in enumerate(members):
            for b in members[i + 1 :]:
                pair = (min(a, b), max(a, b))
                if pair in exact_pairs or pair in near_pairs or images[a][0] == images[b][0]:
                    continue
                distance = hamming(images[a][4], images[b][4])
                if distance <= max_distance:
                    near_pairs[pair] = distance
    for (a, b), kind, distance in [(p, "exact", 0) for p in sorted(exact_pairs)] + [
        (p, "near", d) for p, d in sorted(near_pairs.items())
    ]:
        for x, y in ((a, b), (b, a)):
            rows.append(
                {
                    "pmcid": images[x][0],
                    "fig_id": images[x][1],
                    "image_file": images[x][2],
                    "kind": kind,
                    "other_pmcid": images[y][0],
                    "other_fig_id": images[y][1],
                    "other_image_file": images[y][2],
                    "distance": distance,
                }
            )
    return rows
