"""The release assets through Dagster, and the result read by the consumers a user will point at it:
the ``webdataset`` library, Hugging Face ``datasets`` (webdataset, parquet and the card's configs),
and OpenCLIP's training data loader. The Hub's network calls are the one boundary replaced."""

import glob
import json
import os
import tarfile
from argparse import Namespace

import pytest
from dagster import DagsterInstance, EnvVar, MultiPartitionKey

from assets.release import (
    dataset_card,
    dataset_samples,
    hf_upload,
    release_parquet,
    webdataset_concept_balanced,
    webdataset_concept_filtered,
    webdataset_shards,
)
from pipelines.core.lake import Lake, dataset_dir
from pipelines.release import hub
from pipelines.release.hub import HubLimitError, plan_upload, release_patterns
from resources.hub import HuggingFaceHubResource
from resources.lake import LakeResource
from resources.quality import QualityResource
from tests.helpers import materialize_one, open_test_release
from tests.stages.test_release import RELEASE, SHARDS, write_hand_labels
from tests.unit.test_parse import FOLDER_TO_PMCID

TOKEN = "hf_test_secret_0123456789abcdef"
HEMIBRAIN = FOLDER_TO_PMCID["biorxiv-2020.04.07.030213"]


class FakeHfApi:
    """Stands in for ``huggingface_hub.HfApi``: records calls instead of reaching the network."""

    calls: list = []
    tokens: list = []

    def __init__(self, token=None):
        FakeHfApi.tokens.append(token)

    def create_repo(self, repo_id, **kwargs):
        FakeHfApi.calls.append(("create_repo", repo_id, kwargs))

    def upload_folder(self, **kwargs):
        FakeHfApi.calls.append(("upload_folder", kwargs["repo_id"], kwargs))


@pytest.fixture(scope="module")
def release(parsed_lake, tmp_path_factory):
    import shutil

    tmp = tmp_path_factory.mktemp("release_assets")
    shutil.copytree(parsed_lake.root, tmp / "lake")
    lake = Lake(tmp / "lake")
    # hand-written labels: the hemibrain preprint's figures are Microscopy, the rest Plots and Charts
    write_hand_labels(lake, lambda pmcid: "Microscopy" if pmcid == HEMIBRAIN else "Plots and Charts")
    (tmp / "home").mkdir()
    instance = DagsterInstance.local_temp(str(tmp / "home"))
    open_test_release(instance, RELEASE)
    resources = {
        "lake": LakeResource(home=str(lake.root)),
        "hub": HuggingFaceHubResource(repo_id="me/panelforge"),
        "quality": QualityResource(),
    }

    def run(asset, key, config=None, **overrides):
        return materialize_one(asset, key, instance, {**resources, **overrides}, config, raise_on_error=False)

    small = {"max_samples_per_shard": 10}
    planned = [run(dataset_samples, MultiPartitionKey({"release": RELEASE, "shard": s})) for s in SHARDS]
    shards = run(webdataset_shards, RELEASE, small)
    filtered = run(webdataset_concept_filtered, RELEASE, small)
    balanced = run(webdataset_concept_balanced, RELEASE, {**small, "cap_per_concept": 4})
    tables = run(release_parquet, RELEASE, {"token_sample": 50})
    card = run(dataset_card, RELEASE)
    for result in [*planned, shards, filtered, balanced, tables, card]:
        assert result.success
    return lake, run, instance, {"planned": planned, "shards": shards, "filtered": filtered, "tables": tables}


def _metadata(result) -> dict:
    (event,) = result.get_asset_materialization_events()
    return {k: v.value for k, v in event.materialization.metadata.items()}


