"""Release stages: the sample plan per partition, WebDataset subsets and training mixtures, the
Parquet tables and statistics, the dataset card, and the upload to the Hugging Face Hub."""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import tarfile
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.core.fingerprints import fingerprint
from pipelines.core.lake import Lake
from pipelines.core.rawstore import RawReader
from pipelines.core.schemas import Table
from pipelines.core.stage import RELEASE, Check, Markdown, Partition, Preview, Stage, StageInputError, StageResult
from pipelines.core.taxonomy import load_taxonomy
from pipelines.images.gate import REASONS as GATE_REASONS
from pipelines.images.gate import GateSettings
from pipelines.images.previews import SHEET_ITEMS, captioned_sheet, sheet_preview
from pipelines.release.audit import find_machine_paths
from pipelines.release.card import write_card, write_release_json
from pipelines.release.export import export_tables
from pipelines.release.hub import plan_upload, release_patterns, upload_release
from pipelines.release.pairs import PAIR_LEVELS, PANEL, REGION, plan_pair_shard
from pipelines.release.pairs import REASONS as PAIR_REASONS
from pipelines.release.samples import REASONS, plan_shard
from pipelines.release.stats import pair_stats, release_stats
from pipelines.release.synthetic import synthetic_parts
from pipelines.release.webdataset import (
    LICENSE_SUBSETS,
    ShardLimits,
    by_level_and_license,
    by_license,
    concept_cap,
    concept_filter,
    dataset_dir,
    skipped_subsets,
    write_release_subsets,
)
from pipelines.text.pairing import CAPTION_MATCHES, VLM

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
SHARD_NAME = "panelforge"


@dataclass
class SamplePlanStage(Stage):
    """One row per figure image: included (caption, JSON, where its JPEG bytes are) or excluded
    with a reason; non-JPEG figures are converted once into a per-partition tar."""

    shuffle_seed: int = 0

    name = "dataset_samples"
    reads = (
        Table.ARTICLES,
        Table.FIGURES,
        Table.MENTIONS,
        Table.RAW_FILES,
        Table.PUBMED,
        Table.EMBEDDINGS,
        Table.FIGURE_CONCEPTS,
    )
    writes = (Table.SAMPLES,)

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        release, shard = partition.release, partition.shard
        converted = lake.path("converted", f"release={release}", f"shard={shard}", "images.tar")
        with lake.commit(self.name, release, shard) as commit:
            plan = plan_shard(lake, release, shard, self.shuffle_seed, converted, commit)
            commit.write_table(Table.SAMPLES, plan.rows)
        excluded = [r for r in plan.rows if r["status"] == "excluded"]
        return self.result(
            partition,
            ok=plan.included,
            skipped=len(excluded),
            counts={
                "samples": plan.included,
                "excluded": len(excluded),
                **{f"excluded_{reason}": plan.excluded.get(reason, 0) for reason in REASONS},
                "converted_to_jpeg": plan.converted,
                "shuffle_seed": self.shuffle_seed,
            },
            previews={
                "preview": Preview(plan.rows, ["key", "status", "reason", "license_group", "global_concept", "caption"])
            },
        )


def license_subsets() -> dict[str, Callable[[dict], bool]]:
    """The full release: one subset per license group."""
    return {group: by_license(group) for group in LICENSE_SUBSETS}


def concept_filtered_subsets(concepts: list[str], taxonomy: str | None = None) -> dict[str, Callable[[dict], bool]]:
    """BIOMEDICA's concept-filtered mixture: only the chosen global concepts, per license group."""
    known = set(load_taxonomy(taxonomy).global_concepts)
    unknown = sorted(set(concepts) - known)
    if unknown:
        raise StageInputError(f"unknown global concepts {unknown}; known: {sorted(known)}")
    return {f"concept-filtered-{g}": concept_filter(g, concepts) for g in LICENSE_SUBSETS}


def concept_balanced_subsets(cap: int) -> dict[str, Callable[[dict], bool]]:
    """BIOMEDICA's concept-balanced mixture: at most ``cap`` samples per global concept."""
    return {f"concept-balanced-{g}": concept_cap(g, cap) for g in LICENSE_SUBSETS}


