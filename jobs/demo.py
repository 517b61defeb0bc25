"""``make demo``: run every asset on the bundled sample release, offline.

Packages ``sample/`` into the PMC Cloud layout, serves it from a loopback S3-compatible
server (started and stopped here), materializes every asset of release ``2026`` into
``PANELFORGE_HOME`` (``./data``): acquisition to the WebDataset release, then the launched
training and evaluation jobs on the tiny local models (marked synthetic), and prints what it made.
Runs are recorded in ``.demo/dagster_home`` so ``make ui`` shows them.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import warnings
from pathlib import Path

from dagster import BetaWarning

DEMO_RELEASE = "2026"
# 157 sample images: a handful of clusters a person can review (production: k = 2000)
DEMO_CONCEPT_MODEL = {"n_components": 16, "k": 8, "sample_size": 10_000, "seed": 0}
DEMO_HELDOUT_SHARE = 0.2  # of the 38 articles: held out of the training assets, scored by clip_evaluation


def demo_config(repo: Path) -> dict[str, dict]:
    """The run configuration of the assets whose defaults are production sizes; the launched jobs
    run at demo sizes on the tiny local models anyway (the synthetic profile's, assets/synthetic.py)."""
    return {
        "concept_model": DEMO_CONCEPT_MODEL,
        "cluster_labels": {"directory": str(repo / "sample" / "annotations")},  # the sample's annotations
        "hf_upload": {"dry_run": True},
        # the first training asset records the release's held-out split; the evaluation scores that one
        "clip_continual_pretraining": {"heldout_share": DEMO_HELDOUT_SHARE},
        "multilevel_training": {"heldout_share": DEMO_HELDOUT_SHARE},
        "clip_evaluation": {"share": DEMO_HELDOUT_SHARE},
    }


def main() -> int:
    from resources.settings import REPO

    config = demo_config(REPO)
    warnings.filterwarnings("ignore", category=BetaWarning)
    os.environ.setdefault("PANELFORGE_PROFILE", "demo")
    from jobs.instance import prepare_instance
    from resources.settings import DEMO_DIR, Settings

    os.environ.setdefault("DAGSTER_HOME", str(DEMO_DIR / "dagster_home"))
    prepare_instance(Path(os.environ["DAGSTER_HOME"]), Settings.from_env())  # `make ui` may be setting it up too

    from testing.loopback.eutils_server import EutilsLoopbackServer
    from testing.loopback.s3_server import S3LoopbackServer
    from testing.loopback.sample_mirror import build_cloud_mirror

    mirror = DEMO_DIR / "mirror" / "cloud"
    if mirror.exists():
        shutil.rmtree(mirror)
    build_cloud_mirror(mirror)
    started = time.time()
    with S3LoopbackServer(mirror) as server, EutilsLoopbackServer() as eutils:
        os.environ["PANELFORGE_PMC_SOURCE"] = server.url
        os.environ["NCBI_EUTILS_URL"] = eutils.url
        print(f"serving the sample release (PMC Cloud layout) at {server.url}")
        print(f"serving recorded E-utilities answers at {eutils.url}")
        from dagster import DagsterInstance, materialize

        from assets.partitions import open_release, release_shard_keys
        from jobs.automation import STARTED_BY_A_PERSON, UPLOAD
        from jobs.definitions import build_definitions, materialization_order, per_shard, unbound
        from pipelines.core.partitioning import shard_keys
        from resources.profiles import build_resources

        settings = Settings.from_env()
        instance = DagsterInstance.get()
        open_release(instance, DEMO_RELEASE, settings.shards)
        keys = release_shard_keys(DEMO_RELEASE, shard_keys(settings.shards))
        resources = build_resources(settings)
        quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
        # every asset of the code location, parents first; consecutive per-shard assets run
        # together, one run per shard
        runs: list[list] = []
        for asset_def in unbound(materialization_order(build_definitions(settings))):
            if runs and per_shard(asset_def) and per_shard(runs[-1][0]):
                runs[-1].append(asset_def)
            else:
                runs.append([asset_def])
        for group in runs:
            names = [a.key.path[-1] for a in group]
            run_config = {"ops": {n: {"config": config[n]} for n in names if n in config}, **quiet}
            step = time.time()
            for key in keys if per_shard(group[0]) else [DEMO_RELEASE]:
                result = materialize(
                    group, partition_key=key, instance=instance, resources=resources, run_config=run_config
                )
                if not result.success:
                    return 1
            where = " (every shard)" if per_shard(group[0]) else f"[{DEMO_RELEASE}]"
            note = " (dry run)" if names == [UPLOAD] else ""
            if set(names) <= STARTED_BY_A_PERSON:
                note = f" (tiny local model, synthetic; {time.time() - step:.0f}s)"
            print(f"  materialized {', '.join(names)}{where}{note}")
    print_summary(resources["lake"].lake(), time.time() - started)
    return 0


def print_summary(lake, seconds: float) -> None:
    con = lake.connect()
    print(f"\nPanelForge demo finished in {seconds:.1f}s. Lake: {lake.url}")
    tables = (
        "inventory",
        "raw_manifest",
        "raw_files",
        "articles",
        "figures",
        "mentions",
        "pubmed",
        "image_duplicates",
        "embeddings",
        "figure_concepts",
        "samples",
        "panel_figures",
        "panels",
        "panel_captions",
        "panel_crops",
        "pairs",
        "mining_figures",
        "pair_negatives",
        "long_captions",
    )
    for table in tables:
        (count,) = con.execute(f"SELECT count(*) FROM {table} WHERE release = '{DEMO_RELEASE}'").fetchone()
        print(f"  {table:<16} {count:>6} rows")
    print("  articles by status:", dict(con.execute("SELECT status, count(*) FROM raw_manifest GROUP BY 1").fetchall()))
    print("  pubmed by status:  ", dict(con.execute("SELECT status, count(*) FROM pubmed GROUP BY 1").fetchall()))
    concepts = con.execute("SELECT global_concept, count(*) FROM figure_concepts GROUP BY 1 ORDER BY 2 DESC").fetchall()
    print("  figure concepts:   ", dict(concepts), "(tiny random DINOv2: marked synthetic)")
    samples = con.execute(
        "SELECT coalesce(reason, status), count(*) FROM samples GROUP BY 1 ORDER BY 2 DESC"
    ).fetchall()
    print("  samples:           ", dict(samples))
    figures = con.execute("SELECT status, count(*) FROM panel_figures GROUP BY 1 ORDER BY 2 DESC").fetchall()
    (n_panels,) = con.execute("SELECT count(*) FROM panels").fetchone()
    methods = dict(con.execute("SELECT method, count(*) FROM panels GROUP BY 1 ORDER BY 2 DESC").fetchall())
    print("  panel figures:     ", dict(figures), f"-> {n_panels} panels {methods} (detector: tiny random, not kept)")
    levels = dict(con.execute("SELECT level, count(*) FROM pairs GROUP BY 1 ORDER BY 2 DESC").fetchall())
    requests, tokens_in, tokens_out, failures = con.execute(
        "SELECT sum(vlm_requests), sum(prompt_tokens), sum(completion_tokens), sum(parse_failures) FROM mining_figures"
    ).fetchone()
    print(
        "  pairs:             ",
        levels,
        f"from {requests} VLM requests ({tokens_in} tokens in, {tokens_out} out, {failures} unusable answers; "
        "tiny random Qwen2.5-VL: marked synthetic)",
    )
    longcap = dict(con.execute("SELECT status, count(*) FROM long_captions GROUP BY 1 ORDER BY 2 DESC").fetchall())
    print("  long captions:     ", longcap, "(the original caption is kept whenever the model's refinement is not)")
    files = con.execute("SELECT kind, count(*), sum(size) FROM raw_files GROUP BY 1 ORDER BY 1").fetchall()
    for kind, n, size in files:
        print(f"  {kind:<6} files: {n:>4} ({size / 1e6:.1f} MB in raw tars)")
    con.close()
    duckdb_cli = os.path.relpath(os.path.join(sys.prefix, "bin", "duckdb"), lake.root)
    query = "SELECT status, count(*) FROM raw_manifest GROUP BY ALL"
    print(f'\nQuery it:    cd {os.path.relpath(lake.root)} && {duckdb_cli} catalog.duckdb "{query}"')
    dataset = os.path.relpath(lake.path("dataset"))
    print(f"The dataset: {dataset}/README.md (card), {dataset}/{DEMO_RELEASE}/commercial/*.tar (WebDataset)")
    print("Open the UI: make ui   (then http://127.0.0.1:3000: Lineage for the graph, Catalog, Runs for what ran)")


if __name__ == "__main__":
    sys.exit(main())
