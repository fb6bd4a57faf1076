"""The lineage through Dagster with real resources on a small customer: sync -> index -> tasks ->
training -> benchmark -> serving, and the CLI's JSON contracts for search, tasks, bench,
finetune, serve, keys and the search service."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.tiny_models import tiny_model_dir

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
        "benchmark: {k: 5, policies: [bm25, hybrid, heuristic], test_limit: 5, model_options: {max_new_tokens: 8}, harness: {max_turns: 3}}\n"
        "training:\n"
        f"  base_model: {tiny_model_dir(tmp_path_factory)}\n"
        "  harness: {token_budget: 4096, search_budget_tokens: 256, response_reserve_tokens: 256, max_turns: 4}\n"
        "  teacher: {max_tasks: 4, workers: 2}\n"
        "  lora: {rank: 4, alpha: 8}\n"
        "  sft: {max_steps: 2, max_length: 16384, max_samples: 6, grad_accum: 1, torch_threads: 1}\n"
        "  rl: {steps: 1, group_size: 2, tasks_per_step: 1, substeps: 1, max_new_tokens: 8, rollout_workers: 1, max_tasks: 2}\n"
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


def test_finetune_serve_rollback_and_the_search_service(small_customer):
    """A customer added by file alone is fine-tuned, benchmarked with its checkpoints, served through
    the gate, rolled back, and answered by `searchsmith api` with a per-customer key."""
    env = small_customer
    sft = cli(env, "finetune", "small", "--stage", "sft")
    assert Path(sft["adapter_path"], "adapter_config.json").is_file() and sft["steps"] == 2 and "loss" in json.dumps(sft["metrics"])
    rl = cli(env, "finetune", "small", "--stage", "rl")
    assert Path(rl["adapter_path"], "adapter_config.json").is_file() and rl["steps"] == 1 and rl["adapter_path"] != sft["adapter_path"]
    again = cli(env, "finetune", "small", "--stage", "all")
    assert again["reused"] and again["adapter_path"] == rl["adapter_path"], "nothing changed: no retraining"

    code = (
        "import dagster as dg\n"
        "from orchestration.definitions import defs\n"
        "job = defs.resolve_implicit_global_asset_job_def()\n"
        "r = job.execute_in_process(asset_selection=[dg.AssetKey('benchmark_report')], partition_key='small', instance=dg.DagsterInstance.get())\n"
        "print('CANDIDATES', r.asset_materializations_for_node('benchmark_report')[0].metadata['candidates'].value)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-4000:]
    assert sft["adapter_path"] in result.stdout and rl["adapter_path"] in result.stdout

    served = cli(env, "serve", "small")
    assert served["promoted"] and served["reason"] and served["served"]["policy"]
    assert "test" in served["served"]["metrics"]
    unchanged = cli(env, "serve", "small")
    assert not unchanged["promoted"] and unchanged["served"]["policy"] == served["served"]["policy"]
    back = cli(env, "serve", "small", "--rollback")
    assert not back["promoted"] and back["served"]["policy"] == "heuristic" and "rolled back" in back["reason"]
    failed = subprocess.run([*CLI, "serve", "small", "--rollback", "--json"], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert failed.returncode == 1 and "nothing to roll back" in json.loads(failed.stdout)["error"]

    key = cli(env, "keys", "create", "small")["key"]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([*CLI, "api", "--host", "127.0.0.1", "--port", str(port)], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, "the search service did not start"
            time.sleep(0.5)
        question = {"customer": "small", "query": "Which football match was played at Kennington Oval in 1872?", "k": 3}
        response = httpx.post(f"{url}/v1/search", json=question, headers={"Authorization": f"Bearer {key}"}, timeout=300)
        assert response.status_code == 200, response.text
        body = response.json()
        assert 0 < len(body["documents"]) <= 3 and body["summary"]["tool_calls"] > 0
        assert httpx.post(f"{url}/v1/search", json=question, timeout=30).status_code == 401
        assert httpx.post(f"{url}/v1/search", json={**question, "customer": "demo"},
                          headers={"Authorization": f"Bearer {key}"}, timeout=30).status_code == 403
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    assert key not in server.stderr.read(), "the key must never be logged"
