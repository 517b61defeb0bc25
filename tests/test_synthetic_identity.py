"""The synthetic generator's output, pinned byte for byte.

Restructuring the generator (issue 21: one module per seam) must not change a single sample, or
every detector trained since stops being reproducible from its recorded seed. This test draws 30
samples (several seeds, both splits, the default settings, a clean and a busy configuration, fixed
layouts, each label placement) and writes one small COCO dataset (train + val, with a
near-duplicate source that de-duplication drops), and compares the SHA-256 of every JPEG, of every
sample's annotations and of every written file with the digests below.

These digests are not expectations derived by hand: they were computed by the generator as it was
before the split (one ``pipelines/panels/synthetic.py``, commit recorded in the history of this
file), with the pinned Pillow and matplotlib (its fonts). A change that is meant to alter the output
bumps ``GENERATOR_VERSION`` and rewrites them: ``python -m tests.test_synthetic_identity``.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import PIL
from PIL import Image

from pipelines.panels.synthetic import GeneratorConfig, SourceCache, SourcePanel, generate_sample, write_coco_dataset

ROOT = Path(__file__).resolve().parent.parent
# The inputs live here, not shared with test_synthetic.py: the digests pin them as much as the code.
REAL = [  # single-panel figures of the sample (sample/articles/FIGURES.csv, layout_observed = single)
    "scielo-hoehnea-49-e1112020/2236-8906-hoehnea-49-e1112020-gf1.jpg",
    "scielo-hoehnea-49-e1112020/2236-8906-hoehnea-49-e1112020-gf2.jpg",
    "elife-52882/fig2-figsupp1.jpg",
    "pone.0091296/g007.png",
    "elife-43154/fig1.jpg",
    "elife-19405/elife-19405-inf1.tif",
]
CLEAN = GeneratorConfig(
    label_prob=0.0, distractor_prob=0.0, inset_prob=0.0, double_jpeg_prob=0.0, downscale_prob=0.0, jpeg_quality=(95, 95)
)
BUSY = GeneratorConfig(
    inset_prob=0.5, distractor_prob=1.0, label_prob=1.0, double_jpeg_prob=1.0, downscale_prob=1.0, max_panels=8
)


def _drawing(seed: int, size: tuple[int, int]) -> bytes:
    """A smooth, distinct PNG: a colour gradient and a few filled rectangles."""
    rng = np.random.default_rng(seed)
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    base, slope = rng.uniform(0, 255, 3), rng.uniform(-1.5, 1.5, (3, 2))
    pixels = np.stack([base[c] + slope[c, 0] * x + slope[c, 1] * y for c in range(3)], axis=-1)
    for _ in range(4):
        x0, y0 = rng.integers(0, w - 20), rng.integers(0, h - 20)
        pixels[y0 : y0 + rng.integers(10, 40), x0 : x0 + rng.integers(10, 40)] = rng.uniform(0, 255, 3)
    out = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(out, "PNG")
    return out.getvalue()


def sources() -> list[SourcePanel]:
    real = [SourcePanel(p, (ROOT / "sample/articles" / p).read_bytes(), "CC BY 4.0", "commercial") for p in REAL]
    drawn = [SourcePanel(f"draw/{i}", _drawing(i, (140 + 40 * i, 100 + 23 * i)), "CC0", "commercial") for i in range(3)]
    copy = io.BytesIO()  # a re-encoded copy of a real figure: a near duplicate under another key
    Image.open(io.BytesIO(real[2].read())).convert("RGB").save(copy, "JPEG", quality=80)
    duplicate = SourcePanel("reposted/fig2-figsupp1.jpg", copy.getvalue(), "CC BY-NC 4.0", "noncommercial")
    return real + drawn + [duplicate]


def _placed(placement: str, box_style: str) -> GeneratorConfig:
    return replace(GeneratorConfig(), label_prob=1.0, placements=((placement, 1.0),), box_styles=((box_style, 1.0),))


CASES: list[tuple[str, dict]] = [
    *[(f"default-s0-train-{i}", {"seed": 0, "index": i}) for i in range(9)],
    *[(f"default-s2024-val-{i}", {"seed": 2024, "index": i, "split": "val"}) for i in range(5)],
    *[(f"clean-s3-{i}", {"seed": 3, "index": i, "config": CLEAN}) for i in range(3)],
    *[(f"busy-s5-{i}", {"seed": 5, "index": i, "config": BUSY}) for i in range(6)],
    ("layout-rows", {"seed": 9, "index": 0, "layout": "R[C[P,P,P],C[P,P]]", "picks": [0, 1, 2, 3, 4]}),
    ("layout-insets", {"seed": 9, "index": 1, "layout": "C[Pi,R[P,Pi]]", "picks": [5, 6, 7]}),
    ("layout-spanning", {"seed": 9, "index": 2, "layout": "R[Pi,C[P,P]]", "config": BUSY}),
    ("outside-left", {"seed": 11, "index": 0, "layout": "C[P,P,P]", "config": _placed("outside_left", "plain")}),
    (
        "outside-above",
        {"seed": 11, "index": 1, "layout": "R[C[P,P],C[P,P]]", "config": _placed("outside_above", "plain")},
    ),
    ("inside-br-black", {"seed": 11, "index": 2, "layout": "C[P,R[P,P]]", "config": _placed("inside_br", "black_box")}),
    ("inside-tr-white", {"seed": 11, "index": 3, "layout": "R[P,P]", "config": _placed("inside_tr", "white_box")}),
]
TIMINGS = ("seconds", "images_per_second")  # summary.json's wall-clock figures, the only bytes that vary


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sample_digests(panels: list[SourcePanel]) -> dict[str, list[str]]:
    """Per case: the JPEG's digest and that of the annotations (every field of the sample)."""
    cache, out = SourceCache(), {}
    for name, kwargs in CASES:
        sample = generate_sample(panels, cache=cache, **kwargs)
        annotations = {
            "width": sample.width,
            "height": sample.height,
            "seed": sample.seed,
            "layout": sample.layout,
            "panels": sample.panels,
            "labels": sample.labels,
            "fonts": sorted(sample.fonts),
            "degradation": sample.degradation,
        }
        out[name] = [_sha(sample.jpeg), _sha(json.dumps(annotations, sort_keys=True).encode())]
    return out


