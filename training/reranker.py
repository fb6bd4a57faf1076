"""A per-customer reranker trained on the customer's own verified tasks, with no human labels.

Pairs: for each verified train task, the agent's query (and short views of it) against
- each supporting document's evidence chunk (the chunk holding its verified quote): label 1;
- verified distractors (chunks checked not to contain the answer): label 0;
- hybrid hard negatives (the best hybrid hits outside the task's gold documents): label 0;
- with `chain_pairs`, for each later hop of a multi-hop task: the question extended with the
  previous hop's evidence chunk against this hop's evidence (label 1) and the hybrid hard
  negatives of that extended query (label 0), which is how selection judges a chain
  (`search.reranker.Reranker.chain_order`).
A chunk is read as the selection step reads it (`search.reranker.pair_text`), so training and use agree.

Training, from the customer's `training.reranker.base` or the packaged all-MiniLM-L6-v2, by kind:
- `bi`: sentence-transformers' `SentenceTransformerTrainer` with the multiple-negatives ranking
  loss over (query, positive, negative) triplets: each positive against one of its query's
  negatives and every other passage in the batch (batches never hold one text twice, so a
  task's evidence asked two ways is not its own negative);
- `cross`: `CrossEncoderTrainer` with binary cross-entropy over the labelled pairs, from the
  encoder with a fresh head.
The check that matters is on the dev split, which training never sees: hybrid's top documents
for each dev task reordered by the trained model against the same documents reordered by the
start, scored as recall of the gold documents in the top k.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from core.cpu_precision import cpu_training_precision
from core.progress import Progress, library_bars_follow_hub_setting
from core.training_settings import RerankerSettings
from evaluation.synth_tasks import tasks_from_synth
from search.backend import SearchBackend
from search.reranker import Reranker, fresh_head_quietly, pair_text, start_model_dir
from synth.query_views import short_views

LOG = logging.getLogger(__name__)
MODEL_CARD_MODULE = "sentence_transformers.base.model_card"


@dataclass(frozen=True)
class Pair:
    query: str
    text: str
    label: float


def training_pairs(tasks: Sequence[Any], chunks: Any, backend: SearchBackend, settings: RerankerSettings) -> list[Pair]:
    """Labelled pairs from verified `SynthTask`s and the customer's chunk table (see module doc)."""
    rows = {r["chunk_id"]: r for r in chunks.select("chunk_id", "doc_id", "title", "text").iter_rows(named=True)}
    pairs: list[Pair] = []
    progress = Progress(LOG, "reranker pairs from tasks", len(tasks))
    for task, bench in zip(tasks, tasks_from_synth(tasks, chunks)):
        progress.advance()
        positives = [sorted(fact)[0] for fact in bench.gold.facts if fact]
        if not positives:
            continue
        gold_docs = bench.gold.doc_ids
        distractors = [d.chunk_id for d in task.distractors if d.doc_id not in gold_docs][: settings.distractors]
        queries = [(query, positives) for query in
                   [bench.question, *short_views(bench.question, settings.short_queries, task.id, settings.short_query_words)]]
        if settings.chain_pairs:  # hop i's evidence extends the question; hop i+1's evidence answers it
            queries += [(f"{bench.question} {pair_text(rows[first]['title'], rows[first]['text'] or '')}", [second])
                        for first, second in zip(positives, positives[1:]) if first in rows]
        for query, wanted in queries:
            negatives = list(distractors)
            if settings.hard_negatives:
                hard = [hit.chunk_id for hit in backend.search(query, k=max(20, settings.hard_negatives * 4)) if hit.doc_id not in gold_docs]
                negatives += [chunk for chunk in hard if chunk not in negatives][: settings.hard_negatives]
            for chunk_id, label in [*((c, 1.0) for c in wanted), *((c, 0.0) for c in negatives)]:
                row = rows.get(chunk_id)
                if row is not None:
                    pairs.append(Pair(query, pair_text(row["title"], row["text"] or ""), label))
    return pairs


@dataclass
class RerankerRun:
    path: Path
    base: str
    pairs: int
    positives: int
    steps: int
    train_s: float
    pairs_per_s: float
    metrics: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "path": str(self.path)}


def train_reranker(pairs: Sequence[Pair], settings: RerankerSettings, out_dir: Path) -> RerankerRun:
    """Fine-tune the start on `pairs`; the model is saved in `out_dir` (a folder of `settings.kind`)."""
    import torch

    if not pairs or not any(p.label for p in pairs) or all(p.label for p in pairs):
        raise ValueError(f"reranker training needs positive and negative pairs; got {len(pairs)} pairs "
                         f"({sum(1 for p in pairs if p.label)} positive): too few verified train tasks?")
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    base = settings.base or str(start_model_dir())
    if settings.kind == "bi":
        return _train_bi_encoder(pairs, settings, base, out_dir)
    return _train_cross_encoder(pairs, settings, base, out_dir)


