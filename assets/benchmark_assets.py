"""Lineage stage: every available candidate policy on held-out tasks and external files."""

import json
import tempfile
from pathlib import Path

import dagster as dg

from agent.policy_spec import PolicySpec
from assets.index_assets import open_index
from assets.metadata import benchmark_numbers
from assets.partitions import customers_partitions
from assets.resources import ArtifactStoreResource, ChromaResource, CustomersResource
from assets.synth_assets import distractor_sets
from assets.training_assets import cispo_checkpoint, reranker_checkpoint, sft_checkpoint
from core.layout import CHECKPOINT_STAGES, benchmark_prefix, benchmark_summary_key, chunks_key, final_tasks_key
from core.storage import push_folder
from evaluation.per_customer import benchmark_candidates, png_markdown, run_customer_benchmark
from evaluation.report import render_markdown
from search.reranker import Reranker
from synth.per_customer import load_tasks
from training.per_customer import checkpoint_policies, local_adapter, local_reranker, read_manifest, read_reranker


def _checkpoint_labels(artifacts, customer: str) -> dict[str, str]:
    """Checkpoint spec -> its stage (`sft`, `cispo`): a name that survives retraining."""
    labels = {}
    for stage in CHECKPOINT_STAGES:
        manifest = read_manifest(artifacts, customer, stage)
        if manifest is not None:
            labels[PolicySpec.for_adapter(local_adapter(artifacts, manifest)).name] = stage
    return labels


@dg.asset(
    partitions_def=customers_partitions,
    group_name="evaluation",
    kinds={"python", "matplotlib"},
    deps=[distractor_sets, reranker_checkpoint, sft_checkpoint, cispo_checkpoint],
    description="Baselines, the teacher and every checkpoint on the verified test split and the customer's external "
    "benchmark files; report.json/report.md and plots saved in the artifact store for the promotion gate.",
)
def benchmark_report(
    context: dg.AssetExecutionContext, store: ArtifactStoreResource, chroma: ChromaResource, customers: CustomersResource
) -> dg.MaterializeResult:
    name = context.partition_key
    config = customers.get(name)
    settings = config.benchmark
    artifacts = store.get()
    index = open_index(name, store, chroma, customers)
    trained = read_reranker(artifacts, name) if config.training.reranker.enabled else None
    reranker = Reranker.load(local_reranker(artifacts, trained)) if trained is not None else None
    candidates = benchmark_candidates(settings, checkpoint_policies(artifacts, name), has_reranker=reranker is not None)
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        result = run_customer_benchmark(
            load_tasks(artifacts, final_tasks_key(name)), artifacts.read_parquet(chunks_key(name)), index, settings, candidates, out, config.base_dir,
            reranker,
        )
        push_folder(artifacts, out, benchmark_prefix(name))
        metadata: dict = {"candidates": [spec.name for spec in candidates], "suites": sorted(result.reports)}
        # SUITE/CANDIDATE/METRIC as numbers, so the UI plots each across materializations.
        metadata.update(benchmark_numbers(result.reports, _checkpoint_labels(artifacts, name)))
        for suite, report in result.reports.items():
            plots = "\n\n".join(png_markdown(p) for p in result.plots.get(suite, []))
            metadata[f"{suite}_report"] = dg.MetadataValue.md(render_markdown(report) + "\n\n" + plots)
    artifacts.write_text(benchmark_summary_key(name), json.dumps({suite: r["policies"] for suite, r in result.reports.items()}, indent=2, default=str))
    metadata["path"] = dg.MetadataValue.path(artifacts.uri(benchmark_prefix(name)))
    return dg.MaterializeResult(metadata=metadata)
