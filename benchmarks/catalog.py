"""What each benchmark is, for ``docs/benchmarks.md``: its command, its results and what to show of them.

One entry per module of ``benchmarks/`` that measures something. ``runs`` are the commands
``make bench`` (or ``make gpu-check``) runs and the results file(s) each writes;
``tests/unit/test_benchmark_report.py`` checks the Makefile runs exactly these and that every file in
``benchmarks/results/`` belongs to one entry. ``rows`` and ``tables`` name numbers by their path
in the JSON (``"a/b/0/c"``; ``{key}`` is the row of a table, ``{name}`` the value of a top-level
entry, a final ``#count`` the length of a list), so the page is generated from the results, never
copied from them. Labels carry no numbers of their own: what is measured, and which way a ratio goes.

This module imports nothing heavy: the report reads the results, not the benchmarks' code.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Run:
    """One command and the results file(s) it writes (a name or a glob under benchmarks/results)."""

    command: str
    results: str


@dataclass(frozen=True)
class Row:
    """A headline number: what this run measured, what it is compared with, and their ratio."""

    measure: str
    value: str | None = None
    against: str | None = None
    ratio: str | None = None
    optional: bool = False  # shown only in results that have it (files of one benchmark that differ in kind)


@dataclass(frozen=True)
class Col:
    header: str
    path: str  # relative to the table's row; a leading "/" starts at the top of the results
    ratio: bool = False


@dataclass(frozen=True)
class Table:
    """One row per entry of the dict (or list) at ``over``; a missing cell is shown as a dash."""

    title: str
    over: str
    key_header: str
    columns: tuple[Col, ...]
    label: str | None = None  # path of a list item's label (lists have no keys)
    optional: bool = False  # a results file of the benchmark without it shows no table


@dataclass(frozen=True)
class Benchmark:
    module: str
    title: str
    runs: tuple[Run, ...]
    rows: tuple[Row, ...] = ()
    tables: tuple[Table, ...] = ()
    baseline: str = "baseline"  # path of the results' own description of the baseline
    baseline_text: str | None = None  # where the results describe none
    notes: tuple[str, ...] = ("note",)  # paths of caveats to quote, shown when present
    gpu: bool = False  # needs a CUDA GPU: run by `make gpu-check`, not `make bench`


def _cmd(module: str, args: str = "") -> str:
    return f"python -m benchmarks.{module}" + (f" {args}" if args else "")


# the GPU run of benchmarks/training.py: ViT-B-16 at 64 per level (128 ran too, 256 ran out of an
# 80 GB H100's memory in the multi-level step; docs/training.md)
TRAINING_GPU_ARGS = (
    "--device cuda --model ViT-B-16 --batch-size 64 --workers 8 --multilevel-workers 0,8 --steps 10 "
    "--warmup-steps 2 --figures 512 --out benchmarks/results/training_gpu.json"
)


# benchmarks/panel_scales.py: the decision's scores on each rendition of a split's figures
RENDITION_COLUMNS = (
    Col("recall", "recall"),
    Col("precision", "precision"),
    Col("ImageCLEF-style", "imageclef_accuracy"),
    Col("singles whole", "single_whole"),
    Col("exact count", "count_exact"),
    Col("labels read", "labels_read"),
    Col("panel with its own text", "panel_text"),
    Col("figures whose panel count changes", "figures_whose_panel_count_changes"),
)


def _training(title: str, run: Run, memory_key: str, memory_label: str, gpu: bool = False) -> Benchmark:
    """The training benchmark's page section, on the CPU or a GPU (their memory is counted differently)."""
    return Benchmark(
        "training",
        title,
        (run,),
        baseline_text="the compute ceiling: the same model and step fed one batch from memory, no loader",
        rows=(
            Row("model", "settings/model"),
            Row("device", "settings/device"),
            Row(
                "OpenCLIP step loop, samples/s fed by its loader against the ceiling",
                "openclip/fed/samples_per_s",
                "openclip/ceiling/samples_per_s",
                "openclip/loader_over_ceiling",
            ),
            Row("OpenCLIP step loop, share of a step waiting for data", "openclip/fed/stall_share"),
        ),
        tables=(
            Table(
                "Multi-level trainer per loader-worker count",
                "multilevel",
                "run",
                (
                    Col("workers per level", "workers_per_level"),
                    Col("samples/s, fed", "fed/samples_per_s"),
                    Col("samples/s, ceiling", "ceiling/samples_per_s"),
                    Col("fed over ceiling", "loader_over_ceiling", ratio=True),
                    Col("stall share", "fed/stall_share"),
                    Col("GPU utilisation (%)", "fed/gpu_utilisation/mean_percent"),
                    Col(memory_label, f"fed/peak_memory/{memory_key}"),
                ),
            ),
        ),
        gpu=gpu,
    )