def coco_digests(panels: list[SourcePanel], folder: Path) -> dict[str, str]:
    """Per written file (path relative to the dataset): its digest; ``summary.json`` without timings."""
    write_coco_dataset(folder, panels, 12, seed=4, split=0.25)
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.name == "summary.json":
            summary = json.loads(data)
            for part in (summary, *summary["splits"].values()):
                for key in TIMINGS:
                    part.pop(key)
            data = json.dumps(summary, sort_keys=True).encode()
        out[path.relative_to(folder).as_posix()] = _sha(data)
    return out


RECORDED_WITH = {"pillow": "13.0.0", "matplotlib": "3.11.2"}
SAMPLES = {
    "default-s0-train-0": [
        "047cb751183b6c7144eb610df9fcb95e1f6c5697274740dd86e0364c99c39fd6",
        "be2b0c271247bee9aefbd91bdc2ebe15edbde8ea75771074eee727d898e70fba",
    ],
    "default-s0-train-1": [
        "aeec7490538a07a220db0f89515d07bfd39b8bda624d503478a6568242a68c10",
        "8259fcbcc2e73200a3cbf1dd64edc27317a5047f946d8e86a7db44897ee36b96",
    ],
    "default-s0-train-2": [
        "30a543c79820776a46b6afaccaf2a20f6b6ef44c33390aeab5fb47bb9f0ce7b7",
        "eb63d58f190cb5b1fb21e42d522a3803aad447661553bb2ae686f698e8ba25b1",
    ],
    "default-s0-train-3": [
        "66d5e3792c17875323ddb77fd8e2f9afb824f0bba11be181b8e3ca1be7e9f586",
        "c71c74fe9e611b32738ca3de6093fbe3ca34053733b5be493250d4a43874c501",
    ],
    "default-s0-train-4": [
        "8f04539f0a11360e6b63deacdb5b9d5142be1aa112c9d7bd7fdc9b47c3b78fb4",
        "9842784c29e732c5618677d69c71ebbda6aa7bb64d594be8037d63f04f26facf",
    ],
    "default-s0-train-5": [
        "d45bb704c8dc2c2caea4e1294a4e2e5309fd680235682e0154ac64ce36a1a812",
        "c494bb30896828835984c64772c4e3bde7ec3314559160a729ec65d45523dafb",
    ],
    "default-s0-train-6": [
        "cac7d775b7b18e423ba3665779408f6ad173da4eb7188f611791db16ab45c4b9",
        "0b3db2ef3c3ad90552e5d395bb94effdf687bd4659fc6ed17b2430b96bfc6ec3",
    ],
    "default-s0-train-7": [
        "6b9b6311942f84ce982e3b61f78ef879ce6695642f351fdab609f90611ad0423",
        "f408b73806c8f14528b2c070260104713a67c9a3e5fbc331d65fec169bbda2fa",
    ],
    "default-s0-train-8": [
        "516016cae81ed3e76ad73038193eab1625b9712abe09a0c658dfce351d91854f",
        "fd65369e7dc14ca9c5c7f4e660ab92e2d525131047b3e42bff7e6a44ab7664b1",
    ],
    "default-s2024-val-0": [
        "df82ffe60cb1a00f4dc3dba95e5f36a2014fa96aec4a0e030107e1ca1b12d274",
        "3447c1286e1473abf7606e2eacdb80bf0b675478553958eb8f8758f7fc62acdd",
    ],
    "default-s2024-val-1": [
        "9a1c1fcf2f37154e8befa03317b59b9bf70fd0cae0b340c52174f573dc8a05f1",
        "acd6093d937939d6ee8b758ad593f965736c2495bb67b08d4c9694e7d084fdce",
    ],
    "default-s2024-val-2": [
        "7a09f31b7527d9aa85c2fc302c8ea1eda69c37766932dba6e8c8b78184133370",
        "ffdc1bc28fe5a8b23f49b7dc813207be4dc8902c6adbdcabb6e852b17e9399ab",
    ],
    "default-s2024-val-3": [
        "76ae56d4d4354e364689a96007494d015399760950238732de916d6c6e7f15a3",
        "c2a12b25ce40aacf64a5ff2369b58d73be30856d3d36918d0109742859cb03c0",
    ],
    "default-s2024-val-4": [
        "4eb90bedee41b4eee3d63a7ee1c57ae1e0c1897c8c947fc91213ba658255627e",
        "82caa70850fd4d3c1a37edfa2db2a27a4e53858b40351ed9d9d34491e37a24a9",
    ],
    "clean-s3-0": [
        "f93e264e6585781cb5d7cb689cd6437280281ffd0a4436f3870050190e1a50dd",
        "2bf535bcb3c8572f5f066429902ed015798932542146202bea42db0a2a3c3b94",
    ],
    "clean-s3-1": [
        "1b3d6970e0141de98096124ef473d4448cb653b0ee1fc55bee25613a6bc2b496",
        "4f7eb8d44c9fc7c9c71634205e92791a3a00e8f0ebc8c3d625baac7baa8caa24",
    ],
    "clean-s3-2": [
        "a0f81afeb5bd5ddd0218ccb345383b5f5e8ab13cd0fe7721ed83dc0c66f35e48",
        "547ce4ebb7f81748727c8e3edf8a6f8c5ada1f2004776edd59fc5cce0b5f4acf",
    ],
    "busy-s5-0": [
        "12d5e3d69bfa14dec94bf8b96bbe84dadc62dcb5a56fe96e43eefd7fc1ca0e2f",
        "0c4b9b919f87a11d89b320659557c33447f56f9e915b782378a5180f9ba7fc30",
    ],
    "busy-s5-1": [
        "f9d6b134e8ea5ee33e7c2ff32c34e3a4d4b6d641aed66e5400fe9020f91bced8",
        "a682d2a5c7a21c6ebf46e10631d30c615c23460aef6461a2aea92b50439b3972",
    ],
    "busy-s5-2": [
        "d0c3c89ada0e39281bb254fd60b4d0f28b2b7e69b0b938a1544849e10371a882",
        "66d7eaad8ac26aa78178493917cbfca793e35b6016463b3f40c3f92f2dae8ab8",
    ],
    "busy-s5-3": [
        "e6d653f0d1b710ee22ef2e1fd1487fcc02b4f37514ff015f5ed5e972ed93ad44",
        "8f89422a5b00a895127fcef94781709e3309deecf3021d9f2c679a5966289d80",
    ],
    "busy-s5-4": [
        "e8d5a3228760aa7ca761d49a28924cb775550b9d49c7e7bcb3864863be962b4f",
        "3121ba447919825d0e60c091d8891cf48bf676f6501f9cfdd595555f72a9b506",
    ],
    "busy-s5-5": [
        "98eb157a824834d1dc01039c29139a4fe01a8d6cc9423877258b6d028576d475",
        "2bc3784c9393a556114057229258cd0dc9ba83242e5d3f70414113e69798c4ce",
    ],
    "layout-rows": [
        "c2606f254f172e2a59ef300d0853c37f7500ff7315f256eac82caf68d4f6effd",
        "4f8b5b72e01bac01518f9c647949aba2a29d62130a0d0a035da11c0b1b69414e",
    ],
    "layout-insets": [
        "daccf4c95d0fcaeb2f745c033b3f2ca152379ea8856486617f2d63edfd175f32",
        "c813c876177c58caef0491baadd57ce9d5388b35b804d7baa98d6e85ae1dc35a",
    ],
    "layout-spanning": [
        "759fa76258f89f1181a0ba10c128a637c69e5b7f59d1bdf707daa81cba77def7",
        "4fd833feb2d7a033ab7200085389b9a0fe751dcf447bc7230af4ae55fa3c9c56",
    ],
    "outside-left": [
        "23fcf4fdfcc09756e5a497844a1f6356c52089734b59f740c3b607cc86814978",
        "716cc9f4239b41a3c65ba8f2dc3d39c8f22ee305a845226745527726de2ef740",
    ],
    "outside-above": [
        "9afffd0ce395dda7d1490cb044f17db870d82f9296f821cca67618083fd4e9b8",
        "dd148110e7e0b4d3c643713a10a515414dad7c9c019db34635329a863306d6bf",
    ],
    "inside-br-black": [
        "4fdd0cb0bc695ccf62b2fdd74ad230f3e22aed4fec3b78e3174436a739b32935",
        "cdadc1d80e5d5e4deb8908fea8d9a4d65890410bd5b5c41ea7fe358f3f4b2685",
    ],
    "inside-tr-white": [
        "bec14cc04a989f4468575f9d7577553d45d65ea7433e6bfe2703d1f0aeeea695",
        "4931cff1d69d750b0a8d9517b5d5717bb065029941132203070f2608f227db8c",
    ],
}
COCO = {
    "sources.json": "7adbad1c7ed3e2de322f33d32526c61dc10d885389a65c9af3332e848001bb30",
    "summary.json": "f327bd38e8d853eef778688aa9e1966cf0f855883549933feaa6695390d32365",
    "train/annotations.json": "7e828bd24fbdbd0fdcc7fe99e709488cb9dc9049f71b5f8cc2a6401f46120f73",
    "train/images/00000001.jpg": "aa7269914a0d44403fb75d5271ba141ae98f28bba350cf1c06fea68bab201ade",
    "train/images/00000002.jpg": "9ef2251a45d5790d4db9c27eaca575db4128f1106eb02bddad28627fdefa42a4",
    "train/images/00000003.jpg": "fcffe876d6c2de499b0d0251a65cc21b94f90d046486eaa9e7a36ac14625af32",
    "train/images/00000004.jpg": "9536d3ad75b36c121604a3a2b741cf4080a6f34d91093cc7d7847ca75e35a4be",
    "train/images/00000005.jpg": "a916aff30b8645ffc540c2f9417045312bb4c77d34b5c9ce69e28449fde93ca2",
    "train/images/00000006.jpg": "54448dd4a20dcd8908efb27a68e1d1077d2a72d21535412797df2128fe4f9287",
    "train/images/00000007.jpg": "d49ca812fdedc465b8b07bca20b34b91e9b72b7571a4ac323c4bbe94fa4fc3a4",
    "train/images/00000008.jpg": "c6b0762c21ca677e31161f3536a70129f03ead854071484c09cd9337110153f8",
    "train/images/00000009.jpg": "3ad6f1b8ba11a6453b2234441d123a67737d37e6e86114e8c46b37ddc1edcded",
    "train/sources.json": "1d09d32983cdf91113d02a5c97295c654d250bd4c2615d858dbbd55016d2e172",
    "val/annotations.json": "7d7deeae9b15f915be1c07c16a5271c02a580de293dbd917d86ab3505d19671f",
    "val/images/00000001.jpg": "3209c447f9fe08edccc393c11b991f1e2566cc119f359efe1e3d160c0d94d75d",
    "val/images/00000002.jpg": "05f0b6ddb6384a3ff83de15c90649b8e807e794e648300509824ffdeeed6da62",
    "val/images/00000003.jpg": "1696bbb651bcc6be40010a40dd108e8f37c8719dc008bda7b3c6a11abbdf6ba7",
    "val/sources.json": "fd0b4b76f3bade96f27542335f4fe5674799046606c52e71eef548b87734ba0d",
}