_LEVEL_NOUNS = {"panel": "panel pair", "region": "region pair", "longcap": "long caption"}


def empty_reason(subset: str) -> str:
    """What it means that a subset built here has no sample (the card says it for each one skipped)."""
    group = subset.rsplit("-", 1)[-1]
    if subset.startswith("concept-filtered-"):
        return f"no included figure in license group '{group}' has one of the chosen global concepts"
    if subset.startswith("concept-balanced-"):
        return f"no included figure in license group '{group}' has a global concept label"
    level = subset.split("-", 1)[0] if "-" in subset else None
    if level in _LEVEL_NOUNS:
        return f"no included {_LEVEL_NOUNS[level]} in license group '{group}'"
    return f"no included figure in license group '{group}'"


@dataclass
class WebDatasetStage(Stage):
    """Shuffled WebDataset shards of the release for each named subset, with a Parquet sidecar
    per shard and sizes.json for OpenCLIP; shards of an interrupted run are reused."""

    subsets: dict[str, Callable[[dict], bool]]
    limits: ShardLimits = ShardLimits()
    shard_name: str = SHARD_NAME
    mixture: str | None = None
    name: str = "webdataset_shards"

    level = RELEASE
    reads = (Table.SAMPLES,)

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        release = partition.release
        reasons = {subset: empty_reason(subset) for subset in self.subsets}
        results = write_release_subsets(
            lake, release, self.subsets, self.limits, self.shard_name, self.mixture, empty_reasons=reasons
        )
        return _subsets_result(self, partition, lake, results)


def _subsets_result(stage: Stage, partition: Partition, lake: Lake, results: dict) -> StageResult:
    """The result of a stage that wrote WebDataset subsets: samples, shards and bytes of each."""
    counts: dict[str, object] = {}
    for subset, written in results.items():
        counts[f"{subset}_samples"] = written.samples
        counts[f"{subset}_shards"] = len(written.shards)
        counts[f"{subset}_bytes"] = written.bytes
    reused = sum(s["reused"] for r in results.values() for s in r.shards)
    counts["shards_reused_from_earlier_run"] = reused
    counts["subsets_skipped"] = {subset: r.skipped for subset, r in results.items() if r.skipped}
    seed = next((r.seed for r in results.values() if r.seed is not None), None)
    counts["shuffle_seed"] = seed if seed is not None else "none (no samples)"
    result = stage.result(
        partition,
        ok=sum(r.samples for r in results.values()),
        bytes=sum(r.bytes for r in results.values()),
        counts=counts,
        paths={"path": dataset_dir(lake, partition.release)},
    )
    # the shards' bytes decide what a downstream asset sees: their sha256, per subset
    result.version = fingerprint({name: [s["sha256"] for s in r.shards] for name, r in sorted(results.items())})
    return result