def test_release_assets(release):
    lake, _, _, results = release
    planned = [_metadata(r) for r in results["planned"]]
    samples = sum(m["samples"] for m in planned)
    included = [r for r in lake.read_release("samples", RELEASE).to_pylist() if r["status"] == "included"]
    assert samples == len(included) > 0
    shards = _metadata(results["shards"])
    assert shards["commercial_samples"] == samples and shards["noncommercial_samples"] == 0
    assert shards["commercial_shards"] == -(-samples // 10)
    filtered = _metadata(results["filtered"])
    assert filtered["concept-filtered-commercial_samples"] == 29  # only the hemibrain figures are Microscopy
    tables = _metadata(results["tables"])
    assert tables["articles_rows"] == len(lake.read_release("articles", RELEASE))  # every sample article has a license
    assert tables["labels_rows"] == len(lake.read_release("figure_concepts", RELEASE))
    stats = json.loads(open(dataset_dir(lake, RELEASE, "stats", "stats.json")).read())
    assert stats["fields"]["caption"]["chars"]["count"] == samples
    assert stats["counts"]["concept"] == {"Microscopy": 29, "Plots and Charts": samples - 29}
    assert stats["fields"]["caption"]["tokens"]["sampled_texts"] == 50
    assert os.path.exists(dataset_dir(lake, RELEASE, "stats", "caption.png"))


def test_dataset_card_header_and_configs(release):
    from huggingface_hub import DatasetCard

    lake = release[0]
    card = DatasetCard(open(dataset_dir(lake, "README.md")).read())
    data = card.data.to_dict()
    names = {c["config_name"]: c for c in data["configs"]}
    assert names[f"{RELEASE}-commercial"]["data_files"] == [{"split": "train", "path": f"{RELEASE}/commercial/*.tar"}]
    assert names[f"{RELEASE}-commercial"].get("default") is True
    assert f"{RELEASE}-articles" in names and f"{RELEASE}-noncommercial" not in names  # empty subsets are left out
    assert data["license"] == "other" and data["license_link"] == "LICENSES.md"
    assert data["size_categories"] == ["n<1K"]
    assert "CC BY" in open(dataset_dir(lake, "LICENSES.md")).read()


def test_consumers_read_the_release(release, tmp_path):
    import datasets
    import webdataset as wds

    lake = release[0]
    folder = dataset_dir(lake, RELEASE, "commercial")
    sizes = json.loads(open(f"{folder}/sizes.json").read())
    total = sum(sizes.values())
    pattern = f"{folder}/panelforge-{{000000..{len(sizes) - 1:06d}}}.tar"

    decoded = list(wds.WebDataset(pattern, shardshuffle=False).decode("pil"))
    assert len(decoded) == total
    assert all(s["jpg"].size[0] > 0 and s["txt"] and s["json"]["key"] == s["__key__"] for s in decoded)

    cache = str(tmp_path / "hf-cache")
    tars = sorted(glob.glob(f"{folder}/*.tar"))
    web = datasets.load_dataset("webdataset", data_files={"train": tars}, split="train", cache_dir=cache)
    assert len(web) == total and web[0]["jpg"].size[0] > 0 and isinstance(web[0]["json"], dict)
    articles = datasets.load_dataset(
        "parquet",
        data_files=dataset_dir(lake, RELEASE, "parquet", "articles", "*.parquet"),
        split="train",
        cache_dir=cache,
    )
    assert len(articles) == len(lake.read_release("articles", RELEASE))
    by_card = datasets.load_dataset(dataset_dir(lake), f"{RELEASE}-commercial", split="train", cache_dir=cache)
    assert len(by_card) == total

    import open_clip
    from open_clip_train.data import get_wds_dataset

    _, _, preprocess = open_clip.create_model_and_transforms("ViT-B-32", pretrained=None)
    args = Namespace(
        train_data=pattern, val_data=None, train_num_samples=None, dataset_resampled=False,
        train_data_upsampling_factors=None, seed=0, workers=0, world_size=1, batch_size=4,
    )  # fmt: skip
    info = get_wds_dataset(args, preprocess, is_train=True, tokenizer=open_clip.get_tokenizer("ViT-B-32"))
    images, texts = next(iter(info.dataloader))
    assert tuple(images.shape) == (4, 3, 224, 224) and tuple(texts.shape) == (4, 77)
    assert info.dataloader.num_samples >= total  # from sizes.json


def test_upload_dry_run_makes_no_network_call(release, monkeypatch):
    _, run, _, _ = release
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "HfApi", None)  # any use would fail
    result = run(hf_upload, RELEASE, {"dry_run": True})
    assert result.success
    meta = _metadata(result)
    assert meta["dry_run"] is True and meta["files"] > 0 and meta["private"] is True


