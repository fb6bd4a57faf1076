"""Reranker training on CPU in fp32 against bf16 autocast (`training.reranker.training_precision`).

Trains the packaged all-MiniLM-L6-v2 start the way `reranker_checkpoint` does
(`training.reranker.train_reranker`, each kind with its defaults) on the same pairs, alternating
precisions, `--runs` times each, and prints per precision and kind: training pairs/s (median),
the final training loss, and how the two trained models agree on held-out pairs (Spearman
correlation of their scores and the share of held-out queries whose best text is the same).

Pairs come from the dev file's paragraphs, never its questions: the query is the first words of
a supporting paragraph's first sentence, that paragraph is the positive and a non-supporting
paragraph of the same entry the negative, so lengths are those the reranker trains on. Nothing is
asserted; the figures belong in the note of the change that uses them.

Usage: .venv/bin/python bench/reranker_train_bench.py [--kinds bi,cross] [--triplets 256] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from core.cpu_precision import cpu_has_native_bf16  # noqa: E402
from core.training_settings import RerankerSettings  # noqa: E402
from search.reranker import Reranker  # noqa: E402
from training.reranker import Pair, train_reranker  # noqa: E402

DEV = REPO.parent / "shared" / "data" / "multihop_dev.jsonl"


def paragraph_triplets(limit: int, skip: int = 0) -> list[tuple[str, str, str]]:
    """(query, positive, negative) from the dev file's paragraphs, `skip` entries in."""
    triplets = []
    for line in DEV.read_text(encoding="utf-8").splitlines()[skip:]:
        entry = json.loads(line)
        supporting = [p for p in entry["paragraphs"] if p.get("is_supporting")]
        others = [p for p in entry["paragraphs"] if not p.get("is_supporting")]
        for i, paragraph in enumerate(supporting):
            if not others:
                break
            first = paragraph["text"].split(". ")[0].split()
            triplets.append((" ".join(first[:10]), f"{paragraph['title']}\n{paragraph['text']}", f"{others[i % len(others)]['title']}\n{others[i % len(others)]['text']}"))
            if len(triplets) == limit:
                return triplets
    return triplets


def as_pairs(triplets: list[tuple[str, str, str]]) -> list[Pair]:
    return [pair for q, pos, neg in triplets for pair in (Pair(q, pos, 1.0), Pair(q, neg, 0.0))]


def spearman(a: list[float], b: list[float]) -> float:
    def ranks(values: list[float]) -> list[int]:
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0] * len(values)
        for rank, i in enumerate(order):
            out[i] = rank
        return out

    ra, rb = ranks(a), ranks(b)
    n = len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb, strict=True)) / (n * (n * n - 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", default="bi,cross")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--triplets", type=int, default=256)
    parser.add_argument("--held-out", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    train = paragraph_triplets(args.triplets)
    held_out = paragraph_triplets(args.held_out, skip=300)
    print(f"native bf16: {cpu_has_native_bf16()}; {len(train)} training triplets, {len(held_out)} held-out; "
          f"{args.runs} runs each, alternated", flush=True)
    precisions = args.precisions.split(",")
    rows = []
    for kind in args.kinds.split(","):
        figures: dict[str, list[float]] = {p: [] for p in precisions}
        losses: dict[str, list[float]] = {p: [] for p in precisions}
        scores: dict[str, list[float]] = {}
        with tempfile.TemporaryDirectory() as scratch:
            for run in range(args.runs):
                for precision in precisions:
                    settings = RerankerSettings(kind=kind, precision=precision, torch_threads=args.threads)
                    out = Path(scratch) / f"{kind}-{precision}-{run}"
                    result = train_reranker(as_pairs(train), settings, out)
                    figures[precision].append(result.pairs_per_s)
                    losses[precision].append(result.metrics["train_loss"])
                    print(f"  {kind} {precision} run {run + 1}: {result.pairs_per_s} pairs/s, loss {result.metrics['train_loss']}", flush=True)
                    if run == 0:
                        reranker = Reranker.load(out)
                        scores[precision] = [s for q, pos, neg in held_out for s in reranker.score(q, [pos, neg])]
        base = statistics.median(figures[precisions[0]])
        agreement = ""
        if len(precisions) == 2:
            a, b = (scores[p] for p in precisions)
            same_best = sum((a[2 * i] > a[2 * i + 1]) == (b[2 * i] > b[2 * i + 1]) for i in range(len(held_out))) / len(held_out)
            agreement = f"spearman {spearman(a, b):.3f}, same best {same_best:.2f}"
        for precision in precisions:
            median = statistics.median(figures[precision])
            correct = sum(scores[precision][2 * i] > scores[precision][2 * i + 1] for i in range(len(held_out))) / len(held_out)
            rows.append(f"| {kind} | {precision} | {median:.1f} | {median / base:.2f}x | {statistics.median(losses[precision]):.4f} "
                        f"| {correct:.2f} | {agreement} |")
    print("\n| kind | precision | train pairs/s (median) | ratio | train loss | held-out positive first | agreement |")
    print("|---|---|---:|---:|---:|---:|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
