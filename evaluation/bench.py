"""`searchsmith bench`: candidates over an external benchmark file, scored, reported, plotted.

`run_bench_command(...)` returns exactly the object written to `DIR/report.json`; the CLI
prints it for `--json`. `run_benchmark(...)` is the part that knows nothing of files: tasks and
a backend in, report out, so the `benchmark_report` asset can run it on a customer's verified
test split (`synth_tasks.tasks_from_synth`) and index as well.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from agent.policy_spec import PolicySpec
from evaluation.aggregate import summarize_scores
from evaluation.bootstrap import DEFAULT_RESAMPLES, DEFAULT_SEED
from evaluation.candidates import build_candidate, split_candidates
from evaluation.external import file_sha256, load_external_benchmark
from evaluation.metrics import Granularity
from evaluation.report import write_report
from evaluation.runner import default_workers, run_candidate, save_results
from evaluation.synth_tasks import file_kind, read_synth_tasks, tasks_from_synth
from evaluation.tasks import Task
from search.backend import SearchBackend
from search.reranker import Reranker

log = logging.getLogger(__name__)


def run_benchmark(
    tasks: Sequence[Task],
    backend: SearchBackend,
    policies: Sequence[str | PolicySpec] | str,
    k: int,
    out_dir: str | Path,
    *,
    progress: bool = True,
    workers: int | None = None,
    seed: int = DEFAULT_SEED,
    resamples: int = DEFAULT_RESAMPLES,
    granularity: Granularity = "document",
    harness_overrides: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    model_options: dict[str, Any] | None = None,
    reranker: Reranker | None = None,
) -> dict[str, Any]:
    """Run every candidate on every task at output size `k`; write and return the report."""
    if k < 1:
        raise ValueError("k must be >= 1")
    if not tasks:
        raise ValueError("no tasks to run")
    specs = split_candidates(policies)
    out_dir = Path(out_dir)
    summaries: dict[str, dict[str, Any]] = {}
    candidates_config: dict[str, Any] = {}
    files: dict[str, Any] = {"trajectories": {}, "scores": {}}
    for spec in specs:
        candidate = build_candidate(spec, backend, k, harness_overrides, model_options, reranker)
        concurrent = workers or episode_workers(spec)
        started = time.perf_counter()
        try:
            results = run_candidate(candidate, tasks, k, workers=concurrent, progress=progress, seed=seed, granularity=granularity)
        finally:
            close = getattr(getattr(candidate, "harness", None), "close", None)
            if close:
                close()
        elapsed = time.perf_counter() - started
        saved = save_results(results, out_dir, spec.name)
        files["trajectories"][spec.name] = saved["trajectories"]
        files["scores"][spec.name] = saved["scores"]
        summary = summarize_scores([r.score for r in results], [r.task.group for r in results], resamples=resamples, seed=seed)
        summary["wall_s_total"] = elapsed
        summaries[spec.name] = summary
        candidates_config[spec.name] = {**candidate.describe(), "workers": concurrent}
        log.info("%s: answer found %.3f, recall %.3f over %d tasks in %.0fs", spec.name, summary["answer_found"], summary["recall"], summary["n"], elapsed)
    report = {
        "policies": summaries,
        "config": {
            **(config or {}),
            "k": k, "n_tasks": len(tasks), "seed": seed, "bootstrap_resamples": resamples, "granularity": granularity,
            "workers": workers or default_workers(), "candidates": candidates_config,
            "created_at": datetime.now(timezone.utc).isoformat(), "host": {"python": platform.python_version(), "cpus": os.cpu_count()},
        },
        "files": files,
    }
    return write_report(report, out_dir)


def episode_workers(spec: PolicySpec) -> int:
    """How many of a candidate's episodes run at once when the caller did not say.

    An in-process model's episodes all wait on one generation batcher, so running fewer of them
    than a batch holds leaves rows of every batch empty: with the default 4 workers on 2 cores
    the demo's 6 test questions ran as a batch of 4 and then a tail of 2 that started when the
    first episodes ended. Other candidates are bound by the index and the CPU: the default."""
    if spec.generates_in_process:
        from agent.policies.transformers_policy import generation_batch_size

        return max(default_workers(), generation_batch_size())
    return default_workers()


def run_bench_command(
    tasks_file: str | Path,
    policies: Sequence[str | PolicySpec] | str,
    k: int,
    out_dir: str | Path,
    limit: int | None = None,
    progress: bool = True,
    *,
    workers: int | None = None,
    seed: int = DEFAULT_SEED,
    cache_root: str | Path | None = None,
    embedding_model: str | None = None,
    harness_overrides: dict[str, Any] | None = None,
    backend: SearchBackend | None = None,
    chunks: Any = None,
    split: str | None = "test",
    granularity: Granularity = "document",
    model_options: dict[str, Any] | None = None,
    reranker: Reranker | str | Path | None = None,
) -> dict[str, Any]:
    """`searchsmith bench --tasks FILE --policies P1,P2 --k K --out DIR [--limit N] [--reranker DIR]`.

    An external benchmark file (question/answer/paragraphs): the pooled corpus of the whole
    file is indexed (cached by the file's sha256) and the first `limit` questions run. A synth
    task file (SynthTask JSONL) runs its verified `split` tasks against `backend`, the
    customer's opened index (the caller opens it; `chunks` enables fact-level gold). Returns
    the report.json object.
    """
    specs = split_candidates(policies)  # fail on a bad spec before minutes of indexing
    if isinstance(reranker, (str, Path)):
        reranker = Reranker.load(reranker)  # a bad folder fails here, named, before any indexing
    if any(spec.rerank for spec in specs) and reranker is None:
        raise ValueError("+rerank candidates need --reranker DIR (a bi- or cross-encoder folder, e.g. a customer's reranker_checkpoint)")
    if limit is not None and limit < 1:
        raise ValueError("limit must be >= 1")
    if workers is not None and workers < 1:
        raise ValueError(f"workers {workers}: must be at least 1 (questions run concurrently)")
    if Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise ValueError(f"--out {out_dir} is a file: the report needs a folder")  # found after the run, the run was lost
    names = [spec.name for spec in specs]
    if file_kind(tasks_file) == "synth":
        if backend is None:
            raise ValueError(f"{tasks_file} holds synthetic tasks: pass the customer's index as backend (bench --customer)")
        tasks = tasks_from_synth(read_synth_tasks(tasks_file, split=split, limit=limit), chunks)
        embedder = getattr(getattr(backend, "embedder", None), "name", None)
        config = {
            "tasks_file": str(tasks_file), "tasks_sha256": file_sha256(tasks_file), "split": split, "limit": limit,
            "embedding_model": embedder, "index_collection": getattr(backend, "name", None),
            "stand_ins": {"embedding_model": embedder, "index": type(backend).__name__, "policies": ", ".join(names)},
        }
    else:
        bench = load_external_benchmark(tasks_file, limit=limit, cache_root=cache_root, embedding_model=embedding_model)
        tasks, backend = bench.tasks, bench.index
        config = {
            **bench.config(),
            "limit": limit,
            "stand_ins": {
                "embedding_model": bench.embedding_model,
                "index": f"HybridIndex (embedded Chroma + BM25, RRF k=60) over {bench.n_documents} pooled paragraphs",
                "policies": ", ".join(names),
            },
        }
    return run_benchmark(
        tasks, backend, names, k, out_dir, progress=progress, workers=workers, seed=seed,
        harness_overrides=harness_overrides, config={**config, "reranker": str(reranker.path) if reranker else None},
        granularity=granularity, model_options=model_options, reranker=reranker,
    )
