"""Review material for annotators: one contact sheet per cluster, an HTML index, CSV templates.

Each cluster's sheet shows a seeded random sample of up to 30 of its images (the same images
on every rerun), so annotators of one release see the same thing.
"""

from __future__ import annotations

import hashlib
import html
import io
from collections import defaultdict

from PIL import Image, ImageDraw

from pipelines.core.lake import Lake
from pipelines.core.rawstore import read_raw_file
from pipelines.images.decode import decode_image

SHEET_SIZE, THUMB, COLUMNS = 30, 160, 6


def seeded_sample(members: list[dict], size: int, seed: int) -> list[dict]:
    """``size`` members chosen by a keyed hash of their sha256: stable across reruns and order."""

    def score(m: dict) -> bytes:
        return hashlib.blake2b(f"{seed}:{m['sha256']}:{m['image_file']}".encode(), digest_size=8).digest()

    return sorted(members, key=score)[:size]


def contact_sheet(lake: Lake, cluster_id: int, members: list[dict], total: int) -> bytes:
    rows = max(1, -(-len(members) // COLUMNS))
    sheet = Image.new("RGB", (COLUMNS * THUMB, rows * THUMB + 28), "white")
    draw = ImageDraw.Draw(sheet)
    draw.text((6, 6), f"cluster {cluster_id}: {len(members)} of {total} images", fill="black")
    for i, member in enumerate(members):
        image, error = decode_image(read_raw_file(lake, member))
        x, y = (i % COLUMNS) * THUMB, 28 + (i // COLUMNS) * THUMB
        if image is None:
            draw.text((x + 6, y + 6), f"undecodable\n{error[:40]}", fill="red")
            continue
        image.thumbnail((THUMB - 8, THUMB - 8))
        sheet.paste(image, (x + 4 + (THUMB - 8 - image.width) // 2, y + 4 + (THUMB - 8 - image.height) // 2))
    out = io.BytesIO()
    sheet.save(out, "PNG", optimize=True)
    return out.getvalue()


def index_html(version: str, clusters: dict[int, list[dict]], sizes: dict[int, int]) -> str:
    rows = []
    for cluster in sorted(clusters):
        examples = ", ".join(html.escape(f"{m['pmcid']} {m['fig_id'] or ''}") for m in clusters[cluster][:5])
        rows.append(
            f"<tr><td id='c{cluster}'>{cluster}</td><td>{sizes[cluster]}</td>"
            f"<td><a href='cluster_{cluster:04d}.png'><img src='cluster_{cluster:04d}.png' width='480'></a></td>"
            f"<td>{examples}</td></tr>"
        )
    return (
        "<!doctype html><meta charset='utf-8'><title>PanelForge concept review " + html.escape(version) + "</title>"
        "<style>body{font-family:sans-serif}td{vertical-align:top;padding:4px}</style>"
        f"<h1>Concept model {html.escape(version)}: {len(clusters)} clusters</h1>"
        "<p>Fill one <code>annotations_template.csv</code> per annotator (panel type, global concept, "
        "local concepts separated by ';'), leave its <code>model_version</code> and <code>fingerprint</code> "
        "columns as they are, and put the files in the annotations folder.</p>"
        "<table><tr><th>cluster</th><th>images</th><th>sample</th><th>examples</th></tr>" + "".join(rows) + "</table>"
    )


def group_members(rows: list[dict]) -> dict[int, list[dict]]:
    grouped: dict[int, list[dict]] = defaultdict(list)
    for row in rows:
        grouped[row["cluster_id"]].append(row)
    return grouped