@dataclass
class PairPlanStage(Stage):
    """One row per panel pair, region pair and long caption of the partition, included or excluded
    with a reason, keyed and licensed by its figure-level sample; crops are reused from
    panel_crops or cut once from the raw image into a per-partition tar. Panel samples ship
    caption-matched texts (by printed label or reading order; ``include_vlm_text`` adds the
    texts the VLM associated) and crops that pass the release gate."""

    include_vlm_text: bool = False
    gate: GateSettings = field(default_factory=GateSettings)

    name = "pair_samples"
    reads = (
        Table.SAMPLES,
        Table.PAIRS,
        Table.PANELS,
        Table.PANEL_CROPS,
        Table.LONG_CAPTIONS,
        Table.PAIR_NEGATIVES,
        Table.RAW_FILES,
    )
    writes = (Table.PAIR_SAMPLES,)

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        release, shard = partition.release, partition.shard
        crops = lake.path("release_crops", f"release={release}", f"shard={shard}", "crops.tar")
        with lake.commit(self.name, release, shard) as commit:
            matches = (*CAPTION_MATCHES, VLM) if self.include_vlm_text else CAPTION_MATCHES
            plan = plan_pair_shard(lake, release, shard, crops, matches, self.gate, commit=commit)
            if {Table.PAIRS, Table.LONG_CAPTIONS} <= set(plan.inputs_absent):  # either one gives samples
                lake.require(Table.PAIRS, release, shard)  # says: materialize `pairs` first
            commit.write_table(Table.PAIR_SAMPLES, plan.rows)
        counts: dict[str, object] = {f"{level}_samples": plan.included(level) for level in PAIR_LEVELS}
        counts |= {f"excluded_{reason}": plan.excluded.get(reason, 0) for reason in PAIR_REASONS}
        counts |= {f"crops_{source}": n for source, n in sorted(plan.crop_sources.items())}
        counts |= {f"panel_text_{match}": plan.panel_matches.get(match, 0) for match in (*CAPTION_MATCHES, VLM)}
        counts |= {f"gate_{reason}": plan.gate.get(reason, 0) for reason in GATE_REASONS}
        counts["panel_texts_shipped"] = ", ".join(matches)
        counts["inputs_absent"] = ", ".join(plan.inputs_absent) or "none"
        counts |= pair_sheets(lake, plan.rows, partition)
        return self.result(
            partition,
            ok=plan.included(),
            skipped=sum(plan.excluded.values()),
            counts=counts,
            previews={"preview": Preview(plan.rows, ["key", "level", "status", "reason", "crop_source", "caption"])},
        )


def pair_sheets(lake: Lake, rows: list[dict], partition: Partition) -> dict[str, Markdown]:
    """Contact sheets of the partition's first included panel and region samples (plan order:
    shuffled), each crop with the text it ships with and the model's description, for the UI."""
    sheets: dict[str, Markdown] = {}
    with RawReader(lake) as reader:
        for level in (PANEL, REGION):
            included = [r for r in rows if r["level"] == level and r["status"] == "included"]
            chosen = included[:SHEET_ITEMS]
            if not chosen:
                continue
            items, synthetic = [], False
            for row in chosen:
                meta = json.loads(row["meta_json"])
                synthetic |= bool(meta.get("synthetic"))
                described = f" | VLM: {meta['description']}" if meta.get("description") else ""
                items.append(
                    (reader.read(row["image_tar"], row["image_offset"], row["image_size"]), row["caption"] + described)
                )
            title = f"{level} samples of {partition}: {len(chosen)} of {len(included)}"
            title += " (SYNTHETIC: tiny random VLM)" if synthetic else ""
            sheets[f"{level}_samples_sheet"] = Markdown(sheet_preview(captioned_sheet(items, title), title=title))
    return sheets


def pair_level_subsets() -> tuple[dict[str, Callable[[dict], bool]], dict[str, str]]:
    """One subset per pair level and license group (``panel-commercial``...), and each one's level."""
    subsets = {f"{level}-{g}": by_level_and_license(level, g) for level in PAIR_LEVELS for g in LICENSE_SUBSETS}
    return subsets, {f"{level}-{g}": level for level in PAIR_LEVELS for g in LICENSE_SUBSETS}


def included_figure_keys(lake: Lake, release: str) -> Iterator[str]:
    for shard in lake.shards():
        table = lake.read_table(Table.SAMPLES, release, shard)
        for row in table.select(["key", "status"]).to_pylist() if table is not None else []:
            if row["status"] == "included":
                yield row["key"]


def included_pair_samples(lake: Lake, release: str) -> Iterator[dict]:
    for shard in lake.shards():
        table = lake.read_table(Table.PAIR_SAMPLES, release, shard)
        columns = ["level", "figure_key", "status", "caption", "meta_json"]
        for row in table.select(columns).to_pylist() if table is not None else []:
            if row["status"] == "included":
                yield row


