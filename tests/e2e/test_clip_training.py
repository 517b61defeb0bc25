"""Continual CLIP pretraining: OpenCLIP's real trainer on tiny WebDataset shards of real sample
figures, on CPU, with a tiny local-dir: model; resumed on a fresh machine from the lake's copy."""

import io
import json
import tarfile
from dataclasses import replace
from pathlib import Path

import fsspec
import pytest
import torch

from pipelines.launch import LaunchInfo
from pipelines.training.clip import (
    ClipTrainConfig,
    RunLog,
    TrainData,
    export_wise_ft,
    main,
    subset_data,
    train,
    trainer_args,
    trainer_command,
    wise_ft,
)
from pipelines.training.tiny import TINY_CLIP, write_tiny_clip

REPO = Path(__file__).resolve().parents[2]
IMAGES = sorted((REPO / "sample" / "images").glob("*/*.jpg"))
CAPTIONS = [
    "Fluorescence microscopy of stained cells.",
    "Bar chart of expression levels by group.",
    "Western blot of protein lysates.",
    "Line plot of survival over time.",
]
TINY = TINY_CLIP  # pipelines/training/tiny.py


def write_subset(folder: Path, shards: int, per_shard: int) -> Path:
    """``panelforge-NNNNNN.tar`` shards of (jpg, txt) samples and their sizes.json, as the release writes."""
    folder.mkdir(parents=True, exist_ok=True)
    sizes, n = {}, 0
    for s in range(shards):
        name = f"panelforge-{s:06d}.tar"
        with tarfile.open(folder / name, "w") as tar:
            for _ in range(per_shard):
                for ext, data in (("jpg", IMAGES[n % len(IMAGES)].read_bytes()), ("txt", CAPTIONS[n % 4].encode())):
                    info = tarfile.TarInfo(f"sample{n:06d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                n += 1
        sizes[name] = per_shard
    (folder / "sizes.json").write_text(json.dumps(sizes))
    return folder


def write_tiny_model(folder: Path) -> Path:
    """The tiny model with its (random, seeded) weights saved beside its config: the base model."""
    return write_tiny_clip(folder, seed=0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="module")
def subset(tmp_path_factory) -> Path:
    return write_subset(tmp_path_factory.mktemp("dataset") / "r1" / "commercial", shards=2, per_shard=4)


def tiny_config(model: Path, data: Path, run_dir: str, **kw) -> ClipTrainConfig:
    values = dict(
        train_data=[str(data)],
        run_dir=run_dir,
        model=f"local-dir:{model}",
        batch_size=4,
        accum_freq=1,
        gpus=0,
        lr=1e-4,
        warmup=1,
        epochs=1,
        workers=1,
        device="cpu",
        log_every_n_steps=1,
        wise_ft_alpha=0.5,
    )
    return ClipTrainConfig(**{**values, **kw})


# ------------------------------------------------------------------------------- pure parts


def test_biomedica_recipe_becomes_these_trainer_arguments():
    """The values of table 11 of the paper, the base model and the three memory flags of
    BIOMEDICA's launch scripts (``submit_and_manage_jobs_wds.py``: ``--local-loss
    --gather-with-grad --grad-checkpointing --pretrained "commonpool_xl_clip_s13b_b90k"``)."""
    config = ClipTrainConfig(train_data=["/lake/dataset/r1/commercial"], run_dir="/lake/runs/x")
    data = TrainData(["/lake/dataset/r1/commercial/panelforge-{000000..000011}.tar"], 24_000)
    assert trainer_args(config, data, "/lake/runs/x/openclip") == [
        "--model", "ViT-L-14",
        "--train-data", "/lake/dataset/r1/commercial/panelforge-{000000..000011}.tar",
        "--dataset-type", "webdataset",
        "--train-num-samples", "24000",
        "--batch-size", "1024",
        "--accum-freq", "2",
        "--epochs", "9",
        "--lr", "1e-06",
        "--warmup", "1000",
        "--beta1", "0.9",
        "--beta2", "0.95",
        "--wd", "0.2",
        "--grad-clip-norm", "1.0",
        "--precision", "fp32",
        "--workers", "8",
        "--seed", "0",
        "--device", "cuda",
        "--log-every-n-steps", "50",
        "--save-frequency", "1",
        "--logs", "/lake/runs/x/openclip",
        "--name", "train",
        "--pretrained", "commonpool_xl_clip_s13b_b90k",
        "--grad-checkpointing",
        "--local-loss",
        "--gather-with-grad",
        "--delete-previous-checkpoint",
        "--resume", "latest",
    ]  # fmt: skip
    # 4 GPUs: OpenCLIP under its own torchrun, one process per GPU
    assert trainer_command("py", ["--epochs", "9"], 4) == [
        "py", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
        "-m", "pipelines.compute.hf_text", "--epochs", "9",
    ]  # fmt: skip
    assert trainer_command("py", ["--epochs", "9"], 1) == ["py", "-m", "pipelines.compute.hf_text", "--epochs", "9"]


def test_a_mixture_is_joined_with_its_upsampling_factors_and_local_dir_skips_pretrained():
    config = ClipTrainConfig(
        train_data=["a", "b"],
        run_dir="r",
        upsampling_factors=[1.0, 3.0],
        dataset_resampled=True,
        model="local-dir:/m",
        resume=False,
        delete_previous_checkpoint=False,
        extra_args=["--lock-image"],
    )
    args = trainer_args(config, TrainData(["a/p-{000000..000001}.tar", "b/p-{000000..000000}.tar"], 30), "logs")
    assert args[args.index("--train-data") + 1] == "a/p-{000000..000001}.tar::b/p-{000000..000000}.tar"
    assert args[args.index("--train-data-upsampling-factors") + 1] == "1.0::3.0"
    assert "--dataset-resampled" in args
    assert "--pretrained" not in args and "--resume" not in args and "--delete-previous-checkpoint" not in args
    assert args[-1] == "--lock-image"
    plain = trainer_args(replace(config, grad_checkpointing=False, local_loss=False, gather_with_grad=False),
                         TrainData(["a"], 1), "logs")  # fmt: skip
    assert not {"--grad-checkpointing", "--local-loss", "--gather-with-grad"} & set(plain)
    with pytest.raises(ValueError, match="dataset_resampled"):
        ClipTrainConfig(train_data=["a", "b"], run_dir="r", upsampling_factors=[1.0, 3.0]).validate()
    with pytest.raises(ValueError, match="one factor per"):
        ClipTrainConfig(train_data=["a"], run_dir="r", upsampling_factors=[1.0, 3.0], dataset_resampled=True).validate()


def test_subset_shards_and_samples_come_from_sizes_json(tmp_path):
    folder = tmp_path / "commercial"
    folder.mkdir()
    (folder / "sizes.json").write_text(json.dumps({"panelforge-000000.tar": 10, "panelforge-000001.tar": 7}))
    assert subset_data(str(folder)) == (f"{folder}/panelforge-{{000000..000001}}.tar", 17)
    (folder / "sizes.json").write_text(json.dumps({"panelforge-000000.tar": 10, "panelforge-000002.tar": 7}))
    with pytest.raises(ValueError, match="not contiguous"):
        subset_data(str(folder))
    remote = "memory://lake/dataset/r1/commercial"
    with fsspec.open(f"{remote}/sizes.json", "w") as fh:
        fh.write(json.dumps({"panelforge-000000.tar": 5}))
    url, samples = subset_data(remote, python="py")
    assert (url, samples) == (
        "pipe:py -m pipelines.training.clip --cat " + remote + "/panelforge-{000000..000000}.tar",
        5,
    )


def test_the_job_config_is_strict_and_takes_the_launch_section_and_main_still_cats(tmp_path, capsysbinary):
    near = r"unknown CLIP training config keys: \['epocs'\] \('epocs': did you mean 'epochs'\?\)"
    with pytest.raises(ValueError, match=near):
        ClipTrainConfig.from_dict({"train_data": ["a"], "run_dir": "r", "epocs": 3})
    launch = LaunchInfo(run_id="x", run_dir="s3://lake/runs/x", checkpoint_dir="s3://lake/runs/x/ckpt", gpus=4)
    launched = ClipTrainConfig.from_job({"train_data": ["a"]}, launch)
    assert (launched.run_dir, launched.checkpoint_dir, launched.gpus) == (
        "s3://lake/runs/x",
        "s3://lake/runs/x/ckpt",
        4,
    )
    assert ClipTrainConfig.from_job({"train_data": ["a"], "gpus": 1}, launch).gpus == 1  # the config's own wins
    shard = tmp_path / "panelforge-000000.tar"  # the pipe: OpenCLIP reads a remote shard through
    shard.write_bytes(b"shard bytes")
    assert main(["--cat", str(shard)]) is None
    assert capsysbinary.readouterr().out == b"shard bytes"


def test_wise_ft_interpolates_float_weights_by_hand():
    base = {"w": torch.tensor([0.0, 2.0]), "step": torch.tensor([1])}
    tuned = {"w": torch.tensor([4.0, 6.0]), "step": torch.tensor([7])}
    merged = wise_ft(base, tuned, 0.25)  # 0.75 * base + 0.25 * tuned
    assert torch.equal(merged["w"], torch.tensor([1.0, 3.0]))
    assert torch.equal(merged["step"], torch.tensor([7]))  # integer buffers: the fine-tuned ones
    with pytest.raises(ValueError, match="keys"):
        wise_ft(base, {"w": tuned["w"]}, 0.5)
    with pytest.raises(ValueError, match="alpha"):
        wise_ft(base, tuned, 1.5)


def test_the_trainer_log_becomes_progress():
    log = RunLog(steps_per_epoch=2)
    assert log.read("2026 | INFO | => resuming checkpoint '/x/epoch_1.pt' (epoch 1)") is None
    assert log.read("2026 | INFO | Start epoch 1") is None
    line = (
        "Train Epoch: 1 [ 8/16 (50%)] Data (t): 0.1 Batch (t): 0.5, 8.0/s, 8.0/s/gpu LR: 0.000100 "
        "Logit Scale: 14.286 Contrastive_loss: 2.5 (2.4) Loss: 2.5 (2.4)"
    )
    step, metrics = log.read(line)
    assert step == 3  # epoch 1 of 2 steps each, half-way
    assert metrics == {"epoch": 1.0, "contrastive_loss": 2.5, "loss": 2.5, "lr": 1e-4, "samples_per_second": 8.0}
    assert (log.resumed_from_epoch, log.epochs_started) == (1, [1])


# ------------------------------------------------------------------------------- real training


def test_train_export_then_resume_on_a_fresh_machine(tiny, subset, tmp_path):
    import open_clip
    from safetensors.torch import load_file

    run_dir = "memory://lake/models/clip/runs/tiny-run"  # a lake off this machine: copies in checkpoints/
    first = train(tiny_config(tiny, subset, run_dir, scratch_dir=str(tmp_path / "machine-a")))
    assert first["epochs"] == 1 and first["epochs_run"] == "0" and first["resumed_from_epoch"] is None
    assert first["samples_per_epoch"] == 8
    assert first["final_loss"] is not None and torch.isfinite(torch.tensor(first["final_loss"]))
    fs = fsspec.filesystem("memory")
    assert fs.exists("/lake/models/clip/runs/tiny-run/checkpoints/ckpt-00000001.pt")

    # a second launch asking for 2 epochs, on a machine without the first one's folder
    second = train(tiny_config(tiny, subset, run_dir, epochs=2, scratch_dir=str(tmp_path / "machine-b")))
    assert second["resumed_from_epoch"] == 1 and second["epochs_run"] == "1"  # epoch 0 was not run again
    assert second["epochs"] == 2 and torch.isfinite(torch.tensor(second["final_loss"]))
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls("/lake/models/clip/runs/tiny-run/checkpoints", detail=False))
    assert names == ["ckpt-00000002.pt"]  # the previous epoch's copy deleted, as OpenCLIP deletes its own

    # the checkpoint reloads into the model, and the exported model reloads with local-dir:
    with fs.open("/lake/models/clip/runs/tiny-run/checkpoints/ckpt-00000002.pt", "rb") as fh:
        checkpoint = torch.load(io.BytesIO(fh.read()), map_location="cpu", weights_only=False)
    assert checkpoint["epoch"] == 2
    model = open_clip.create_model(f"local-dir:{tiny}")
    model.load_state_dict(checkpoint["state_dict"])
    exported = tmp_path / "exported"
    fs.get("/lake/models/clip/runs/tiny-run/model/", str(exported), recursive=True)
    reloaded, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{exported}")
    assert reloaded.encode_image(torch.zeros(1, 3, 64, 64)).shape == (1, 32)

    # WiSE-FT: alpha 0 is the base model exactly, alpha 1 the fine-tuned one, 0.5 the midpoint
    ckpt_path = tmp_path / "final.pt"
    torch.save(checkpoint, ckpt_path)
    base, tuned = load_file(str(tiny / "open_clip_model.safetensors")), checkpoint["state_dict"]
    for alpha, expected in ((0.0, base), (1.0, tuned)):
        out = tmp_path / f"alpha-{alpha}"
        export_wise_ft(tiny_config(tiny, subset, run_dir, wise_ft_alpha=alpha), ckpt_path, str(out))
        weights = load_file(str(out / "open_clip_model.safetensors"))
        assert weights.keys() == expected.keys()
        assert all(torch.equal(weights[k], expected[k]) for k in expected)
    assert any(not torch.equal(base[k], tuned[k]) for k in base)  # training changed the weights
    half = load_file(str(exported / "open_clip_model.safetensors"))  # the run's own export, alpha 0.5
    assert all(
        torch.allclose(half[k], (base[k] + tuned[k]) / 2, atol=1e-6) for k in base if base[k].is_floating_point()
    )