# the figure decision's scores, one row per evidence added (benchmarks/panels.py, figure_decision)
DECISION_COLS = (
    Col("recall", "recall"),
    Col("precision", "precision"),
    Col("ImageCLEF accuracy", "imageclef_accuracy"),
    Col("single figures whole", "single_whole"),
    Col("panel count exact", "count_exact"),
    Col("labels read", "labels_read"),
    Col("panel and its own text", "panel_text"),
    Col("CPU ms per figure", "ms_per_figure_cpu"),
)

BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark(
        "acquisition",
        "Acquisition: the rate limit",
        (
            Run(_cmd("acquisition"), "acquisition.json"),
            Run(
                _cmd("acquisition", "--rate 20 --concurrency 8 --out benchmarks/results/acquisition-rate20.json"),
                "acquisition-rate20.json",
            ),
        ),
        rows=(
            Row("limit configured (requests/s)", "limited/configured_rate"),
            Row(
                "requests/s achieved (ratio: over the limit)",
                "limited/achieved_rate",
                None,
                "ratios/achieved_over_limit",
            ),
            Row(
                "most requests in any 1 s window (ratio: over the limit)",
                "limited/max_requests_in_any_1s_window",
                None,
                "ratios/max_window_over_limit",
            ),
            Row(
                "requests/s with the limit lifted (ratio: over the limit)",
                "unlimited/achieved_rate",
                None,
                "ratios/unlimited_rate_over_limit",
            ),
            Row("MB/s, limited against unlimited", "limited/mb_per_s", "unlimited/mb_per_s"),
            Row("requests per article", "limited/requests_per_article"),
            Row("requests when run again", "limited/rerun_requests"),
            Row("peak RSS per process (MB)", "limited/peak_rss_mb_per_process"),
        ),
    ),
    Benchmark(
        "acquisition_scale",
        "Acquisition at PMC scale",
        (Run(_cmd("acquisition_scale"), "acquisition_scale.json"),),
        rows=(
            Row(
                "peak RSS (MB), every article against a quarter of them (ratio: growth)",
                "memory/peak_rss_mb_c64_all",
                "memory/peak_rss_mb_c64_quarter",
                "memory/growth_ratio",
            ),
            Row(
                "first acquisition of PMC-OA in hours, 4 hosts at the cloud limit (projection)",
                "projection/at_the_cloud_limit/first_acquisition_h/4_hosts_h",
            ),
            Row(
                "yearly refresh in hours, 4 hosts at the cloud limit (projection)",
                "projection/at_the_cloud_limit/yearly_refresh_h/4_hosts_h",
            ),
        ),
        tables=(
            Table(
                "Each configuration downloading from the loopback S3 server",
                "runs",
                "configuration",
                (
                    Col("rate limit", "rate_limit"),
                    Col("articles at once", "concurrency"),
                    Col("articles", "articles"),
                    Col("requests/s", "requests_per_s"),
                    Col("MB/s", "mb_per_s"),
                    Col("max in flight", "max_in_flight_at_server"),
                    Col("peak RSS (MB)", "peak_rss_mb"),
                    Col("requests/s over the baseline", "/ratios_vs_baseline/{key}", ratio=True),
                ),
            ),
        ),
    ),
    Benchmark(
        "parsing",
        "Parsing",
        (Run(_cmd("parsing"), "parsing.json"),),
        rows=(
            Row(
                "articles per CPU second, one core, against pubmed_parser",
                "panelforge/articles_per_s_per_core",
                "pubmed_parser/articles_per_s_per_core",
                "speedup",
            ),
            Row("articles per CPU second on the whole corpus", "panelforge_whole_corpus/articles_per_s_per_core"),
            Row("articles pubmed_parser fails on", "articles_pubmed_parser_fails_on/#count"),
            Row(
                "peak RSS (MB) after every pass against after one",
                "panelforge_peak_rss_mb_after_all_passes",
                "panelforge_peak_rss_mb_after_1_pass",
            ),
        ),
    ),
    Benchmark(
        "parse_memory",
        "Parse memory",
        (Run(_cmd("parse_memory"), "parse_memory.json"),),
        rows=(
            Row(
                "peak RSS, largest shard over smallest: streaming parse against in memory",
                "peak_ratio_largest_to_smallest/parse_streaming",
                "peak_ratio_largest_to_smallest/parse_in_memory",
            ),
            Row(
                "peak RSS, largest shard over smallest: streaming carry-over against in memory",
                "peak_ratio_largest_to_smallest/carry_streaming",
                "peak_ratio_largest_to_smallest/carry_in_memory",
            ),
            Row(
                "peak RSS (MB), largest shard, streaming parse against in memory (ratio: in memory over streaming)",
                "runs/-1/parse_streaming/peak_rss_mb",
                "runs/-1/parse_in_memory/peak_rss_mb",
                "in_memory_over_streaming_peak_at_64x/parse",
            ),
            Row(
                "CPU time of the parse (ratio: streaming over in memory)",
                None,
                None,
                "streaming_cpu_over_in_memory_cpu_parse",
            ),
        ),
        tables=(
            Table(
                "Peak RSS (MB) as the shard grows",
                "runs",
                "copies of the sample",
                (
                    Col("articles", "articles_per_shard"),
                    Col("parse, streaming", "parse_streaming/peak_rss_mb"),
                    Col("parse, in memory", "parse_in_memory/peak_rss_mb"),
                    Col("carry, streaming", "carry_streaming/peak_rss_mb"),
                    Col("carry, in memory", "carry_in_memory/peak_rss_mb"),
                ),
                label="copies",
            ),
        ),
    ),
    Benchmark(
        "entrez",
        "E-utilities requests",
        (Run(_cmd("entrez"), "entrez.json"),),
        rows=(
            Row("PMIDs asked for", "pmids"),
            Row(
                "efetch requests (ratio: BIOMEDICA's over ours)",
                "panelforge/efetch",
                "biomedica/efetch",
                "efetch_reduction",
            ),
            Row("elink requests (citing articles; BIOMEDICA fetches none)", "panelforge/elink", "biomedica/elink"),
            Row("requests in all", "panelforge/total", "biomedica/total"),
            Row("requests when run again on the same lake", "rerun_requests_with_cache"),
            Row("minutes for all of PMC-OA at 3 requests/s (projection)", "minutes_at_3_req_s_for_6_4M_articles"),
        ),
    ),
    Benchmark(
        "embeddings",
        "Figure embeddings",
        (Run(_cmd("embeddings"), "embeddings.json"),),
        baseline_text="the model alone on prepared images, against decoding and preparing them: the slower is "
        "the bottleneck",
        rows=(
            Row(
                "images/s: decode and prepare on one core, against the ViT-L/14 model (ratio: decode over model)",
                "decode_and_prepare_images_per_s_one_core",
                "model_images_per_s/dinov2_vit_l14_architecture_fp32_cpu",
                "decode_over_model_ratio",
            ),
            Row("images/s of the tiny test model", "model_images_per_s/tiny_test_model"),
            Row("bottleneck with ViT-L/14", "bottleneck_with_vit_l14_on_cpu"),
        ),
        tables=(
            Table(
                "The Ray Data pipeline with the tiny model, at 1x and 4x the images",
                "ray_pipeline_tiny_model",
                "run",
                (
                    Col("images", "images"),
                    Col("seconds", "seconds"),
                    Col("images/s", "images_per_s"),
                    Col("peak Ray worker RSS (MB)", "peak_ray_worker_rss_mb"),
                ),
            ),
        ),
    ),
    Benchmark(
        "kmeans",
        "k-means",
        (Run(_cmd("kmeans"), "kmeans.json"),),
        rows=(
            Row(
                "seconds, PanelForge (faiss, k-means++ seeds) against MiniBatchKMeans (ratio: theirs over ours)",
                "faiss_kmeanspp_init_panelforge/seconds",
                "minibatch_kmeans/seconds",
                "time_ratio_minibatch_over_panelforge",
            ),
            Row(
                "inertia, the same (ratio: theirs over ours)",
                "faiss_kmeanspp_init_panelforge/inertia",
                "minibatch_kmeans/inertia",
                "inertia_ratio_minibatch_over_panelforge",
            ),
            Row(
                "inertia of faiss with random seeds (ratio: over PanelForge's)",
                "faiss_random_init/inertia",
                None,
                "inertia_ratio_faiss_random_over_panelforge",
            ),
        ),
    ),
    Benchmark(
        "panels",
        "Panel splitting",
        (Run(_cmd("panels"), "panels.json"),),
        baseline="speed_baseline",
        tables=(
            Table(
                "Each method: speed (CPU time, decode included) and boxes at IoU >= 0.5 on the hand-boxed figures",
                "methods",
                "method",
                (
                    Col("figures/s per core", "speed/figures_per_second_per_core"),
                    Col("speed over the baseline", "speed_vs_xycut", ratio=True),
                    Col("panels per figure", "speed/panels_per_figure"),
                    Col("recall", "iou_0.5/all/recall"),
                    Col("precision", "iou_0.5/all/precision"),
                    Col("figures exact", "iou_0.5/all/exact"),
                    Col("mAP, synthetic val", "map_synthetic_val/map"),
                ),
            ),
            Table(
                "The figure decision on the tune split of sample/panels/eval, one evidence added per row",
                "figure_decision/splits/tune/methods",
                "evidence",
                DECISION_COLS,
            ),
            Table(
                "The figure decision on the tune split, per article (no article's house style should carry a rule)",
                "figure_decision/splits/tune/methods/decision/per_article",
                "article",
                (
                    Col("figures", "figures"),
                    Col("recall", "recall"),
                    Col("precision", "precision"),
                    Col("ImageCLEF accuracy", "imageclef_accuracy"),
                    Col("single figures whole", "single_whole"),
                    Col("labels read", "labels_read"),
                    Col("panel and its own text", "panel_text"),
                ),
            ),
            Table(
                "The figure decision on the holdout split (never tuned on)",
                "figure_decision/splits/holdout/methods",
                "evidence",
                DECISION_COLS,
            ),
            Table(
                "The figure decision on 7 figures from outside the project, boxed before any code ran on them "
                "(benchmarks/data/README.md; no caption; its first run, at e67ccbe, was the blind one)",
                "figure_decision/splits/external/methods",
                "evidence",
                tuple(col for col in DECISION_COLS if col.path != "panel_text"),  # no caption: no text
            ),
            Table(
                "The figure decision on 20 more figures from outside the project, boxed before any code ran on "
                "them (benchmarks/data/README.md; no caption; its first run, at b21a9be, was the blind one)",
                "figure_decision/splits/external2/methods",
                "evidence",
                tuple(col for col in DECISION_COLS if col.path != "panel_text"),
            ),
            Table(
                "The figure decision on the two halves of those 20: diagnose (its misses were read after the "
                "blind run) and held (never looked at, only its totals)",
                "figure_decision/splits/external2/parts",
                "half",
                tuple(col for col in DECISION_COLS if col.path != "panel_text"),
            ),
            Table(
                "OCR engines reading the printed labels of the tune split's labelled figures",
                "figure_decision/splits/tune/ocr/engines",
                "engine",
                (
                    Col("label recall", "recall"),
                    Col("label precision", "precision"),
                    Col("CPU ms per figure", "ms_per_figure_cpu"),
                    Col("crops read per figure", "crops_per_figure"),
                ),
            ),
        ),
        rows=(
            Row("caption label sets exact (hand-split captions)", "captions/all/exact_label"),
            Row("caption texts right (hand-split captions)", "captions/all/text"),
            Row(
                "the figure decision, OCR included: figures/s per core, against the layout splitter in the same run",
                "figure_decision/speed/decision/figures_per_second_per_core",
                "figure_decision/speed/xycut/figures_per_second_per_core",
                "figure_decision/speed/decision_vs_xycut",
                optional=True,
            ),
        ),
    ),
    Benchmark(
        "label_styles",
        "Printed panel labels, one style at a time (drawn figures)",
        (Run(_cmd("label_styles"), "label_styles.json"),),
        tables=(
            Table(
                "Each family of drawn figures: every label read, every panel split, against the decision without them",
                "families",
                "family",
                (
                    Col("figures", "figures"),
                    Col("every label read", "labels_all_read_share"),
                    Col("every panel split", "split_right_share"),
                    Col("split, without labels", "baseline_split_right_share"),
                    Col("split over the baseline", "split_vs_baseline", ratio=True),
                    Col("CPU ms per decision", "ms_per_figure_cpu"),
                ),
            ),
            Table(
                "Charts, per style (font, form, size, place)",
                "families/charts/by",
                "style",
                (Col("figures", "figures"), Col("every label read", "labels_all_read"), Col("split", "split_right")),
            ),
            Table(
                "Photographs, per style",
                "families/photographs/by",
                "style",
                (Col("figures", "figures"), Col("every label read", "labels_all_read"), Col("split", "split_right")),
            ),
            Table(
                "Numbering schemes, per style",
                "families/schemes/by",
                "style",
                (Col("figures", "figures"), Col("every label read", "labels_all_read"), Col("split", "split_right")),
            ),
        ),
    ),
    Benchmark(
        "panels_detector",
        "Panel detector throughput",
        (Run(_cmd("panels_detector"), "panels_detector.json"),),
        baseline_text="Open-PMC-18M's own inference path (openpmc_detect: squashed to a square, its batch size, NMS)",
        rows=(
            Row(
                "full-size model, time per figure: ours at 800 px over Open-PMC-18M's path",
                None,
                None,
                "full_model_ours800_over_openpmc_time_ratio",
            ),
            Row("Ray Data pipeline, tiny model: figures/s", "ray_pipeline_tiny_model/figures_per_s"),
        ),
        tables=(
            Table(
                "Figures/s, decode included",
                "figures_per_s",
                "model",
                (
                    Col("ours 800 px, batch 1", "ours_800px_aspect_kept_batch1"),
                    Col("ours 800 px, batch 8", "ours_800px_aspect_kept_batch8"),
                    Col("ours 480 px, batch 8", "ours_480px_aspect_kept_batch8"),
                    Col("Open-PMC-18M 480 px squash, batch 8", "openpmc_480px_squash_batch8"),
                    Col("Open-PMC-18M 480 px squash, batch 32", "openpmc_480px_squash_batch32"),
                    Col("images", "images"),
                ),
            ),
        ),
    ),
    Benchmark(
        "captions",
        "Caption splitting",
        (
            Run(_cmd("captions"), "captions.json"),
            Run(
                _cmd("captions", "--baseline 4999c77 --output benchmarks/results/captions_vs_first_holdout_run.json"),
                "captions_vs_first_holdout_run.json",
            ),
        ),
        tables=(
            Table(
                "Hand-chosen phrases found under their label, per split",
                "splits",
                "split",
                (
                    Col("captions", "current/captions"),
                    Col("phrases", "current/phrases"),
                    Col("found", "current/found_share"),
                    Col("found, baseline", "baseline/found_share"),
                    Col("found over the baseline", "found_vs_baseline", ratio=True),
                    Col("leaked", "current/leaked_share"),
                    Col("leaked, baseline", "baseline/leaked_share"),
                    Col("label sets exact", "current/label_set_exact"),
                    Col("label sets exact, baseline", "baseline/label_set_exact"),
                    Col("captions/s", "captions_per_s/current"),
                    Col("captions/s, baseline", "captions_per_s/baseline"),
                ),
            ),
            Table(
                "Subcaptions written by CompFigSep (NLM prostate subset), per half: labels whose panel text "
                "holds their own words and not other labels' (dev read while writing rules, test scored once)",
                "compfigsep/halves",
                "half",
                (
                    Col("figures", "current/figures"),
                    Col("labels", "current/labels"),
                    Col("right", "current/right_share"),
                    Col("right, baseline", "baseline/right_share"),
                    Col("own words found", "current/found_share"),
                    Col("others' words leaked", "current/leaked_share"),
                    Col("label not split off", "current/missing_share"),
                ),
                optional=True,
            ),
        ),
        rows=(
            Row(
                "label sets exact, hand-split captions",
                "label_sets/current/exact_label",
                "label_sets/baseline/exact_label",
            ),
            Row("texts right, hand-split captions", "label_sets/current/text", "label_sets/baseline/text"),
        ),
    ),
    Benchmark(
        "mining_tau",
        "Mark-guided region mining: τ",
        (Run(_cmd("mining_tau"), "mining_tau.json"),),
        notes=("data",),
        rows=(
            Row("τ chosen (best F1 with detected markers)", "chosen_tau"),
            Row(
                "region F1 at the chosen τ, detected markers (ratio: over the baseline)",
                "tau/detected_markers/{chosen_tau}/f1",
                "caption_only/f1",
                "ratios/f1_at_chosen_tau_vs_caption_only",
            ),
            Row(
                "region F1 at the chosen τ, drawn markers as an oracle (ratio: over the baseline)",
                "tau/oracle_markers/{chosen_tau}/f1",
                "caption_only/f1",
                "ratios/oracle_f1_at_chosen_tau_vs_caption_only",
            ),
            Row("marker detection recall, every kind", "marker_detection/all/recall"),
            Row("marker detection precision, every kind", "marker_detection/all/precision"),
            Row("marker detection, ms per panel on the CPU", "detection_ms_per_panel_cpu"),
        ),
        tables=(
            Table(
                "Regions against the targets per τ (IoU >= 0.5)",
                "tau/detected_markers",
                "τ",
                (
                    Col("precision", "precision"),
                    Col("recall", "recall"),
                    Col("F1", "f1"),
                    Col("F1, oracle markers", "/tau/oracle_markers/{key}/f1"),
                ),
            ),
            Table(
                "Marker detection per kind",
                "marker_detection",
                "kind",
                (
                    Col("drawn", "drawn"),
                    Col("detected", "detected"),
                    Col("recall", "recall"),
                    Col("precision", "precision"),
                    Col("median tip error (px)", "median_tip_error_px"),
                ),
            ),
        ),
    ),
    Benchmark(
        "mining",
        "Panel2Patch mining cost",
        (Run(_cmd("mining"), "mining.json"),),
        baseline_text="the engine at batch size 1 (the run every per-figure number comes from); for the pre-filter, "
        "the requests that would be sent without it (an estimate from measured per-request costs)",
        notes=("note", "timing_caveat"),
        rows=(
            Row("VLM requests per figure (mean)", "per_figure/all_prompts/vlm_requests/mean"),
            Row("prompt tokens per figure (mean, reduced pixel band)", "per_figure/all_prompts/prompt_tokens/mean"),
            Row(
                "completion tokens per figure (mean, tiny model, capped)",
                "per_figure/all_prompts/completion_tokens/mean",
            ),
            Row(
                "seconds per request at batch 8 against batch 1 (ratio: 8 over 1)",
                "batching/batch_8/seconds_per_request",
                "batching/batch_1/seconds_per_request",
                "batching/batch_8/seconds_per_request_over_batch_1",
            ),
            Row(
                "requests with the pre-filter against without (ratio: without over with)",
                "prefilter/with_prefilter/requests",
                "prefilter/without_prefilter_estimate/requests",
                "prefilter/ratio_without_over_with/requests",
            ),
            Row(
                "prompt tokens with the pre-filter against without (ratio: without over with)",
                "prefilter/with_prefilter/prompt_tokens",
                "prefilter/without_prefilter_estimate/prompt_tokens",
                "prefilter/ratio_without_over_with/prompt_tokens",
            ),
            Row(
                "share of prompt tokens a prefix cache reuses (production band, computed)",
                "prefix_caching/strict_share_production_band",
            ),
            Row(
                "H100-hours for the projected figures, short answers (ASSUMED throughput), against Panel2Patch's",
                "projection_24m/low_completion/h100_hours",
                "projection_24m/panel2patch_reference/h100_hours",
            ),
            Row(
                "H100-hours, answers at the prompts' budgets (ASSUMED throughput)",
                "projection_24m/budget_completion/h100_hours",
            ),
        ),
    ),
    Benchmark(
        "longcap",
        "Long captions (LongCAP)",
        (Run(_cmd("longcap"), "longcap.json"),),
        baseline_text="the original captions, (a) below; LongCAP's reported padding shares for context",
        notes=("note", "stage/why_equal"),
        rows=(
            Row(
                "padding share at 77 tokens: (b) caption + context, upper bound, against (a) the caption",
                "sample/enriched_upper_bound/padding_share_77",
                "sample/caption/padding_share_77",
            ),
            Row(
                "padding share at 512 tokens: (b) against (a)",
                "sample/enriched_upper_bound/padding_share_512",
                "sample/caption/padding_share_512",
            ),
            Row(
                "padding share at 512 tokens: (c) the stage's long caption, synthetic run, against (a)",
                "sample/stage_long_caption/padding_share_512",
                "sample/caption/padding_share_512",
            ),
            Row(
                "LongCAP's reported padding share, after against before",
                "longcap_reported/after",
                "longcap_reported/before",
            ),
            Row(
                "prompt tokens per request at the production pixel band (mean)",
                "vlm_cost/per_request/prompt_tokens_production/mean",
            ),
            Row(
                "H100-hours for the projected figures, short against budget answers (ASSUMED throughput)",
                "vlm_cost/projection_24m/low_completion/h100_hours",
                "vlm_cost/projection_24m/budget_completion/h100_hours",
            ),
        ),
    ),
    Benchmark(
        "crop_gate",
        "The release gate of panel crops",
        (Run(_cmd("crop_gate"), "crop_gate.json"),),
        rows=(
            Row("hand-boxed panel crops measured", "crops"),
            Row(
                "ms of CPU per crop, the erosion against the distance transform",
                "methods/erosion/ms_per_crop",
                "methods/distance_transform/ms_per_crop",
                "speed_vs_distance_transform",
            ),
            Row("the same measures for every crop", "identical_measures"),
            Row("crops the gate releases", "released"),
        ),
    ),
    Benchmark(
        "panel_scales",
        "The figure decision on other renditions of its evaluation figures",
        (Run(_cmd("panel_scales"), "panel_scales.json"),),
        rows=(
            Row("tune figures", "splits/tune/figures"),
            Row("their median longest side (px)", "splits/tune/median_longest_side_px"),
            Row("holdout figures", "splits/holdout/figures"),
            Row("their median longest side (px)", "splits/holdout/median_longest_side_px"),
        ),
        tables=(
            Table(
                "Tune split, each rendition",
                "splits/tune/renditions",
                "rendition",
                RENDITION_COLUMNS,
            ),
            Table(
                "Holdout split, each rendition",
                "splits/holdout/renditions",
                "rendition",
                RENDITION_COLUMNS,
            ),
        ),
    ),
    Benchmark(
        "model_inputs",
        "Model input batches: normalised on the device, against NumPy on the host",
        (Run(_cmd("model_inputs"), "model_inputs.json"),),
        rows=(
            Row(
                "DINOv2, 64 images at 224 px: ms of CPU, torch (1 thread) against NumPy",
                "models/dinov2/timings/1_threads/cpu_ms_torch",
                "models/dinov2/timings/1_threads/cpu_ms_numpy_on_the_host",
                "models/dinov2/timings/1_threads/cpu_speed_vs_numpy",
            ),
            Row(
                "DAB-DETR, 8 figures at 800 px: ms of CPU, torch (1 thread) against NumPy",
                "models/detector/timings/1_threads/cpu_ms_torch",
                "models/detector/timings/1_threads/cpu_ms_numpy_on_the_host",
                "models/detector/timings/1_threads/cpu_speed_vs_numpy",
            ),
            Row(
                "bytes sent to the device per DINOv2 batch, now against before",
                "models/dinov2/bytes_to_the_device/now",
                "models/dinov2/bytes_to_the_device/before",
            ),
            Row(
                "bytes sent to the device per detector batch, now against before",
                "models/detector/bytes_to_the_device/now",
                "models/detector/bytes_to_the_device/before",
            ),
            Row(
                "the same inputs, DINOv2 and detector",
                "models/dinov2/identical_inputs",
                "models/detector/identical_inputs",
            ),
        ),
    ),
    Benchmark(
        "serialization",
        "WebDataset serialization",
        (Run(_cmd("serialization"), "serialization.json"),),
        baseline_text="a BIOMEDICA-style writer (webdataset.ShardWriter, each image re-encoded by PIL) on a slice "
        "of the same samples; BIOMEDICA's reported rate is context only",
        rows=(
            Row(
                "samples per CPU second, PanelForge's writer against the BIOMEDICA-style one",
                "panelforge_writer/full/samples_per_cpu_s",
                "biomedica_style_writer/samples_per_cpu_s",
                "ratio_panelforge_over_biomedica_style_in_run",
            ),
            Row(
                "the same per wall-clock second (ratio)",
                None,
                None,
                "ratio_panelforge_over_biomedica_style_in_run_wall",
            ),
            Row(
                "peak RSS (MB), every sample against a quarter of them (ratio: growth)",
                "panelforge_writer/full/peak_rss_mb",
                "panelforge_writer/quarter/peak_rss_mb",
                "peak_rss_ratio_full_over_quarter",
            ),
            Row("samples written", "panelforge_writer/full/samples"),
            Row("planning, samples per CPU second", "planning_samples_per_cpu_s"),
            Row(
                "BIOMEDICA's reported pairs/s (whole pipeline, other hardware; not compared)",
                "biomedica_reported_pairs_per_s",
            ),
        ),
    ),
    Benchmark(
        "dinov2_pad",
        "DINOv2: centre crop against padding to a square",
        (Run(_cmd("dinov2_pad"), "dinov2_pad.json"),),
        rows=(
            Row("figures of the sample measured", "figures"),
            Row("share of the area the crop keeps, figures 2:1 or longer", "crop_keeps_area/elongated (>= 2)"),
            Row("share of the area the crop keeps, all figures", "crop_keeps_area/all"),
        ),
        tables=(
            Table(
                "Clustering with each preprocessing (encoders with random weights)",
                "models",
                "encoder",
                (
                    Col("agreement of crop and pad clusters (ARI)", "cluster_agreement_ari"),
                    Col("5 nearest neighbours shared", "knn5_overlap/all"),
                    Col("clusters follow aspect, crop (NMI)", "clusters_follow_aspect_nmi/crop"),
                    Col("clusters follow aspect, pad (NMI)", "clusters_follow_aspect_nmi/pad"),
                ),
                label="model",
            ),
        ),
    ),
    Benchmark(
        "gpu_check",
        "GPU check: the production architectures at real size (make gpu-check)",
        (Run(_cmd("gpu_check"), "gpu_*.json"),),
        gpu=True,
        rows=(
            Row("device", "device"),
            Row("DINOv2-L images/s", "images_per_second", optional=True),
            Row(
                "DINOv2-L images/s, inputs normalised on the GPU against on the host",
                "images_per_second",
                "baseline_images_per_second",
                "speedup",
                optional=True,
            ),
            Row("DAB-DETR DC5 figures/s in process, CPU resize included", "figures_per_second", optional=True),
            Row(
                "DAB-DETR DC5 figures/s on prepared batches, inputs normalised on the GPU against on the host",
                "batched_figures_per_second",
                "baseline_batched_figures_per_second",
                "speedup",
                optional=True,
            ),
            Row("Qwen2.5-VL new tokens/s", "new_tokens_per_second", optional=True),
            Row("ViT-L-14 training samples/s", "samples_per_second", optional=True),
            Row("ViT-L-14 per-GPU batch (the largest the estimate fits)", "batch_per_gpu", optional=True),
            Row("estimated GB at that batch", "estimate_gb", optional=True),
            Row("peak GPU memory (GB)", "memory/peak_allocated_gb"),
            Row("mean GPU utilisation (%)", "gpu_utilisation/mean_percent"),
        ),
    ),
    _training("Training throughput", Run(_cmd("training"), "training.json"), "process_peak_rss_mib", "peak RSS (MiB)"),
    _training(
        "Training throughput on a GPU",
        Run(_cmd("training", TRAINING_GPU_ARGS), "training_gpu.json"),
        "cuda_max_allocated_mib",
        "peak GPU memory allocated (MiB)",
        gpu=True,
    ),
)