@dataclass
class PairWebDatasetStage(Stage):
    """Shuffled WebDataset subsets of the pair levels (panel, region with hard negatives, long
    captions), one per level and license group, with sidecars, and their statistics."""

    limits: ShardLimits = ShardLimits()
    shard_name: str = SHARD_NAME
    token_sample: int = 5_000
    seed: int = 0

    name = "webdataset_pairs"
    level = RELEASE
    reads = (Table.PAIR_SAMPLES, Table.SAMPLES)

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        release = partition.release
        subsets, levels = pair_level_subsets()
        results = write_release_subsets(
            lake,
            release,
            subsets,
            self.limits,
            self.shard_name,
            table=Table.PAIR_SAMPLES,
            levels=levels,
            empty_reasons={subset: empty_reason(subset) for subset in subsets},
        )
        stats = pair_stats(
            included_pair_samples(lake, release),
            included_figure_keys(lake, release),
            token_sample=self.token_sample,
            seed=self.seed,
        )
        summary = stats.result()
        synthetic = synthetic_parts(lake, release)
        summary["synthetic"] = synthetic.short
        pngs = stats.histograms(synthetic.footer() if synthetic else None)
        for name, payload in {**pngs, "pairs.json": json.dumps(summary, indent=1).encode()}.items():
            with lake.atomic_local_file(dataset_dir(lake, release, "stats", "pairs", name)) as tmp:
                Path(tmp).write_bytes(payload)
        result = _subsets_result(self, partition, lake, results)
        for name in ("longcap_tokens_before", "longcap_tokens_after", "panel_pairs_per_figure"):
            value = summary["fields"].get(name, {}).get("value", {})
            result.counts[f"{name}_mean"] = value.get("mean", 0)
        return result


def included_samples(lake: Lake, release: str) -> Iterator[tuple[str, str]]:
    """(caption, JSON) of every included sample of the release, one shard at a time."""
    for shard in lake.shards():
        table = lake.read_table(Table.SAMPLES, release, shard)
        if table is None:
            continue
        for row in table.select(["status", "caption", "meta_json"]).to_pylist():
            if row["status"] == "included":
                yield row["caption"], row["meta_json"]


def licensed_bodies(lake: Lake, release: str) -> Iterator[str]:
    """Body text of every article with a known license, one shard at a time."""
    for shard in lake.shards():
        table = lake.read_table(Table.ARTICLES, release, shard)
        for row in table.select(["license_code", "body_text"]).to_pylist() if table is not None else []:
            if row["license_code"]:
                yield row["body_text"]


@dataclass
class ReleaseTablesStage(Stage):
    """The release's tables as its Parquet dataset (articles, figures, mentions, PubMed, labels,
    panels, pairs, long captions, hard negatives), and statistics (lengths in characters and CLIP
    tokens, image sizes, counts) with PNG histograms."""

    reservoir: int = 100_000
    token_sample: int = 5_000
    seed: int = 0

    name = "release_parquet"
    level = RELEASE
    reads = (
        Table.SAMPLES,
        Table.ARTICLES,
        Table.FIGURES,
        Table.MENTIONS,
        Table.PUBMED,
        Table.FIGURE_CONCEPTS,
        Table.PANELS,
        Table.PAIRS,
        Table.LONG_CAPTIONS,
        Table.PAIR_NEGATIVES,
    )

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        release = partition.release
        lake.require(Table.SAMPLES, release)  # the articles' shards are parsed and planned: not an empty release
        tables = export_tables(lake, release, lake.shards())
        stats = release_stats(
            included_samples(lake, release),
            licensed_bodies(lake, release),
            self.reservoir,
            self.token_sample,
            self.seed,
        )
        summary = stats.result()
        synthetic = synthetic_parts(lake, release)
        summary["synthetic"] = synthetic.short
        pngs = stats.histograms(synthetic.footer() if synthetic else None)
        for name, payload in {**pngs, "stats.json": json.dumps(summary, indent=1).encode()}.items():
            with lake.atomic_local_file(dataset_dir(lake, release, "stats", name)) as tmp:
                Path(tmp).write_bytes(payload)
        with lake.atomic_local_file(dataset_dir(lake, release, "parquet", "tables.json")) as tmp:
            Path(tmp).write_text(json.dumps(tables, indent=1, sort_keys=True))
        counts: dict[str, object] = {f"{t}_rows": f["rows"] for t, f in tables.items()}
        counts["articles_withheld_unknown_license"] = tables["articles"]["withheld_unknown_license"]
        counts["tokenizer"] = summary["tokenizer"]
        for name, entry in summary["fields"].items():
            part = entry.get("chars") or entry.get("value")
            counts[f"{name}_median"] = part.get("p50", 0)
            if "tokens" in entry:
                counts[f"{name}_tokens_mean"] = entry["tokens"]["mean"]
        for name in ("caption.png", "per_concept.png"):
            if name in pngs:
                encoded = base64.b64encode(pngs[name]).decode()
                counts[name.replace(".png", "_histogram")] = Markdown(f"![{name}](data:image/png;base64,{encoded})")
        result = self.result(
            partition,
            ok=sum(f["rows"] for f in tables.values()),
            counts=counts,
            paths={"path": dataset_dir(lake, release, "parquet")},
        )
        result.version = fingerprint({"tables": tables, "stats": summary})
        return result


