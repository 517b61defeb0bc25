"""Parsing benchmark: PanelForge's parser against pubmed_parser on the bundled corpus, one core.

Baseline, in the same run on the same files: pubmed_parser 0.5.1's nearest equivalent —
``parse_pubmed_xml`` (metadata) + ``parse_pubmed_caption`` (figure captions) +
``parse_pubmed_paragraph`` (paragraphs with their references). PanelForge extracts more
(child figures, resolved image files, mention markers and ranges, licences, other graphics).
pubmed_parser reads a file path, so both parse from the same files on disk. Memory: the
corpus is parsed repeatedly one article at a time; peak RSS after 1 and after ``--repeat``
passes must be the same (flat as the corpus grows).

    python -m benchmarks.parsing [--repeat 20]

Writes ``benchmarks/results/parsing.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import time
import warnings
from pathlib import Path

from benchmarks.record import write_results
from pipelines.parse.nxml import parse_article
from testing.loopback.sample_mirror import SAMPLE_DIR, article_files, sample_rows

RESULTS = Path(__file__).parent / "results" / "parsing.json"


def corpus() -> list[tuple[Path, list[str]]]:
    out = []
    for row in sample_rows():
        xml, others = article_files(SAMPLE_DIR, row)
        out.append((xml, sorted(p.name for p in others)))
    return out


def panelforge(xml: Path, files: list[str]) -> int:
    parsed = parse_article(xml, files=files)
    return len(parsed.figures) + len(parsed.mentions)


def baseline(xml: Path, files: list[str]) -> int:
    import pubmed_parser as pp

    pp.parse_pubmed_xml(str(xml))
    captions = pp.parse_pubmed_caption(str(xml)) or []
    paragraphs = pp.parse_pubmed_paragraph(str(xml), all_paragraph=True) or []
    return len(captions) + len(paragraphs)


def readable_by(fn, docs) -> list:
    """The documents ``fn`` parses without raising."""
    ok = []
    for xml, files in docs:
        try:
            fn(xml, files)
            ok.append((xml, files))
        except Exception:  # noqa: BLE001 - pubmed_parser fails on some JATS flavours
            pass
    return ok


def run(fn, docs, repeat: int) -> dict:
    errors = 0
    start = time.process_time()
    for _ in range(repeat):
        for xml, files in docs:
            try:
                fn(xml, files)
            except Exception:  # noqa: BLE001 - count what the parser cannot read
                errors += 1
    cpu = time.process_time() - start
    n = repeat * len(docs)
    return {"articles": n, "cpu_s": round(cpu, 3), "articles_per_s_per_core": round(n / cpu, 1), "errors": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    docs = corpus()
    # time both on the files both can read: a parser that fails fast must not look faster
    common = readable_by(baseline, readable_by(panelforge, docs))
    run(panelforge, docs, 1)
    rss_one = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ours_all = run(panelforge, docs, args.repeat)
    rss_many = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ours = run(panelforge, common, args.repeat)
    theirs = run(baseline, common, args.repeat)
    sample = parse_article(docs[9][0], files=docs[9][1])
    result = {
        "benchmark": "nXML parsing throughput on the bundled sample (38 articles), one core, CPU time",
        "baseline": "pubmed_parser 0.5.1: parse_pubmed_xml + parse_pubmed_caption + parse_pubmed_paragraph",
        "python": platform.python_version(),
        "repeat": args.repeat,
        "articles_both_parse": len(common),
        "articles_pubmed_parser_fails_on": sorted(
            str(x.relative_to(SAMPLE_DIR)) for x, _ in docs if (x, _) not in common
        ),
        "panelforge": ours,
        "pubmed_parser": theirs,
        "panelforge_whole_corpus": ours_all,
        "speedup": round(ours["articles_per_s_per_core"] / theirs["articles_per_s_per_core"], 2),
        "panelforge_peak_rss_mb_after_1_pass": round(rss_one / 1024, 1),
        "panelforge_peak_rss_mb_after_all_passes": round(rss_many / 1024, 1),
        "fields_per_figure": sorted(sample.figures[0]),
    }
    write_results(RESULTS, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
