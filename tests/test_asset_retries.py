"""Only network failures are retried: a deterministic error fails at once, an interrupt stops the run.

Everything here is real: errors come from real clients talking to a closed loopback port, the
asset runs through `dg.materialize`, and the interrupt is a real SIGINT sent to a real
`searchsmith sync` while it waits on a real (slow) web site.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import httpx
import pytest

import assets.corpus_assets as corpus_assets
from assets.corpus_assets import raw_documents
from assets.partitions import customers_partitions
from assets.resources import ArtifactStoreResource, CustomersResource
from assets.retries import TransientRetry, is_transient
from core.config import CustomerConfigError
from tests.support.website import Website

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "orchestration.cli"]


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def s3_store_at_closed_port(monkeypatch) -> ArtifactStoreResource:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore's own retries would only slow the test
    return ArtifactStoreResource(location="s3://artifacts/prefix", endpoint_url=f"http://127.0.0.1:{closed_port()}")


def step_events(result: dg.ExecuteInProcessResult, kind: dg.DagsterEventType) -> list:
    return [event for event in result.all_events if event.event_type == kind]


@pytest.fixture
def customers_folder(tmp_path):
    folder = tmp_path / "customers"
    (folder / "docs").mkdir(parents=True)
    (folder / "docs" / "a.md").write_text("# A\n\nA sentence about the first item.")
    (folder / "acme.yaml").write_text("name: acme\nsources:\n  - {type: local, path: ./docs}\n")
    return folder


def test_network_failures_of_real_clients_are_transient(monkeypatch):
    with pytest.raises(httpx.ConnectError) as refused:
        httpx.get(f"http://127.0.0.1:{closed_port()}/", timeout=5)
    assert is_transient(refused.value)
    try:
        raise RuntimeError("index build failed") from refused.value
    except RuntimeError as wrapped:  # a stage that wraps the network error keeps it retryable
        assert is_transient(wrapped)
    store = s3_store_at_closed_port(monkeypatch).get()
    with pytest.raises(Exception) as s3_down:
        store.read_bytes("acme/corpus/raw_documents.parquet")
    assert is_transient(s3_down.value), type(s3_down.value)


@pytest.mark.parametrize(
    "error",
    [CustomerConfigError("acme.yaml: unknown customer"), UnicodeEncodeError("utf-8", "bad\udcff", 3, 4, "surrogates not allowed"), KeyError("doc_id")],
)
def test_deterministic_errors_are_not_transient(error):
    assert not is_transient(error)


def test_deterministic_error_fails_once_without_retry(customers_folder, tmp_path, searchsmith_home):
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(customers_partitions.name, ["ghost"])  # no ghost.yaml: CustomerConfigError
    resources = {
        "store": ArtifactStoreResource(location=str(tmp_path / "artifacts")),
        "customers": CustomersResource(folder=str(customers_folder), home=str(searchsmith_home)),
    }
    result = dg.materialize([raw_documents], resources=resources, partition_key="ghost", instance=instance, raise_on_error=False)
    assert not result.success
    assert not step_events(result, dg.DagsterEventType.STEP_UP_FOR_RETRY)
    assert len(step_events(result, dg.DagsterEventType.STEP_FAILURE)) == 1


def test_unreachable_artifact_store_is_retried(customers_folder, searchsmith_home, monkeypatch):
    monkeypatch.setattr(corpus_assets, "SYNC_RETRY", TransientRetry(max_retries=1, delay_s=0.1))  # the policy, shortened
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(customers_partitions.name, ["acme"])
    resources = {
        "store": s3_store_at_closed_port(monkeypatch),
        "customers": CustomersResource(folder=str(customers_folder), home=str(searchsmith_home)),
    }
    result = dg.materialize([raw_documents], resources=resources, partition_key="acme", instance=instance, raise_on_error=False)
    assert not result.success
    assert len(step_events(result, dg.DagsterEventType.STEP_UP_FOR_RETRY)) == 1


def wait_until(predicate, timeout_s: float, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the sync never reached the web site"
        time.sleep(0.2)


def test_one_sigint_stops_a_sync_and_is_not_retried(tmp_path, searchsmith_home):
    site_root = tmp_path / "site"
    site_root.mkdir()
    folder = tmp_path / "customers"
    folder.mkdir()
    with Website(site_root) as site:
        site.write("index.html", "<html><head><title>Slow</title></head><body><main><p>" + "A slow page of prose. " * 20 + "</p></main></body></html>")
        site.delays["/"] = 8.0  # under the crawler's timeout: the sync is waiting on it when interrupted
        (folder / "acme.yaml").write_text(
            "name: acme\nsources:\n"
            f"  - {{type: web, seeds: ['{site.url('/')}'], allow_private: true, use_sitemap: false, max_pages: 1}}\n"
        )
        env = {**os.environ, "SEARCHSMITH_CUSTOMERS_DIR": str(folder)}
        process = subprocess.Popen([*CLI, "sync", "acme", "--json"], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: site.hits["/"] >= 1, 600, process)
            process.send_signal(signal.SIGINT)
            stdout, stderr = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
        assert process.returncode != 0, stdout
        assert site.hits["/"] == 1  # a retried step would have fetched the page again
    instance = dg.DagsterInstance.from_config(str(searchsmith_home / "dagster"))
    runs = instance.get_runs()
    assert runs and all(run.status != dg.DagsterRunStatus.SUCCESS for run in runs)
    records = instance.get_records_for_run(runs[0].run_id).records
    kinds = {record.event_log_entry.dagster_event.event_type for record in records if record.event_log_entry.dagster_event}
    assert dg.DagsterEventType.STEP_UP_FOR_RETRY not in kinds
    if stdout.strip():
        assert "error" in json.loads(stdout)
