"""Release assets: the sample plan per partition, WebDataset subsets and training mixtures, the
Parquet tables and statistics, the dataset card, and the upload to the Hugging Face Hub."""

import base64
import contextlib
import json
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from dagster import (
    AssetDep,
    AssetExecutionContext,
    BackfillPolicy,
    Config,
    Failure,
    MaterializeResult,
    MetadataValue,
    MultiToSingleDimensionPartitionMapping,
    asset,
)

from assets.concepts import figure_concepts
from assets.metadata import preview
from assets.parsing import parsed_articles, pubmed_metadata
from jobs.partitions import release_shard_partitions, releases_partitions, shard_partitions
from pipelines.concepts.annotations import load_taxonomy
from pipelines.release.card import write_card, write_release_json
from pipelines.release.export import export_tables
from pipelines.release.hub import HubLimitError, hub_token, plan_upload, release_patterns, upload_release
from pipelines.release.samples import REASONS, plan_shard
from pipelines.release.stats import release_stats
from pipelines.release.webdataset import (
    LICENSE_SUBSETS,
    ShardLimits,
    by_license,
    concept_cap,
    concept_filter,
    dataset_dir,
    write_release_subsets,
)
from resources.hub import HuggingFaceHubResource
from resources.lake import LakeResource

BIOMEDICA_FILTERED_CONCEPTS = [
    "Clinical Imaging",
    "Microscopy",
    "Immuno Assays",
    "Illustrative Diagrams",
    "Chemical Structures",
    "Maps",
    "Tools and Materials",
    "Hand Drawn and Screen Based Visuals",
]
_whole_release = MultiToSingleDimensionPartitionMapping("release")


class SamplePlanSettings(Config):
    """``shuffle_seed`` fixes the release's sample order; every shard of a release must use one seed."""

    shuffle_seed: int = 0


@asset(
    partitions_def=release_shard_partitions,
    deps=[parsed_articles, pubmed_metadata, figure_concepts],
    group_name="release",
    kinds={"parquet"},
    backfill_policy=BackfillPolicy.multi_run(1),
    description="One row per figure image: included (caption, JSON, where its JPEG bytes are) or excluded with a "
    "reason; non-JPEG figures converted once.",
)
def dataset_samples(
    context: AssetExecutionContext, config: SamplePlanSettings, lake: LakeResource
) -> MaterializeResult:
    keys = context.partition_key.keys_by_dimension
    release, shard = keys["release"], keys["shard"]
    lk = lake.lake()
    converted = lk.path("converted", f"release={release}", f"shard={shard}", "images.tar")
    plan = plan_shard(lk, release, shard, config.shuffle_seed, converted)
    rows = plan.rows
    lk.write_table("samples", release, shard, rows)
    lk.refresh_catalog()
    for row in rows:
        if row["status"] == "excluded":
            detail = f" ({row['detail']})" if row["detail"] else ""
            context.log.info(f"excluded {row['key']}: {row['reason']}{detail}")
    return MaterializeResult(
        metadata={
            "samples": plan.included,
            "excluded": len(rows) - plan.included,
            **{f"excluded_{reason}": plan.excluded.get(reason, 0) for reason in REASONS},
            "converted_to_jpeg": plan.converted,
            "shuffle_seed": config.shuffle_seed,
            "preview": preview(rows, ["key", "status", "reason", "license_group", "global_concept", "caption"]),
        }
    )


class ShardSettings(Config):
    """At most ``max_samples_per_shard`` samples or ``max_shard_bytes`` bytes per tar."""

    max_samples_per_shard: int = 10_000
    max_shard_bytes: int = 1_000_000_000
    shard_name: str = "panelforge"

    def limits(self) -> ShardLimits:
        return ShardLimits(self.max_samples_per_shard, self.max_shard_bytes)


def _write_subsets(context, lk, release: str, subsets: dict, config: ShardSettings, mixture: str | None):
    results = write_release_subsets(lk, release, subsets, config.limits(), config.shard_name, mixture)
    metadata = {}
    for name, result in results.items():
        metadata[f"{name}_samples"] = result.samples
        metadata[f"{name}_shards"] = len(result.shards)
        metadata[f"{name}_bytes"] = result.bytes
    metadata["shards_reused_from_earlier_run"] = sum(s["reused"] for r in results.values() for s in r.shards)
    metadata["shuffle_seed"] = next((r.seed for r in results.values() if r.seed is not None), None)
    metadata["path"] = MetadataValue.path(dataset_dir(lk, release))
    context.log.info(", ".join(f"{n}: {r.samples} samples in {len(r.shards)} shards" for n, r in results.items()))
    return MaterializeResult(metadata=metadata)


@asset(
    partitions_def=releases_partitions,
    deps=[AssetDep(dataset_samples, partition_mapping=_whole_release)],
    group_name="release",
    kinds={"webdataset"},
    description="The release as WebDataset shards, one subset per license group, shuffled across clusters and "
    "articles, with a Parquet sidecar per shard and sizes.json for OpenCLIP.",
)
def webdataset_shards(context: AssetExecutionContext, config: ShardSettings, lake: LakeResource) -> MaterializeResult:
    subsets = {group: by_license(group) for group in LICENSE_SUBSETS}
    return _write_subsets(context, lake.lake(), context.partition_key, subsets, config, None)


