"""The Dagster UI end to end: `dagster dev` on loopback, a materialization launched and polled
through its GraphQL API for the demo partition, and the asset pages rendered by headless Chromium.

`dagster dev` maps SIGTERM onto its SIGINT handler, and a process started in the background by a
non-interactive shell inherits SIGINT as *ignored*, so such a server ignores both. The fixture
therefore starts it in a new session with both signals reset to their defaults, stops it with
SIGTERM (its own clean shutdown of webserver, daemon and code servers), and sweeps the process
group with SIGKILL if anything is left.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote

import pytest

ROOT = Path(__file__).resolve().parents[1]
DAGSTER = Path(sys.executable).parent / "dagster"
CUSTOMER = "demo"
ASSET = "raw_documents"

# Generous: the server start and the run share two busy cores with the rest of the suite.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _default_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _group_alive(process: subprocess.Popen) -> bool:
    """Whether any process of the leader's group is left (the leader is reaped first: a zombie counts)."""
    process.poll()
    try:
        os.killpg(process.pid, 0)  # start_new_session: the leader's pid is the group id
    except ProcessLookupError:
        return False
    return True


def _wait_group_gone(process: subprocess.Popen, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _group_alive(process):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


@dataclass
class DagsterServer:
    url: str
    process: subprocess.Popen
    log_path: Path

    def log_tail(self, chars: int = 6000) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return f"\n--- dagster dev log ({self.log_path}) ---\n{text[-chars:]}"

    def graphql(self, query: str, variables: dict | None = None, timeout: float = 120) -> dict:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            payload = json.loads(response.read())
        assert not payload.get("errors"), f"GraphQL errors: {payload['errors']}" + self.log_tail()
        return payload["data"]


def _wait_for_server(server: DagsterServer, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"dagster dev exited with {server.process.returncode}" + server.log_tail())
        try:
            with urllib.request.urlopen(f"{server.url}/server_info", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1)
    raise TimeoutError(f"dagster dev did not answer /server_info within {seconds:.0f} s" + server.log_tail())


LOCATIONS = """
{ workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus
    locationOrLoadError { __typename
      ... on RepositoryLocation { repositories { name } }
      ... on PythonError { message stack } } } }
  ... on PythonError { message } } }
"""


def _wait_for_repository(server: DagsterServer, seconds: float) -> dict[str, str]:
    """The selector of our code location's repository, once the location has loaded."""
    deadline = time.monotonic() + seconds
    entries: list = []
    while time.monotonic() < deadline:
        entries = server.graphql(LOCATIONS)["workspaceOrError"]["locationEntries"]
        if entries and all(entry["loadStatus"] == "LOADED" for entry in entries):
            break
        time.sleep(1)
    else:
        raise TimeoutError(f"code location not loaded within {seconds:.0f} s: {entries}" + server.log_tail())
    (entry,) = entries
    location = entry["locationOrLoadError"]
    assert location["__typename"] == "RepositoryLocation", f"code location failed to load: {location}" + server.log_tail()
    (repository,) = location["repositories"]
    return {"repositoryLocationName": entry["name"], "repositoryName": repository["name"]}


def _stop(process: subprocess.Popen) -> list[str]:
    """SIGTERM to `dagster dev` (it shuts down its webserver, daemon and code servers), then
    SIGTERM and at last SIGKILL to whatever is left of its process group."""
    problems = []
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            problems.append("dagster dev ignored SIGTERM for 60 s")
    if not _wait_group_gone(process, 20):
        os.killpg(process.pid, signal.SIGTERM)
        if not _wait_group_gone(process, 20):
            problems.append("processes of its group survived SIGTERM and were killed")
            os.killpg(process.pid, signal.SIGKILL)
            _wait_group_gone(process, 10)
    process.wait(timeout=10)
    return problems


@pytest.fixture(scope="module")
def dagster_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("ui")
    home = root / "home"
    dagster_home = home / "dagster"
    dagster_home.mkdir(parents=True)
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    port = _free_port()
    env = {**os.environ, "SEARCHSMITH_HOME": str(home), "DAGSTER_HOME": str(dagster_home), "PYTHONUNBUFFERED": "1"}
    for name in ("SEARCHSMITH_ARTIFACTS", "SEARCHSMITH_CUSTOMERS_DIR"):
        env.pop(name, None)  # the repository's own customers/ and a local artifact store
    log_path = root / "dagster-dev.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(DAGSTER), "dev", "-h", "127.0.0.1", "-p", str(port), "-w", "workspace.yaml"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_default_signals,
        )
    server = DagsterServer(url=f"http://127.0.0.1:{port}", process=process, log_path=log_path)
    try:
        _wait_for_server(server, 300)
        yield server
    finally:
        problems = _stop(process)
        assert not problems, "; ".join(problems) + server.log_tail()