def training_precision(settings: RerankerSettings) -> str:
    """fp32 or bf16 for the trainer. bf16 is autocast (weights and the optimizer stay fp32): on a
    CPU with native bf16 it is `cpu_training_precision`'s choice, on CUDA where the GPU has bf16;
    elsewhere fp32, since emulated bf16 is slower than fp32.

    Measured on the AMX Xeon with 2 threads (2026-12-06, `bench/reranker_train_bench.py`, 256
    triplets of dev-file paragraphs, median of 3 alternated runs): the bi-encoder trains 7.5 against
    4.6 pairs/s (1.63x), the cross-encoder 12.2 against 8.5 (1.44x), with the same training loss
    (0.0529 against 0.0532; 0.6935 both) and the same held-out orders."""
    import torch

    if settings.precision != "auto":
        return settings.precision
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return cpu_training_precision()


def triplets(pairs: Sequence[Pair]) -> list[tuple[str, str, str]]:
    """(query, positive, negative) for each positive pair, its query's negatives taken in turn;
    a query without a negative has nothing to contrast and gives none."""
    by_query: dict[str, tuple[list[str], list[str]]] = {}
    for pair in pairs:
        by_query.setdefault(pair.query, ([], []))[0 if pair.label else 1].append(pair.text)
    return [(query, positive, negatives[i % len(negatives)])
            for query, (positives, negatives) in by_query.items() if negatives for i, positive in enumerate(positives)]


def _train_bi_encoder(pairs: Sequence[Pair], settings: RerankerSettings, base: str, out_dir: Path) -> RerankerRun:
    import torch
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments, losses
    from sentence_transformers.training_args import BatchSamplers

    from search.reranker import folder_kind

    if folder_kind(base) != "bi":
        raise ValueError(f"training.reranker.base {base}: a cross-encoder folder cannot start a bi-encoder (kind: bi); "
                         "name a sentence-transformers embedding folder, or set kind: cross")
    examples = triplets(pairs)
    if not examples:
        raise ValueError(f"reranker training (kind bi) needs queries with a positive and a negative; got none from {len(pairs)} pairs")
    random.Random(settings.seed).shuffle(examples)
    precision = training_precision(settings)
    dataset = Dataset.from_dict({name: [t[i] for t in examples] for i, name in enumerate(("anchor", "positive", "negative"))})
    model = SentenceTransformer(base, device="cpu" if not torch.cuda.is_available() else None, local_files_only=True)
    model.max_seq_length = settings.max_length
    out_dir.mkdir(parents=True, exist_ok=True)
    # warmup_steps below 1 is a ratio of the total steps (transformers 5 deprecates warmup_ratio)
    args = SentenceTransformerTrainingArguments(
        output_dir=str(out_dir / "trainer"), num_train_epochs=settings.epochs, per_device_train_batch_size=settings.batch_size,
        learning_rate=settings.learning_rate, warmup_steps=settings.warmup_ratio, seed=settings.seed, data_seed=settings.seed,
        batch_sampler=BatchSamplers.NO_DUPLICATES, save_strategy="no", report_to="none", dataloader_pin_memory=False,
        logging_steps=10, disable_tqdm=True, dataloader_num_workers=0, bf16=precision == "bf16",
        use_cpu=not torch.cuda.is_available(),
    )
    with library_bars_follow_hub_setting(MODEL_CARD_MODULE):  # the card's "widget examples" bar
        trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=dataset, callbacks=[_progress_callback()],
                                             loss=losses.MultipleNegativesRankingLoss(model))
    started = time.perf_counter()
    result = trainer.train()
    elapsed = time.perf_counter() - started
    model.save(str(out_dir))
    # A triplet is two labelled pairs (query-positive, query-negative) read against the batch.
    return RerankerRun(path=out_dir, base=base, pairs=len(pairs), positives=sum(1 for p in pairs if p.label),
                       steps=int(result.global_step), train_s=round(elapsed, 1),
                       pairs_per_s=round(2 * len(examples) * settings.epochs / elapsed, 1),
                       metrics={"train_loss": round(float(result.training_loss), 4), "triplets": len(examples), "kind": "bi",
                                "precision": precision})


