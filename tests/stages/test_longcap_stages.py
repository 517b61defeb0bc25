"""The long-caption and hard-negative stages on a lake: what they read, what they write, reruns."""

from __future__ import annotations

import os

import pytest

from pipelines.core.lake import Lake
from pipelines.core.schemas import TABLES, Table
from pipelines.core.stage import Partition, StageInputError
from pipelines.longcap.stages import NEGATIVES_DIFFER, NegativesStage

RELEASE, SHARD = "2026", "000"


def _pair(pair_id: str, level: str, text: str | None) -> dict:
    row = dict.fromkeys(TABLES[Table.PAIRS].names)
    row.update(pair_id=pair_id, pmcid="PMC1", image_file="f1.png", level=level, x1=0, y1=0, x2=10, y2=10, text=text)
    return row


def test_negatives_for_region_pairs_only(tmp_path):
    lake = Lake(tmp_path / "lake")
    lake.write_table(
        Table.PAIRS,
        RELEASE,
        SHARD,
        [
            _pair("PMC1/f1.png", "global", "The left ventricle is dilated."),
            _pair("PMC1/f1.png/p000", "panel", "The left ventricle is dilated."),
            _pair("PMC1/f1.png/p000/r00", "region", "arrows indicate the dilated left ventricle"),
            _pair("PMC1/f1.png/p000/r01", "region", None),  # a lone marker's region: no text to negate
        ],
    )
    result = NegativesStage().run(lake, Partition(RELEASE, SHARD))
    rows = lake.read_table(Table.PAIR_NEGATIVES, RELEASE, SHARD).to_pylist()
    assert {r["pair_id"] for r in rows} == {"PMC1/f1.png/p000/r00"}
    by_kind = {r["perturbation"]: r for r in rows}
    # read by hand: "left" is the laterality, "dilated" the size
    assert by_kind["laterality"]["text"] == "arrows indicate the dilated right ventricle"
    assert (by_kind["laterality"]["original_span"], by_kind["laterality"]["replacement"]) == ("left", "right")
    assert by_kind["size"]["original_span"] == "dilated" and "left ventricle" in by_kind["size"]["text"]
    assert all(r["source"] == "rule" for r in rows)
    assert [r["negative_index"] for r in rows] == list(range(len(rows)))
    assert result.ok == 1 and result.counts["region_pairs"] == 1
    assert {c.name: c.passed for c in result.checks} == {NEGATIVES_DIFFER: True}
    # what it wrote, counted: the sizes of the partition's two files (the negatives and the per-pair items)
    files = [lake.table_path(t, RELEASE, SHARD) for t in (Table.PAIR_NEGATIVES, Table.NEGATIVE_ITEMS)]
    assert result.bytes == sum(os.path.getsize(f) for f in files) and all(os.path.getsize(f) > 0 for f in files)


def test_negatives_need_pairs(tmp_path):
    with pytest.raises(StageInputError, match="materialize `pairs` first"):
        NegativesStage().run(Lake(tmp_path / "lake"), Partition(RELEASE, SHARD))


# ---- long captions ------------------------------------------------------------------------------
# eLife 43154 (CC BY), author response image 1, PMC900000008 `resp-fig1.jpg` (600x296), shard 001.
# Caption (title + text): "Role of sickle cell in case definitions of SMA and CM. Sickle cell mutations
# will increase the likelihood of anaemia and are presumed protective against CM." The article defines
# "severe malarial anaemia (SMA)" and "cerebral malaria (CM)"; the paragraph citing the figure says it
# is "an extension of Figure 1 in our paper to include a vertex for sickle cell status".

LC_SHARD = "001"
FIGURE = ("PMC900000008", "resp-fig1.jpg")
CAPTION = (
    "Role of sickle cell in case definitions of SMA and CM. Sickle cell mutations will increase the "
    "likelihood of anaemia and are presumed protective against CM."
)
REFINED = (
    "Role of sickle cell in case definitions of severe malarial anaemia (SMA) and cerebral malaria (CM). "
    "Sickle cell mutations will increase the likelihood of anaemia and are presumed protective against CM. "
    "The causal diagram extends Figure 1 with a vertex for sickle cell status."
)


@pytest.fixture(scope="module")
def parsed_lake(tmp_path_factory):
    from testing.pipeline import sample_lake

    return sample_lake(tmp_path_factory.mktemp("longcap"), RELEASE)


