"""The model-stage loop on the sample release: a killed run resumes where it stopped, tables
written together are published together, a copied lake reuses everything, and every request is
built from a prompt (issues 21 §2-3 and 23 §2, §4).

The engine is scripted (``testing.vlm``): it answers every prompt the same way, counts what it is
sent, and can die mid-run the way a killed process or a lost server does. Shard 000 of the sample
has 15 figure images, each with a caption; 12 of them get at least one request (compound figures,
split into panels, so Set-of-Mark and panel descriptions are asked). The three hoehnea-49 figures
(``gf1``-``gf3``) are single scatter charts with a legend below (looked at by hand), kept whole by
the panel decision, and their captions name no panel and no marker: nothing is asked about them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from pipelines.core.lake import Lake
from pipelines.core.schemas import TABLES, Table
from pipelines.core.stage import Partition
from pipelines.longcap.stages import LongCapSettings, LongCapStage, NegativesStage
from pipelines.mining.stages import MiningSettings, MiningStage
from pipelines.panels.stages import PanelSettings, PanelStage
from pipelines.vlm import prompts
from pipelines.vlm.engine import EngineConfig, VlmOutage, VlmRequest
from testing.vlm import ScriptedEngine

REPO = Path(__file__).resolve().parents[2]  # what the child processes import, whatever the cwd

RELEASE, SHARD = "2026", "000"
PARTITION = Partition(RELEASE, SHARD)
FIGURES = 15
ASKED = 12  # figures with at least one request (see the module docstring)
CANARY_ANSWER = json.dumps({"canary": prompts.CANARY_TOKEN})
ANSWERS = {
    "canary": CANARY_ANSWER,
    "panels": '{"panels": []}',
    "associate": '{"panels": []}',
    "describe_panel": '{"description": "A panel."}',
    "locate_region": '{"regions": []}',
    "describe_region": '{"description": "A region."}',
    "longcap": json.dumps({"features": [], "verdict": "NOT_FEASIBLE", "long_caption": "x", "acronyms": []}),
}


def paneled_lake(root: Path) -> Lake:
    """The sample release parsed, shard 000 split into panels: what the model stages read."""
    from testing.pipeline import sample_lake

    lake = sample_lake(root, RELEASE)
    PanelStage(PanelSettings()).run(lake, PARTITION)
    return lake


@pytest.fixture(scope="module")
def base_lake(tmp_path_factory) -> Lake:
    return paneled_lake(tmp_path_factory.mktemp("model-stages"))


def copy_of(lake: Lake, dest: Path) -> Lake:
    shutil.copytree(lake.root, dest)
    return Lake(dest)


class Counting(ScriptedEngine):
    """Answers every prompt from ANSWERS; dies (``die`` raised, as a lost server) on the first
    request of an item once ``die_after`` items have had requests."""

    def __init__(self, model: str = "scripted", die_after: int | None = None, die: Exception | None = None):
        super().__init__(lambda r: ANSWERS[r.prompt_name], EngineConfig(model=model, synthetic=True))
        self.die_after, self.die, self.owners = die_after, die, []

    def generate(self, requests):
        for request in requests:
            owner = request.id.split("|", 1)[0]
            if request.prompt_name != "canary" and owner not in self.owners:
                if self.die_after is not None and len(self.owners) >= self.die_after:
                    raise self.die or VlmOutage("the server went away")
                self.owners.append(owner)
        return super().generate(requests)

    def per_item(self) -> Counter:
        return Counter(r.id.split("|", 1)[0] for r in self.requests if r.prompt_name != "canary")


def mining(engine, batch: int = 2, **settings) -> MiningStage:
    stage = MiningStage(engine, MiningSettings(som_views=1, figures_per_batch=batch, **settings))
    stage.checkpoint_every = batch
    return stage


def rows(lake: Lake, table: str) -> list[dict]:
    return lake.read_table(table, RELEASE, SHARD).to_pylist()


def test_a_run_killed_after_some_figures_resumes_there_and_writes_what_an_uninterrupted_run_writes(base_lake, tmp_path):
    whole = copy_of(base_lake, tmp_path / "whole")
    uninterrupted = Counting()
    mining(uninterrupted).run(whole, PARTITION)
    assert len(uninterrupted.per_item()) == ASKED and all("/" in k for k in uninterrupted.per_item())

    killed = copy_of(base_lake, tmp_path / "killed")
    dying = Counting(die_after=5)  # batches of 2, a checkpoint after each: 4 figures saved, the 5th lost
    with pytest.raises(VlmOutage):
        mining(dying).run(killed, PARTITION)
    assert killed.read_table(Table.PAIRS, RELEASE, SHARD) is None  # nothing published
    parts = sorted(Path(killed.path("checkpoints", "pairs", f"release={RELEASE}", f"shard={SHARD}")).iterdir())
    assert len(parts) == 2  # two whole batches
    saved = {r["pmcid"] + "/" + r["image_file"] for p in parts for r in _parquet(p / "mining_figures.parquet")}
    assert len(saved) == 4 and saved == set(dying.owners[:4])

    rerun = Counting()
    result = mining(rerun).run(killed, PARTITION)
    # exactly the other 11 figures' requests, each figure's the same as in the uninterrupted run
    assert rerun.per_item() == Counter({k: n for k, n in uninterrupted.per_item().items() if k not in saved})
    assert result.counts["resumed"] == 4 and result.ok == FIGURES and result.skipped == 0
    assert rows(killed, Table.MINING_FIGURES) == rows(whole, Table.MINING_FIGURES)
    assert rows(killed, Table.PAIRS) == rows(whole, Table.PAIRS)
    # the final commit removed the checkpoints
    assert not os.path.exists(killed.path("checkpoints", "pairs", f"release={RELEASE}", f"shard={SHARD}"))


def _parquet(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def test_a_settings_change_killed_between_two_tables_publishes_neither(base_lake, tmp_path, monkeypatch):
    """Issue 23 §2: mining_figures written, then pairs: a kill between the two left new figure
    rows over old pairs, and the rerun carried every figure with the old pairs."""
    from pipelines.core import lake as lake_module

    lake = copy_of(base_lake, tmp_path / "lake")
    mining(Counting(), describe_panels=True).run(lake, PARTITION)
    before = (rows(lake, Table.MINING_FIGURES), rows(lake, Table.PAIRS))
    assert any(p["description"] for p in before[1])

    real = lake_module.Commit.write_table

    def dies_on_pairs(self, table, data, *args, **kwargs):
        if table == Table.PAIRS:
            raise KeyboardInterrupt("killed between the two tables")
        return real(self, table, data, *args, **kwargs)

    monkeypatch.setattr(lake_module.Commit, "write_table", dies_on_pairs)
    with pytest.raises(KeyboardInterrupt):
        mining(Counting(), describe_panels=False).run(lake, PARTITION)
    monkeypatch.setattr(lake_module.Commit, "write_table", real)
    assert (rows(lake, Table.MINING_FIGURES), rows(lake, Table.PAIRS)) == before  # the old set, whole

    result = mining(Counting(), describe_panels=False).run(lake, PARTITION)
    assert result.skipped == 0 and result.ok == FIGURES  # mined again: the new settings are new
    assert not any(p["description"] for p in rows(lake, Table.PAIRS))


def test_rows_of_two_tables_from_different_commits_are_not_reused(base_lake, tmp_path):
    lake = copy_of(base_lake, tmp_path / "lake")
    mining(Counting()).run(lake, PARTITION)
    # a table rewritten on its own (by hand, by an old version) no longer belongs with the other
    lake.write_table(Table.PAIRS, RELEASE, SHARD, rows(lake, Table.PAIRS))
    again = Counting()
    result = mining(again).run(lake, PARTITION)
    assert result.skipped == 0 and len(again.per_item()) == ASKED


def test_a_copied_lake_with_its_model_elsewhere_reuses_every_pair_and_long_caption(base_lake, tmp_path):
    """The model is a local directory inside the lake (as the demo's tiny model is): a copy of
    the lake, opened with the copy's model directory, recomputes nothing."""
    lake = copy_of(base_lake, tmp_path / "A" / "lake")
    model = Path(lake.path("models", "vlm", "scripted"))
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "qwen2_5_vl", "hidden_size": 16}')
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    settings = LongCapSettings(tokenizer="tiny", budget=512, context_budget=400)
    mining(Counting(str(model))).run(lake, PARTITION)
    LongCapStage(Counting(str(model)), settings).run(lake, PARTITION)
    NegativesStage(Counting(str(model))).run(lake, PARTITION)

    # provenance names the model by its directory and its content, never by a machine's path
    for table in (Table.PAIRS, Table.LONG_CAPTIONS):
        written = rows(lake, table)
        assert {(r["model"], r["model_revision"][:6]) for r in written} == {("local:scripted", "local:")}
        assert str(tmp_path) not in json.dumps(written, default=str)

    shutil.copytree(tmp_path / "A", tmp_path / "B")
    shutil.rmtree(tmp_path / "A")  # nothing can be read through the old paths
    copy = Lake(tmp_path / "B" / "lake")
    moved = copy.path("models", "vlm", "scripted")
    for stage in (
        mining(Counting(moved)),
        LongCapStage(Counting(moved), settings),
        NegativesStage(Counting(moved)),
    ):
        result = stage.run(copy, PARTITION)
        assert stage.engine.requests == [], stage.name  # not even the canary: nothing to ask
        assert result.counts["carried"] == result.items and result.ok == 0, stage.name

    # another model (its configuration differs) is another model
    other = Path(copy.path("models", "vlm", "other"))
    shutil.copytree(moved, other)
    (other / "config.json").write_text('{"model_type": "qwen2_5_vl", "hidden_size": 32}')
    engine = Counting(str(other))
    mining(engine).run(copy, PARTITION)
    assert len(engine.per_item()) == ASKED