def _versions() -> dict[str, str]:
    import matplotlib

    return {"pillow": PIL.__version__, "matplotlib": matplotlib.__version__}


def test_samples_are_byte_identical_to_the_recorded_generator():
    assert _versions() == RECORDED_WITH, "digests were recorded with other pins: rewrite them if the bytes differ"
    found = sample_digests(sources())
    changed = sorted(name for name in SAMPLES if found[name] != SAMPLES[name])
    assert len(found) == len(SAMPLES) == 30 and not changed, f"samples that changed: {changed}"


def test_coco_dataset_is_byte_identical_to_the_recorded_writer(tmp_path):
    found = coco_digests(sources(), tmp_path / "coco")
    assert sorted(found) == sorted(COCO)
    changed = sorted(name for name in COCO if found[name] != COCO[name])
    assert not changed, f"files that changed: {changed}"
    # the re-encoded copy fell in val and its original in train: the copy is dropped
    listing = {s["key"]: s["split"] for s in json.loads((tmp_path / "coco" / "sources.json").read_text())}
    assert listing["reposted/fig2-figsupp1.jpg"] == "dropped" and listing["elife-52882/fig2-figsupp1.jpg"] == "train"


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        panels = sources()
        print("SAMPLES =", json.dumps(sample_digests(panels), indent=4))
        print("COCO =", json.dumps(coco_digests(panels, Path(tmp) / "coco"), indent=4))
