"""The synthetic compound-figure generator: reproducibility, geometry, labels, COCO output,
train/val de-duplication, licences, and that the pixels at a box are the source's."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipelines.core.rawstore import add_member
from pipelines.core.schemas import TABLES
from pipelines.panels.synthetic import (
    PANEL,
    PANEL_LABEL,
    GeneratorConfig,
    SourceCache,
    SourcePanel,
    count_panels,
    format_layout,
    generate_sample,
    label_texts,
    parse_layout,
    sample_seed,
    source_panels,
    write_coco_dataset,
)

ROOT = Path(__file__).resolve().parents[2]
REAL = [  # single-panel figures of the sample (sample/articles/FIGURES.csv, layout_observed = single)
    "scielo-hoehnea-49-e1112020/2236-8906-hoehnea-49-e1112020-gf1.jpg",
    "scielo-hoehnea-49-e1112020/2236-8906-hoehnea-49-e1112020-gf2.jpg",
    "elife-52882/fig2-figsupp1.jpg",
    "pone.0091296/g007.png",
]
CLEAN = GeneratorConfig(
    label_prob=0.0, distractor_prob=0.0, inset_prob=0.0, double_jpeg_prob=0.0, downscale_prob=0.0, jpeg_quality=(95, 95)
)


def drawing(seed: int, size=(160, 120), fmt="PNG") -> bytes:
    """A smooth, distinct test image: a colour gradient and a few filled rectangles."""
    rng = np.random.default_rng(seed)
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    base = rng.uniform(0, 255, 3)
    slope = rng.uniform(-1.5, 1.5, (3, 2))
    pixels = np.stack([base[c] + slope[c, 0] * x + slope[c, 1] * y for c in range(3)], axis=-1)
    for _ in range(4):
        x0, y0 = rng.integers(0, w - 20), rng.integers(0, h - 20)
        pixels[y0 : y0 + rng.integers(10, 40), x0 : x0 + rng.integers(10, 40)] = rng.uniform(0, 255, 3)
    out = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(
        out, fmt, **({"quality": 92} if fmt == "JPEG" else {})
    )
    return out.getvalue()


@pytest.fixture(scope="module")
def sources() -> list[SourcePanel]:
    made = [SourcePanel(f"draw/{i}", drawing(i, (120 + 30 * i, 90 + 17 * i)), "CC BY", "commercial") for i in range(6)]
    real = [SourcePanel(p, (ROOT / "sample/articles" / p).read_bytes(), "CC BY 4.0", "commercial") for p in REAL]
    return made + real


def decode(jpeg: bytes) -> Image.Image:
    return Image.open(io.BytesIO(jpeg)).convert("RGB")


def test_same_seed_same_bytes_in_any_order(sources):
    in_order = [generate_sample(sources, 11, i, cache=SourceCache()) for i in range(6)]
    alone = generate_sample(sources, 11, 4)  # its own cache, generated after others
    backwards = [generate_sample(sources, 11, i) for i in reversed(range(6))][::-1]
    assert alone.jpeg == in_order[4].jpeg
    assert (alone.panels, alone.labels, alone.layout) == (in_order[4].panels, in_order[4].labels, in_order[4].layout)
    assert [s.jpeg for s in backwards] == [s.jpeg for s in in_order]
    assert alone.seed == sample_seed(11, "train", 4)
    assert generate_sample(sources, 12, 4).jpeg != alone.jpeg
    assert generate_sample(sources, 11, 4, split="val").jpeg != alone.jpeg
    assert len({s.jpeg for s in in_order}) == 6


def _inside(box, outer, tolerance=0.02) -> bool:
    x, y, w, h = box
    ox, oy, ow, oh = outer
    return x >= ox - tolerance and y >= oy - tolerance and x + w <= ox + ow + tolerance and y + h <= oy + oh + tolerance


def _intersection(a, b) -> float:
    dx = min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0])
    dy = min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1])
    return max(0.0, dx) * max(0.0, dy)


def test_boxes_inside_image_no_overlap_except_insets_labels_by_their_panel(sources):
    config = GeneratorConfig(inset_prob=0.3, distractor_prob=0.6)
    seen_insets = seen_outside = seen_inside = 0
    for index in range(40):
        sample = generate_sample(sources, 3, index, config=config)
        image = decode(sample.jpeg)
        assert image.size == (sample.width, sample.height)
        whole = (0, 0, sample.width, sample.height)
        hosts = [p for p in sample.panels if not p["inset"]]
        assert len(hosts) == count_panels(sample.layout["spec"])[0]
        for p in sample.panels:
            assert _inside(p["bbox"], whole), (index, p)
            assert p["bbox"][2] >= 1 and p["bbox"][3] >= 1
        for i, a in enumerate(hosts):
            for b in hosts[i + 1 :]:
                assert _intersection(a["bbox"], b["bbox"]) < 0.01, (index, a, b)  # touching at most
        for p in sample.panels:
            if p["inset"]:
                seen_insets += 1
                assert _inside(p["bbox"], sample.panels[p["parent"]]["bbox"])
        for label in sample.labels:
            panel = sample.panels[label["panel"]]["bbox"]
            assert _inside(label["bbox"], whole)
            assert sample.panels[label["panel"]]["label_text"] == label["label_text"]
            if sample.layout["label_placement"].startswith("inside"):
                seen_inside += 1
                assert _inside(label["bbox"], panel)
            else:  # outside: next to its panel (within one label size), on no other panel
                seen_outside += 1
                x, y, w, h = label["bbox"]
                reach = max(w, h) * 1.5
                assert _inside(
                    label["bbox"], (panel[0] - reach, panel[1] - reach, panel[2] + 2 * reach, panel[3] + 2 * reach)
                )
                assert all(_intersection(label["bbox"], other["bbox"]) < 0.01 for other in hosts)  # may touch
    assert seen_insets and seen_outside and seen_inside  # the 40 samples exercised every case


@pytest.mark.parametrize(
    ("spec", "panels", "insets"),
    [
        ("R[C[P,P,P],C[P,P]]", 5, 0),  # rows with different column counts
        ("R[P,C[P,P]]", 3, 0),  # the first panel spans two columns
        ("C[P,R[P,P]]", 3, 0),  # the first panel spans two rows
        ("R[C[P,R[P,P],P],C[P,P]]", 6, 0),  # a nested cell
        ("C[Pi,P]", 3, 1),  # an inset is a panel too
        ("P", 1, 0),
    ],
)
def test_panels_per_layout_match_the_spec(sources, spec, panels, insets):
    assert count_panels(spec) == (panels - insets, insets)
    assert format_layout(parse_layout(spec)) == spec
    config = GeneratorConfig(width=(900, 900), downscale_prob=0.0)
    for index in range(3):
        sample = generate_sample(sources, 5, index, config=config, layout=spec)
        assert len(sample.panels) == panels
        assert sum(p["inset"] for p in sample.panels) == insets
        assert sample.layout["spec"] == spec and sample.layout["kind"] == "given"
        if sample.layout["labels"]:
            assert len(sample.labels) == panels - insets  # insets carry no label here


def test_spanning_and_rows_geometry(sources):
    sample = generate_sample(sources, 1, 0, config=CLEAN, layout="R[P,C[P,P]]", picks=[0, 1, 2])
    top, left, right = (p["bbox"] for p in sample.panels)
    assert top[1] + top[3] <= left[1] and top[1] + top[3] <= right[1]  # both below the spanning panel
    assert left[0] + left[2] <= right[0]  # side by side
    assert [p["source_key"] for p in sample.panels] == ["draw/0", "draw/1", "draw/2"]


def test_label_texts_in_pmc_styles():
    three = parse_layout("R[P,C[P,P]]")
    assert label_texts(three, "alnum", "({})") == [("(A)", "A"), ("(B1)", "B1"), ("(B2)", "B2")]
    assert label_texts(three, "roman", "{}.") == [("i.", "i"), ("ii.", "ii"), ("iii.", "iii")]
    assert label_texts(three, "lower", "{})") == [("a)", "a"), ("b)", "b"), ("c)", "c")]
    assert label_texts(three, "digit", "{}") == [("1", "1"), ("2", "2"), ("3", "3")]
    many = parse_layout("C[" + ",".join(["P"] * 28) + "]")
    assert [core for _, core in label_texts(many, "upper", "{}")][25:] == ["Z", "AA", "AB"]
    with pytest.raises(ValueError):
        parse_layout("R[P,C[P]")
    with pytest.raises(ValueError):
        parse_layout("X")


def test_source_pixels_are_at_the_annotated_box(sources):
    for picks in ([0, 7], [8, 3]):  # a drawing and a real figure each way round
        sample = generate_sample(sources, 9, 0, config=CLEAN, layout="C[P,P]", picks=picks)
        image = np.asarray(decode(sample.jpeg), dtype=float)
        for panel, pick in zip(sample.panels, picks, strict=True):
            x, y, w, h = (round(v) for v in panel["bbox"])
            crop = image[y : y + h, x : x + w]
            source = Image.open(io.BytesIO(sources[pick].read())).convert("RGB")
            expected = np.asarray(source.resize((w, h), Image.Resampling.BICUBIC), dtype=float)
            other = sources[picks[0] if pick != picks[0] else picks[1]]
            wrong = np.asarray(
                Image.open(io.BytesIO(other.read())).convert("RGB").resize((w, h), Image.Resampling.BICUBIC),
                dtype=float,
            )
            error = np.abs(crop - expected).mean()
            assert error < 6, (pick, error)  # JPEG at quality 95 and resampling only
            assert np.abs(crop - wrong).mean() > 3 * error  # the check can tell sources apart
            shifted = image[y + 4 : y + h + 4, x + 4 : x + w + 4]
            if shifted.shape == crop.shape:
                assert np.abs(shifted - expected).mean() > error  # the box is where the pixels are


def test_writes_coco_that_pycocotools_loads(tmp_path, sources):
    from pycocotools.coco import COCO

    summary = write_coco_dataset(tmp_path / "ds", sources, n=12, seed=21, split=0.25)
    assert summary["splits"]["train"]["images"] == 9 and summary["splits"]["val"]["images"] == 3
    for split, n_images in (("train", 9), ("val", 3)):
        folder = tmp_path / "ds" / split
        coco = COCO(str(folder / "annotations.json"))
        assert sorted(coco.getCatIds()) == [PANEL, PANEL_LABEL]
        assert [c["name"] for c in coco.loadCats([PANEL, PANEL_LABEL])] == ["panel", "panel_label"]
        assert len(coco.getImgIds()) == n_images
        data = json.loads((folder / "annotations.json").read_text())
        assert data["info"]["seed"] == 21 and data["info"]["version"].startswith("panelforge-synthetic/")
        assert data["info"]["counts"]["images"] == n_images
        assert data["info"]["counts"]["panels"] == len(coco.getAnnIds(catIds=[PANEL]))
        assert data["info"]["counts"]["labels"] == len(coco.getAnnIds(catIds=[PANEL_LABEL]))
        assert set(data["info"]["fonts"]) <= {
            "DejaVuSans", "DejaVuSans-Bold", "DejaVuSerif", "DejaVuSerif-Bold",
            "DejaVuSansMono", "DejaVuSansMono-Bold", "STIXGeneral", "STIXGeneral-Bold",
        }  # fmt: skip
        listed = {s["key"]: s for s in json.loads((folder / "sources.json").read_text())}
        for image in coco.loadImgs(coco.getImgIds()):
            with Image.open(folder / "images" / image["file_name"]) as on_disk:
                assert on_disk.size == (image["width"], image["height"]) and on_disk.format == "JPEG"
            assert image["seed"] == sample_seed(21, split, image["id"] - 1)
            for ann in coco.loadAnns(coco.getAnnIds(imgIds=[image["id"]])):
                assert ann["iscrowd"] == 0 and ann["area"] == pytest.approx(ann["bbox"][2] * ann["bbox"][3], abs=0.01)
                if ann["category_id"] == PANEL:
                    assert listed[ann["source_key"]]["license_code"] == ann["license_code"]
                else:
                    assert coco.anns[ann["panel_id"]]["category_id"] == PANEL
        # regenerating one image alone gives the same bytes as the written file
        image = coco.loadImgs([2])[0]
        pool = [s for s in sources if s.key in listed]
        pool.sort(key=lambda s: [x.key for x in sources].index(s.key))
        assert generate_sample(pool, 21, 1, split).jpeg == (folder / "images" / image["file_name"]).read_bytes()
    everything = json.loads((tmp_path / "ds" / "sources.json").read_text())
    assert len(everything) == len(sources) and all(s["license_code"] for s in everything)


def test_written_coco_is_what_training_and_evaluation_read(tmp_path, sources):
    """``file_name`` is relative to ``images/`` (COCO), as ``train.CocoDataset`` and
    ``coco_eval.evaluate_detector`` open it."""
    from pipelines.panels.coco_eval import evaluate_detector
    from pipelines.panels.detector import Classes, DetectorConfig
    from pipelines.panels.train import CocoDataset

    write_coco_dataset(tmp_path / "ds", sources, n=4, seed=3, split=0.25)
    train = CocoDataset(str(tmp_path / "ds" / "train"), 64, Classes(panel=0, label=1))
    pixels, frame, classes, boxes = train[0]
    assert pixels.shape == (64, 64, 3) and len(classes) == len(boxes) > 0
    metrics = evaluate_detector(DetectorConfig(synthetic=True, input_size=64), str(tmp_path / "ds" / "val"))
    assert metrics["images"] == 1


def test_near_duplicate_sources_end_in_one_split_only(tmp_path):
    distinct = [SourcePanel(f"d{i}", drawing(100 + i), "CC BY", "commercial") for i in range(6)]
    pairs = []
    for i in range(8):  # the same drawing as PNG and re-encoded as JPEG: near duplicates
        png, jpeg = drawing(200 + i, fmt="PNG"), drawing(200 + i, fmt="JPEG")
        pairs.append((f"p{i}-png", f"p{i}-jpeg"))
        distinct += [
            SourcePanel(f"p{i}-png", png, "CC BY", "commercial"),
            SourcePanel(f"p{i}-jpeg", jpeg, "CC0", "commercial"),
        ]
    summary = write_coco_dataset(tmp_path / "ds", distinct, n=4, seed=2, split=0.5)
    split_of = {s["key"]: s["split"] for s in json.loads((tmp_path / "ds" / "sources.json").read_text())}
    for a, b in pairs:
        assert {split_of[a], split_of[b]} in ({"train"}, {"val"}, {"train", "dropped"}), (a, b, split_of)
    dropped = [k for k, v in split_of.items() if v == "dropped"]
    assert summary["dedup"]["dropped_near_duplicates"] == len(dropped) >= 1  # seed 2 sends some pairs apart
    assert all(k.startswith("p") for k in dropped)  # the distinct drawings are never near one another
    val_keys = {s["key"] for s in json.loads((tmp_path / "ds" / "val" / "sources.json").read_text())}
    assert not set(dropped) & val_keys


def _row(table: str, **values) -> dict:
    return {name: None for name in TABLES[table].names} | values


def test_source_panels_from_the_lake_pick_single_panels_and_licences(lake):
    images = {name: drawing(i) for i, name in enumerate(["a.png", "b.png", "c.png", "d.png"])}
    tar_rel = "raw/release=2025/shard=00/part-00000.tar"
    path = Path(lake.path(tar_rel))
    path.parent.mkdir(parents=True)
    raw = []
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for pmcid, names in (("PMC1", ["a.png", "b.png", "c.png"]), ("PMC2", ["d.png"])):
            for name in names:
                offset = add_member(tar, f"{pmcid}/{name}", io.BytesIO(images[name]), len(images[name]))
                raw.append(
                    _row("raw_files", pmcid=pmcid, version=1, name=name, kind="image", tar_path=tar_rel)
                    | {"offset": offset, "size": len(images[name]), "md5": "", "sha256": ""}
                )
    lake.write_table("raw_files", "2025", "00", raw)
    lake.write_table(
        "articles",
        "2025",
        "00",
        [
            _row("articles", pmcid="PMC1", license_code="CC BY", license_group="commercial", parse_status="ok"),
            _row("articles", pmcid="PMC2", license_code="CC BY-NC", license_group="noncommercial", parse_status="ok"),
        ],
    )
    figures = [("PMC1", "f1", "a.png"), ("PMC1", "f2", "b.png"), ("PMC1", "f3", "c.png"), ("PMC2", "g1", "d.png")]
    lake.write_table(
        "figures",
        "2025",
        "00",
        [_row("figures", pmcid=p, fig_id=f, image_files=[n], phash=["00000000000000ff"]) for p, f, n in figures],
    )
    concepts = [
        ("PMC1", "f1", "a.png", "single panel"),
        ("PMC1", "f2", "b.png", "multiple panels with biomedical imaging and plots"),
    ]
    concepts.append(("PMC2", "g1", "d.png", "single panel"))  # c.png is not labelled
    lake.write_table(
        "figure_concepts",
        "2025",
        "00",
        [
            _row("figure_concepts", pmcid=p, fig_id=f, image_file=n, panel_type=t, label_status="labeled")
            for p, f, n, t in concepts
        ],
    )
    every = {s.key: s for s in source_panels(lake, "2025", ["00"], commercial_only=False)}
    assert sorted(every) == ["PMC1/a.png", "PMC2/d.png"]
    assert every["PMC2/d.png"].license_group == "noncommercial" and every["PMC2/d.png"].license_code == "CC BY-NC"
    assert every["PMC1/a.png"].read() == images["a.png"] and every["PMC1/a.png"].phash == "00000000000000ff"
    commercial = [s.key for s in source_panels(lake, "2025", ["00"], commercial_only=True)]
    assert commercial == ["PMC1/a.png"]
    checked = []
    with_check = [
        s.key for s in source_panels(lake, "2025", ["00"], True, is_single=lambda im: checked.append(im.size) or True)
    ]
    assert with_check == ["PMC1/a.png", "PMC1/c.png"]  # the unlabelled figure, by the layout check
    assert checked == [(160, 120)]  # only the unlabelled image was decoded for the check
    assert [s.key for s in source_panels(lake, "2025", ["00"], True, is_single=lambda im: False)] == ["PMC1/a.png"]