def test_long_captions_resume_from_checkpoints(base_lake, tmp_path):
    settings = LongCapSettings(tokenizer="tiny", budget=512, context_budget=400, figures_per_batch=2)
    whole = copy_of(base_lake, tmp_path / "whole")
    uninterrupted = Counting()
    LongCapStage(uninterrupted, settings).run(whole, PARTITION)
    asked = uninterrupted.per_item()
    assert len(asked) >= 6

    lake = copy_of(base_lake, tmp_path / "killed")
    stage = LongCapStage(Counting(die_after=5), settings)
    stage.checkpoint_every = 2
    with pytest.raises(VlmOutage):
        stage.run(lake, PARTITION)
    rerun = Counting()
    result = LongCapStage(rerun, settings).run(lake, PARTITION)
    assert result.counts["resumed"] == 4 and sum(rerun.per_item().values()) == sum(asked.values()) - 4
    assert rows(lake, Table.LONG_CAPTIONS) == rows(whole, Table.LONG_CAPTIONS)


def _pairs_with_regions(lake: Lake, n: int) -> None:
    texts = ["arrows indicate the dilated left ventricle", "the red arrow marks the upper lobe", "three nuclei"]
    pairs = []
    for i in range(n):
        row = dict.fromkeys(TABLES[Table.PAIRS].names)
        row.update(pair_id=f"PMC1/f{i}.png/p000/r00", pmcid="PMC1", image_file=f"f{i}.png", level="region")
        row.update(x1=0, y1=0, x2=10, y2=10, text=f"{texts[i % 3]} ({i})")
        pairs.append(row)
    lake.write_table(Table.PAIRS, RELEASE, SHARD, pairs)


