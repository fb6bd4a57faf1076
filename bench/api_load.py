"""Load on the search service: throughput and latency at 4, 8 and 16 concurrent clients.

Starts the real service (`serving.api.create_app` under uvicorn) on a free loopback port over a
small real index (the test corpus, hash embeddings, BM25) with the heuristic policy, then runs
rounds of C clients x R requests each (every client a thread with its own keep-alive
connection, sending the next request when the last one is answered). Prints, per round: answers
by status, requests per second, and p50/p95/max latency. Bounded: C x R requests per round, and
every request has a client timeout. Prints figures only, never asserts on time.

    .venv/bin/python bench/api_load.py [--clients 4,8,16] [--requests 25] [--workers 4] [--queue 64] [--json]

`--queue 0` reproduces the service as it was before it had a queue (every request beyond the
workers got 503).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from search.chroma_client import persistent_client  # noqa: E402
from serving.api import ApiLimits, create_app  # noqa: E402
from serving.api_keys import ApiKeyStore  # noqa: E402
from tests.test_index import DATA, HashEmbedder, chunk_table, make_index  # noqa: E402
from tests.test_serving_api import served  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))] if ordered else float("nan")


def run_round(base: str, key: str, questions: list[str], clients: int, requests: int) -> dict:
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    lock = threading.Lock()

    def client(number: int) -> None:
        with httpx.Client(base_url=base, timeout=300) as http:
            for i in range(requests):
                body = {"customer": "acme", "query": questions[(number * requests + i) % len(questions)], "k": 5}
                started = time.perf_counter()
                try:
                    status = http.post("/v1/search", json=body, headers={"Authorization": f"Bearer {key}"}).status_code
                except httpx.HTTPError:
                    status = 0  # no answer at all
                elapsed = time.perf_counter() - started
                with lock:
                    statuses[status] += 1
                    if status == 200:
                        latencies.append(elapsed)

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    return {
        "clients": clients, "requests": clients * requests, "statuses": dict(sorted(statuses.items())),
        "answered_per_s": round(statuses[200] / wall, 2), "wall_s": round(wall, 2),
        "p50_ms": round(percentile(latencies, 0.50) * 1000, 1), "p95_ms": round(percentile(latencies, 0.95) * 1000, 1),
        "max_ms": round(max(latencies, default=float("nan")) * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", default="4,8,16", help="comma-separated client counts, one round each")
    parser.add_argument("--requests", type=int, default=25, help="requests per client per round")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--queue", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    records = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    questions = [record["question"] for record in records]
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        index = make_index(persistent_client(root / "chroma"), root, "acme", HashEmbedder())
        index.build_or_update(chunk_table(records))
        keys = ApiKeyStore(root / "api_keys.json")
        key = keys.create_key("acme")
        limits = ApiLimits(max_concurrent_searches=args.workers, max_queued_searches=args.queue)
        app = create_app(keys, lambda: {"acme"}, lambda customer: index, lambda customer: "heuristic", limits)
        with served(app) as base:  # the tests' real uvicorn on an ephemeral loopback port
            run_round(base, key, questions, 2, 2)  # warm-up: the index and the policy's first load
            rounds = [run_round(base, key, questions, int(c), args.requests) for c in args.clients.split(",") if c.strip()]
    if args.json:
        print(json.dumps({"workers": args.workers, "queue": args.queue, "rounds": rounds}))
        return
    print(f"search service: {args.workers} workers, queue {args.queue}, heuristic policy, {len(records)} questions")
    print(f"{'clients':>7} {'requests':>8} {'answered/s':>10} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}  statuses")
    for r in rounds:
        print(f"{r['clients']:>7} {r['requests']:>8} {r['answered_per_s']:>10} {r['p50_ms']:>8} {r['p95_ms']:>8} {r['max_ms']:>8}  {r['statuses']}")


if __name__ == "__main__":
    main()
