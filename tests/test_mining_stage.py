"""The mining stage on the sample release: pairs at three levels, costs, reuse, bad answers, outages.

The model is scripted here (answers written by hand, per prompt) so that what the stage makes
of an answer can be checked by hand; the last test runs the tiny real Qwen2.5-VL end to end.

The figure most tests look at is PMC900000002 ``469032v1_figs7`` (bioRxiv 2021.11.17.469032,
CC BY), 1280x691: panel A (two MRI slices, an asterisk on the left hippocampus at about
(447, 178)) over panel B. The layout splitter's panels are A = (182, 3, 1090, 342) and
B = (7, 352, 1273, 688); the caption splits as "a. T1-weighted structural MRI scan showing the
right medial temporal lobe (left; hippocampus indicated by *) ..." and "b. (left) The grey
matter/white matter ...".
"""

from __future__ import annotations

import json

import pytest

from pipelines.mining import prompts
from pipelines.mining.stages import (
    BOXES_INSIDE,
    CANARY,
    EXTRACTIVE,
    PARSE_FAILURES,
    MiningSettings,
    MiningStage,
)
from pipelines.panels.stages import PanelSettings, PanelStage
from pipelines.stage import Partition, StageInputError
from pipelines.vlm.engine import EngineConfig, Sampling, VlmOutage, VlmRequest
from testing.pipeline import sample_lake
from testing.vlm import ScriptedEngine

RELEASE, SHARD = "2026", "002"
FIGURE = ("PMC900000002", "469032v1_figs7")
CANARY_ANSWER = json.dumps({"canary": prompts.CANARY_TOKEN})
# Panel A's crop is 908x339; the processor's frame for it is 896x336 (smart_resize, factor 28:
# round(339/28)=12 -> 336, round(908/28)=32 -> 896; 301,056 pixels lie inside the default band).
# The hippocampus around the asterisk, in the frame: (225, 146)-(324, 200), i.e. in the crop
# x * 908/896, y * 339/336 = (228.0, 147.3)-(328.3, 201.8), in the figure + (182, 3).
REGION_ANSWER = '{"regions": [{"bbox_2d": [225, 146, 324, 200]}]}'


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    lake = sample_lake(tmp_path_factory.mktemp("mining"), RELEASE)
    PanelStage(PanelSettings()).run(lake, Partition(RELEASE, SHARD))
    return lake


def scripted(overrides: dict[str, str] | None = None) -> ScriptedEngine:
    """A model that answers every prompt sensibly and briefly (``overrides`` by prompt name)."""
    answers = {
        "canary": CANARY_ANSWER,
        "panels": '{"panels": []}',
        "associate": '{"panels": []}',
        "describe_panel": '{"description": "Two MRI slices."}',
        "locate_region": '{"regions": []}',
        "describe_region": '{"description": "The hippocampus."}',
        **(overrides or {}),
    }

    def answer(request: VlmRequest) -> str:
        name = prompts.name_of(request.prompt)
        if name == "locate_region" and "indicated by *" in request.prompt:
            return REGION_ANSWER
        return answers[name]

    return ScriptedEngine(answer)


def _pairs(lake) -> list[dict]:
    return lake.read_table("pairs", RELEASE, SHARD).to_pylist()


def _figures(lake) -> dict[tuple[str, str], dict]:
    return {(r["pmcid"], r["image_file"]): r for r in lake.read_table("mining_figures", RELEASE, SHARD).to_pylist()}


def _run(lake, engine, **settings):
    return MiningStage(engine, MiningSettings(som_views=1, **settings)).run(lake, Partition(RELEASE, SHARD))


def test_pairs_at_three_levels_for_a_figure_read_by_hand(lake):
    result = _run(lake, scripted())
    pairs = [p for p in _pairs(lake) if (p["pmcid"], p["image_file"]) == FIGURE]
    by_level = {level: [p for p in pairs if p["level"] == level] for level in ("global", "panel", "region")}

    (whole,) = by_level["global"]
    assert (whole["x1"], whole["y1"], whole["x2"], whole["y2"]) == (0, 0, 1280, 691)
    assert whole["text"].startswith(
        "Adjustment of grey matter/white matter interface underlying the hippocampus. a. T1"
    )
    assert whole["text_source"] == "caption"

    a, b = sorted(by_level["panel"], key=lambda p: p["panel_index"])
    assert (a["x1"], a["y1"], a["x2"], a["y2"]) == (182, 3, 1090, 342)
    assert (b["x1"], b["y1"], b["x2"], b["y2"]) == (7, 352, 1273, 688)
    assert a["text"].startswith("T1-weighted structural MRI scan showing the right medial temporal lobe")
    assert b["text"].startswith("(left) The grey matter/white matter (gm-wm) interface")
    assert {a["text_source"], b["text_source"]} == {"caption_split"} and a["extractive"] and b["extractive"]
    assert a["description"] == "Two MRI slices." and a["pair_id"] == "PMC900000002/469032v1_figs7/p000"

    regions = [p for p in by_level["region"] if p["panel_index"] == 0]
    assert len(regions) == 1, regions
    (region,) = regions
    # the model's box, mapped back and moved into the figure: (410, 150)-(510, 205), kept because
    # the asterisk at about (447, 178) lies within tau of its centre
    assert abs(region["x1"] - 410) <= 2 and abs(region["y1"] - 150) <= 2
    assert abs(region["x2"] - 510) <= 2 and abs(region["y2"] - 205) <= 2
    assert region["marker"] == "asterisk" and region["region_source"] == "caption+marker"
    assert "hippocampus indicated by *" in region["text"] and region["extractive"]
    assert region["frame_box"] == [225, 146, 324, 200] and (region["frame_width"], region["frame_height"]) == (896, 336)
    assert region["description"] == "The hippocampus."

    for pair in pairs:
        assert pair["model"] == "scripted" and pair["prompt_version"] == prompts.PROMPT_VERSION
        assert pair["backend"] == "scripted" and pair["synthetic"] is True

    checks = {c.name: c for c in result.checks}
    assert checks[BOXES_INSIDE].passed and checks[EXTRACTIVE].passed and checks[CANARY].passed
    assert result.counts["pairs_global"] == result.counts["images"] == result.ok
    figure = _figures(lake)[FIGURE]
    assert figure["status"] == "mined" and "regions" in figure["prefilter"] and "som" in figure["prefilter"]
    assert figure["vlm_requests"] > 0 and figure["n_regions"] >= 1


