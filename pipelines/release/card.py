"""The dataset card: the Hub's ``README.md`` (YAML header + a user's manual) for every release.

The card is regenerated from each release's ``release.json`` whenever a release is built, so a
repository that receives a release every year describes all of them. The Hub takes one license
entry per repository; PanelForge's subsets are license groups, so the header says ``other`` and
the card and ``LICENSES.md`` give the licenses of each subset with counts.
"""

from __future__ import annotations

import json

import yaml

from pipelines.core.lake import Lake, dataset_dir
from pipelines.images.gate import GateSettings
from pipelines.release.pairs import JSON_FIELDS_OF, LONGCAP, PANEL, REGION
from pipelines.release.samples import JSON_FIELDS

SUBSET_LICENSES = {
    "commercial": "CC0, CC BY, CC BY-SA, CC BY-ND: commercial use allowed, with attribution (except CC0)",
    "noncommercial": "CC BY-NC, CC BY-NC-SA, CC BY-NC-ND: no commercial use",
    "other": "no Creative Commons license (PMC's 'NO-CC CODE') or public-domain mark: check each article",
}
SIZE_CATEGORIES = [
    (1_000, "n<1K"),
    (10_000, "1K<n<10K"),
    (100_000, "10K<n<100K"),
    (1_000_000, "100K<n<1M"),
    (10_000_000, "1M<n<10M"),
    (100_000_000, "10M<n<100M"),
]
CITATION = """@misc{panelforge,
  title  = {PanelForge: figure-caption pairs from PubMed Central Open Access},
  note   = {Built with PanelForge from the PMC Open Access Subset},
  url    = {https://www.ncbi.nlm.nih.gov/pmc/tools/openftlist/}
}
@article{lozano2025biomedica,
  title   = {BIOMEDICA: An Open Biomedical Image-Caption Archive, Dataset, and Vision-Language Models
             Derived from Scientific Literature},
  author  = {Lozano, Alejandro and Sun, Min Woo and Burgess, James and others},
  journal = {arXiv preprint arXiv:2501.07171},
  year    = {2025}
}"""


def size_category(n: int) -> str:
    for bound, name in SIZE_CATEGORIES:
        if n < bound:
            return name
    return "100M<n<1B"


def write_release_json(lake: Lake, release: str, info: dict) -> str:
    dest = dataset_dir(lake, release, "release.json")
    with lake.atomic_local_file(dest) as tmp, open(tmp, "w") as fh:
        json.dump(info, fh, indent=1, sort_keys=True)
    return dest


def releases(lake: Lake) -> dict[str, dict]:
    found = {}
    for path in sorted(lake.fs.glob(dataset_dir(lake, "*", "release.json"))):
        with lake.fs.open(path, "rb") as fh:
            info = json.loads(fh.read())
        found[info["release"]] = info
    return found


FIGURE = "figure"
# What each level's samples hold beyond ``jpg``, ``json`` and ``txt``.
EXTRA_MEMBERS = {REGION: ["neg.txt"]}
LEVEL_TEXTS = {
    FIGURE: "the figure image; `.txt` the caption",
    PANEL: "one panel's crop; `.txt` the panel's text (its part of the caption, or the text a VLM associated)",
    REGION: "a marked region's crop; `.txt` the caption clause anchored to the marker; `.neg.txt` its hard "
    "negatives, one per line (empty when none), detailed in the JSON's `negatives`",
    LONGCAP: "the figure image (the same bytes as the figure level); `.txt` the long caption (the original caption "
    "is the JSON's `caption`)",
}


def _feature(name: str, kind) -> dict:
    if isinstance(kind, dict):  # a list of records
        return {"name": name, "list": [_feature(k, v) for k, v in kind.items()]}
    if kind in ("list", "ints"):
        return {"name": name, "list": "string" if kind == "list" else "int64"}
    return {"name": name, "dtype": kind}


def webdataset_features(level: str = FIGURE) -> list[dict]:
    """The features of a WebDataset config in the card's YAML (the ``datasets`` library's format)."""
    fields = JSON_FIELDS_OF.get(level, JSON_FIELDS)
    return [
        {"name": "__key__", "dtype": "string"},
        {"name": "__url__", "dtype": "string"},
        {"name": "jpg", "dtype": "image"},
        {"name": "json", "struct": [_feature(name, kind) for name, kind in fields.items()]},
        *({"name": member, "dtype": "string"} for member in EXTRA_MEMBERS.get(level, [])),
        {"name": "txt", "dtype": "string"},
    ]


