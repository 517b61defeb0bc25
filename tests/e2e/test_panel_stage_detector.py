"""The panel stage with the synthetic DAB-DETR, which runs in a Ray Data actor pool (a local Ray):
candidates go to the detector and are recorded; a rerun of the next release carries every image
and other settings look again. (The layout-only panel stage: tests/stages/test_panel_stage.py.)"""

import pytest

from pipelines.core.panel_methods import CONSENSUS, DECISION
from pipelines.core.stage import Partition
from pipelines.panels.stages import PanelSettings, PanelStage
from testing.pipeline import sample_lake
from tests.helpers import SHARDS
from tests.stages.test_panel_stage import RELEASE, TINY, _rows


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    """The sample release split into panels without a detector (the figure decision), every shard (as
    test_layout_only_run_on_the_sample leaves the module's lake in tests/stages/test_panel_stage.py)."""
    lake = sample_lake(tmp_path_factory.mktemp("panels"), RELEASE)
    for shard in SHARDS:
        PanelStage(PanelSettings()).run(lake, Partition(RELEASE, shard))
    return lake


def test_a_rerun_of_the_next_release_carries_every_image(lake, tmp_path, local_ray):
    import shutil

    for table in ("figures", "raw_files", "panel_figures", "panels"):
        for shard in SHARDS:
            src = lake.table_path(table, RELEASE, shard)
            dst = lake.table_path(table, "2027", shard)
            if table in ("figures", "raw_files"):
                import os

                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copyfile(src, dst)
    results = {s: PanelStage(PanelSettings()).run(lake, Partition("2027", s)) for s in SHARDS}
    assert sum(r.skipped for r in results.values()) == 128 and sum(r.ok for r in results.values()) == 0
    key = ("pmcid", "image_file", "panel_index", "x1", "y1", "x2", "y2", "method")
    old = sorted(tuple(p[k] for k in key) for p in _rows(lake, "panels"))
    new = sorted(tuple(p[k] for k in key) for p in _rows(lake, "panels", "2027"))
    assert new == old
    # a rerun of a partition carries its own rows too (the one reuse rule)
    again = PanelStage(PanelSettings()).run(lake, Partition("2027", SHARDS[1]))
    assert again.skipped == again.items and again.ok == 0
    # other settings (a detector now) are not carried: every image is looked at again
    changed = PanelStage(PanelSettings(detector=TINY, prefer=DECISION)).run(lake, Partition("2027", SHARDS[0]))
    assert changed.skipped == 0


def test_a_synthetic_detector_runs_on_candidates_and_is_recorded(lake, local_ray):
    shard = SHARDS[1]
    lines: list[str] = []
    result = PanelStage(PanelSettings(detector=TINY, prefer=DECISION)).run(
        lake, Partition(RELEASE, shard), lines.append
    )
    figures = lake.read_table("panel_figures", RELEASE, shard).to_pylist()
    candidates = [f for f in figures if f["n_detr"] is not None]
    n = len(candidates)
    # the run log hears of the detector (the shard is one batch of the loop), then of the loop's end
    assert any(line.startswith(f"panel detection done: {n}/{n} images (100%)") for line in lines)
    assert lines[-1].startswith(f"panels {RELEASE}|{shard} done: {len(figures)}/{len(figures)} figures (100%)")
    expected = [f for f in figures if f["reason"] is None or f["n_xycut"] >= 2 or f["caption_labels"] >= 2]
    assert result.counts["sent_to_detector"] == len(candidates) > 0
    assert all(f["n_xycut"] >= 2 or f["caption_labels"] >= 2 for f in candidates)
    assert len(candidates) <= len(expected)
    for f in candidates:
        assert f["model"] == "synthetic-tiny-dab-detr" and f["synthetic"] and f["threshold"] == 0.0
        assert f["agreement"] is not None and f["method"] in (DECISION, CONSENSUS)


def test_a_killed_detector_run_resumes_from_its_checkpoints(lake, tmp_path, monkeypatch, local_ray):
    """The model-stage loop's checkpoints on the detector path: a run killed in its second batch
    keeps the first batch's figures, and the rerun sends none of them to the detector again and
    writes the tables an uninterrupted run in one batch writes."""
    import shutil

    from pipelines.core.lake import Lake
    from pipelines.panels import stages

    settings = PanelSettings(detector=TINY, prefer=DECISION, figures_per_batch=16)
    # 28 figure images, two batches; 20 go to the detector, so each batch sends some (at most 8
    # of a batch's figures do not); a shard no other test here runs the detector on
    shard = SHARDS[2]
    partition = Partition(RELEASE, shard)
    whole = Lake(shutil.copytree(lake.root, tmp_path / "whole"))
    PanelStage(PanelSettings(detector=TINY, prefer=DECISION)).run(whole, partition)  # one batch, never killed
    real, sent = stages.detect, []

    def killed_in_the_second_batch(lake, figures, settings):
        if sent:
            raise KeyboardInterrupt("killed")
        sent.append(len(figures))
        return real(lake, figures, settings)

    monkeypatch.setattr(stages, "detect", killed_in_the_second_batch)
    stage = PanelStage(settings)
    stage.checkpoint_every = 16
    with pytest.raises(KeyboardInterrupt):
        stage.run(lake, partition)
    monkeypatch.setattr(stages, "detect", real)
    result = PanelStage(settings).run(lake, partition)
    assert result.counts["resumed"] == 16 and result.counts["carried"] == 0
    detected = [f for f in whole.read_table("panel_figures", RELEASE, shard).to_pylist() if f["n_detr"] is not None]
    assert sent[0] + result.counts["sent_to_detector"] == len(detected) > sent[0] > 0
    for table in ("panel_figures", "panels", "panel_captions"):
        assert lake.read_table(table, RELEASE, shard).to_pylist() == whole.read_table(table, RELEASE, shard).to_pylist()
    assert not lake.exists(lake.path("checkpoints", "panels", f"release={RELEASE}", f"shard={shard}"))
