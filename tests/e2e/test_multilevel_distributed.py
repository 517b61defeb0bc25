"""The multi-level trainer data-parallel: the feature gather on two gloo processes checked against
hand-built tensors, and each rank's share of the data (the torchrun run: test_multilevel_torchrun)."""

import json
from pathlib import Path

import torch

from pipelines.training.distributed import DistInfo
from pipelines.training.multilevel import LevelReader
from testing.distributed import gather_on_ranks
from tests.helpers import write_subset as _write

REPO = Path(__file__).resolve().parents[2]


def test_gather_features_joins_ranks_in_order_with_the_local_gradient_only(tmp_path):
    # rank 0 holds two rows, rank 1 one: the gather pads and cuts back
    rows = [[[1.0, 0.0], [0.0, 1.0]], [[0.6, 0.8]]]
    weights = [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    got = gather_on_ranks(rows, weights, tmp_path)
    expected = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    for r in (0, 1):
        assert torch.equal(got[r]["gathered"], expected)
        assert got[r]["objects"] == [{"rank": 0}, {"rank": 1}]
    # d(sum(gathered * weights)) / d(local rows) = the weights' rows of the local slice, nothing else
    assert got[0]["grad"].tolist() == [[0.0, 1.0], [2.0, 3.0]]
    assert got[1]["grad"].tolist() == [[4.0, 5.0]]
    # the logits have the global batch (3) as columns: rank 0's rows [1, 0] and [0, 1], rank 1's [0.6, 0.8]
    assert torch.allclose(got[0]["logits"], torch.tensor([[1.0, 0.0, 0.6], [0.0, 1.0, 0.8]]))
    assert torch.allclose(got[1]["logits"], torch.tensor([[0.6, 0.8, 1.0]]))


def test_each_rank_reads_a_disjoint_share(tmp_path):
    def keys(folder: Path, rank: int, n: int) -> list[str]:
        reader = LevelReader("figure", [str(folder)], "panelforge", info=DistInfo(rank, 2, rank))
        return [s["__key__"] for s in reader.take(n)]

    one = _write(tmp_path / "one", [{"__key__": f"k{i}", "txt": b"t"} for i in range(4)])
    # one shard, two ranks: every other sample, pass after pass
    assert keys(one, 0, 3) == ["k0", "k2", "k0"] and keys(one, 1, 3) == ["k1", "k3", "k1"]
    two = tmp_path / "two"
    _write(two, [{"__key__": f"a{i}", "txt": b"t"} for i in range(2)])
    (two / "panelforge-000000.tar").rename(two / "keep.tar")
    _write(two, [{"__key__": f"b{i}", "txt": b"t"} for i in range(2)])
    (two / "panelforge-000000.tar").rename(two / "panelforge-000001.tar")
    (two / "keep.tar").rename(two / "panelforge-000000.tar")
    (two / "sizes.json").write_text(json.dumps({"panelforge-000000.tar": 2, "panelforge-000001.tar": 2}))
    # two shards, two ranks: a shard each
    assert keys(two, 0, 3) == ["a0", "a1", "a0"] and keys(two, 1, 3) == ["b0", "b1", "b0"]
