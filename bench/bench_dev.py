"""Figures for the dev file: every baseline and the heuristic agent (1x and 4x) at k=5.

    .venv/bin/python bench/bench_dev.py [--tasks ../shared/data/multihop_dev.jsonl]
        [--policies bm25,dense,hybrid,heuristic,heuristic@4] [--k 5] [--out bench/out/dev] [--limit N]
        [--reranker DIR  (with hybrid+rerank, heuristic+rerank: selection by a trained reranker)]

Prints the markdown table (and the per-dataset one) and writes report.json, report.md, plots,
trajectories and per-task scores under --out. The first run indexes the pooled corpus
(~5,400 paragraphs: a few minutes on 2 CPU cores); later runs reuse the cached index. A
benchmark prints figures; it never asserts timings.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DEFAULT_TASKS = REPO.parent / "shared" / "data" / "multihop_dev.jsonl"
FALLBACK_TASKS = REPO / "customers" / "demo" / "benchmarks" / "multihop_sample.jsonl"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=Path, default=DEFAULT_TASKS if DEFAULT_TASKS.exists() else FALLBACK_TASKS)
    parser.add_argument("--policies", default="bm25,dense,hybrid,heuristic,heuristic@4")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "dev")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--cache", type=Path, default=None, help="index cache root (default $SEARCHSMITH_HOME/cache/benchmarks)")
    parser.add_argument("--reranker", type=Path, default=None, help="reranker folder (bi- or cross-encoder) for +rerank candidates")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")

    from evaluation.bench import run_bench_command
    from evaluation.report import group_table, markdown_table

    report = run_bench_command(
        args.tasks, args.policies, args.k, args.out, limit=args.limit, progress=True,
        workers=args.workers, cache_root=args.cache, reranker=args.reranker,
    )
    config = report["config"]
    print(f"{config['tasks_file']} (sha256 {config['tasks_sha256'][:12]}), k={config['k']}, n={config['n_tasks']}, "
          f"{config['n_documents']} pooled documents / {config['n_chunks']} chunks, embeddings {config['embedding_model']}")
    print(markdown_table(report["policies"]))
    groups = group_table(report["policies"])
    if groups:
        print()
        print(groups)
    print(f"\nwall time per candidate (s): " + ", ".join(f"{n} {s['wall_s_total']:.0f}" for n, s in report["policies"].items()))
    print(f"report: {report['files']['report_md']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
