"""The task stage as the lineage runs it: three artifacts per customer in the artifact store.

`{customer}/synth/synthetic_tasks.jsonl`: every generated task, verified or not (with reasons).
`{customer}/synth/verified_tasks.jsonl` (+ a Hugging Face dataset folder): split, verified only.
`{customer}/synth/tasks.jsonl`: verified tasks with their distractor sets (what training reads),
and `distractors.parquet`: kept and rejected distractor candidates with reasons.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import polars as pl

from core.layout import (
    chunks_key,
    distractors_key,
    documents_key,
    final_tasks_key,
    llm_cache_prefix,
    synth_prefix,
    synthetic_key,
    verified_dataset_prefix,
    verified_key,
)
from core.storage import ArtifactStore, push_folder
from core.task_settings import TaskGenConfig
from llm.cache import ResponseCache
from llm.client import LLMClient
from synth.corpus_view import CorpusView
from synth.export import distractor_table, save_dataset, tasks_from_jsonl, tasks_to_jsonl
from synth.generate import SynthesisResult, attach_all_distractors, summarize, synthesize_tasks
from synth.schema import SynthTask
from synth.split import apply_splits


def load_tasks(store: ArtifactStore, key: str) -> list[SynthTask]:
    return tasks_from_jsonl(store.read_text(key)) if store.exists(key) else []


def run_synthesis(customer: str, store: ArtifactStore, backend, config: TaskGenConfig, llm: LLMClient | None) -> tuple[list[SynthTask], dict[str, Any]]:
    """Generate + verify + chain; failed tasks are kept with their reason. Resumes from seed records."""
    chunks = store.read_parquet(chunks_key(customer))
    documents = store.read_parquet_or_none(documents_key(customer))
    corpus = CorpusView.from_frames(chunks, documents.filter(~pl.col("deleted")) if documents is not None else None)
    prefix = synth_prefix(customer)
    run_llm = None
    if llm is not None and config.generator == "llm":
        run_llm = llm.clone(cache=llm.cache or ResponseCache(store, f"{prefix}/llm_cache"))
    synthesis = synthesize_tasks(corpus, backend, config, run_llm, store, prefix)
    store.write_text(synthetic_key(customer), tasks_to_jsonl(synthesis.tasks))
    summary = summarize(synthesis.tasks, synthesis, run_llm.usage.as_dict() if run_llm else {}).metadata()
    return synthesis.tasks, summary


def run_verification_split(customer: str, store: ArtifactStore, config: TaskGenConfig) -> list[SynthTask]:
    tasks = apply_splits(load_tasks(store, synthetic_key(customer)), config.split_fractions, config.split_salt)
    verified = [task for task in tasks if task.passed_verification]
    store.write_text(verified_key(customer), tasks_to_jsonl(verified))
    with tempfile.TemporaryDirectory() as folder:
        target = save_dataset(verified, Path(folder) / "dataset")
        push_folder(store, Path(target), verified_dataset_prefix(customer))
    return tasks


def run_distractors(customer: str, store: ArtifactStore, backend, config: TaskGenConfig, llm: LLMClient | None) -> list[SynthTask]:
    verified = load_tasks(store, verified_key(customer))
    run_llm = llm.clone(cache=llm.cache or ResponseCache(store, llm_cache_prefix(customer))) if llm is not None else None
    with_distractors = attach_all_distractors(verified, backend, config, run_llm)
    store.write_text(final_tasks_key(customer), tasks_to_jsonl(with_distractors))
    store.write_parquet(distractors_key(customer), distractor_table(with_distractors))
    return with_distractors


def task_counts(all_tasks: list[SynthTask], final: list[SynthTask]) -> dict[str, Any]:
    """The `searchsmith tasks --json` object."""
    summary = summarize(all_tasks, SynthesisResult(tasks=all_tasks)).summary()
    summary["distractors"] = sum(len(task.distractors) for task in final)
    return summary
