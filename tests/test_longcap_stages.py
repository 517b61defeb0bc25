"""The long-caption and hard-negative stages on a lake: what they read, what they write, reruns."""

from __future__ import annotations

import pytest

from pipelines.lake import Lake
from pipelines.longcap.stages import NEGATIVES_DIFFER, NegativesStage
from pipelines.schemas import TABLES, Table
from pipelines.stage import Partition, StageInputError

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


def test_negatives_need_pairs(tmp_path):
    with pytest.raises(StageInputError, match="materialize `pairs` first"):
        NegativesStage().run(Lake(tmp_path / "lake"), Partition(RELEASE, SHARD))
