"""Multi-level (zoom-in / region-aware) training: the losses on hand-computed tiny tensors, the
schedules by hand, and a few CPU steps of the real trainer on tiny linked figure/panel/region
shards of real sample figures, with checkpoint reload and resume."""

import json
import math
import random
from pathlib import Path

import fsspec
import pytest
import torch

from pipelines import launch
from pipelines.training.multilevel import (
    ChildBuffer,
    MultilevelConfig,
    clip_loss,
    cross_level_loss,
    curriculum_weights,
    decode,
    levels_at,
    negative_sigmoid_loss,
    negative_softmax_loss,
    parent_key,
    region_text,
    train,
)
from pipelines.training.tiny import TINY_CLIP_32PX as TINY
from tests.helpers import SAMPLE_IMAGES as IMAGES

REPO = Path(__file__).resolve().parents[2]
E = torch.eye(2)  # two orthonormal embeddings: cosine 1 with itself, 0 with the other


# ----------------------------------------------------------------------------------- losses


def test_clip_loss_on_2x2_logits():
    # logits [[1, 0], [0, 1]]: each row's CE is -log(e / (e + 1)) = log(1 + e^-1), both directions alike
    assert clip_loss(E, E, 1.0).item() == pytest.approx(math.log(1 + math.exp(-1)), abs=1e-6)
    # swapped texts: the positive scores 0 against a 1 -> log(1 + e)
    assert clip_loss(E, E.flip(0), 1.0).item() == pytest.approx(math.log(1 + math.e), abs=1e-6)


def test_negative_sigmoid_loss_grows_when_the_negative_outscores_the_positive():
    img, mask = E[:1], torch.tensor([[True]])
    tied = negative_sigmoid_loss(img, E[:1], E[:1].unsqueeze(1), mask, 1.0)  # s+ = s- = 1: -log sigma(0)
    assert tied.item() == pytest.approx(math.log(2), abs=1e-6)
    below = negative_sigmoid_loss(img, E[:1], E[1:].unsqueeze(1), mask, 1.0)  # s+ 1, s- 0: log(1 + e^-1)
    assert below.item() == pytest.approx(math.log(1 + math.exp(-1)), abs=1e-6)
    above = negative_sigmoid_loss(img, E[1:], E[:1].unsqueeze(1), mask, 1.0)  # s+ 0, s- 1: log(1 + e)
    assert above.item() - tied.item() == pytest.approx(math.log(1 + math.e) - math.log(2), abs=1e-6)
    # tau 0.5 doubles the gap: log(1 + e^2)
    assert negative_sigmoid_loss(img, E[1:], E[:1].unsqueeze(1), mask, 0.5).item() == pytest.approx(
        math.log(1 + math.e**2), abs=1e-6
    )
    # a padded slot (mask False) counts for nothing
    padded = torch.stack([E[1], E[0]]).unsqueeze(0)  # real negative scores 0, the padding 1
    assert negative_sigmoid_loss(img, E[:1], padded, torch.tensor([[True, False]]), 1.0).item() == pytest.approx(
        math.log(1 + math.exp(-1)), abs=1e-6
    )


def test_negative_softmax_loss_adds_the_hard_negatives_as_logits():
    # region 0 has one negative scoring 0 (row [1, 0 | 0]); region 1 none (row [0, 1 | -inf])
    neg = torch.stack([E[1:], E[:1]])  # (2, 1, 2)
    mask = torch.tensor([[True], [False]])
    row0 = math.log(math.e + 2) - 1  # -log(e / (e + 1 + 1))
    row1 = math.log(1 + math.exp(-1))
    assert negative_softmax_loss(E, E, neg, mask, 1.0).item() == pytest.approx((row0 + row1) / 2, abs=1e-6)
    # the same negative scoring 1 (as much as the positive): row 0 becomes -log(e / (e + 1 + e))
    hard = torch.stack([E[:1], E[:1]])
    worse = negative_softmax_loss(E, E, hard, mask, 1.0).item()
    assert worse - (row0 + row1) / 2 == pytest.approx((math.log(2 * math.e + 1) - 1 - row0) / 2, abs=1e-6)