def release_info(lake: Lake, release: str) -> dict:
    """What the card says about one release: its subsets' manifests, tables, statistics and exclusions."""
    subsets = {}
    for path in sorted(lake.fs.glob(dataset_dir(lake, release, "*", "manifest.json"))):
        manifest = json.loads(lake.fs.cat(path))
        manifest["shards"] = len(manifest["shards"])
        subsets[manifest["subset"]] = manifest
    if not subsets:
        raise StageInputError(f"release {release} has no WebDataset subsets: materialize webdataset_shards first")
    excluded: Counter = Counter()
    for shard in lake.shards():
        table = lake.read_table(Table.SAMPLES, release, shard)
        for row in table.select(["status", "reason"]).to_pylist() if table is not None else []:
            if row["status"] == "excluded":
                excluded[row["reason"]] += 1
    base = subsets.get("commercial") or next(iter(subsets.values()))
    tables_path = dataset_dir(lake, release, "parquet", "tables.json")
    stats_path = dataset_dir(lake, release, "stats", "stats.json")
    pair_stats_path = dataset_dir(lake, release, "stats", "pairs", "pairs.json")
    examples = {}
    for name, manifest in subsets.items():
        level = manifest.get("level")
        if level in PAIR_LEVELS and level not in examples and manifest["samples"]:
            examples[level] = first_sample(
                lake, dataset_dir(lake, release, name, manifest["shard_name"] + "-000000.tar")
            )
    return {
        "release": release,
        "subsets": {name: {k: v for k, v in m.items() if k != "subset"} for name, m in subsets.items()},
        "tables": json.loads(lake.fs.cat(tables_path)) if lake.exists(tables_path) else {},
        "stats": json.loads(lake.fs.cat(stats_path)) if lake.exists(stats_path) else {},
        "pair_stats": json.loads(lake.fs.cat(pair_stats_path)) if lake.exists(pair_stats_path) else {},
        "examples": examples,
        "panel_pairs": panel_pair_summary(lake, release),
        "excluded": dict(sorted(excluded.items())),
        "shuffle_seed": base["shuffle_seed"],
        "limits": base["limits"],
        "synthetic": synthetic_parts(lake, release).parts,
        "skipped_subsets": skipped_subsets(lake, release),
    }


def panel_pair_summary(lake: Lake, release: str) -> dict:
    """What the card says about the panel level: included panel samples by how their text was
    matched, excluded ones by reason, and the release gate's reasons."""
    included: Counter = Counter()
    excluded: Counter = Counter()
    gate: Counter = Counter()
    for shard in lake.shards():
        table = lake.read_table(Table.PAIR_SAMPLES, release, shard)
        columns = ["level", "status", "reason", "detail", "meta_json"]
        for row in table.select(columns).to_pylist() if table is not None else []:
            if row["level"] != PANEL:
                continue
            if row["status"] == "included":
                included[json.loads(row["meta_json"]).get("text_match") or "unknown"] += 1
            else:
                excluded[row["reason"]] += 1
                if row["reason"] == "crop_gate":
                    gate[row["detail"]] += 1
    return {"included": dict(sorted(included.items())), "excluded": dict(sorted(excluded.items())), "gate": dict(gate)}


