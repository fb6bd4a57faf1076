"""Embedding backends side by side: sentence-transformers on torch vs the numpy encoder
(`search.numpy_encoder`, what a serving-only install without torch uses).

Two figures per backend, median of `--runs` alternated runs on the same texts: single-query
latency (the search service embeds one question per request) and batch throughput over
dev-file paragraphs (indexing), plus the largest difference between the two backends' vectors.
Nothing is asserted.

Usage: .venv/bin/python bench/embedder_backends.py [--queries 50] [--chunks 128] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from search.embeddings import Embedder  # noqa: E402

DEV = REPO.parent / "shared" / "data" / "multihop_dev.jsonl"
SAMPLE = REPO / "customers" / "demo" / "benchmarks" / "multihop_sample.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--chunks", type=int, default=128)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    records = [json.loads(line) for line in (DEV if DEV.exists() else SAMPLE).read_text().splitlines() if line.strip()]
    questions = [r["question"] for r in records][: args.queries]
    paragraphs = [f"{p['title']}\n{p['text']}" for r in records for p in r["paragraphs"]][: args.chunks]
    backends = {name: Embedder(backend=name) for name in ("torch", "numpy")}
    for embedder in backends.values():
        embedder.encode(questions[:2])  # load the weights outside the timings
    latency: dict[str, list[float]] = {name: [] for name in backends}
    throughput: dict[str, list[float]] = {name: [] for name in backends}
    for _ in range(args.runs):
        for name, embedder in backends.items():
            start = time.perf_counter()
            for question in questions:
                embedder.encode([question])
            latency[name].append((time.perf_counter() - start) / len(questions) * 1000)
            start = time.perf_counter()
            embedder.encode(paragraphs)
            throughput[name].append(len(paragraphs) / (time.perf_counter() - start))
    difference = float(np.abs(backends["torch"].encode(paragraphs[:32]) - backends["numpy"].encode(paragraphs[:32])).max())
    print(f"{len(questions)} single queries, {len(paragraphs)} paragraphs (batch {backends['torch'].batch_size}), "
          f"median of {args.runs} runs, {os.cpu_count()} CPUs")
    print("| backend | query p50 ms | queries/s | chunks/s (batch) |")
    print("|---|---:|---:|---:|")
    for name in backends:
        ms = statistics.median(latency[name])
        print(f"| {name} | {ms:.1f} | {1000 / ms:.0f} | {statistics.median(throughput[name]):.0f} |")
    torch_ms, numpy_ms = statistics.median(latency["torch"]), statistics.median(latency["numpy"])
    print(f"numpy / torch: query latency x{numpy_ms / torch_ms:.2f}, batch throughput "
          f"x{statistics.median(throughput['numpy']) / statistics.median(throughput['torch']):.2f}; "
          f"largest vector difference {difference:.1e}")


if __name__ == "__main__":
    main()
