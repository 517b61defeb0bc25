"""The panel detector through a Ray Data actor pool (a local Ray) gives what in-process inference
gives, and bad images become error rows. (The detector in this process: tests/unit/test_detector.py.)"""

import numpy as np
from PIL import Image

from pipelines.core.lake import Lake
from pipelines.panels.detector import Detector, decode_and_detect, detect_images
from tests.panel_fixtures import write_tar
from tests.unit.test_detector import FIGURES, SYNTHETIC, _png


def test_ray_actor_pool_equals_in_process_and_bad_images_are_rows(tmp_path, local_ray):
    lake = Lake(tmp_path / "lake")
    good = [p.read_bytes() for p in FIGURES] + [_png(Image.new("RGBA", (90, 300), (0, 0, 0, 0)))]
    truncated = good[0][:300]
    members = [("PMC1/fig1.jpg", good[0]), ("PMC1/broken.jpg", truncated), ("PMC2/fig2.jpg", good[1])]
    members += [("PMC2/doc.pdf", b"%PDF-1.4 not an image"), ("PMC3/fig3.jpg", good[2]), ("PMC3/alpha.png", good[3])]
    refs = write_tar(tmp_path / "lake", "raw/release=2025/shard=00/part-00000.tar", members)
    for i, ref in enumerate(refs):
        ref.update(pmcid=ref["image_file"].split("/")[0], fig_id=None if i == 3 else f"F{i}", sha256=str(i))
    rows = detect_images(lake, refs, SYNTHETIC, batch_size=2, actors=1)
    assert [r["image_file"] for r in rows] == [m for m, _ in members]
    assert rows[1]["error"].startswith("unreadable image") and rows[3]["error"].startswith("not an image")
    assert rows[1]["panels"] == [] and rows[3]["label_boxes"] == [] and rows[3]["fig_id"] is None
    local = decode_and_detect(Detector(SYNTHETIC), [d for _, d in members], batch_size=2)
    assert isinstance(local[1], str) and isinstance(local[3], str)
    for row, expected in zip(rows, local, strict=True):
        if isinstance(expected, str):
            continue
        assert row["error"] is None and (row["width"], row["height"]) in [
            (600, 994),
            (600, 970),
            (600, 1170),
            (90, 300),
        ]
        for got, want in ((row["panels"], expected.panels), (row["label_boxes"], expected.label_boxes)):
            assert [p.box for p in got] == [p.box for p in want]
            assert np.allclose([p.score for p in got], [p.score for p in want], atol=1e-5)
