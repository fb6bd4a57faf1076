"""Sync + chunk throughput for 10,000 local documents, and the cost of a 1%-changed resync.

Prints docs/s, peak RSS, and resync time as a share of the full sync (goal: under 5%).
Median of several runs. Usage: .venv/bin/python bench/sync_throughput.py [--docs 10000] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import tempfile
import time
from pathlib import Path

from core.config import parse_customer
from core.storage import LocalArtifactStore
from corpus.per_customer import chunk_customer_documents, sync_customer_documents
from search.embedding_window import embedding_model_info, load_token_offsets

SAMPLE = Path(__file__).resolve().parents[1] / "customers" / "demo" / "benchmarks" / "multihop_sample.jsonl"


def write_corpus(root: Path, n_docs: int, seed: int = 0) -> list[Path]:
    paragraphs = [p["text"] for line in SAMPLE.read_text().splitlines() for p in json.loads(line)["paragraphs"]]
    rng = random.Random(seed)
    paths = []
    for i in range(n_docs):
        folder = root / f"d{i // 500:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"doc{i:05d}.md"
        body = "\n\n".join(rng.sample(paragraphs, 3))
        path.write_text(f"# Document {i}\n\n{body}\n")
        paths.append(path)
    return paths


def timed_sync(config, store, work, tokenizer, model) -> tuple[float, dict]:
    start = time.perf_counter()
    result = sync_customer_documents(config, store, work)
    chunked, _ = chunk_customer_documents(config, store, tokenizer, model.name, model.max_chunk_tokens)
    return time.perf_counter() - start, {**result.counts.as_dict(), "chunks": chunked.chunks.height, "rechunked": chunked.rechunked_docs}


def one_run(n_docs: int, seed: int) -> dict:
    model = embedding_model_info()
    tokenizer = load_token_offsets(str(model.path))
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        paths = write_corpus(root / "corpus", n_docs, seed)
        config = parse_customer({"name": "bench", "sources": [{"type": "local", "path": "corpus"}]}, root / "bench.yaml")
        store = LocalArtifactStore(root / "artifacts")
        full_s, full_counts = timed_sync(config, store, root / "work", tokenizer, model)
        rng = random.Random(seed + 1)
        for path in rng.sample(paths, max(1, n_docs // 100)):
            path.write_text(path.read_text() + "\nAn added sentence for the resync.\n")
        resync_s, resync_counts = timed_sync(config, store, root / "work", tokenizer, model)
    return {"full_s": full_s, "resync_s": resync_s, "full": full_counts, "resync": resync_counts}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    runs = [one_run(args.docs, seed) for seed in range(args.runs)]
    full = statistics.median(r["full_s"] for r in runs)
    resync = statistics.median(r["resync_s"] for r in runs)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"documents: {args.docs}, runs: {args.runs}")
    print(f"full sync + chunk: {full:.2f} s median -> {args.docs / full:,.0f} docs/s ({runs[0]['full']['chunks']} chunks)")
    print(f"resync with 1% changed: {resync:.2f} s median -> {resync / full:.1%} of the full sync (goal < 5%)")
    print(f"resync counts: {runs[0]['resync']}")
    print(f"peak RSS: {peak_mib:,.0f} MiB")


if __name__ == "__main__":
    main()