def card_header(infos: dict[str, dict], repo_id: str | None) -> dict:
    configs, features = [], []
    latest = max(infos)
    for release, info in sorted(infos.items(), reverse=True):
        for subset, facts in info["subsets"].items():
            if facts["samples"]:
                configs.append(
                    {
                        "config_name": f"{release}-{subset}",
                        "data_files": [{"split": "train", "path": f"{release}/{subset}/*.tar"}],
                    }
                )
                level = facts.get("level") or FIGURE
                features.append({"config_name": f"{release}-{subset}", "features": webdataset_features(level)})
        for table, facts in info["tables"].items():
            if facts["rows"]:
                configs.append(
                    {
                        "config_name": f"{release}-{table}",
                        "data_files": [{"split": "train", "path": f"{release}/parquet/{table}/*.parquet"}],
                    }
                )
    default = next((c for c in configs if c["config_name"] == f"{latest}-commercial"), configs[0] if configs else None)
    if default is not None:
        default["default"] = True
    total = sum(
        f["samples"]
        for f in infos[latest]["subsets"].values()
        if not f.get("mixture") and (f.get("level") or FIGURE) == FIGURE
    )
    return {
        "pretty_name": "PanelForge: PMC-OA figure-caption pairs",
        "license": "other",
        "license_name": "pmc-oa-per-article",
        "license_link": "LICENSES.md",
        "language": ["en"],
        "task_categories": ["image-to-text", "zero-shot-image-classification", "image-classification"],
        "tags": ["biology", "medical", "pubmed-central", "webdataset", "image-text"],
        "size_categories": [size_category(total)],
        "configs": configs,
        "dataset_info": features,
    }


