"""Index figures: embedding vs index-build throughput, and search latency/QPS at 100k chunks.

1. Raw embedding throughput of the packaged all-MiniLM-L6-v2 alone vs `HybridIndex`
   build throughput on the same ~1000 chunks (goal: build >= 0.8 x raw). Runs alternate so
   load drift on a shared machine hits both alike.
2. At 100,000 chunks (multihop paragraphs recombined; random unit vectors of dim 384 for
   the dense leg, so 100k texts need not be embedded): p50/p95 of BM25 alone, dense alone
   and hybrid, all excluding query embedding (precomputed query vectors); hybrid with 500
   seen ids excluded; grep; and QPS with 8 concurrent agents (threads).
   Goals: hybrid p50 <= 15 ms and <= 1.5 x the slower leg.

Figures are medians over `--runs`; nothing is asserted. Harness overhead is measured elsewhere.
Usage: .venv/bin/python bench/index_bench.py [--embed-chunks 1000] [--chunks 100000] [--runs 3]
       [--workdir DIR  (reuse a built 100k index across invocations)] [--skip-embed]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from corpus.chunk_sync import CHUNK_SCHEMA  # noqa: E402
from corpus.chunking import chunk_id_for  # noqa: E402
from search.chroma_client import persistent_client  # noqa: E402
from search.index import HybridIndex  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DATA_CANDIDATES = [REPO.parent / "shared" / "data" / "multihop_dev.jsonl", REPO / "tests" / "data" / "multihop_sample.jsonl"]
DIMS = 384


def load_records() -> list[dict]:
    for path in DATA_CANDIDATES:
        if path.exists():
            return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    raise SystemExit(f"no multihop data in {DATA_CANDIDATES}")


def paragraphs(records: list[dict]) -> list[tuple[str, str]]:
    return sorted({(p["title"], p["text"]) for record in records for p in record["paragraphs"]})


def make_chunks(paras: list[tuple[str, str]], n: int, chunker: str = "bench:v1") -> pl.DataFrame:
    """`n` distinct chunks: paragraph i, plus the first sentence of another paragraph once
    the real paragraphs run out (keeps BM25 statistics realistic)."""
    rows, seen = [], set()
    for i in range(n):
        title, text = paras[i % len(paras)]
        if i >= len(paras):
            other = paras[(i * 7919 + 13) % len(paras)][1]
            text = f"{text} {other.split('. ')[0]}. (part {i // len(paras)})"
        doc_id = f"doc-{i // 4:06d}"
        chunk_id = chunk_id_for(doc_id, text)
        if chunk_id in seen:  # the same paragraph twice in one document
            text = f"{text} [{i}]"
            chunk_id = chunk_id_for(doc_id, text)
        seen.add(chunk_id)
        rows.append(
            {
                "chunk_id": chunk_id,
                "doc_id": doc_id,
                "index": i % 4,
                "title": title,
                "text": text,
                "start": 0,
                "end": len(text),
                "n_tokens": len(text.split()),
                "source": "bench",
                "uri": "",
                "domain": "web",
                "content_hash": "",
                "chunker": chunker,
            }
        )
    return pl.DataFrame(rows, schema=CHUNK_SCHEMA)


class RandomEmbedder:
    """Random unit vectors: the dense leg's latency does not depend on what the vectors mean."""

    name = "bench-random-384"
    dims = DIMS

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def encode(self, texts):
        vectors = self.rng.standard_normal((len(texts), DIMS)).astype(np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


# -- 1. embedding vs build -------------------------------------------------------------------


def embed_vs_build(records: list[dict], n: int, runs: int) -> dict:
    from search.embeddings import Embedder

    chunks = make_chunks(paragraphs(records), n)
    texts = chunks.get_column("text").to_list()
    embedder = Embedder()
    embedder.encode(texts[:32])  # load the model and warm up once; both sides share it
    raw, build, share = [], [], []
    for run in range(runs):
        start = time.perf_counter()
        embedder.encode(texts)
        raw.append(n / (time.perf_counter() - start))
        with tempfile.TemporaryDirectory() as folder:
            index = HybridIndex(persistent_client(Path(folder) / "chroma"), "bench", embedder, Path(folder) / "bm25")
            stats = index.build_or_update(chunks)
            assert stats.embedded == n
            build.append(n / stats.seconds)
            share.append(stats.embed_seconds / stats.seconds)
        print(f"  run {run + 1}: raw {raw[-1]:.1f} chunks/s, build {build[-1]:.1f} chunks/s, embedding {share[-1]:.1%} of build", file=sys.stderr)
    tokenizer = embedder._model().tokenizer
    mean_tokens = float(np.mean([len(tokenizer(t, truncation=True, max_length=embedder.max_seq_length)["input_ids"]) for t in texts[:200]]))
    raw_m, build_m = statistics.median(raw), statistics.median(build)
    return {
        "chunks": n,
        "mean_tokens": round(mean_tokens, 1),
        "raw_chunks_per_s": round(raw_m, 1),
        "build_chunks_per_s": round(build_m, 1),
        "build_over_raw": round(build_m / raw_m, 3),
        "embedding_share_of_build": round(statistics.median(share), 3),
    }


# -- 2. search at 100k ---------------------------------------------------------------------


def build_large(records: list[dict], n: int, workdir: Path) -> tuple[HybridIndex, dict]:
    chunks = make_chunks(paragraphs(records), n)
    client = persistent_client(workdir / "chroma")
    write_batch = min(5000, int(client.get_max_batch_size()))
    index = HybridIndex(
        client, "bench", RandomEmbedder(), workdir / "bm25", write_batch=write_batch, embed_block=20_000, store_documents=False
    )
    stats = index.build_or_update(chunks)
    return index, stats.as_dict()


def latencies(fn, queries: list[tuple[str, np.ndarray]], warmup: int = 20) -> list[float]:
    for query, vector in queries[:warmup]:
        fn(query, vector)
    out = []
    for query, vector in queries:
        start = time.perf_counter()
        fn(query, vector)
        out.append((time.perf_counter() - start) * 1000)
    return out


def qps(fn, queries: list[tuple[str, np.ndarray]], workers: int = 8) -> float:
    def agent(part: list[tuple[str, np.ndarray]]) -> None:
        for query, vector in part:
            fn(query, vector)

    parts = [queries[i::workers] for i in range(workers)]
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(agent, parts))
    return len(queries) / (time.perf_counter() - start)


