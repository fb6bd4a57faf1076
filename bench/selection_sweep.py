"""Selection on the dev file at every policy weight: how much a reranker adds, and where.

    .venv/bin/python bench/selection_sweep.py --reranker DIR|start|start-cross [--policy hybrid|heuristic]
        [--weights 0.5,1,2,1000] [--chains 0,3] [--limit N]

`--reranker`: a trained reranker folder (a customer's `reranker_checkpoint`, either kind), `start`
(the packaged MiniLM as a bi-encoder: the default kind's untrained start) or `start-cross` (the
same encoder with a fresh head). `--policy` runs on every dev question at k=5 (hybrid hands over
its top 20 documents, as `hybrid+rerank` does); every surfaced document is judged at its best seen
chunk (or, with `--chains` N > 0, by the best two-document chain through it from the N best
first links: `search.reranker.Reranker.chain_order`) and that order is fused with the policy's by
reciprocal rank at each weight (`agent.selection.fuse`; 1000 is the policy's own order). It prints
answer found per way of judging and weight, overall, per half of the file by sha1(task id) parity
and per dataset.

Why beside `bench/bench_dev.py`: the product picks the weight on the customer's synthetic dev split
(`training.selection_weight`) and the benchmark reports that one; this sweep shows what the other
weights would have given on real questions. Reading it to choose a weight would be tuning to the
evaluation questions: it is for understanding, the halves show how stable a difference is.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
for variable, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("ANONYMIZED_TELEMETRY", "False"),
                        ("TOKENIZERS_PARALLELISM", "false")):
    os.environ.setdefault(variable, value)

DEV_FILE = REPO.parent / "shared" / "data" / "multihop_dev.jsonl"
COLUMNS = ["all", "half A", "half B", "HotpotQA", "MuSiQue"]


def sweep(reranker_spec: str, policy: str, weights: list[float], chains: list[int], limit: int | None) -> None:
    from agent.selection import SelectionSettings, calibrated_as, fuse, policy_order, surfaced_texts
    from evaluation.baselines import SingleShotBaseline
    from evaluation.candidates import RERANK_BASELINE_DOCS, build_candidate, split_candidates
    from evaluation.external import load_external_benchmark
    from evaluation.metrics import answer_found_in
    from search.reranker import Reranker

    reranker = {"start": lambda: Reranker.load(), "start-cross": lambda: Reranker.load(kind="cross")}.get(
        reranker_spec, lambda: Reranker.load(reranker_spec))()
    bench = load_external_benchmark(DEV_FILE, limit=limit)
    inner = (SingleShotBaseline(bench.index, "hybrid", RERANK_BASELINE_DOCS) if policy == "hybrid"
             else build_candidate(split_candidates(policy)[0], bench.index, 5))
    found: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    settings = SelectionSettings()
    for task in bench.tasks:
        trajectory = inner.run(task.question, task.task_id)
        order = policy_order(trajectory)[: settings.max_candidates]
        candidates = surfaced_texts(trajectory, bench.index, order)
        judged = {chain: [doc for doc, _ in ranked] for chain, ranked in reranker.orders(task.question, candidates, chains).items()}
        half = "A" if int(hashlib.sha1(task.task_id.encode()).hexdigest(), 16) % 2 == 0 else "B"
        groups = ("all", f"half {half}", "MuSiQue" if "MuSiQue" in str(task.group) else "HotpotQA")
        for group in groups:
            counts[group] += 1
        for chain in chains:
            for weight in weights:
                top = fuse(order, judged[chain], SelectionSettings(rrf_k=settings.rrf_k, policy_weight=weight))[:5]
                for group in groups:
                    found[(chain, weight, group)] += answer_found_in(set(top), task.gold)
    weight, chain_anchors = reranker.choice_for(calibrated_as(policy))
    print(f"{policy} judged by {reranker_spec} ({reranker.kind}; calibrated for {calibrated_as(policy)}: weight {weight:g}, "
          f"chains {chain_anchors}): answer found at k=5 (questions: " + ", ".join(f"{c} {counts[c]}" for c in COLUMNS) + ")")
    print("| chains | policy weight | " + " | ".join(COLUMNS) + " |\n|---|---|" + "---:|" * len(COLUMNS))
    for chain in chains:
        for weight in weights:
            print(f"| {chain} | {weight:g} | " + " | ".join(f"{found[(chain, weight, c)] / max(1, counts[c]):.3f}" for c in COLUMNS) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reranker", required=True, help="a reranker folder, `start` or `start-cross`")
    parser.add_argument("--policy", default="hybrid")
    parser.add_argument("--weights", default="0.5,1,2,1000")
    parser.add_argument("--chains", default="0,3", help="first links of the chains judged (0: by the question alone)")
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args()
    sweep(args.reranker, args.policy, [float(w) for w in args.weights.split(",")], [int(c) for c in args.chains.split(",")], args.limit)


if __name__ == "__main__":
    main()