def _table(rows: list[list], head: list[str]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def render_card(infos: dict[str, dict], repo_id: str | None) -> str:
    header = card_header(infos, repo_id)
    latest = max(infos)
    info = infos[latest]
    repo = repo_id or "<user>/<dataset>"
    subsets = [
        [
            f"`{latest}/{name}`",
            f"{facts['samples']:,}",
            facts["shards"],
            f"{facts['bytes'] / 1e9:.3f}",
            ", ".join(f"{code} ({n:,})" for code, n in sorted(facts["license_codes"].items())) or "-",
        ]
        for name, facts in info["subsets"].items()
        if (facts.get("level") or FIGURE) == FIGURE
    ]
    tables = [
        [f"`{latest}/parquet/{t}/`", f"{f['rows']:,}", f"{f['bytes'] / 1e6:.2f}"] for t, f in info["tables"].items()
    ]
    stats = info.get("stats", {}).get("fields", {})
    stat_rows = []
    for name, entry in stats.items():
        chars = entry.get("chars") or entry.get("value") or {}
        tokens = entry.get("tokens", {})
        stat_rows.append(
            [
                name,
                chars.get("count", 0),
                chars.get("mean", "-"),
                chars.get("p50", "-"),
                chars.get("p95", "-"),
                tokens.get("mean", "-"),
                tokens.get(f"share_over_{75}", "-"),
            ]
        )
    warning = test_build_banner(info)
    limits = info["limits"]
    last_shard = max(info["subsets"].get("commercial", {}).get("shards", 1) - 1, 0)
    body = f"""
# PanelForge: PMC-OA figure-caption pairs

Figure images and their captions from the [PubMed Central Open Access Subset](https://www.ncbi.nlm.nih.gov/pmc/tools/openftlist/),
with article metadata, PubMed MeSH terms, citation counts and concept labels, built by PanelForge.
One sample is one figure image with a non-empty caption. Releases: {", ".join(sorted(infos))}.
{warning}
## Release {latest}: WebDataset subsets

Shards are named `{{release}}/{{subset}}/panelforge-{{000000..N}}.tar`, hold at most
{limits["max_samples"]:,} samples or {limits["max_bytes"] / 1e9:g} GB, and are shuffled across clusters
and articles with seed {info["shuffle_seed"]}. Each sample has `.jpg` (the original bytes for JPEG figures;
other formats are converted once to JPEG, quality 95, 4:4:4, alpha on white, and say so in
`converted_from`), `.txt` (the caption) and `.json` (figure and article metadata; the article's
full text is in the `articles` table, joined by `pmcid`). Next to each shard,
`panelforge-NNNNNN.parquet` lists its keys; `sizes.json` gives the sample counts OpenCLIP reads.
Subsets never mix license groups.

{_table(subsets, ["subset", "samples", "shards", "GB", "licenses (samples)"])}
{render_skipped(info)}

Licenses: commercial = {SUBSET_LICENSES["commercial"]}; noncommercial = {SUBSET_LICENSES["noncommercial"]};
other = {SUBSET_LICENSES["other"]}. Every sample's JSON carries its article's `license_code` and `license_url`.

{render_pair_levels(info)}
## Parquet tables

{_table(tables, ["table", "rows", "MB"])}

## Statistics

Characters are exact over all samples; tokens are {info.get("stats", {}).get("tokenizer", "-")} on a seeded sample.

{_table(stat_rows, ["field", "n", "mean chars", "median chars", "p95 chars", "mean tokens", "share > 75 tokens"])}

Excluded while planning (counted, never written half-way): {json.dumps(info.get("excluded", {}), sort_keys=True)}.

## Loading

```python
from datasets import load_dataset

ds = load_dataset("{repo}", "{latest}-commercial", split="train", streaming=True)
articles = load_dataset("{repo}", "{latest}-articles", split="train")
```

OpenCLIP: `--dataset-type webdataset --train-data "{latest}/commercial/panelforge-{{000000..{last_shard:06d}}}.tar"`
(the sample count comes from `sizes.json`).

DuckDB, all commercial-license microscopy figures with their shard keys:

```sql
SELECT key, shard, pmcid, fig_id
FROM '{latest}/commercial/*.parquet'
WHERE global_concept = 'Microscopy';
```

## Attribution and citation

The figures and captions are from articles in the PMC Open Access Subset; each remains under its authors' license,
named per sample. PubMed metadata courtesy of the U.S. National Library of Medicine. Please cite the articles you use
and:

```bibtex
{CITATION}
```
"""
    return "---\n" + yaml.safe_dump(header, sort_keys=False, allow_unicode=True) + "---\n" + body


def test_build_banner(info: dict) -> str:
    """The card's warning when the release holds anything a synthetic model made (see
    ``pipelines/release/synthetic.py``): every such part, with how many samples it touches."""
    parts = list(info.get("synthetic") or [])
    if not parts and info.get("synthetic_labels"):  # a release.json written before the parts were listed
        parts = ["**Concept labels** come from a tiny randomly initialised model, not DINOv2: they are placeholders."]
    if not parts:
        return ""
    lines = "\n".join(f"> - {part}" for part in parts)
    return (
        "\n> **Test build: synthetic parts.** This release was built with tiny randomly initialised models "
        "(PanelForge's demo or test profile). What they made has the shape of real data and none of its "
        f"meaning; every plot of this release is marked. Do not train or evaluate on it.\n>\n{lines}\n"
    )


def render_skipped(info: dict) -> str:
    """The subsets that were not written because they had no sample, each with why."""
    skipped = info.get("skipped_subsets") or {}
    if not skipped:
        return ""
    items = "; ".join(f"`{info['release']}/{name}` ({facts['reason']})" for name, facts in sorted(skipped.items()))
    return f"\nNot written, having no sample: {items}.\n"


def render_licenses(infos: dict[str, dict]) -> str:
    lines = ["# Licenses", "", "Each figure keeps its article's license. Per release and subset:", ""]
    for release, info in sorted(infos.items()):
        for subset, facts in info["subsets"].items():
            codes = ", ".join(f"{c}: {n:,}" for c, n in sorted(facts["license_codes"].items())) or "empty"
            lines.append(f"- `{release}/{subset}`: {codes}")
    lines += ["", *(f"- {k}: {v}" for k, v in SUBSET_LICENSES.items()), ""]
    return "\n".join(lines)


def write_card(lake: Lake, repo_id: str | None) -> str:
    infos = releases(lake)
    dest = dataset_dir(lake, "README.md")
    for name, text in (("README.md", render_card(infos, repo_id)), ("LICENSES.md", render_licenses(infos))):
        with lake.atomic_local_file(dataset_dir(lake, name)) as tmp, open(tmp, "w") as fh:
            fh.write(text)
    return dest


def _stat_row(name: str, entry: dict) -> list:
    value = entry.get("value") or entry.get("chars") or {}
    return [name, value.get("count", 0), value.get("mean", "-"), value.get("p50", "-"), value.get("max", "-")]


def _shorten(value, limit: int = 200):
    """An example as the card shows it: long texts cut, so one long caption does not fill the page."""
    if isinstance(value, dict):
        return {k: _shorten(v, limit) for k, v in value.items()}
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + " …"
    return value


EXCLUSION_TEXTS = {  # why a panel sample is left out, as the card says it
    "no_text": "no caption text of its own (`text_match` `none`: no printed label named the panel and no reading "
    "order was certain)",
    "vlm_text": "a text the VLM associated (`vlm`)",
    "crop_gate": "a crop the release gate drops",
    "figure_excluded": "a figure that is not released",
    "figure_not_planned": "a figure without a figure-level sample",
    "bad_box": "a box outside its image",
    "undecodable_image": "an image that could not be decoded",
}


def render_panel_pairing(summary: dict) -> str:
    """How panel texts were matched to their crops, and what the panel subsets leave out."""
    included, excluded, gate = (summary.get(k) or {} for k in ("included", "excluded", "gate"))
    shipped = ", ".join(f"`{match}` {n:,}" for match, n in sorted(included.items())) or "none"
    vlm = (
        "This release includes them (built with `include_vlm_text`)."
        if included.get("vlm")
        else "This release leaves them out (the default; the `pair_samples` setting `include_vlm_text` adds them)."
    )
    left = [f"{EXCLUSION_TEXTS.get(reason, reason)} ({n:,})" for reason, n in sorted(excluded.items())]
    gated = ", ".join(f"{reason.replace('_', ' ')} {n:,}" for reason, n in sorted(gate.items()))
    g = GateSettings()
    return f"""
Each panel's text is its own part of the caption, matched to the crop by the label printed on the panel
(`text_match` `label`) or, where the panels and the caption's labels agree in number and the layout reads in one
order, by reading order (`order`); `count_agreement` compares the figure's panels with its caption's labels. A
panel no rule could pair gets no caption text and is not released. Texts a VLM associated with a panel the rules
left without one are marked `vlm`. {vlm} Shipped panel samples by match: {shipped}.

Panel samples left out, by reason: {"; ".join(left) or "none"}.{f" Release gate: {gated}." if gated else ""} The gate
drops crops with a side under {g.min_side} px or an area under {g.min_area:,} px, longer than {g.max_aspect:g} times
their width, blank, or holding only text and straight lines (tick-label strips, row headers, titles, lone axes); the
reason of each crop is in the lake's `panel_crops.gate`.
"""


def render_pair_levels(info: dict) -> str:
    """The card's section on the panel, region and long-caption subsets: per level its counts,
    what a sample holds (features), an example, then the pair statistics."""
    latest = info["release"]
    parts = []
    for level in (PANEL, REGION, LONGCAP):
        subsets = {n: f for n, f in info["subsets"].items() if f.get("level") == level}
        if not subsets:
            continue
        rows = [
            [f"`{latest}/{n}`", f"{f['samples']:,}", f["shards"], f"{f['bytes'] / 1e9:.3f}"] for n, f in subsets.items()
        ]
        members = ", ".join(f"`.{m}`" for m in ["jpg", "json", *EXTRA_MEMBERS.get(level, []), "txt"])
        example = _shorten(info.get("examples", {}).get(level) or {})
        shown = (
            f"\n\nExample:\n\n```json\n{json.dumps(example, indent=1, ensure_ascii=False)}\n```\n" if example else ""
        )
        pairing = render_panel_pairing(info.get("panel_pairs") or {}) if level == PANEL else ""
        parts.append(
            f"""### Level `{level}`

Members {members}: `.jpg` is {LEVEL_TEXTS[level]}. JSON fields: {", ".join(f"`{f}`" for f in JSON_FIELDS_OF[level])}.
{pairing}
{_table(rows, ["subset", "samples", "shards", "GB"])}{shown}
"""
        )
    if not parts:
        return ""
    stats = info.get("pair_stats", {}).get("fields", {})
    stat_rows = [_stat_row(name, entry) for name, entry in stats.items() if "value" in entry]
    return f"""## Release {latest}: panel, region and long-caption subsets

Keys trace back to the figure: a panel is `<figure key>_pNNN`, a region `<figure key>_pNNN_rNN` (panel index in the
figure, region index in the panel), a long caption has its figure's key; every JSON names its `figure_key`. Subsets
follow the figure level's license groups, exclusions and shuffle seed. Panel crops and region crops are cut once from
the original image (JPEG quality 95, 4:4:4); boxes (`box`) are in the original image's pixels.

{"".join(parts)}
OpenCLIP trains on the long captions with a text tower of a long context (e.g. 512 tokens):
`--dataset-type webdataset --train-data "{latest}/longcap-commercial/panelforge-{{000000..N}}.tar"`.
Hard negatives for region-level contrastive training: `.neg.txt`, one caption per line.

Pairs per released figure, and long captions' tokens before and after refinement (the long-caption tokenizer):

{_table(stat_rows, ["statistic", "n", "mean", "median", "max"])}
"""