def test_cross_level_loss_pools_children_and_ignores_childless_parents():
    parents = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])  # parent 2 has no child in the batch
    # parent 0: two children [1, 0] -> mean [1, 0]; parent 1: one child [0, 1]
    children = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    groups = [0, 1, 0]
    one = math.log(1 + math.exp(-1))  # the CLIP loss of identity 2x2 logits
    assert cross_level_loss(parents, parents, children, children, groups, 1.0).item() == pytest.approx(
        2 * one, abs=1e-6
    )
    # parent 0's children [1, 0] and [0, 1] pool to the diagonal (cos a = 1/sqrt2 with both parents);
    # parent 1's child is [0, 1]. Logits rows (parent -> pooled): [a, 0] and [a, 1].
    a = 1 / math.sqrt(2)
    rows = (math.log(1 + math.exp(-a)) + math.log(math.exp(a) + math.e) - 1) / 2
    cols = (math.log(2) + math.log(1 + math.exp(-1))) / 2  # columns [a, a] -> target 0, [0, 1] -> target 1
    children = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    got = cross_level_loss(parents[:2], parents[:2], children, children, [0, 0, 1], 1.0)
    assert got.item() == pytest.approx(2 * (rows + cols) / 2, abs=1e-6)
    # a single parent with children: a 1x1 softmax, loss 0
    assert cross_level_loss(parents, parents, children, children, [2, 2, 2], 1.0).item() == pytest.approx(0.0, abs=1e-6)


# ----------------------------------------------------------------------------------- schedules


def test_levels_at_rotates_m_p_r_per_step_or_per_epoch():
    mpr = [["figure"], ["panel"], ["region"]]
    assert [levels_at(s, mpr)[0] for s in range(5)] == ["figure", "panel", "region", "figure", "panel"]
    # two steps per slot (an "epoch" of 2 steps)
    assert [levels_at(s, mpr, 2)[0] for s in range(7)] == ["figure"] * 2 + ["panel"] * 2 + ["region"] * 2 + ["figure"]
    assert levels_at(3, [["figure", "region"]]) == ["figure", "region"]