def test_the_negatives_vlm_path_is_a_model_stage(tmp_path):
    """Reuse, the canary, batches and checkpoints for VLM negatives, as for the other model stages."""
    ANSWERS["negatives"] = '{"negatives": []}'
    lake = Lake(tmp_path / "lake")
    _pairs_with_regions(lake, 7)
    dying = Counting(die_after=4)
    stage = NegativesStage(dying, batch_size=2)
    stage.checkpoint_every = 2
    with pytest.raises(VlmOutage):
        stage.run(lake, PARTITION)
    assert [r.prompt_name for r in dying.requests][0] == "canary"
    rerun = Counting()
    result = NegativesStage(rerun, batch_size=2).run(lake, PARTITION)
    assert result.counts["resumed"] == 4 and len(rerun.per_item()) == 3
    items = rows(lake, Table.NEGATIVE_ITEMS)
    assert len(items) == 7 and {r["status"] for r in items} == {"rules+vlm"}
    # a rerun asks nothing; rules alone (no engine) are another setting
    again = Counting()
    assert NegativesStage(again).run(lake, PARTITION).counts["carried"] == 7 and again.requests == []
    assert NegativesStage(None).run(lake, PARTITION).counts["carried"] == 0


def test_every_request_is_built_from_a_prompt():
    """No hand-built VlmRequest in the product: Prompt.request carries schema, budget, system
    text and prompt name together."""
    root = Path(__file__).resolve().parents[2] / "pipelines"
    found = [
        f"{path.relative_to(root)}:{n}"
        for path in root.rglob("*.py")
        if path.name not in ("engine.py", "prompt.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bVlmRequest\(", line)
    ]
    assert found == []
    request = prompts.LOCATE_REGION.request("k|locate_region|0.0", [], phrase="the arrow", marker="arrow")
    assert isinstance(request, VlmRequest) and request.system == prompts.SYSTEM
    assert (request.schema, request.max_tokens) == (prompts.LOCATE_REGION.schema, prompts.LOCATE_REGION.max_tokens)
    assert request.prompt_name == "locate_region" and 'says: "the arrow"' in request.prompt