@pytest.fixture(scope="module")
def repository(dagster_server) -> dict[str, str]:
    return _wait_for_repository(dagster_server, 300)


ADD_PARTITION = """
mutation($selector: RepositorySelector!, $name: String!, $key: String!) {
  addDynamicPartition(repositorySelector: $selector, partitionsDefName: $name, partitionKey: $key) {
    __typename
    ... on AddDynamicPartitionSuccess { partitionsDefName partitionKey }
    ... on Error { message }
  }
}
"""

LAUNCH_RUN = """
mutation($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on Error { message }
    ... on PythonError { stack }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""

RUN_STATUS = """
query($runId: ID!) { runOrError(runId: $runId) { __typename ... on Run { status } ... on Error { message } } }
"""

RUN_ERRORS = """
query($runId: ID!) { logsForRun(runId: $runId) { ... on EventConnection { events {
  __typename ... on MessageEvent { message level }
  ... on ExecutionStepFailureEvent { error { message stack } } } } } }
"""

MATERIALIZATIONS = """
query($key: AssetKeyInput!, $partition: String!) {
  assetOrError(assetKey: $key) {
    __typename
    ... on Asset { assetMaterializations(partitions: [$partition]) { partition runId } }
  }
}
"""

PARTITION_KEYS = """
query($key: AssetKeyInput!) { assetNodeOrError(assetKey: $key) { __typename ... on AssetNode { partitionKeys } } }
"""

ASSET_NODES = """
query($selector: RepositorySelector!) {
  repositoryOrError(repositorySelector: $selector) {
    __typename ... on Repository { assetNodes { assetKey { path } } } ... on Error { message }
  }
}
"""

TERMINAL = {"SUCCESS", "FAILURE", "CANCELED"}


def _poll_run(server: DagsterServer, run_id: str, seconds: float) -> str:
    deadline = time.monotonic() + seconds
    status = "UNKNOWN"
    while time.monotonic() < deadline:
        result = server.graphql(RUN_STATUS, {"runId": run_id})["runOrError"]
        assert result["__typename"] == "Run", result
        status = result["status"]
        if status in TERMINAL:
            return status
        time.sleep(2)
    return status


def _run_errors(server: DagsterServer, run_id: str) -> str:
    events = server.graphql(RUN_ERRORS, {"runId": run_id})["logsForRun"].get("events", [])
    lines = [e["error"]["message"] for e in events if e.get("error")]
    lines += [e["message"] for e in events if e.get("level") in ("ERROR", "CRITICAL")]
    return "\n".join(lines)


def _defined_assets() -> dict[str, str]:
    """Asset name -> group name, from the same Definitions the code location loads."""
    from orchestration.definitions import defs

    graph = defs.resolve_asset_graph()
    return {key.to_user_string(): graph.get(key).group_name for key in graph.get_all_asset_keys()}


def test_repository_lists_every_defined_asset(dagster_server, repository):
    data = dagster_server.graphql(ASSET_NODES, {"selector": repository})["repositoryOrError"]
    assert data["__typename"] == "Repository", data
    listed = {"/".join(node["assetKey"]["path"]) for node in data["assetNodes"]}
    defined = set(_defined_assets())
    assert ASSET in defined
    assert defined <= listed, f"missing from the UI: {sorted(defined - listed)}"


def test_materialize_demo_partition_through_graphql(dagster_server, repository):
    added = dagster_server.graphql(ADD_PARTITION, {"selector": repository, "name": "customers", "key": CUSTOMER})["addDynamicPartition"]
    # The customer-files sensor (running by default) usually registers it first, on its first tick.
    assert added["__typename"] in ("AddDynamicPartitionSuccess", "DuplicateDynamicPartitionError"), added
    node = dagster_server.graphql(PARTITION_KEYS, {"key": {"path": [ASSET]}})["assetNodeOrError"]
    assert CUSTOMER in node["partitionKeys"], node

    params = {
        "selector": {**repository, "jobName": "__ASSET_JOB", "assetSelection": [{"path": [ASSET]}]},
        "executionMetadata": {"tags": [{"key": "dagster/partition", "value": CUSTOMER}, {"key": "customer", "value": CUSTOMER}]},
    }
    launched = dagster_server.graphql(LAUNCH_RUN, {"params": params})["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["run"]["runId"]

    status = _poll_run(dagster_server, run_id, 600)
    assert status == "SUCCESS", f"run {run_id} ended {status}:\n{_run_errors(dagster_server, run_id)}" + dagster_server.log_tail()

    asset = dagster_server.graphql(MATERIALIZATIONS, {"key": {"path": [ASSET]}, "partition": CUSTOMER})["assetOrError"]
    assert asset["__typename"] == "Asset", asset
    assert {"partition": CUSTOMER, "runId": run_id} in asset["assetMaterializations"]


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class _VisibleText(HTMLParser):
    """The text a reader sees: data outside <script> and <style> (script URLs hold words like `chunks`)."""

    def __init__(self):
        super().__init__()
        self.hidden = 0
        self.items: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.hidden += tag in ("script", "style")

    def handle_endtag(self, tag):
        self.hidden -= tag in ("script", "style")

    def handle_data(self, data):
        if not self.hidden and data.strip():
            self.items.add(data.strip())


def _rendered_text(url: str, profile: Path) -> set[str]:
    """The DOM after the React app has run: virtual time lets its queries and rendering finish."""
    command = [
        _chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--window-size=1600,2400",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=30000",
        "--dump-dom",
        url,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, "HOME": str(profile)})
    assert result.returncode == 0, result.stderr[-3000:]
    parser = _VisibleText()
    parser.feed(result.stdout)
    return parser.items


@pytest.mark.skipif(_chromium() is None, reason="Chromium not on PATH (Debian: apt-get install chromium; .ci/run installs it)")
def test_asset_pages_render_in_headless_chromium(dagster_server, repository, tmp_path):
    assets = _defined_assets()
    group = assets[ASSET]
    in_group = {name for name, g in assets.items() if g == group}
    # The asset graph (lineage) of the group holding raw_documents: every asset of the group is a node.
    location = repository["repositoryLocationName"]
    if repository["repositoryName"] != "__repository__":
        location = f"{repository['repositoryName']}@{location}"
    graph_text = _rendered_text(f"{dagster_server.url}/locations/{quote(location)}/asset-groups/{quote(group)}", tmp_path / "graph")
    assert in_group <= graph_text, f"group {group!r} graph misses {sorted(in_group - graph_text)}; rendered text: {sorted(graph_text)}"
    # The catalog lists assets by name (a virtualized table: rows beyond the window may not render).
    catalog = set(assets) & _rendered_text(f"{dagster_server.url}/assets", tmp_path / "catalog")
    assert len(catalog) >= min(5, len(assets)), f"catalog shows {sorted(catalog)} of {sorted(assets)}"
