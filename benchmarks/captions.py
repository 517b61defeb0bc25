"""Caption splitting against hand-split captions, per split, against a named baseline.

Data: the caption phrases of the panel evaluation set (``sample/panels/eval``: every
``figures-*.json`` and ``captions-nxml.json``; format in its README), scored with
``captions.phrase_agreement`` (found under the phrase's label, leaked into another label's text,
no-panel text leaked into a panel, label sets exact), one entry per split ("tune", "holdout");
a caption listed twice (the same figure at two resolutions) counts once. And the label sets of
``tests/data/caption_splits.json`` with ``captions.caption_agreement``.

Baseline: ``split_caption`` as it was at a git revision (``--baseline``, default the commit before
the rule-set of issue 19 §4), loaded from ``git show`` into its own module and run on the same
cases in the same process; ``found_vs_baseline`` is the ratio of found shares. Speed: captions
per second of CPU time for both, over every caption of the run (one warm-up pass).

    python -m benchmarks.captions [--splits tune holdout] [--eval-dir DIR] [--baseline REV] [--output PATH]

Results go to ``benchmarks/results/captions.json`` (``--output``); entries of splits not run this
time are kept. ``captions_vs_first_holdout_run.json`` is the same against ``4999c77``, the code
whose holdout score was the first one taken (the changes after it were made having seen the
holdout's misses, so only that first score is a measure on unseen captions).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

from benchmarks.record import write_results
from pipelines.text.captions import caption_agreement, normalize_caption, phrase_agreement, split_caption

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results" / "captions.json"
EVAL_DIR = ROOT / "sample" / "panels" / "eval"
LABEL_CASES = ROOT / "tests" / "data" / "caption_splits.json"
BASELINE = "7c4b7de"  # main before the caption rules of issue 19 §4


def load_cases(directory: Path, splits: list[str]) -> tuple[list[dict], dict[str, int]]:
    """The caption cases of the evaluation set in ``splits``, each caption once, and how many
    entries each file gave."""
    cases, seen, files = [], set(), {}
    for path in sorted(directory.glob("figures-*.json")) + sorted(directory.glob("captions-*.json")):
        data = json.loads(path.read_text("utf-8"))
        entries = data if isinstance(data, list) else data.get("cases") or data.get("figures") or []
        kept = [e for e in entries if e.get("caption") and e.get("split") in splits]
        files[path.name] = len(kept)
        for entry in kept:
            key = (normalize_caption(entry["caption"]), json.dumps(entry.get("phrases"), sort_keys=True))
            if key not in seen:
                seen.add(key)
                cases.append(entry)
    return cases, files


def baseline_splitter(revision: str) -> Callable:
    """``split_caption`` of ``pipelines/text/captions.py`` at ``revision``."""
    source = subprocess.run(
        ["git", "show", f"{revision}:pipelines/text/captions.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    module = types.ModuleType(f"captions_at_{revision}")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, f"captions@{revision}", "exec"), module.__dict__)  # noqa: S102 - our own code at a revision
    return module.split_caption


def speed(splitter: Callable, captions: list[str]) -> float:
    for caption in captions:
        splitter(caption)
    began = time.process_time()
    for caption in captions:
        splitter(caption)
    elapsed = time.process_time() - began
    return round(len(captions) / elapsed, 1) if elapsed else float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", nargs="+", default=["tune", "holdout"])
    parser.add_argument("--eval-dir", type=Path, default=EVAL_DIR)
    parser.add_argument("--baseline", default=BASELINE, help="git revision of the baseline splitter")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    baseline = baseline_splitter(args.baseline)
    previous = json.loads(args.output.read_text()) if args.output.exists() else {}
    result = {
        "benchmark": "caption splitting: hand-chosen phrases found under their label (phrase_agreement) "
        "per split, against the splitter at a baseline revision in the same run",
        "python": platform.python_version(),
        "eval_dir": str(args.eval_dir.resolve().relative_to(ROOT))
        if args.eval_dir.resolve().is_relative_to(ROOT)
        else "",
        "baseline": f"split_caption@{args.baseline}",
        "splits": dict(previous.get("splits", {})),
    }
    for split in args.splits:
        cases, files = load_cases(args.eval_dir, [split])
        if not cases:
            continue
        now = phrase_agreement(cases).get(split, {})
        before = phrase_agreement(cases, splitter=baseline).get(split, {})
        captions = [c["caption"] for c in cases]
        result["splits"][split] = {
            "files": files,
            "current": now,
            "baseline": {k: v for k, v in before.items() if k != "misses"},
            "found_vs_baseline": round(now["found_share"] / before["found_share"], 3)
            if before.get("found_share")
            else None,
            "captions_per_s": {"current": speed(split_caption, captions), "baseline": speed(baseline, captions)},
        }
    label_cases = json.loads(LABEL_CASES.read_text("utf-8"))["cases"]
    result["label_sets"] = {
        "file": str(LABEL_CASES.relative_to(ROOT)),
        "current": caption_agreement(label_cases),
        "baseline": caption_agreement(label_cases, splitter=baseline),
    }
    write_results(args.output, result, indent=1)
    for split, entry in result["splits"].items():
        now, before = entry["current"], entry["baseline"]
        print(
            f"{split}: {now['captions']} captions, {now['phrases']} phrases: found {before['found_share']} -> "
            f"{now['found_share']}, leaked {before['leaked_share']} -> {now['leaked_share']}, no-panel leaked "
            f"{before['no_panel_leaked']} -> {now['no_panel_leaked']} of {now['no_panel']}, label sets exact "
            f"{before['label_set_exact']} -> {now['label_set_exact']}"
        )
    print(
        f"label sets ({LABEL_CASES.name}): {result['label_sets']['baseline']['exact_label']:.4f} -> "
        f"{result['label_sets']['current']['exact_label']:.4f}"
    )


if __name__ == "__main__":
    main()