def test_a_rerun_redoes_nothing_and_a_new_model_mines_again(lake):
    _run(lake, scripted())
    before = sorted(_pairs(lake), key=lambda p: p["pair_id"])
    engine = scripted()
    result = _run(lake, engine)
    assert engine.requests == [] and result.ok == 0 and result.skipped == result.counts["images"]
    assert sorted(_pairs(lake), key=lambda p: p["pair_id"]) == before
    assert {f["status"] for f in _figures(lake).values()} == {"carried"}

    other = scripted()
    other.config = EngineConfig(model="scripted-v2", synthetic=True)
    result = _run(lake, other)
    assert result.skipped == 0 and other.requests
    assert {p["model"] for p in _pairs(lake)} == {"scripted-v2"}


def test_garbage_answers_are_reasons_not_failures(lake):
    engine = scripted(
        {
            "panels": "Sorry, I cannot see any panels.",
            "describe_panel": '{"description": ',
            "locate_region": "```json\n[garbage",
            "describe_region": "no",
        }
    )
    result = _run(lake, engine)
    figure = _figures(lake)[FIGURE]
    assert figure["status"] == "mined" and result.error == 0
    assert any(r.startswith("panels: view 0") for r in figure["reasons"])
    assert figure["parse_failures"] >= 3
    # the caption-derived pairs do not depend on the model
    panels = [p for p in _pairs(lake) if (p["pmcid"], p["image_file"]) == FIGURE and p["level"] == "panel"]
    assert len(panels) == 2 and all(p["description"] is None and p["text"] for p in panels)
    assert not {c.name: c for c in result.checks}[PARSE_FAILURES].passed


def test_an_engine_that_ignores_schemas_is_refused_before_mining(lake):
    engine = scripted({"canary": "Hello!"})
    with pytest.raises(StageInputError, match="structured outputs are not applied"):
        _run(lake, engine)
    assert all(prompts.name_of(r.prompt) == "canary" for r in engine.requests)


def test_an_outage_fails_the_run_and_writes_nothing(tmp_path):
    lake = sample_lake(tmp_path, RELEASE)
    PanelStage(PanelSettings()).run(lake, Partition(RELEASE, SHARD))

    class Down(ScriptedEngine):
        """The server answers the canary, then goes away."""

        def generate(self, requests):
            if any(prompts.name_of(r.prompt) != "canary" for r in requests):
                raise VlmOutage("connection refused")
            return super().generate(requests)

    with pytest.raises(VlmOutage):
        _run(lake, Down(lambda r: CANARY_ANSWER))
    assert lake.read_table("pairs", RELEASE, SHARD) is None
    assert lake.read_table("mining_figures", RELEASE, SHARD) is None


def test_the_tiny_real_model_end_to_end(lake, tmp_path_factory):
    from pipelines.vlm.hf import TransformersEngine
    from pipelines.vlm.tiny import tiny_model_dir

    model = tiny_model_dir(tmp_path_factory.mktemp("vlm"))
    config = EngineConfig(
        model=str(model),
        synthetic=True,
        dtype="float32",
        min_pixels=64 * 28 * 28,
        max_pixels=256 * 28 * 28,
        sampling=Sampling(max_tokens=24),
    )
    with TransformersEngine(config, device="cpu", batch_size=8) as engine:
        result = MiningStage(engine, MiningSettings(som_views=2, figures_per_batch=8)).run(
            lake, Partition(RELEASE, SHARD)
        )
    pairs = _pairs(lake)
    assert result.error == 0 and result.counts["pairs_global"] == result.counts["images"]
    assert all(p["synthetic"] and p["backend"] == "transformers" for p in pairs)
    assert {c.name: c for c in result.checks}[CANARY].passed
    assert {c.name: c for c in result.checks}[BOXES_INSIDE].passed
    assert result.counts["prompt_tokens"] > 0 and result.counts["vlm_requests"] > 0