def _answer(long_caption: str, verdict: str = "FEASIBLE", acronyms=None) -> str:
    import json

    features = [
        {
            "text": "sickle cell status is a vertex of the causal diagram",
            "source": "context",
            "visual": True,
            "status": "SUPPORTED",
        }
    ]
    acronyms = acronyms if acronyms is not None else [{"short": "SMA", "long": "severe malarial anaemia"}]
    return json.dumps({"features": features, "verdict": verdict, "long_caption": long_caption, "acronyms": acronyms})


def _longcap(lake, answer_for_figure: str, model: str, budget: int = 512):
    import json as _json

    from pipelines.longcap.prompts import LONGCAP
    from pipelines.longcap.stages import LongCapSettings, LongCapStage
    from pipelines.vlm.engine import EngineConfig
    from pipelines.vlm.prompts import CANARY_TOKEN
    from testing.vlm import ScriptedEngine

    def answer(request):
        if request.schema is not None and "canary" in request.schema.get("properties", {}):
            return _json.dumps({"canary": CANARY_TOKEN})
        assert request.schema == LONGCAP.schema
        if request.id.startswith("PMC900000008/resp-fig1.jpg|"):
            return answer_for_figure
        return _answer("irrelevant", verdict="NOT_FEASIBLE")

    engine = ScriptedEngine(answer, EngineConfig(model=model, synthetic=True))
    stage = LongCapStage(engine, LongCapSettings(tokenizer="tiny", budget=budget, context_budget=400))
    lines: list[str] = []
    result = stage.run(lake, Partition(RELEASE, LC_SHARD), progress=lines.append)
    rows = {
        (r["pmcid"], r["image_file"]): r for r in lake.read_table(Table.LONG_CAPTIONS, RELEASE, LC_SHARD).to_pylist()
    }
    return result, rows, engine, lines


def test_a_refinement_that_only_adds_context_is_kept(parsed_lake):
    result, rows, engine, lines = _longcap(parsed_lake, _answer(REFINED), "scripted-a")
    row = rows[FIGURE]
    assert row["caption"] == CAPTION and row["status"] == "refined" and row["long_caption"] == REFINED
    # the tiny tokenizer: one token per word or punctuation mark, plus two: 12 + 16 + 2
    assert row["tokens_before"] == 30 and row["tokens_after"] > row["tokens_before"] and row["gained_context"]
    assert "mentions" in row["context_sources"] and row["verdict"] == "FEASIBLE" and not row["cut"]
    acronyms = __import__("json").loads(row["acronyms"])
    assert acronyms["SMA"] == {"long": "severe malarial anaemia", "source": "article"}
    assert acronyms["CM"] == {"long": "cerebral malaria", "source": "article"}
    assert row["model"] == "scripted-a" and row["synthetic"] is True and row["tokenizer"]
    # the run log's last line counts every figure sent to the model (the fallbacks and this one)
    sent = [r for r in rows.values() if r["status"] in ("refined", "fallback")]
    assert lines[-1].startswith(f"long captions {RELEASE}|{LC_SHARD} done: {len(sent)}/{len(sent)} figures (100%)")
    others = [r for k, r in rows.items() if k != FIGURE and r["status"] == "fallback"]
    assert others and all(
        r["long_caption"] == r["caption"] and r["reason"] == "model verdict: NOT_FEASIBLE" for r in others
    )
    assert "token_lengths" in result.counts

    again, _, engine, _ = _longcap(parsed_lake, _answer(REFINED), "scripted-a")
    assert engine.requests == [] and again.skipped == again.counts["images"]


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (_answer(REFINED.replace("a vertex", "37.5 mg of a vertex")), "number not in sources: 37.5 mg"),
        (
            _answer(REFINED, acronyms=[{"short": "SMA", "long": "sickle malaria anaemia"}]),
            "acronym SMA expanded as 'sickle malaria anaemia'",
        ),
        (_answer(REFINED, verdict="NOT_FEASIBLE"), None),
        ("I think this figure shows a diagram.", None),
    ],
)
def test_what_the_guards_reject_falls_back_to_the_caption(parsed_lake, answer, why):
    _, rows, _, _ = _longcap(parsed_lake, answer, f"scripted-{hash(answer) % 10_000}")
    row = rows[FIGURE]
    assert row["status"] == "fallback" and row["long_caption"] == CAPTION and not row["gained_context"]
    if why:
        assert any(f.startswith(why) for f in row["guard_failures"]), row["guard_failures"]
    else:
        assert row["reason"].startswith(("model verdict: NOT_FEASIBLE", "unusable answer"))


