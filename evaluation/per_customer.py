"""The per-customer benchmark the lineage runs: every available candidate on the verified test
split (searched in the customer's own index) and on the external benchmark files the customer
file lists (each pooled and indexed on its own, cached by the file's hash).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from agent.policy_spec import RERANK_SUFFIX, PolicySpec
from core.benchmark_settings import BenchmarkSettings
from evaluation.bench import run_bench_command, run_benchmark
from evaluation.synth_tasks import tasks_from_synth
from search.backend import SearchBackend
from search.reranker import Reranker


def benchmark_candidates(settings: BenchmarkSettings, checkpoints: list[PolicySpec], has_reranker: bool = False) -> list[PolicySpec]:
    """The configured policies plus the training checkpoints (`all`, or the `latest` one), and
    with a reranker the `rerank` policies as `POLICY+rerank`; no repeats (by name, the report key)."""
    chosen = checkpoints[-1:] if settings.checkpoints == "latest" else checkpoints
    reranked = [f"{policy}{RERANK_SUFFIX}" for policy in settings.rerank] if has_reranker else []
    specs = [PolicySpec.parse(text) for text in settings.policies + reranked] + list(chosen)
    unique: dict[str, PolicySpec] = {}
    for spec in specs:
        unique.setdefault(spec.name, spec)
    return list(unique.values())


@dataclass
class CustomerBenchmark:
    reports: dict[str, dict[str, Any]] = field(default_factory=dict)  # suite name -> report.json object
    plots: dict[str, list[Path]] = field(default_factory=dict)


def run_customer_benchmark(
    tasks: list,
    chunks: pl.DataFrame,
    backend: SearchBackend,
    settings: BenchmarkSettings,
    candidates: list[PolicySpec],
    out_dir: Path,
    base_dir: Path,
    reranker: Reranker | None = None,
) -> CustomerBenchmark:
    result = CustomerBenchmark()
    test_tasks = [task for task in tasks if task.split == "test" and task.passed_verification]
    if settings.test_limit:
        test_tasks = test_tasks[: settings.test_limit]
    if test_tasks:
        suite_dir = out_dir / "test"
        result.reports["test"] = run_benchmark(
            tasks_from_synth(test_tasks, chunks), backend, candidates, settings.k, suite_dir, progress=False, workers=settings.workers,
            config={"suite": "verified test split", "tasks": len(test_tasks), "model_options": settings.model_options},
            harness_overrides=settings.harness, model_options=settings.model_options, reranker=reranker,
        )
        result.plots["test"] = sorted(suite_dir.glob("*.png"))
    for external in settings.external:
        path = Path(external) if Path(external).is_absolute() else (base_dir / external).resolve()
        if not path.exists():
            raise FileNotFoundError(f"benchmark file listed in the customer file not found: {path}")
        suite = path.stem
        suite_dir = out_dir / suite
        result.reports[suite] = run_bench_command(
            path, candidates, settings.k, suite_dir, settings.external_limit, progress=False, workers=settings.workers,
            harness_overrides=settings.harness, model_options=settings.model_options, reranker=reranker,
        )
        result.plots[suite] = sorted(suite_dir.glob("*.png"))
    return result


def png_markdown(path: Path) -> str:
    """Inline a plot for the Dagster UI's markdown metadata."""
    encoded = base64.b64encode(path.read_bytes()).decode()
    return f"![{path.stem}](data:image/png;base64,{encoded})"