def search_figures(index: HybridIndex, records: list[dict], runs: int, n_queries: int) -> dict:
    rng = np.random.default_rng(1)
    texts = [record["question"] for record in records]
    queries = [(texts[i % len(texts)], v / np.linalg.norm(v)) for i, v in enumerate(rng.standard_normal((n_queries, DIMS)).astype(np.float32))]
    seen = set(rng.choice(index.state.table.ids, size=500, replace=False).tolist())
    modes = {
        "bm25": lambda q, v: index.search_bm25(q, k=50),
        "dense": lambda q, v: index.search_dense(q, k=50, query_embedding=v),
        "hybrid": lambda q, v: index.search(q, k=50, query_embedding=v),
        "hybrid_500_seen": lambda q, v: index.search(q, k=50, exclude=seen, query_embedding=v),
    }
    figures: dict[str, dict] = {}
    for name, fn in modes.items():
        p50s, p95s, rates = [], [], []
        for _ in range(runs):
            values = latencies(fn, queries)
            p50s.append(pct(values, 50))
            p95s.append(pct(values, 95))
            rates.append(qps(fn, queries, 8))
        figures[name] = {
            "p50_ms": round(statistics.median(p50s), 2),
            "p95_ms": round(statistics.median(p95s), 2),
            "qps_8_agents": round(statistics.median(rates), 1),
        }
        print(f"  {name}: {figures[name]}", file=sys.stderr)
    grep = {}
    for label, pattern in {"grep_common_word": r"\bthe\b", "grep_no_match": r"zqxjkv", "grep_regex_no_match": r"\b[Zz]\w+ian River\b"}.items():
        index.grep(pattern, limit=5, timeout_s=30)  # the first grep builds the joined haystack
        times = []
        for _ in range(max(3, runs)):
            start = time.perf_counter()
            index.grep(pattern, limit=5, timeout_s=30)
            times.append((time.perf_counter() - start) * 1000)
        grep[label] = round(statistics.median(times), 2)
    figures["grep_ms"] = grep
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--embed-chunks", type=int, default=1000)
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--workdir", type=Path, default=None, help="keep the 100k index here and reuse it")
    parser.add_argument("--skip-embed", action="store_true")
    parser.add_argument("--skip-search", action="store_true")
    args = parser.parse_args()
    records = load_records()
    report: dict = {"cpus": os.cpu_count(), "load_avg_start": os.getloadavg()[0]}

    if not args.skip_embed:
        print(f"embedding vs build on {args.embed_chunks} chunks ...", file=sys.stderr)
        report["embedding"] = embed_vs_build(records, args.embed_chunks, args.runs)
        e = report["embedding"]
        print(
            f"embedding ({e['chunks']} chunks, ~{e['mean_tokens']} tokens): raw {e['raw_chunks_per_s']} chunks/s, "
            f"index build {e['build_chunks_per_s']} chunks/s -> {e['build_over_raw']:.2f} x raw (goal >= 0.80); "
            f"embedding is {e['embedding_share_of_build']:.1%} of build time"
        )

    if not args.skip_search:
        temp = None
        workdir = args.workdir
        if workdir is None:
            temp = tempfile.TemporaryDirectory()
            workdir = Path(temp.name)
        print(f"building the {args.chunks:,}-chunk index in {workdir} ...", file=sys.stderr)
        index, stats = build_large(records, args.chunks, workdir)
        report["large_build"] = {k: stats[k] for k in ("embedded", "kept", "deleted", "total", "seconds")}
        print(f"{args.chunks:,}-chunk index: {json.dumps(report['large_build'])}")
        figures = search_figures(index, records, args.runs, args.queries)
        report["search"] = figures
        for name in ("bm25", "dense", "hybrid", "hybrid_500_seen"):
            f = figures[name]
            print(f"{name:>16}: p50 {f['p50_ms']:6.2f} ms  p95 {f['p95_ms']:6.2f} ms  QPS(8 agents) {f['qps_8_agents']:7.1f}")
        slower = max(figures["bm25"]["p50_ms"], figures["dense"]["p50_ms"])
        hybrid = figures["hybrid"]["p50_ms"]
        print(f"hybrid p50 {hybrid:.2f} ms (goal <= 15) = {hybrid / slower:.2f} x the slower leg (goal <= 1.5)")
        print(f"grep at {args.chunks:,} chunks (ms): {figures['grep_ms']}")
        if temp is not None:
            temp.cleanup()
    report["load_avg_end"] = os.getloadavg()[0]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