def test_curriculum_weights_move_from_global_to_region():
    base = {"figure": 1.0, "region": 1.0, "negative": 2.0}
    stages = [
        {"steps": 4, "weights": {"region": 0.0, "negative": 0.0}},
        {"steps": 4, "weights": {}, "ramp_steps": 2},
    ]
    at = [curriculum_weights(s, base, stages, 8) for s in range(10)]
    assert [w["region"] for w in at] == [0.0, 0.0, 0.0, 0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert [w["negative"] for w in at[3:7]] == [0.0, 1.0, 2.0, 2.0]
    assert all(w["figure"] == 1.0 for w in at) and all(w["panel"] == 0.0 for w in at)
    # fractions of the run: 0.5 of 10 steps
    frac = [{"fraction": 0.5, "weights": {"region": 0.0}}, {"fraction": 0.5, "weights": {}}]
    assert [curriculum_weights(s, base, frac, 10)["region"] for s in (4, 5)] == [0.0, 1.0]
    assert curriculum_weights(7, base, [], 10) == {**{k: 0.0 for k in at[0]}, **base}


def test_keys_link_children_to_parents_in_a_bounded_buffer():
    assert parent_key("abc-fig1_p003", "panel") == "abc-fig1"
    assert parent_key("abc-fig1_p003_r01", "region") == "abc-fig1_p003"
    assert parent_key("abc-fig1", "panel") is None and parent_key("abc_p003", "region") is None
    buffer = ChildBuffer(2)
    for key in ("f_p000", "f_p001", "g_p000"):
        buffer.add(parent_key(key, "panel"), key, {"__key__": key})
    assert buffer.evicted == 1  # f_p000, the oldest, went
    assert [(i, s["__key__"]) for i, s in buffer.take(["g", "f"], 10)] == [(0, "g_p000"), (1, "f_p001")]
    assert buffer.take(["f", "g"], 10) == []
    # round-robin under a cap: each parent's first child before any second one
    buffer = ChildBuffer(10)
    for key in ("f_p000", "f_p001", "f_p002", "g_p000", "h_p000"):
        buffer.add(parent_key(key, "panel"), key, {"__key__": key})
    assert [(i, s["__key__"]) for i, s in buffer.take(["f", "g"], 2)] == [(0, "f_p000"), (1, "g_p000")]
    assert [s["__key__"] for _, s in buffer.take(["f", "g"], 1)] == ["f_p001"]
    assert len(buffer.items) == 2  # f_p002 and h_p000 wait


def test_region_text_is_one_of_the_two_descriptions():
    sample = {"txt": b"arrows mark the nuclei", "json": json.dumps({"description": "bright round nuclei"}).encode()}
    assert region_text(sample, 1.0, random.Random(0)) == "bright round nuclei"
    assert region_text(sample, 0.0, random.Random(0)) == "arrows mark the nuclei"
    picks = {region_text(sample, 0.5, random.Random(s)) for s in range(20)}
    assert picks == {"bright round nuclei", "arrows mark the nuclei"}
    no_description = {"txt": b"the clause", "json": json.dumps({"description": ""}).encode()}
    assert region_text(no_description, 1.0, random.Random(0)) == "the clause"


def test_decode_refuses_a_sample_without_image_or_text_and_caps_negatives(tmp_path):
    config = MultilevelConfig(run_dir=str(tmp_path), max_negatives=1)
    jpg = IMAGES[0].read_bytes()
    with pytest.raises(ValueError, match="no image"):
        decode({"__key__": "k", "txt": b"a cell"}, "figure", lambda im: im, config, random.Random(0))
    with pytest.raises(ValueError, match="empty text"):
        decode({"__key__": "k", "jpg": jpg, "txt": b"  "}, "figure", lambda im: im, config, random.Random(0))
    region = {"__key__": "k_p000_r00", "jpg": jpg, "txt": b"the clause", "json": b"{}", "neg.txt": b"one\ntwo\n"}
    got = decode(region, "region", lambda im: im.size, config, random.Random(0))
    assert got.text == "the clause" and got.negatives == ["one"] and got.image[0] > 0


# ----------------------------------------------------------------------------------- training


@pytest.fixture
def data(multilevel_release) -> dict[str, str]:
    """2 figures -> 3 panels -> 4 regions, linked by key (the session's, tests/conftest.py)."""
    return multilevel_release


@pytest.fixture
def tiny(multilevel_tiny) -> Path:
    return multilevel_tiny


def _config(preset: str, data: dict, tiny: Path, run_dir: Path, steps: int, **extra) -> MultilevelConfig:
    return MultilevelConfig.from_dict({
        "preset": preset, "run_dir": str(run_dir), "model": f"local-dir:{tiny}", "device": "cpu",
        "figure_data": [data["figure"]], "panel_data": [data["panel"]], "region_data": [data["region"]],
        "batch_size": 2, "steps": steps, "warmup": 1, "lr": 1e-3, "checkpoint_every": 2, "log_every": 1,
        "link_pull": 4, **extra,
    })  # fmt: skip


def _checkpoint(run_dir: Path) -> dict:
    url = launch.latest_checkpoint(str(run_dir / "checkpoints"))
    with fsspec.open(url, "rb") as f:
        return torch.load(f, map_location="cpu", weights_only=False)


def test_zoom_in_trains_the_last_blocks_links_levels_and_resumes(data, tiny, tmp_path):
    import open_clip

    run = tmp_path / "zoom"
    config = _config("zoom-in", data, tiny, run, 3, unfreeze_last_blocks=1)
    assert config.schedule == [["figure"], ["panel"], ["region"]] and config.freeze_text
    report = train(config)
    assert report["steps"] == 3 and report["first_step"] == 0 and report["resumed_from_step"] is None
    assert math.isfinite(report["final_loss"]) and "loss_region" in report  # step 3 is the region step
    linked = json.loads(report["linked_children"])
    # capped at batch_size (2) children, one per parent: fig1_p000 + fig3_p000, then p000_r00 + p001_r00
    assert linked == {"figure_panel": 2, "panel_region": 2}
    assert report["loss_figure_panel"] > 0 and report["loss_panel_region"] > 0  # two parents: a real softmax
    saved = _checkpoint(run)
    assert saved["step"] == 3 and saved["consumed"]["figure"] == 2 and saved["consumed"]["region"] == 2

    base = open_clip.create_model(f"local-dir:{tiny}").state_dict()
    state = saved["state_dict"]
    assert torch.equal(
        state["visual.transformer.resblocks.0.attn.in_proj_weight"],
        base["visual.transformer.resblocks.0.attn.in_proj_weight"],
    )
    assert torch.equal(
        state["transformer.resblocks.0.mlp.c_fc.weight"], base["transformer.resblocks.0.mlp.c_fc.weight"]
    )  # text frozen
    assert not torch.equal(
        state["visual.transformer.resblocks.1.mlp.c_fc.weight"], base["visual.transformer.resblocks.1.mlp.c_fc.weight"]
    )
    model = open_clip.create_model(f"local-dir:{tiny}")
    model.load_state_dict(state)  # the checkpoint reloads into the architecture

    resumed = train(_config("zoom-in", data, tiny, run, 5, unfreeze_last_blocks=1))
    assert resumed["resumed_from_step"] == 3 and resumed["first_step"] == 3 and resumed["steps"] == 5
    assert "loss_panel" in resumed  # step 5 (index 4) is a panel step
    assert _checkpoint(run)["step"] == 5 and _checkpoint(run)["consumed"]["panel"] == 4
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["ckpt-00000005.pt"]  # keep the last only
    exported, _, _ = open_clip.create_model_and_transforms(f"local-dir:{run / 'model'}")
    assert exported.encode_text(open_clip.get_tokenizer(f"local-dir:{tiny}")(["a cell"])).shape == (1, 32)


def test_region_aware_curriculum_turns_on_hard_negatives_and_resumes(data, tiny, tmp_path):
    run = tmp_path / "regionaware"
    # steps 0-1 global only, then region + negatives ramped in over 2 steps
    curriculum = [
        {"steps": 2, "weights": {"region": 0.0, "negative": 0.0}},
        {"steps": 2, "weights": {}, "ramp_steps": 2},
    ]
    config = _config("region-aware", data, tiny, run, 2, curriculum=curriculum, negative_loss="softmax")
    assert config.schedule == [["figure", "region"]] and config.unfreeze_last_blocks is None
    first = train(config)
    assert "loss_figure" in first and "loss_negative" not in first and "loss_region" not in first
    assert math.isfinite(first["final_loss"])
    resumed = train(_config("region-aware", data, tiny, run, 4, curriculum=curriculum, negative_loss="softmax"))
    assert resumed["resumed_from_step"] == 2 and resumed["steps"] == 4
    assert math.isfinite(resumed["final_loss"]) and resumed["loss_negative"] > 0 and resumed["loss_region"] > 0
    saved = _checkpoint(run)
    # both levels read 2 samples a step for 4 steps: 8 each, 4 region samples a pass
    assert saved["step"] == 4 and saved["consumed"] == {"figure": 8, "region": 8}


def test_config_rejects_unknown_keys_and_levels_without_data(tmp_path):
    with pytest.raises(ValueError, match="unknown multi-level"):
        MultilevelConfig.from_dict({"run_dir": str(tmp_path), "bogus": 1})
    with pytest.raises(ValueError, match="region_data"):
        MultilevelConfig.from_dict({"run_dir": str(tmp_path), "preset": "zoom-in", "figure_data": ["x"],
                                    "panel_data": ["y"]}).validate()  # fmt: skip


def test_the_recipes_start_from_trained_weights_and_random_init_is_asked_for(tiny, tmp_path):
    """Zoom-in starts from BMC-CLIP (Panel2Patch: "a ViT-L/14 encoder initialized from
    BMC-CLIP"), region-aware from BIOMEDICA's CommonPool base; no weights is refused unless
    ``allow_random_init``, and even then a random text tower is never frozen."""
    from pipelines.training import clip

    data = {"figure_data": ["f"], "panel_data": ["p"], "region_data": ["r"]}
    zoom = MultilevelConfig.from_dict({"run_dir": "-", "preset": "zoom-in", **data})
    assert (zoom.model, zoom.pretrained) == ("ViT-L-14", "hf-hub:BIOMEDICA/BMC_CLIP_CF/BMC_CLIP_CF.pt")
    zoom.validate()
    region = MultilevelConfig.from_dict({"run_dir": "-", "preset": "region-aware", **data})
    assert region.pretrained == "commonpool_xl_clip_s13b_b90k"
    assert clip.hub_file(zoom.pretrained) == ("BIOMEDICA/BMC_CLIP_CF", "BMC_CLIP_CF.pt")

    with pytest.raises(ValueError, match="starts from random weights; set pretrained"):
        MultilevelConfig.from_dict({"run_dir": "-", "preset": "zoom-in", "pretrained": "", **data}).validate()
    bare = tmp_path / "bare"  # a local-dir: model without weights is a random initialisation too
    bare.mkdir()
    (bare / "open_clip_config.json").write_text(json.dumps(TINY))
    asked = {"run_dir": "-", "preset": "zoom-in", "model": f"local-dir:{bare}", **data}
    with pytest.raises(ValueError, match="without open_clip_model.safetensors"):
        MultilevelConfig.from_dict(asked).validate()
    asked["allow_random_init"] = True
    with pytest.raises(ValueError, match="set freeze_text: false"):
        MultilevelConfig.from_dict(asked).validate()
    MultilevelConfig.from_dict({**asked, "freeze_text": False}).validate()
    MultilevelConfig.from_dict({"run_dir": "-", "preset": "zoom-in", "model": f"local-dir:{tiny}", **data}).validate()


def test_the_bmc_clip_start_offline_and_not_cached_fails_in_one_line(tmp_path, monkeypatch, no_network):
    """The trainer checks its weights before building anything: offline without BMC-CLIP in the
    cache, one line naming the setting, the ``hf download`` command and offline mode."""
    import huggingface_hub

    from pipelines.compute.weights import ModelUnavailableError
    from pipelines.training.multilevel import Trainer

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    config = MultilevelConfig.from_dict({"run_dir": str(tmp_path), "preset": "zoom-in", "device": "cpu",
                                         "figure_data": ["f"], "panel_data": ["p"], "region_data": ["r"]})  # fmt: skip
    with pytest.raises(ModelUnavailableError) as failed:
        Trainer(config)
    text = str(failed.value)
    assert "\n" not in text and text.startswith("pretrained='hf-hub:BIOMEDICA/BMC_CLIP_CF/BMC_CLIP_CF.pt'")
    assert "`hf download BIOMEDICA/BMC_CLIP_CF BMC_CLIP_CF.pt --local-dir <folder>`" in text
    assert "offline mode is on" in text and no_network == []
