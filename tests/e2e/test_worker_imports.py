"""What a fresh process imports for the steps that run in every shard's run or in every Ray Data
CPU task: a step that only counts tokens or resizes images must not pay for model libraries
(seconds of CPU and hundreds of MB each, in every process of a cluster). A subprocess each, as
the run workers and Ray workers are."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(code: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.split()


def test_counting_clip_tokens_does_not_import_open_clip():
    """The long captions' budget and the release statistics count CLIP BPE tokens; OpenCLIP's
    package (every model family, torchvision) cost 5.1 s of CPU and 880 MB there, against 2.0 s and
    655 MB for its tokenizer module alone (``pipelines.text.clip_bpe``)."""
    code = (
        "import sys; from pipelines.longcap.tokens import load_tokenizer; "
        "print(load_tokenizer('openclip', 77).count('a photo of a cat'), 'open_clip' in sys.modules)"
    )
    assert _run(code) == ["7", "False"]  # <start> a photo of a cat <end>


def test_the_embeddings_decode_task_imports_no_model_library(tmp_path):
    """The Ray Data CPU task that decodes, resizes and crops figures for DINOv2 gets the resize from
    the driver; loading DINOv2's processor there imported transformers and torch (6.3 s of CPU and
    900 MB per CPU worker). A 300 x 200 image: shortest edge to 256 (384 x 256), centre crop 224."""
    from PIL import Image

    Image.new("RGB", (300, 200), (200, 30, 30)).save(tmp_path / "figure.png")
    size = (tmp_path / "figure.png").stat().st_size
    code = f"""
import sys
from dataclasses import asdict
from pipelines.concepts.dinov2 import Resize
from pipelines.concepts.embed import _prepare_batch
batch = {{"tar_path": ["figure.png"], "offset": [0], "size": [{size}], "sha256": ["x"]}}
out = _prepare_batch(batch, {str(tmp_path)!r}, asdict(Resize()), False)
print(out["pixels"].shape, repr(out["error"][0]), out["pixels"][0, 112, 112].tolist())
print(sorted(m for m in ("torch", "transformers", "open_clip") if m in sys.modules))
"""
    assert _run(code) == ["(1,", "224,", "224,", "3)", "''", "[200,", "30,", "30]", "[]"]


def test_the_transformers_vlm_engine_does_not_load_inductor():
    """Every mining and long-caption run loads the transformers engine; its JSON-schema mask came
    from ``llguidance.torch``, whose import ``torch.compile``-decorates an applier the engine never
    calls and so loads Inductor (about 1.2 s of CPU a process). ``llguidance.numpy`` fills the
    same bitmask."""
    code = (
        "import sys; import pipelines.vlm.hf; "
        "print('llguidance.torch' in sys.modules, 'torch._inductor.compile_fx' in sys.modules)"
    )
    assert _run(code) == ["False", "False"]


def test_a_process_that_imports_pipelines_skips_the_last_collection_at_exit():
    """``pipelines`` freezes the garbage collector as its exit handler (0.5-1.9 s of CPU saved in
    every process that ends with torch or Dagster's definitions loaded). Handlers registered after
    the import still run first, with nothing frozen; one registered before it runs after the freeze."""
    code = (
        "import atexit, gc\n"
        "atexit.register(lambda: print('before-import', gc.get_freeze_count() > 0))\n"
        "import pipelines\n"
        "atexit.register(lambda: print('after-import', gc.get_freeze_count() == 0))\n"
    )
    assert _run(code) == ["after-import", "True", "before-import", "True"]