class ConceptFilterSettings(ShardSettings):
    concepts: list[str] = BIOMEDICA_FILTERED_CONCEPTS


@asset(
    partitions_def=releases_partitions,
    deps=[AssetDep(dataset_samples, partition_mapping=_whole_release)],
    group_name="release",
    kinds={"webdataset"},
    description="BIOMEDICA's concept-filtered training mixture: only the chosen global concepts, per license group.",
)
def webdataset_concept_filtered(
    context: AssetExecutionContext, config: ConceptFilterSettings, lake: LakeResource
) -> MaterializeResult:
    known = set(load_taxonomy().global_concepts)
    unknown = sorted(set(config.concepts) - known)
    if unknown:
        raise Failure(f"unknown global concepts {unknown}; known: {sorted(known)}")
    subsets = {f"concept-filtered-{g}": concept_filter(g, config.concepts) for g in LICENSE_SUBSETS}
    return _write_subsets(context, lake.lake(), context.partition_key, subsets, config, "concept-filtered")


class ConceptBalanceSettings(ShardSettings):
    cap_per_concept: int = 100_000


@asset(
    partitions_def=releases_partitions,
    deps=[AssetDep(dataset_samples, partition_mapping=_whole_release)],
    group_name="release",
    kinds={"webdataset"},
    description="BIOMEDICA's concept-balanced training mixture: at most cap_per_concept samples of each global "
    "concept (a random subset, in shuffle order), per license group.",
)
def webdataset_concept_balanced(
    context: AssetExecutionContext, config: ConceptBalanceSettings, lake: LakeResource
) -> MaterializeResult:
    subsets = {f"concept-balanced-{g}": concept_cap(g, config.cap_per_concept) for g in LICENSE_SUBSETS}
    return _write_subsets(context, lake.lake(), context.partition_key, subsets, config, "concept-balanced")


class StatsSettings(Config):
    reservoir: int = 100_000
    token_sample: int = 5_000
    seed: int = 0


def _included(lk, release: str):
    for shard in shard_partitions.get_partition_keys():
        table = lk.read_table("samples", release, shard)
        if table is None:
            continue
        for row in table.select(["status", "caption", "meta_json"]).to_pylist():
            if row["status"] == "included":
                yield row["caption"], row["meta_json"]


def _bodies(lk, release: str):
    for shard in shard_partitions.get_partition_keys():
        table = lk.read_table("articles", release, shard)
        for row in table.select(["license_code", "body_text"]).to_pylist() if table is not None else []:
            if row["license_code"]:
                yield row["body_text"]


@asset(
    partitions_def=releases_partitions,
    deps=[AssetDep(dataset_samples, partition_mapping=_whole_release)],
    group_name="release",
    kinds={"parquet"},
    description="The articles, figures, mentions, pubmed and labels tables as the release's Parquet dataset, "
    "and statistics (lengths in characters and CLIP tokens, image sizes, counts) with PNG histograms.",
)
def release_parquet(context: AssetExecutionContext, config: StatsSettings, lake: LakeResource) -> MaterializeResult:
    release, lk = context.partition_key, lake.lake()
    tables = export_tables(lk, release, shard_partitions.get_partition_keys())
    stats = release_stats(
        _included(lk, release), _bodies(lk, release), config.reservoir, config.token_sample, config.seed
    )
    summary = stats.result()
    pngs = stats.histograms()
    for name, payload in {**pngs, "stats.json": json.dumps(summary, indent=1).encode()}.items():
        with lk.atomic_local_file(dataset_dir(lk, release, "stats", name)) as tmp:
            Path(tmp).write_bytes(payload)
    with lk.atomic_local_file(dataset_dir(lk, release, "parquet", "tables.json")) as tmp:
        Path(tmp).write_text(json.dumps(tables, indent=1, sort_keys=True))
    metadata = {f"{t}_rows": f["rows"] for t, f in tables.items()}
    metadata["articles_withheld_unknown_license"] = tables["articles"]["withheld_unknown_license"]
    metadata["tokenizer"] = summary["tokenizer"]
    for name, entry in summary["fields"].items():
        part = entry.get("chars") or entry.get("value")
        metadata[f"{name}_median"] = part.get("p50", 0)
        if "tokens" in entry:
            metadata[f"{name}_tokens_mean"] = entry["tokens"]["mean"]
    for name in ("caption.png", "per_concept.png"):
        if name in pngs:
            encoded = base64.b64encode(pngs[name]).decode()
            image = MetadataValue.md(f"![{name}](data:image/png;base64,{encoded})")
            metadata[name.replace(".png", "_histogram")] = image
    metadata["path"] = MetadataValue.path(dataset_dir(lk, release, "parquet"))
    return MaterializeResult(metadata=metadata)


