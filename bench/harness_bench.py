"""Harness overhead per turn, excluding the model and the search backend (goal <= 10 ms).

Runs real episodes (the heuristic policy, and a fixed scripted policy that searches, greps,
reads and prunes) against a real HybridIndex over a pooled corpus of dev-set paragraphs, and
reports, per turn: episode wall time minus the policy's inference time minus the wall time of
each turn's concurrent backend phase. What remains is the harness itself: argument checks,
dedup, budget cuts, rendering, token counting, pruning, view snapshots, trajectory records and
answer parsing. Prints medians over several repeats; never asserts on time.

    .venv/bin/python bench/harness_bench.py [--questions 30] [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

from agent.harness import Harness, HarnessConfig
from agent.policies.heuristic import HeuristicPolicy
from agent.policy_base import PolicyStep, ToolCall
from agent.tools import parse_rendered_chunks
from search.embedding_window import load_token_offsets

DEV_FILE = Path(__file__).resolve().parents[2] / "shared" / "data" / "multihop_dev.jsonl"


def pooled_index(n_questions: int, folder: Path):
    from corpus.chunking import chunk_id_for
    from search.chroma_client import persistent_client
    from search.embeddings import make_embedder
    from search.index import HybridIndex

    questions = [json.loads(line) for line in DEV_FILE.read_text().splitlines()[:n_questions]]
    counter = load_token_offsets()
    rows = {}
    for record in questions:
        for paragraph in record["paragraphs"]:
            doc_id = "p" + hashlib.sha1(f"{paragraph['title']}\x00{paragraph['text']}".encode()).hexdigest()[:12]
            rows.setdefault(doc_id, {
                "chunk_id": chunk_id_for(doc_id, paragraph["text"]), "doc_id": doc_id, "text": paragraph["text"],
                "title": paragraph["title"], "n_tokens": counter.count(paragraph["text"]), "index": 0, "chunker": "bench-v1",
            })
    index = HybridIndex(persistent_client(folder), "bench", make_embedder())
    index.build_or_update(pl.DataFrame(list(rows.values())))
    return index, [record["question"] for record in questions]


class ScriptedMix:
    """Every tool each episode: 4 parallel searches, grep + read, prune, then an answer."""

    name = "scripted-mix"

    def token_counter(self):
        return load_token_offsets()

    def new_episode(self, question: str, seed: int = 0):
        return _MixEpisode(question)


class _MixEpisode:
    def __init__(self, question: str):
        self.question = question
        self.turn = 0

    def act(self, messages, tools) -> PolicyStep:
        self.turn += 1
        chunks = [c for m in messages if m["role"] == "tool" for c in parse_rendered_chunks(m["content"])]
        words = self.question.split()
        if self.turn == 1:
            queries = [self.question, " ".join(words[: len(words) // 2]), " ".join(words[len(words) // 2 :]), words[-1]]
            calls = [("search_corpus", {"query": q}) for q in queries]
        elif self.turn == 2 and chunks:
            calls = [("grep_corpus", {"pattern": chunks[0].title.split()[0]}), ("read_document", {"doc_id": chunks[1].doc_id})]
        elif self.turn == 3 and chunks:
            calls = [("prune_chunks", {"chunk_ids": [c.chunk_id for c in chunks[len(chunks) // 2 :]]})]
        else:
            ids = list(dict.fromkeys(c.doc_id for c in chunks))[:10]
            return PolicyStep(content="".join(f"<Document id={d}><Justification>x</Justification></Document>" for d in ids))
        return PolicyStep(content=None, tool_calls=[ToolCall(id=f"t{self.turn}_{i}", name=n, arguments=a) for i, (n, a) in enumerate(calls)])


def measure(harness: Harness, questions: list[str]) -> dict[str, float]:
    per_turn, turns, calls, backend, infer = [], 0, 0, 0.0, 0.0
    for question in questions:
        start = time.perf_counter()
        trajectory = harness.run(question)
        wall_ms = (time.perf_counter() - start) * 1000
        infer_ms = sum(t.timings.get("infer_ms", 0.0) for t in trajectory.turns)
        backend_ms = sum(t.timings.get("backend_ms", 0.0) for t in trajectory.turns)
        n = max(1, len(trajectory.turns))
        per_turn.append((wall_ms - infer_ms - backend_ms) / n)
        turns += len(trajectory.turns)
        calls += len(trajectory.tool_call_records())
        backend += backend_ms
        infer += infer_ms
    return {
        "overhead_ms_per_turn_median": statistics.median(per_turn),
        "overhead_ms_per_turn_p90": sorted(per_turn)[int(0.9 * (len(per_turn) - 1))],
        "backend_ms_per_turn": backend / max(1, turns),
        "policy_ms_per_turn": infer / max(1, turns),
        "turns_per_episode": turns / len(questions),
        "tool_calls_per_turn": calls / max(1, turns),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        tick = time.perf_counter()
        index, questions = pooled_index(args.questions, Path(folder))
        print(f"index: {index.count()} chunks built in {time.perf_counter() - tick:.1f}s", file=sys.stderr)
        results = {}
        for policy in (HeuristicPolicy(), ScriptedMix()):
            with Harness(index, policy, HarnessConfig()) as harness:
                harness.run(questions[0])  # warm caches (query embeddings are cached per query text)
                runs = [measure(harness, questions) for _ in range(args.repeats)]
            results[policy.name] = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        if args.json:
            print(json.dumps(results))
        else:
            for name, figures in results.items():
                print(name, " ".join(f"{k}={v:.2f}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