def _train_cross_encoder(pairs: Sequence[Pair], settings: RerankerSettings, base: str, out_dir: Path) -> RerankerRun:
    import torch
    from datasets import Dataset
    from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

    shuffled = list(pairs)
    random.Random(settings.seed).shuffle(shuffled)
    precision = training_precision(settings)
    dataset = Dataset.from_dict({"query": [p.query for p in shuffled], "text": [p.text for p in shuffled],
                                 "label": [p.label for p in shuffled]})
    with torch.random.fork_rng(devices=[]), fresh_head_quietly():
        torch.manual_seed(settings.seed)
        model = CrossEncoder(base, num_labels=1, max_length=settings.max_length, device="cpu" if not torch.cuda.is_available() else None)
    out_dir.mkdir(parents=True, exist_ok=True)
    args = CrossEncoderTrainingArguments(
        output_dir=str(out_dir / "trainer"), num_train_epochs=settings.epochs, per_device_train_batch_size=settings.batch_size,
        learning_rate=settings.learning_rate, warmup_steps=settings.warmup_ratio, seed=settings.seed, data_seed=settings.seed,
        save_strategy="no", report_to="none", dataloader_pin_memory=False, logging_steps=10, disable_tqdm=True, dataloader_num_workers=0,
        bf16=precision == "bf16", use_cpu=not torch.cuda.is_available(),
    )
    positives = sum(1 for p in pairs if p.label)
    trainer = CrossEncoderTrainer(model=model, args=args, train_dataset=dataset, callbacks=[_progress_callback()],
                                  loss=BinaryCrossEntropyLoss(model, pos_weight=torch.tensor(max(1.0, (len(pairs) - positives) / positives))))
    started = time.perf_counter()
    result = trainer.train()
    elapsed = time.perf_counter() - started
    model.save_pretrained(str(out_dir))
    return RerankerRun(path=out_dir, base=base, pairs=len(pairs), positives=positives, steps=int(result.global_step),
                       train_s=round(elapsed, 1), pairs_per_s=round(len(pairs) * settings.epochs / elapsed, 1),
                       metrics={"train_loss": round(float(result.training_loss), 4), "kind": "cross", "precision": precision})


def _progress_callback() -> Any:
    """Reports `reranker step N/M, loss L` as the trainer logs (the CLI's status line shows it)."""
    from transformers import TrainerCallback

    class StepLog(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                LOG.info("reranker step %d/%d, loss %.3f", state.global_step, state.max_steps, float(logs["loss"]))

    return StepLog()


def dev_recall(reranker: Reranker | None, tasks: Sequence[Any], chunks: Any, backend: SearchBackend, depth: int, k: int,
               progress: Progress | None = None, label: str | None = None, short_words: int | None = None) -> dict[str, float]:
    """Recall of gold documents in the top `k` of hybrid's top `depth` documents per task,
    reordered by `reranker` (None: hybrid's own order), and the mean reciprocal rank of the
    first gold document; scoring pairs/s is reported for the reranker. With `short_words` each
    task is asked by a short view of its question (`synth.query_views`), as people would ask it."""
    recalls, reciprocal, pairs, seconds = [], [], 0, 0.0
    progress = progress or Progress(LOG, f"reranker dev check ({label or ('reranked' if reranker else 'hybrid')})", len(tasks))
    for task, bench in zip(tasks, tasks_from_synth(tasks, chunks)):
        if short_words is not None:
            views = short_views(bench.question, 1, task.id, short_words)
            bench = replace(bench, question=views[0]) if views else bench
        hits = backend.search(bench.question, k=depth * 4)
        docs: dict[str, list[str]] = {}
        for hit in hits:
            if hit.doc_id in docs or len(docs) < depth:
                docs.setdefault(hit.doc_id, []).append(pair_text(hit.title, hit.text))
        order = list(docs)
        if reranker is not None:
            started = time.perf_counter()
            order = [doc for doc, _ in reranker.order(bench.question, list(docs.items()))]
            seconds += time.perf_counter() - started
            pairs += sum(len(texts) for texts in docs.values())
        gold = bench.gold.doc_ids
        recalls.append(len(gold & set(order[:k])) / len(gold) if gold else 0.0)
        first = next((rank for rank, doc in enumerate(order, start=1) if doc in gold), None)
        reciprocal.append(1.0 / first if first else 0.0)
        progress.advance()
    n = max(1, len(recalls))
    figures = {"recall_at_k": round(sum(recalls) / n, 4), "mrr": round(sum(reciprocal) / n, 4), "tasks": len(recalls)}
    if reranker is not None and seconds:
        figures["score_pairs_per_s"] = round(pairs / seconds, 1)
    return figures
