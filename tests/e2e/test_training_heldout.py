"""The held-out filter as OpenCLIP's trainer meets it: the ``pipe:`` URLs of a filtered subset read
by webdataset the way ``open_clip_train.data`` reads ``--train-data`` (each URL a Python process
streaming one shard), and a real OpenCLIP run on them. The tiny release and its split (PMC2 held
out) are the fast tier's, read by hand there (tests/unit/test_training_heldout.py)."""

import math
from pathlib import Path

import pytest
import webdataset as wds

from pipelines.core.heldout import HeldoutSplit, record_split
from pipelines.core.lake import Lake, dataset_dir
from pipelines.training.clip import resolve_data, train
from tests.e2e.test_clip_training import tiny_config, write_tiny_model
from tests.unit.test_training_heldout import FIGURES, KEPT, RELEASE, _write


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> tuple[str, str]:
    """(the figure subset's folder, the recorded split's path: PMC2 held out)."""
    lake = Lake(tmp_path_factory.mktemp("heldout") / "lake")
    folder = _write(Path(dataset_dir(lake, RELEASE, "commercial")), FIGURES)
    return folder, record_split(lake, HeldoutSplit(RELEASE, 0.3, "chosen-by-hand", frozenset({"PMC2"}), 3))


def test_openclips_reader_gets_the_kept_samples_through_the_pipe_urls(release, tmp_path):
    from open_clip_train.data import expand_urls

    folder, path = release
    data = resolve_data(tiny_config(tmp_path, Path(folder), "-", heldout=path))
    urls, _ = expand_urls(data.patterns[0])  # OpenCLIP's own expansion of --train-data
    assert len(urls) == 2 and all(u.startswith("pipe:") for u in urls)
    pipeline = wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples())
    assert [s["__key__"] for s in pipeline] == KEPT["figure"]  # PMC1-fig1, PMC1-fig2, PMC3-fig1


def test_openclip_trains_on_the_filtered_stream(release, tmp_path):
    folder, path = release
    model = write_tiny_model(tmp_path / "tiny")
    report = train(tiny_config(model, Path(folder), str(tmp_path / "run"), heldout=path, batch_size=3))
    assert report["samples_per_epoch"] == 3 and report["heldout_samples_excluded"] == 2
    assert report["heldout"] == path and report["train_data"].startswith("pipe:")
    assert report["epochs"] == 1 and math.isfinite(report["final_loss"])