# ------------------------------------------------------------------------------- the asset


def test_the_asset_trains_through_the_subprocess_launcher(tiny, tmp_path):
    from dagster import DagsterInstance, materialize

    from assets.training import clip_continual_pretraining
    from pipelines.core.lake import Lake
    from resources.compute import ModelsResource
    from resources.lake import LakeResource
    from resources.launcher import JobLauncherResource

    home = tmp_path / "lake"
    write_subset(Path(Lake(str(home)).path("dataset", "r1", "commercial")), shards=1, per_shard=4)
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("releases", ["r1"])
    settings = {"model": f"local-dir:{tiny}", "epochs": 1, "batch_size": 4, "accum_freq": 1, "lr": 1e-4, "warmup": 1}
    settings |= {"workers": 1, "device": "cpu", "log_every_n_steps": 1, "wise_ft_alpha": 1.0}
    # this lake has shards but no articles table to split: the held-out path is test_training_synthetic's
    settings |= {"exclude_heldout": False}
    launcher = JobLauncherResource(backend="subprocess", cwd=str(REPO), env={"PYTHONPATH": str(REPO)})
    result = materialize(
        [clip_continual_pretraining],
        partition_key="r1",
        instance=instance,
        resources={"lake": LakeResource(home=str(home)), "launcher": launcher, "models": ModelsResource()},
        run_config={"ops": {"clip_continual_pretraining": {"config": settings}}},
    )
    assert result.success
    (materialization,) = result.asset_materializations_for_node("clip_continual_pretraining")
    metadata = {k: v.value for k, v in materialization.metadata.items()}
    assert metadata["epochs"] == 1 and metadata["samples_per_epoch"] == 4 and metadata["wise_ft_alpha"] == 1.0
    assert torch.isfinite(torch.tensor(metadata["final_loss"]))
    run_dir = Path(metadata["launch_run_dir"])
    assert run_dir.parent == home / "models" / "clip" / "runs"  # a local lake: OpenCLIP writes into the run dir
    assert (run_dir / "openclip" / "train" / "checkpoints" / "epoch_1.pt").exists()
    assert json.loads((run_dir / "report.json").read_text())["model_dir"] == f"{run_dir}/model"
    assert (run_dir / "model" / "open_clip_model.safetensors").exists()
