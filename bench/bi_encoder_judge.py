"""Does a fine-tuned bi-encoder judge selection better than the cross-encoder? (issue 18, an experiment)

    # once: a customer over the dev file's paragraphs with natural-style tasks (bench/learning.py's
    # customer file, any --size), its SEARCHSMITH_HOME etc. exported, then:
    .venv/bin/python bench/bi_encoder_judge.py train --customer NAME --out DIR [--short-queries 1] [--learning-rate 2e-5]
    .venv/bin/python bench/bi_encoder_judge.py eval --model DIR|start [--policy hybrid|heuristic] [--weights 0.5,1,2,1000]

Why: the reranker (`training/reranker.py`) is a cross-encoder whose start is the packaged
all-MiniLM-L6-v2 *bi-encoder* with a fresh head: it knows nothing of relevance until trained, and
a few thousand synthetic pairs teach it little that carries to real questions (hybrid+rerank
0.658 against hybrid 0.651 on the dev file). The same MiniLM as a bi-encoder already ranks by
relevance (it is hybrid's dense leg), so fine-tuning it on the same pairs (MultipleNegativesRanking
loss: the evidence chunk against in-batch and hybrid hard negatives) adapts a working judge to the
customer instead of building one from nothing.

`train` fits it on the customer's verified train split (the pairs `training.reranker.training_pairs`
builds, distractors off). `eval` runs `--policy` on every dev question at k=5 (hybrid hands over its
top 20 documents, as `hybrid+rerank` does), judges every surfaced document at its best seen chunk
by cosine similarity, fuses that order with the policy's by reciprocal rank at each weight
(`agent.selection.fuse`; 1000 is the policy's own order) and prints answer found per weight,
overall, per half of the file by sha1(task id) parity and per dataset. It prints figures only.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import os
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
for variable, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("ANONYMIZED_TELEMETRY", "False"),
                        ("TOKENIZERS_PARALLELISM", "false")):
    os.environ.setdefault(variable, value)

DEV_FILE = REPO.parent / "shared" / "data" / "multihop_dev.jsonl"


def train(customer: str, out: Path, short_queries: int, learning_rate: float) -> None:
    import torch
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments, losses
    from sentence_transformers.training_args import BatchSamplers

    from core.layout import final_tasks_key
    from core.training_settings import RerankerSettings
    from orchestration.runner import open_index, resources
    from search.reranker import start_model_dir
    from synth.per_customer import load_tasks
    from training.reranker import training_pairs

    index, chunks = open_index(customer)
    tasks = [t for t in load_tasks(resources().store.get(), final_tasks_key(customer)) if t.split == "train"]
    pairs = training_pairs(tasks, chunks, index, RerankerSettings(short_queries=short_queries, hard_negatives=4, distractors=0))
    by_query: dict[str, tuple[list[str], list[str]]] = collections.defaultdict(lambda: ([], []))
    for pair in pairs:
        by_query[pair.query][0 if pair.label else 1].append(pair.text)
    triplets = [(query, positive, negatives[i % len(negatives)])
                for query, (positives, negatives) in by_query.items() if negatives for i, positive in enumerate(positives)]
    random.Random(0).shuffle(triplets)
    print(f"{len(tasks)} train tasks, {len(pairs)} pairs, {len(triplets)} triplets", flush=True)
    model = SentenceTransformer(str(start_model_dir()), device="cpu" if not torch.cuda.is_available() else None)
    model.max_seq_length = 256
    dataset = Dataset.from_dict({name: [t[i] for t in triplets] for i, name in enumerate(("anchor", "positive", "negative"))})
    args = SentenceTransformerTrainingArguments(
        output_dir=str(out / "trainer"), num_train_epochs=1, per_device_train_batch_size=32, learning_rate=learning_rate,
        warmup_ratio=0.1, seed=0, save_strategy="no", report_to="none", logging_steps=10, disable_tqdm=True,
        batch_sampler=BatchSamplers.NO_DUPLICATES, dataloader_pin_memory=False)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=dataset, loss=losses.MultipleNegativesRankingLoss(model))
    started = time.perf_counter()
    result = trainer.train()
    elapsed = time.perf_counter() - started
    model.save(str(out))
    print(f"{result.global_step} steps in {elapsed:.0f} s ({len(triplets) / elapsed:.1f} triplets/s); saved {out}")


def evaluate(model_path: str, policy: str, weights: list[float], limit: int | None) -> None:
    from sentence_transformers import SentenceTransformer

    from agent.selection import SelectionSettings, fuse, policy_order, surfaced_texts
    from evaluation.baselines import SingleShotBaseline
    from evaluation.candidates import RERANK_BASELINE_DOCS, build_candidate, split_candidates
    from evaluation.external import load_external_benchmark
    from evaluation.metrics import answer_found_in
    from search.reranker import start_model_dir

    model = SentenceTransformer(str(start_model_dir()) if model_path == "start" else model_path, device="cpu")
    bench = load_external_benchmark(DEV_FILE, limit=limit)
    inner = (SingleShotBaseline(bench.index, "hybrid", RERANK_BASELINE_DOCS) if policy == "hybrid"
             else build_candidate(split_candidates(policy)[0], bench.index, 5))
    found: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    for task in bench.tasks:
        trajectory = inner.run(task.question, task.task_id)
        order = policy_order(trajectory)[:40]
        candidates = [(doc, text) for doc, texts in surfaced_texts(trajectory, bench.index, order) for text in texts]
        vectors = model.encode([task.question, *(text for _, text in candidates)], normalize_embeddings=True, convert_to_numpy=True)
        best: dict[str, float] = {}
        for (doc, _), score in zip(candidates, vectors[1:] @ vectors[0]):
            best[doc] = max(float(score), best.get(doc, -1.0))
        judged = sorted(best, key=lambda doc: -best[doc])
        half = "A" if int(hashlib.sha1(task.task_id.encode()).hexdigest(), 16) % 2 == 0 else "B"
        groups = ("all", f"half {half}", "MuSiQue" if "MuSiQue" in str(task.group) else "HotpotQA")
        for group in groups:
            counts[group] += 1
        for weight in weights:
            top = fuse(order, judged, SelectionSettings(policy_weight=weight))[:5]
            for group in groups:
                found[(weight, group)] += answer_found_in(set(top), task.gold)
    columns = ["all", "half A", "half B", "HotpotQA", "MuSiQue"]
    print(f"{policy} judged by {model_path}: answer found at k=5 (questions: " + ", ".join(f"{c} {counts[c]}" for c in columns) + ")")
    print("| policy weight | " + " | ".join(columns) + " |\n|---|" + "---:|" * len(columns))
    for weight in weights:
        print(f"| {weight:g} | " + " | ".join(f"{found[(weight, c)] / max(1, counts[c]):.3f}" for c in columns) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    fit = sub.add_parser("train")
    fit.add_argument("--customer", required=True)
    fit.add_argument("--out", type=Path, required=True)
    fit.add_argument("--short-queries", type=int, default=1)
    fit.add_argument("--learning-rate", type=float, default=2e-5)
    judge = sub.add_parser("eval")
    judge.add_argument("--model", required=True, help="a fine-tuned folder, or `start` for the packaged MiniLM")
    judge.add_argument("--policy", default="hybrid")
    judge.add_argument("--weights", default="0.5,1,2,1000")
    judge.add_argument("--limit", type=int, default=None)
    args = parser.parse_args()
    if args.mode == "train":
        train(args.customer, args.out, args.short_queries, args.learning_rate)
    else:
        evaluate(args.model, args.policy, [float(w) for w in args.weights.split(",")], args.limit)


if __name__ == "__main__":
    main()
