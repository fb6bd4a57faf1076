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
    assert {sensor.name for sensor in defs.sensors} == {"customer_files_sensor", "customer_resync_sensor", "corpus_change_sensor"}
    assert not defs.schedules  # resync crons are read by customer_resync_sensor when it ticks, not at import


def test_commands_and_runs_use_resources_built_in_one_place(searchsmith_home):
    """The CLI's resources are the code location's, named by attribute, not looked up in the
    definitions by string: the same classes and settings under the same names."""
    from assets.resources import PipelineResources
    from orchestration.runner import resources

    given = build_definitions().resources
    resources.cache_clear()  # built once per process; this test's home is its own
    commands = resources()
    assert isinstance(commands, PipelineResources) and set(given) == set(commands.as_dagster())
    for name, resource in commands.as_dagster().items():
        assert type(given[name]) is type(resource) and given[name].model_dump() == resource.model_dump(), name
    assert commands.store.get().root == searchsmith_home / "artifacts"
    resources.cache_clear()


def test_importing_the_code_location_reads_no_customer_file_and_no_environment(tmp_path):
    """The definitions load the same with no customers folder and a deployment's variables unset or
    wrong: nothing is scanned or resolved until a run, a sensor tick or the CLI builds a client."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEARCHSMITH_")}
    env.update({"SEARCHSMITH_CUSTOMERS_DIR": str(tmp_path / "missing"), "SEARCHSMITH_CHROMA_MODE": "nonsense",
                "SEARCHSMITH_HOME": str(tmp_path / "home")})
    code = "import orchestration.definitions as d; print(len(list(d.defs.sensors)))"
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0 and loaded.stdout.strip() == "3", loaded.stderr[-2000:]
    assert not (tmp_path / "home").exists()


def test_resync_crons_are_due_once_per_tick_and_new_customers_wait_for_their_next_tick():
    from datetime import datetime, timezone

    from orchestration.automation import due_resyncs

    def at(text: str) -> float:
        return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()

    crons = {"acme": "0 3 * * *", "globex": "*/15 * * * *"}
    due, cursor = due_resyncs(crons, {}, at("2026-12-01T03:05:00"))
    assert due == {} and cursor == {"acme": at("2026-12-01T03:05:00"), "globex": at("2026-12-01T03:05:00")}
    due, cursor = due_resyncs(crons, cursor, at("2026-12-01T03:20:00"))
    assert due == {"globex": datetime(2026, 12, 1, 3, 15, tzinfo=timezone.utc)}
    assert due_resyncs(crons, cursor, at("2026-12-01T03:20:30"))[0] == {}  # the same tick is not due twice
    # Ticks missed while the daemon was down collapse into the latest one, per customer.
    due, _ = due_resyncs(crons, cursor, at("2026-12-03T04:00:00"))
    assert due == {"acme": datetime(2026, 12, 3, 3, 0, tzinfo=timezone.utc), "globex": datetime(2026, 12, 3, 4, 0, tzinfo=timezone.utc)}
    assert due_resyncs({"acme": "0 3 * * *"}, {"acme": at("2026-12-01T03:00:00")}, at("2026-12-01T03:00:00"))[0] == {}


def test_the_resync_sensor_requests_registered_customers_with_a_run_key_per_tick(customer, searchsmith_home, monkeypatch):
    import json as _json
    import time as _time

    from orchestration.automation import customer_resync_sensor

    monkeypatch.setenv("SEARCHSMITH_CUSTOMERS_DIR", str(customer))
    instance = dg.DagsterInstance.ephemeral()
    first = customer_resync_sensor(dg.build_sensor_context(instance=instance))
    assert not first.run_requests and _json.loads(first.cursor) == {}  # acme's file exists, but it is no partition yet
    instance.add_dynamic_partitions(customers_partitions.name, ["acme"])
    # acme's default cron is daily at 03:00: a cursor two days old makes one tick due now.
    cursor = _json.dumps({"acme": _time.time() - 2 * 86400})
    result = customer_resync_sensor(dg.build_sensor_context(instance=instance, cursor=cursor))
    [request] = result.run_requests
    assert request.partition_key == "acme" and request.run_key.startswith("acme:") and request.tags["customer"] == "acme"
    again = customer_resync_sensor(dg.build_sensor_context(instance=instance, cursor=result.cursor))
    assert not again.run_requests


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


def test_a_corpus_without_tasks_stops_at_the_check_and_finetune_says_why(tmp_path, searchsmith_home):
    """An empty corpus: `tasks` materializes zero verified tasks and stops at its blocking check,
    whose line says what it counted; `finetune` then names the shortfall, not "run tasks first"."""
    folder = tmp_path / "customers"
    (folder / "docs").mkdir(parents=True)
    (folder / "empty.yaml").write_text("name: empty\nsources:\n  - {type: local, path: ./docs}\n")
    env = {**os.environ, "SEARCHSMITH_CUSTOMERS_DIR": str(folder)}
    synced = subprocess.run([*CLI, "sync", "empty"], env=env, capture_output=True, text=True, timeout=900)
    assert synced.returncode == 0, synced.stderr[-3000:]
    tasks = subprocess.run([*CLI, "tasks", "empty"], env=env, capture_output=True, text=True, timeout=900)
    assert tasks.returncode == 1 and "Keys mismatch" not in tasks.stderr, tasks.stderr[-3000:]
    assert "verified_tasks    0 verified tasks (train 0, dev 0, test 0)" in tasks.stderr
    assert "  check enough_verified_tasks_per_split FAILED on verified_tasks: by_split {'train': 0, 'dev': 0, 'test': 0}" in tasks.stderr
    finetune = subprocess.run([*CLI, "finetune", "empty", "--stage", "sft", "--json"], env=env, capture_output=True, text=True, timeout=600)
    assert finetune.returncode == 1
    assert json.loads(finetune.stdout)["error"].startswith("customer 'empty' has too few verified tasks to train on (train 0, dev 0, test 0)")