def _release_info(lk, release: str) -> dict:
    subsets = {}
    for path in sorted(lk.fs.glob(dataset_dir(lk, release, "*", "manifest.json"))):
        manifest = json.loads(lk.fs.cat(path))
        manifest["shards"] = len(manifest["shards"])
        subsets[manifest["subset"]] = manifest
    if not subsets:
        raise Failure(f"release {release} has no WebDataset subsets: materialize webdataset_shards first")
    excluded: Counter = Counter()
    synthetic = False
    for shard in shard_partitions.get_partition_keys():
        table = lk.read_table("samples", release, shard)
        for row in table.select(["status", "reason", "meta_json"]).to_pylist() if table is not None else []:
            if row["status"] == "excluded":
                excluded[row["reason"]] += 1
            elif not synthetic and json.loads(row["meta_json"])["labels_from_synthetic_model"]:
                synthetic = True
    base = subsets.get("commercial") or next(iter(subsets.values()))
    tables_path = dataset_dir(lk, release, "parquet", "tables.json")
    stats_path = dataset_dir(lk, release, "stats", "stats.json")
    return {
        "release": release,
        "subsets": {name: {k: v for k, v in m.items() if k != "subset"} for name, m in subsets.items()},
        "tables": json.loads(lk.fs.cat(tables_path)) if lk.exists(tables_path) else {},
        "stats": json.loads(lk.fs.cat(stats_path)) if lk.exists(stats_path) else {},
        "excluded": dict(sorted(excluded.items())),
        "shuffle_seed": base["shuffle_seed"],
        "limits": base["limits"],
        "synthetic_labels": synthetic,
    }


@asset(
    partitions_def=releases_partitions,
    deps=[webdataset_shards, webdataset_concept_filtered, webdataset_concept_balanced, release_parquet],
    group_name="release",
    kinds={"markdown"},
    description="The dataset card (README.md with the Hub's YAML header) and LICENSES.md, covering every release.",
)
def dataset_card(context: AssetExecutionContext, lake: LakeResource, hub: HuggingFaceHubResource) -> MaterializeResult:
    from huggingface_hub import DatasetCard

    release, lk = context.partition_key, lake.lake()
    write_release_json(lk, release, _release_info(lk, release))
    path = write_card(lk, hub.repo_id)
    text = lk.fs.cat(path).decode()
    card = DatasetCard(text)  # parses the YAML header the way the Hub does
    configs = card.data.to_dict().get("configs", [])
    return MaterializeResult(
        metadata={
            "configs": len(configs),
            "size_category": ", ".join(card.data.to_dict().get("size_categories", [])),
            "card": MetadataValue.md(text.split("---\n", 2)[2][:6000]),
            "path": MetadataValue.path(path),
        }
    )


class UploadSettings(Config):
    """``dry_run`` checks and lists everything that would be uploaded without any network call."""

    dry_run: bool = False


@asset(
    partitions_def=releases_partitions,
    deps=[dataset_card],
    group_name="release",
    kinds={"huggingface"},
    description="Upload the release to the Hugging Face dataset repository PANELFORGE_HF_REPO (private by "
    "default, resumable), after checking the Hub's limits.",
)
def hf_upload(
    context: AssetExecutionContext, config: UploadSettings, lake: LakeResource, hub: HuggingFaceHubResource
) -> MaterializeResult:
    release, lk = context.partition_key, lake.lake()
    with _local_folder(lk) as folder:
        try:
            plan = plan_upload(folder, release_patterns(release))
        except HubLimitError as exc:
            raise Failure(str(exc)) from exc
        for warning in plan.warnings:
            context.log.warning(warning)
        metadata = {"files": len(plan.files), "bytes": plan.bytes, "dry_run": config.dry_run}
        metadata["repo_id"] = hub.repo_id or "(PANELFORGE_HF_REPO unset)"
        metadata["private"] = hub.private
        if config.dry_run:
            context.log.info(f"dry run: would upload {len(plan.files)} files ({plan.bytes / 1e6:.1f} MB)")
            return MaterializeResult(metadata=metadata)
        if not hub.repo_id:
            raise Failure("PANELFORGE_HF_REPO is not set: name the dataset repository to upload to")
        if not hub_token():
            raise Failure("HF_TOKEN is not set: export a Hugging Face write token in the environment")
        method = upload_release(hub.client(), hub.repo_id, folder, release, hub.private)
        metadata["method"] = method
        metadata["url"] = MetadataValue.url(f"https://huggingface.co/datasets/{hub.repo_id}")
        return MaterializeResult(metadata=metadata)


@contextlib.contextmanager
def _local_folder(lk) -> Iterator[Path]:
    """The dataset folder on local disk: itself for a local lake, else a temporary copy."""
    if lk.is_local:
        yield Path(dataset_dir(lk))
        return
    tmp = tempfile.mkdtemp(prefix="panelforge-hub-")
    try:
        lk.fs.get(dataset_dir(lk) + "/", tmp + "/", recursive=True)
        yield Path(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