def test_a_refinement_over_budget_never_ships_shorter_than_the_caption(parsed_lake):
    """REFINED is 21 + 16 + 14 + 2 = 53 tiny tokens (its first sentence expands SMA and CM: 21); the
    caption is 30. At 38 tokens, dropping the added third sentence still leaves 39: the caption
    ships whole (a cut at sentence boundaries would have shipped the first sentence alone, 23)."""
    _, rows, _, _ = _longcap(parsed_lake, _answer(REFINED), "scripted-budget-38", budget=38)
    row = rows[FIGURE]
    assert (row["status"], row["long_caption"], row["cut"]) == ("fallback", CAPTION, False)
    assert (row["tokens_before"], row["tokens_after"]) == (30, 30) and not row["gained_context"]
    assert row["reason"] == (
        "the refinement is 53 tokens, over the 38-token budget, and its added context cannot be cut without "
        "cutting the caption"
    )
    # at 40 the added sentence goes and both caption sentences stay: 21 + 16 + 2 = 39
    _, rows, _, _ = _longcap(parsed_lake, _answer(REFINED), "scripted-budget-40", budget=40)
    row = rows[FIGURE]
    assert (row["status"], row["cut"], row["tokens_after"]) == ("refined", True, 39)
    assert row["long_caption"] == REFINED.rsplit(" The causal", 1)[0] and row["gained_context"]


def test_long_captions_made_under_the_old_budget_rule_are_not_reused(monkeypatch):
    """Rows cut by the old rule (the caption itself truncated) must be recomputed, not carried: the
    stage's version is part of every row's fingerprint."""
    from pipelines.longcap import stages
    from testing.vlm import ScriptedEngine

    engine = ScriptedEngine(lambda request: "")
    assert stages.LongCapStage.version == stages.LONGCAP_VERSION == "2"
    now = stages.LongCapStage(engine).settings_fingerprint()
    monkeypatch.setattr(stages.LongCapStage, "version", "1")
    assert stages.LongCapStage(engine).settings_fingerprint() != now


def test_progress_counts_each_figure_as_its_answer_returns(parsed_lake, monkeypatch):
    """The run log said "0/15 figures (0%)" for minutes: progress advanced only when a whole batch
    of figures (``figures_per_batch``) was back from the model. Now each answer counts as it
    returns: when the model is asked about the k-th figure of the batch, k-1 are counted done."""
    import pipelines.model_stage as model_stage  # the loop of every model stage keeps the progress
    from pipelines.core.stage import Progress
    from pipelines.longcap.prompts import LONGCAP
    from pipelines.longcap.stages import LongCapSettings, LongCapStage
    from pipelines.vlm.engine import EngineConfig
    from pipelines.vlm.prompts import CANARY_TOKEN
    from testing.vlm import ScriptedEngine

    made: list[Progress] = []

    class Watched(Progress):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(model_stage, "Progress", Watched)
    seen: list[tuple[int, int]] = []  # (figures counted done, figures asked) when a figure is asked

    def answer(request):
        if request.schema is not None and "canary" in request.schema.get("properties", {}):
            return __import__("json").dumps({"canary": CANARY_TOKEN})
        assert request.schema == LONGCAP.schema
        seen.append((made[-1].done, len(seen)))
        return _answer("irrelevant", verdict="NOT_FEASIBLE")

    engine = ScriptedEngine(answer, EngineConfig(model="scripted-progress", synthetic=True))
    settings = LongCapSettings(tokenizer="tiny", budget=512, context_budget=400, figures_per_batch=64)
    LongCapStage(engine, settings).run(parsed_lake, Partition(RELEASE, LC_SHARD), progress=[].append)
    total = made[-1].total
    assert 2 < total <= settings.figures_per_batch  # one batch holds every figure of the shard
    assert seen == [(k, k) for k in range(total)]  # before: [(0, 0), (0, 1), ...], all counted at the end
    assert made[-1].done == total