def test_upload_is_private_by_default_and_keeps_the_token_out_of_logs(release, monkeypatch):
    lake, run, instance, _ = release
    import huggingface_hub

    FakeHfApi.calls, FakeHfApi.tokens = [], []
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHfApi)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    refused = run(hf_upload, RELEASE)  # no token configured
    assert not refused.success and not FakeHfApi.calls

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub_with_token = HuggingFaceHubResource(repo_id="me/panelforge", token=EnvVar("HF_TOKEN"))
    result = run(hf_upload, RELEASE, hub=hub_with_token)
    assert result.success
    assert FakeHfApi.tokens == [TOKEN]
    (create, upload) = FakeHfApi.calls
    assert create[0] == "create_repo" and create[2] == {"repo_type": "dataset", "private": True, "exist_ok": True}
    assert upload[0] == "upload_folder" and upload[2]["allow_patterns"] == release_patterns(RELEASE)
    assert upload[2]["ignore_patterns"] == hub.IGNORE_PATTERNS
    assert upload[2]["folder_path"] == dataset_dir(lake)
    logs = instance.all_logs(result.run_id)
    assert logs and not any(TOKEN in repr(entry) for entry in logs)


def test_upload_large_folder_is_used_where_the_library_has_it(tmp_path):
    class LargeFolderApi(FakeHfApi):
        def upload_large_folder(self, **kwargs):
            FakeHfApi.calls.append(("upload_large_folder", kwargs["repo_id"], kwargs))

    FakeHfApi.calls = []
    method = hub.upload_release(LargeFolderApi(), "me/ds", tmp_path, "2025", private=True)
    assert method == "upload_large_folder"
    (_, (name, _, kwargs)) = FakeHfApi.calls
    assert name == "upload_large_folder" and kwargs["private"] is True and kwargs["repo_type"] == "dataset"
    assert kwargs["allow_patterns"] == ["2025/**", "README.md", "LICENSES.md"]
    assert kwargs["ignore_patterns"] == hub.IGNORE_PATTERNS


def test_uploads_never_include_dotfiles_or_temporary_files(tmp_path):
    from huggingface_hub.utils import filter_repo_objects

    folder = tmp_path / "dataset"
    (folder / "2025" / "commercial" / ".cache").mkdir(parents=True)
    published = ["2025/commercial/panelforge-000000.tar", "2025/commercial/sizes.json", "README.md"]
    never = [
        "2025/commercial/.panelforge-000000.tar.0123abcd.tmp",  # a killed writer's partial shard
        "2025/commercial/.cache/x.json",
        "2025/commercial/panelforge-000001.tar.tmp",
        "2025/catalog.duckdb.0123abcd.tmp.duckdb",
        ".gitattributes",
    ]
    for name in published + never:
        (folder / name).write_bytes(b"x")
    plan = plan_upload(folder, release_patterns("2025"))
    assert plan.files == sorted(published)
    # huggingface_hub applies the same patterns the same way to what it uploads
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    chosen = filter_repo_objects(files, allow_patterns=release_patterns("2025"), ignore_patterns=hub.IGNORE_PATTERNS)
    assert sorted(chosen) == sorted(published)


def test_hub_limits_are_checked_before_upload(tmp_path, monkeypatch):
    folder = tmp_path / "dataset"
    (folder / "2025" / "big").mkdir(parents=True)
    (folder / "README.md").write_text("card")
    for i in range(12):
        (folder / "2025" / "big" / f"f{i:02d}.tar").write_bytes(b"x" * i)
    (folder / "2024").mkdir()
    (folder / "2024" / "old.tar").write_bytes(b"old")
    plan = plan_upload(folder, release_patterns("2025"))
    assert plan.files[0] == "2025/big/f00.tar" and "2024/old.tar" not in plan.files and len(plan.files) == 13
    monkeypatch.setattr(hub, "MAX_ENTRIES_PER_FOLDER", 10)
    with pytest.raises(HubLimitError, match="folder '2025/big' has 12 entries"):
        plan_upload(folder, release_patterns("2025"))
    monkeypatch.setattr(hub, "MAX_ENTRIES_PER_FOLDER", 10_000)
    monkeypatch.setattr(hub, "MAX_FILE_BYTES", 10)
    with pytest.raises(HubLimitError, match="2025/big/f11.tar is"):
        plan_upload(folder, release_patterns("2025"))
    monkeypatch.setattr(hub, "MAX_FILE_BYTES", 50 * 10**9)
    monkeypatch.setattr(hub, "MAX_FILES_PER_REPO", 5)
    with pytest.raises(HubLimitError, match="13 files"):
        plan_upload(folder, release_patterns("2025"))


def test_tars_hold_only_regular_members(release):
    lake = release[0]
    for path in glob.glob(dataset_dir(lake, RELEASE, "*", "*.tar")):
        with tarfile.open(path) as tar:
            assert all(m.isfile() and m.mtime == 0 and "/" not in m.name for m in tar.getmembers())
