"""The release's Parquet dataset: the lake tables a person filters in SQL, one file per shard.

Only articles whose license is known are exported (the same rule as the WebDataset samples),
so every exported row can be redistributed under the license it carries. ``labels`` is the
``figure_concepts`` table under the name a dataset user looks for; ``panels``, ``pairs``,
``long_captions`` and ``negatives`` (``pair_negatives``) are what the panel, region and
long-caption subsets were made from, with every score, source and model column a user filters
on (join ``pairs.pair_id`` to a pair-level sidecar's ``pair_id`` for the sample key). A table
the lake does not hold (its stage never ran) is left out, not written empty.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipelines.core.lake import Lake, dataset_dir
from pipelines.core.provenance import public_model_name

EXPORTED = {
    "articles": "articles",
    "figures": "figures",
    "mentions": "mentions",
    "pubmed": "pubmed",
    "labels": "figure_concepts",
    "panels": "panels",
    "pairs": "pairs",
    "long_captions": "long_captions",
    "negatives": "pair_negatives",
}


def export_tables(lake: Lake, release: str, shards: list[str]) -> dict[str, dict]:
    """Write ``dataset/<release>/parquet/<table>/part-<shard>.parquet``; returns rows and bytes per table."""
    summary = {name: {"rows": 0, "bytes": 0, "files": 0} for name in EXPORTED}
    withheld = 0
    for shard in shards:
        articles = lake.read_table("articles", release, shard)
        if articles is None:
            continue
        licensed = articles.filter(pc.is_valid(articles["license_code"]))
        withheld += articles.num_rows - licensed.num_rows
        keep = licensed["pmcid"]
        for name, source in EXPORTED.items():
            table = licensed if name == "articles" else lake.read_table(source, release, shard)
            if table is None:
                continue
            if name != "articles":
                table = table.filter(pc.is_in(table["pmcid"], value_set=keep))
            table = _public_models(table)
            dest = dataset_dir(lake, release, "parquet", name, f"part-{shard}.parquet")
            with lake.atomic_local_file(dest) as tmp:
                pq.write_table(table, tmp, compression="zstd")
            summary[name]["rows"] += table.num_rows
            summary[name]["bytes"] += lake.fs.size(dest)
            summary[name]["files"] += 1
    summary["articles"]["withheld_unknown_license"] = withheld
    return {name: facts for name, facts in summary.items() if facts["files"] or name == "articles"}


def _public_models(table: pa.Table) -> pa.Table:
    """The ``model`` column by model id (rows written before provenance stopped holding local
    directories may name one: never released)."""
    if "model" not in table.column_names:
        return table
    index = table.column_names.index("model")
    names = pa.array([public_model_name(m) for m in table["model"].to_pylist()], type=table.schema.field(index).type)
    return table.set_column(index, table.schema.field(index), names)