def test_progress_moves_inside_a_batch(tmp_path, monkeypatch):
    """A stage that reports an item done while its batch runs moves the progress line then; the
    items it did not report are counted when the batch returns."""
    from dataclasses import dataclass

    from pipelines import model_stage
    from pipelines.core.stage import Progress
    from pipelines.model_stage import ModelStage, Outcome

    class Every(Progress):  # a line on every advance, not only every 30 seconds
        def advance(self, n: int = 1, **counts: int) -> None:
            super().advance(n, **counts)
            self.sink(self._line(self.clock()))

    monkeypatch.setattr(model_stage, "Progress", Every)
    seen_inside: list[str] = []

    @dataclass
    class Texts(ModelStage):
        engine: object = None
        batch_size: int = 3
        name = "texts"
        version = "1"
        table, child_table = Table.NEGATIVE_ITEMS, None
        unit = "texts"

        def hashed_settings(self):
            return {}

        def items(self, lake, partition):
            return [model_stage.Item(f"t{i}", f"fp{i}", i) for i in range(3)]

        def run_batch(self, items, engine, done):
            done()  # the first is finished while the other two still run
            seen_inside.append(lines[-1])
            return [Outcome(_item_row(i.key, i.fingerprint)) for i in items]

        def summarize(self, partition, run):
            return self.result(partition, ok=len(run.outcomes))

    lines: list[str] = []
    Texts().run(Lake(tmp_path / "lake"), PARTITION, progress=lines.append)
    assert len(seen_inside) == 1 and seen_inside[0].startswith("texts 2026|000 progress: 1/3 texts")
    assert [line.split(";")[0] for line in lines] == [
        "texts 2026|000 progress: 1/3 texts (33%)",
        "texts 2026|000 progress: 3/3 texts (100%), vlm_requests 0",
        "texts 2026|000 done: 3/3 texts (100%), vlm_requests 0",
    ]


def _item_row(key: str, fp: str) -> dict:
    row = {"pair_id": key, "pmcid": "PMC1", "status": "rules", "negatives": 0, "vlm_requests": 0}
    return row | {"reasons": [], "fingerprint": fp}