def first_sample(lake: Lake, tar_path: str) -> dict:
    """The first sample of a shard as the card shows it: its key and its members, JSON parsed."""
    sample: dict = {}
    with lake.fs.open(tar_path, "rb") as fh, tarfile.open(fileobj=fh) as tar:
        for member in tar:
            key, ext = member.name.split(".", 1)
            if sample and key != sample["__key__"]:
                break
            data = tar.extractfile(member).read()
            sample["__key__"] = key
            if ext == "json":
                sample[ext] = json.loads(data)
            elif ext != "jpg":
                sample[ext] = data.decode()
    return sample


@dataclass
class DatasetCardStage(Stage):
    """The dataset card (README.md with the Hub's YAML header) and LICENSES.md, for every release."""

    repo_id: str | None = None
    audit_tars_per_folder: int | None = 1  # the machine-path audit reads the first tar of each subset

    name = "dataset_card"
    level = RELEASE
    reads = (Table.SAMPLES,)

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        from huggingface_hub import DatasetCard

        write_release_json(lake, partition.release, release_info(lake, partition.release))
        path = write_card(lake, self.repo_id)
        text = lake.fs.cat(path).decode()
        header = DatasetCard(text).data.to_dict()  # parses the YAML header the way the Hub does
        with local_dataset_folder(lake) as folder:
            roots = (lake.root,) if lake.is_local else ()
            leaks = find_machine_paths(folder, False, self.audit_tars_per_folder, roots)
        result = self.result(
            partition,
            ok=1,
            bytes=len(text.encode()),
            counts={
                "configs": len(header.get("configs", [])),
                "size_category": ", ".join(header.get("size_categories", [])),
                "card": Markdown(text.split("---\n", 2)[2][:6000]),
            },
            paths={"path": path},
            checks=[no_machine_paths(leaks)],
        )
        result.version = fingerprint(text)
        return result


NO_MACHINE_PATHS = "no_machine_paths"


def no_machine_paths(leaks: list) -> Check:
    """The dataset folder holds no path of the machine that built it (blocking: the upload waits)."""
    shown = [f"{f.file} {f.where}: {f.value}" for f in leaks[:10]]
    return Check(
        NO_MACHINE_PATHS,
        passed=not leaks,
        description=f"{len(leaks)} absolute paths in the dataset folder" + (": " + "; ".join(shown) if shown else ""),
        metadata={"found": len(leaks)},
    )


@contextlib.contextmanager
def local_dataset_folder(lake: Lake) -> Iterator[Path]:
    """The dataset folder on local disk: itself for a local lake, else a temporary copy."""
    if lake.is_local:
        yield Path(dataset_dir(lake))
        return
    tmp = tempfile.mkdtemp(prefix="panelforge-hub-")
    try:
        lake.fs.get(dataset_dir(lake) + "/", tmp + "/", recursive=True)
        yield Path(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass
class HubUploadStage(Stage):
    """Upload the release to a Hugging Face dataset repository (private by default, resumable)
    after checking the Hub's limits. ``api`` None (or ``dry_run``) only plans: no network call."""

    repo_id: str | None
    api: object | None = None
    private: bool = True
    dry_run: bool = False
    warnings: list[str] = field(default_factory=list)

    name = "hf_upload"
    level = RELEASE

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        release = partition.release
        with local_dataset_folder(lake) as folder:
            plan = plan_upload(folder, release_patterns(release))
            self.warnings.extend(plan.warnings)
            counts: dict[str, object] = {"files": len(plan.files), "dry_run": self.dry_run}
            counts["repo_id"] = self.repo_id or "(PANELFORGE_HF_REPO unset)"
            counts["private"] = self.private
            if not self.dry_run:
                if not self.repo_id:
                    raise StageInputError("PANELFORGE_HF_REPO is not set: name the dataset repository to upload to")
                if self.api is None:
                    raise StageInputError("HF_TOKEN is not set: export a Hugging Face write token in the environment")
                counts["method"] = upload_release(self.api, self.repo_id, folder, release, self.private)
                counts["url"] = f"https://huggingface.co/datasets/{self.repo_id}"
        result = self.result(partition, ok=len(plan.files), bytes=plan.bytes, counts=counts)
        result.version = fingerprint({"files": plan.files, "bytes": plan.bytes, "repo": self.repo_id})
        return result
