"""Embedding backends side by side: sentence-transformers on torch in fp32, the same with
batches in bf16 (`core.cpu_precision.encoder_autocast`, the default where the CPU has bf16
natively), and the numpy encoder (`search.numpy_encoder`, what a serving-only install without
torch uses).

Two figures per backend, median of `--runs` alternated runs on the same texts: single-query
latency (the search service embeds one question per request) and batch throughput over
dev-file paragraphs (indexing), plus each backend's largest difference from the fp32 vectors
and its smallest cosine to them. Nothing is asserted.

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

from core.cpu_precision import cpu_has_native_bf16  # noqa: E402
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
    # (name, backend, SEARCHSMITH_CPU_DTYPE while it runs)
    rows = [("torch fp32", "torch", "float32"), ("torch bf16 batches", "torch", "bfloat16"), ("numpy", "numpy", "float32")]
    backends = {name: Embedder(backend=backend) for name, backend, _ in rows}
    precision = {name: dtype for name, _, dtype in rows}

    def encode(name: str, texts: list[str]) -> np.ndarray:
        os.environ["SEARCHSMITH_CPU_DTYPE"] = precision[name]
        return backends[name].encode(texts)

    for name in backends:
        encode(name, questions[:2])  # load the weights outside the timings
    latency: dict[str, list[float]] = {name: [] for name in backends}
    throughput: dict[str, list[float]] = {name: [] for name in backends}
    for _ in range(args.runs):
        for name in backends:
            start = time.perf_counter()
            for question in questions:
                encode(name, [question])
            latency[name].append((time.perf_counter() - start) / len(questions) * 1000)
            start = time.perf_counter()
            encode(name, paragraphs)
            throughput[name].append(len(paragraphs) / (time.perf_counter() - start))
    reference = encode("torch fp32", paragraphs[:32])
    print(f"{len(questions)} single queries, {len(paragraphs)} paragraphs (batch {backends['numpy'].batch_size}), "
          f"median of {args.runs} runs, {os.cpu_count()} CPUs, native bf16: {cpu_has_native_bf16()}")
    print("| backend | query p50 ms | queries/s | chunks/s (batch) | x fp32 chunks/s | max diff from fp32 | min cosine to fp32 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    base = statistics.median(throughput["torch fp32"])
    for name in backends:
        ms, rate = statistics.median(latency[name]), statistics.median(throughput[name])
        vectors = encode(name, paragraphs[:32])
        print(f"| {name} | {ms:.1f} | {1000 / ms:.0f} | {rate:.0f} | {rate / base:.2f} | "
              f"{float(np.abs(vectors - reference).max()):.1e} | {float((vectors * reference).sum(axis=1).min()):.5f} |")

if __name__ == "__main__":
    main()
