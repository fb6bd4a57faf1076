"""The Dagster layer with real resources: materialize, validate, and the CLI's JSON contract."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from assets.corpus_assets import chunks, raw_documents
from assets.partitions import customers_partitions
from assets.resources import ArtifactStoreResource, CustomersResource
from core.registry import CustomerRegistry
from orchestration.definitions import build_definitions

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "orchestration.cli"]


@pytest.fixture
def customer(tmp_path):
    folder = tmp_path / "customers"
    (folder / "docs").mkdir(parents=True)
    for i in range(3):
        (folder / "docs" / f"d{i}.md").write_text(f"# Page {i}\n\nSentence about item {i}. " * 5)
    (folder / "docs" / "bad.txt").write_bytes(b"\x00\x01")
    (folder / "acme.yaml").write_text("name: acme\nsources:\n  - {type: local, path: ./docs}\n")
    return folder


def test_definitions_hold_exactly_the_lineage_checks_jobs_schedules_and_sensors():
    """The full set of keys: a new asset, check, job or sensor is added here on purpose."""
    defs = build_definitions()
    graph = defs.resolve_asset_graph()
    assert {key.to_user_string() for key in graph.get_all_asset_keys()} == {
        "raw_documents", "chunks", "chroma_index", "synthetic_tasks", "verified_tasks", "distractor_sets", "reranker_checkpoint",
        "sft_trajectories", "sft_checkpoint", "cispo_checkpoint", "benchmark_report", "served_model"}
    assert {key.name for key in graph.asset_check_keys} == {
        "index_count_matches_chunks_check", "no_duplicate_ids_check", "dense_recall_matches_brute_force",
        "enough_verified_tasks_per_split", "supporting_quotes_in_documents", "reranker_beats_its_start"}
    assert {job.name for job in defs.resolve_all_job_defs()} - {"__ASSET_JOB"} == {
        "corpus_resync", "customer_tasks", "finetune_sft", "finetune_rl", "finetune_all", "finetune_reranker",
        "customer_finetune", "serve_model", "customer_lineage"}
    assert {sensor.name for sensor in defs.sensors} == {"customer_files_sensor", "corpus_change_sensor"}
    assert {schedule.name for schedule in defs.schedules} == {f"corpus_resync_{name.replace('-', '_')}" for name in CustomerRegistry().customers()}


def test_materialize_with_real_resources(customer, tmp_path, searchsmith_home):
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(customers_partitions.name, ["acme"])
    resources = {
        "store": ArtifactStoreResource(location=str(tmp_path / "artifacts")),
        "customers": CustomersResource(folder=str(customer), home=str(searchsmith_home)),
    }
    assets = [raw_documents, chunks]
    result = dg.materialize(assets, resources=resources, partition_key="acme", instance=instance)
    assert result.success
    docs = result.asset_materializations_for_node("raw_documents")[0].metadata
    assert docs["added"].value == 3 and docs["quarantined"].value == 1
    assert (tmp_path / "artifacts" / "acme" / "corpus" / "chunks.parquet").exists()
    again = dg.materialize(assets, resources=resources, partition_key="acme", instance=instance)
    metadata = again.asset_materializations_for_node("raw_documents")[0].metadata
    assert metadata["unchanged"].value == 3 and metadata["added"].value == 0


def test_dagster_definitions_validate(searchsmith_home):
    dagster = Path(sys.executable).parent / "dagster"
    result = subprocess.run([str(dagster), "definitions", "validate", "-w", "workspace.yaml"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


def test_cli_json_contract(customer, searchsmith_home):
    env = {**os.environ, "SEARCHSMITH_CUSTOMERS_DIR": str(customer)}
    listed = subprocess.run([*CLI, "customers", "list", "--json"], env=env, capture_output=True, text=True, timeout=600)
    assert json.loads(listed.stdout)["customers"] == ["acme"]
    synced = subprocess.run([*CLI, "sync", "acme", "--json"], env=env, capture_output=True, text=True, timeout=900)
    assert synced.returncode == 0, synced.stderr[-3000:]
    payload = json.loads(synced.stdout)  # exactly one JSON object on stdout
    for key in ("added", "changed", "deleted", "unchanged", "quarantined", "chunks"):
        assert isinstance(payload[key], int)
    assert payload["added"] == 3 and payload["quarantined"] == 1 and payload["chunks"] >= 3
    # The run is recorded in the persistent instance, so it shows in the UI.
    instance = dg.DagsterInstance.from_config(str(searchsmith_home / "dagster"))
    assert any(run.job_name == "corpus_resync" for run in instance.get_runs())
    unknown = subprocess.run([*CLI, "sync", "nobody", "--json"], env=env, capture_output=True, text=True, timeout=600)
    assert unknown.returncode == 1 and "unknown customer" in json.loads(unknown.stdout)["error"]
    # a policy whose endpoint is down is an error with its cause, never an empty answer with exit 0
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        down = f"openai:http://127.0.0.1:{probe.getsockname()[1]}/v1#served-model"
    failed = subprocess.run([*CLI, "search", "acme", "What is item 1 about?", "--policy", down, "--json"], env=env, capture_output=True, text=True, timeout=600)
    assert failed.returncode == 1, failed.stdout[-2000:]
    error = json.loads(failed.stdout)["error"]  # still exactly one JSON object on stdout
    assert "served-model" in error and "failed" in error and "Connection" in error
    human = subprocess.run([*CLI, "search", "acme", "What is item 1 about?", "--policy", down], env=env, capture_output=True, text=True, timeout=600)
    assert human.returncode == 1 and human.stdout == "" and human.stderr.strip().splitlines()[-1].startswith("error: the search policy")


def test_sync_reports_each_source_and_exits_1_when_one_cannot_be_listed(customer, searchsmith_home):
    from orchestration.cli import _human_sync

    with socket.socket() as probe:  # an S3 endpoint that is down
        probe.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{probe.getsockname()[1]}"
    (customer / "acme.yaml").write_text(
        "name: acme\nsources:\n  - {type: local, path: ./docs}\n"
        f"  - {{type: s3, bucket: gone, endpoint_url: '{endpoint}', access_key_env: T_KEY, secret_key_env: T_SECRET, max_attempts: 1, connect_timeout_s: 2}}\n"
    )
    env = {**os.environ, "SEARCHSMITH_CUSTOMERS_DIR": str(customer), "T_KEY": "k", "T_SECRET": "s"}
    synced = subprocess.run([*CLI, "sync", "acme", "--json"], env=env, capture_output=True, text=True, timeout=900)
    assert synced.returncode == 1, synced.stderr[-3000:]
    payload = json.loads(synced.stdout)  # still exactly one JSON object, with the counts
    assert payload["added"] == 3 and payload["chunks"] >= 3  # the good source was synced and indexed
    local, s3 = payload["sources"]
    assert local["source"] == "local:./docs" and local["status"] == "ok" and local["added"] == 3 and local["quarantined"] == 1
    assert s3["source"] == "s3:gone/" and s3["status"] == "failed" and endpoint in s3["reason"]
    assert payload["failed_sources"] == ["s3:gone/"]
    human = _human_sync(payload)
    assert "FAILED  s3:gone/" in human and "ok      local:./docs" in human
