"""The lineage through Dagster with real resources on a small customer: sync -> index -> tasks ->
benchmark, and the CLI's JSON contracts for search, tasks and bench."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WIKI = ROOT / "customers" / "demo" / "wiki"
SAMPLE = ROOT / "customers" / "demo" / "benchmarks" / "multihop_sample.jsonl"
CLI = [sys.executable, "-m", "orchestration.cli"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def small_customer(tmp_path_factory):
    root = tmp_path_factory.mktemp("lineage")
    folder = root / "customers"
    docs = folder / "wiki"
    docs.mkdir(parents=True)
    for path in sorted(WIKI.glob("*.md"))[:60]:
        shutil.copy(path, docs / path.name)
    (folder / "small.yaml").write_text(
        "name: small\n"
        "sources:\n  - {type: local, path: ./wiki}\n"
        "tasks: {generator: extractive, max_seeds: 40, distractors_per_task: 3}\n"
        "benchmark: {k: 5, policies: [bm25, hybrid, heuristic], test_limit: 5}\n"
    )
    env = {**os.environ, "SEARCHSMITH_HOME": str(root / "home"), "DAGSTER_HOME": str(root / "home" / "dagster"), "SEARCHSMITH_CUSTOMERS_DIR": str(folder)}
    return env


def cli(env, *args, timeout=900):
    result = subprocess.run([*CLI, *args, "--json"], env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout)


def test_sync_tasks_search_bench(small_customer, tmp_path):
    env = small_customer
    synced = cli(env, "sync", "small")
    assert synced["added"] == 60 and synced["index"]["embedded"] == synced["chunks"]
    again = cli(env, "sync", "small")
    assert again["unchanged"] == 60 and again["index"]["embedded"] == 0

    tasks = cli(env, "tasks", "small")
    assert tasks["verified"] > 0 and tasks["generated"] >= tasks["verified"]
    assert set(tasks["by_split"]) == {"train", "dev", "test"} and sum(tasks["by_split"].values()) == tasks["verified"]
    assert isinstance(tasks["failed"], dict) and tasks["by_hops"]

    found = cli(env, "search", "small", "Which football match was played at Kennington Oval in 1872?", "--k", "3")
    assert 0 < len(found["documents"]) <= 3
    assert set(found["documents"][0]) >= {"doc_id", "chunk_id", "title", "justification"}
    assert set(found["summary"]) == {"turns", "tool_calls", "peak_tokens", "pruned"} and found["summary"]["tool_calls"] > 0

    out = tmp_path / "bench"
    report = cli(env, "bench", "--tasks", str(SAMPLE), "--policies", "bm25,hybrid", "--k", "5", "--out", str(out), "--limit", "8")
    for name in ("bm25", "hybrid"):
        metrics = report["policies"][name]
        for key in ("answer_found", "recall", "precision", "f1", "trajectory_recall", "prune_accuracy", "mean_prompt_tokens", "n"):
            assert key in metrics
        assert metrics["n"] == 8
    assert json.loads((out / "report.json").read_text())["policies"].keys() == report["policies"].keys()
    assert (out / "report.md").exists() and list(out.glob("*.png"))


def test_benchmark_report_asset_materializes(small_customer):
    """After the CLI built the index and tasks, the benchmark asset runs in the same instance."""
    code = (
        "import dagster as dg\n"
        "from orchestration.definitions import defs\n"
        "job = defs.resolve_implicit_global_asset_job_def()\n"
        "r = job.execute_in_process(asset_selection=[dg.AssetKey('benchmark_report')], partition_key='small', instance=dg.DagsterInstance.get())\n"
        "md = r.asset_materializations_for_node('benchmark_report')[0].metadata\n"
        "print('SUITES', md['suites'].value)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], env=small_customer, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "SUITES ['test']" in result.stdout
