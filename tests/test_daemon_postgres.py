"""The production deployment, run for real on loopback: a PostgreSQL instance rendered by
orchestration/instance.py (the file deploy/dagster.yaml holds), the code location served by
`dagster api grpc`, `dagster-daemon run` launching and dequeuing runs, Chroma as a `chroma run`
server, SeaweedFS as the artifact store and the compute-log bucket.

One scenario runs once per module (it costs a few minutes on two cores) and records what
happened; each test checks one property of the record:
- two customers' resync crons are due (the first tick forced through the instance by starting
  the resync sensor with a cursor in the past, the second a minute later), so the daemon queues resyncs of both
  customers, two of each; each customer has a local folder and a website its crawler fetches
  politely (10 s between requests), so a resync lasts at least 30 s and the second tick's runs
  wait in the queue behind the first;
- the queue never runs two resyncs of one customer together, while different customers do run together;
- every resync succeeds, with documents and chunks in S3, the index in the Chroma server and the
  step logs in S3;
- `corpus_change_sensor` requests `customer_finetune` for each resync that changed more than the
  customer's `limits.resync_retrain_share` (a first sync, and a change of 37.5% made while the
  daemon was down) and for no other; the requests stay queued (0 accelerators) and a later
  sensor tick launches nothing;
- the daemon is killed (SIGKILL) while a run is in progress and started again: the run
  finishes, the queued runs start afterwards, and no run is lost or made twice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.chroma_server import chroma_server
from tests.support.postgres import find_bindir, postgres_server
from tests.support.seaweed import free_ports, log_tail, seaweed_s3
from tests.support.website import Website

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
BUCKET = "searchsmith"
LOCATION = "searchsmith"
CUSTOMERS = ("alpha", "beta")
RUNS_PER_CUSTOMER = 2  # scheduled resyncs of each customer queued together
SCENARIO_TIMEOUT_S = 420.0
SHARE = 0.2
CRAWL_RATE_PER_S = 0.1

TOPICS = {
    "alpha": ["lighthouses", "tides", "harbours", "sailing ships", "fog signals"],
    "beta": ["volcanoes", "glaciers", "deserts", "coral reefs", "river deltas"],
}


def _document(topic: str, n: int) -> str:
    sentences = [f"The {topic} report number {n} describes fact {i} about {topic} in plain words." for i in range(12)]
    return f"# {topic.title()}\n\n" + " ".join(sentences[:6]) + "\n\n" + " ".join(sentences[6:]) + "\n"


def _slow_site(site: Website, name: str) -> None:
    """Three pages a polite crawler fetches 10 s apart (robots.txt first): every resync of the
    customer lasts at least 30 s, so its next scheduled resync finds it still running."""
    site.write("/robots.txt", "User-agent: *\nAllow: /\n")
    links = "".join(f'<p><a href="/page-{i}.html">page {i}</a></p>' for i in (1, 2))
    site.write("/index.html", f"<html><head><title>{name} news</title></head><body><h1>{name} news</h1>"
                              f"<p>{_document(name + ' news', 0)}</p>{links}</body></html>")
    for i in (1, 2):
        site.write(f"/page-{i}.html", f"<html><head><title>{name} page {i}</title></head><body><h1>{name} page {i}</h1>"
                                      f"<p>{_document(f'{name} archive', i)}</p></body></html>")


def _write_customer(folder: Path, corpora: Path, name: str, site: Website) -> None:
    corpus = corpora / name
    corpus.mkdir(parents=True)
    for n, topic in enumerate(TOPICS[name]):
        (corpus / f"{topic.replace(' ', '-')}.md").write_text(_document(topic, n), encoding="utf-8")
    _slow_site(site, name)
    (folder / f"{name}.yaml").write_text(
        f"name: {name}\ndomain: web\nschedule: \"* * * * *\"\n"
        f"sources:\n  - {{type: local, path: {corpus}, include: [\"**/*.md\"], exclude: []}}\n"
        f"  - {{type: web, seeds: [\"{site.url('/index.html')}\"], allow_private: true, use_sitemap: false, "
        f"rate_limit_per_s: {CRAWL_RATE_PER_S}, max_pages: 10}}\n"
        f"limits: {{resync_retrain_share: {SHARE}}}\n",
        encoding="utf-8",
    )


@dataclass
class Record:
    """What the scenario saw. `samples`: (time, {run_id: status}) every poll."""

    resyncs: list = field(default_factory=list)  # RunRecord of corpus_resync
    finetunes: list = field(default_factory=list)  # RunRecord of customer_finetune
    samples: list = field(default_factory=list)
    killed_at: float = 0.0
    restarted_at: float = 0.0
    killed_run: str = ""
    queued_while_down: set = field(default_factory=set)
    started_while_down: set = field(default_factory=set)
    changed_customer: str = "alpha"
    sensor_ticks: list = field(default_factory=list)
    chroma_counts: dict = field(default_factory=dict)
    chunk_rows: dict = field(default_factory=dict)
    artifact_keys: list = field(default_factory=list)
    compute_log_keys: list = field(default_factory=list)
    instance_config: dict = field(default_factory=dict)
    logs: dict = field(default_factory=dict)
    timeline: list = field(default_factory=list)  # (seconds since the scenario began, what)


def _spawn(command: list[str], env: dict, log_path: Path) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _stop(process: subprocess.Popen | None, first: int = signal.SIGTERM) -> None:
    if process is None or process.poll() is not None:
        return
    for sig in (first, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=20)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def _wait(predicate, timeout: float, what: str, logs: dict[str, Path], step: float = 0.5, state=None):
    """Poll `predicate`; on timeout fail with `state()` (what the runs are doing) and the logs'
    tails, the daemon's without its once-a-second queue lines."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    tails = "\n".join(f"--- {name} ---\n{_informative_tail(path)}" for name, path in logs.items())
    described = f"{state()}\n" if state else ""
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}\n{described}{tails}")


def _informative_tail(path: Path, lines: int = 30) -> str:
    kept = [line for line in log_tail(path, 2000).splitlines() if "Priority sorting and checking tag concurrency" not in line]
    return "\n".join(kept[-lines:])


def _unfinished_runs(instance) -> str:
    """Each resync not yet ended: its customer, status and its last events."""
    described = []
    for run in _runs(instance, "corpus_resync"):
        if run.dagster_run.status.value in ("SUCCESS", "FAILURE", "CANCELED"):
            continue
        events = [f"    {e.dagster_event.event_type_value if e.dagster_event else 'log'}: {e.message[:200]}"
                  for e in instance.all_logs(run.dagster_run.run_id)[-6:]]
        described.append(f"{run.dagster_run.run_id} {_customer(run)} {run.dagster_run.status.value}\n" + "\n".join(events))
    return "--- unfinished resyncs ---\n" + ("\n".join(described) or "(none)")


def _runs(instance, job: str):
    import dagster as dg

    return instance.get_run_records(filters=dg.RunsFilter(job_name=job))


def _customer(record) -> str:
    return record.dagster_run.tags.get("dagster/partition", "")


def _code_server_ready(port: int) -> bool:
    from dagster._grpc.client import DagsterGrpcClient

    try:
        DagsterGrpcClient(port=port, host="127.0.0.1").ping("ready")
    except Exception:
        return False
    return True


def _start_instigators(instance, port: int, started_ago_s: float) -> list:
    """Start the resync sensor with a cursor `started_ago_s` old for both customers (so a tick of
    their every-minute cron is due now, through the instance) and the corpus change sensor;
    returns the resync sensor."""
    import json

    from dagster._core.definitions.sensor_definition import SensorType
    from dagster._core.remote_origin import GrpcServerCodeLocationOrigin
    from dagster._core.scheduler.instigation import SensorInstigatorData

    origin = GrpcServerCodeLocationOrigin(host="127.0.0.1", port=port, location_name=LOCATION)
    location = origin.create_location(instance)
    repository = location.get_repository("__repository__")
    resync = repository.get_sensor("customer_resync_sensor")
    state = instance.start_sensor(resync)
    since = time.time() - started_ago_s
    cursor = json.dumps({name: since for name in CUSTOMERS})
    instance.update_instigator_state(state.with_data(SensorInstigatorData(min_interval=resync.min_interval_seconds, cursor=cursor,
                                                                          sensor_type=SensorType.STANDARD)))
    instance.start_sensor(repository.get_sensor("corpus_change_sensor"))
    return [resync]


def _stop_sensor(instance, sensor, logs: dict[str, Path], timeout: float = 90) -> int:
    """Stop a sensor so that it stays stopped. The daemon writes a sensor's whole state back at
    the start and the end of each tick (with the status it read moments before), so a stop that
    lands inside a tick can be undone: stop 30's CI saw the resync sensor tick on every minute
    after its stop, and the resyncs it kept queuing never all finished. So stop again until the
    stored state reads stopped, the last tick has finished, and no tick began after the last
    stop (one that did may have read the state before it). Returns how many stops it took."""
    from dagster._core.scheduler.instigation import InstigatorStatus, TickStatus

    origin, selector = sensor.get_remote_origin_id(), sensor.selector_id
    stops: list[float] = []

    def stopped_for_good() -> bool:
        state = instance.get_instigator_state(origin, selector)
        ticks = instance.get_ticks(origin, selector, limit=1)
        last = ticks[0] if ticks else None
        if (stops and state is not None and state.status == InstigatorStatus.STOPPED
                and (last is None or (last.status != TickStatus.STARTED and last.timestamp < stops[-1]))):
            return True
        stops.append(time.time())
        instance.stop_sensor(origin, selector, sensor)
        return False

    _wait(stopped_for_good, timeout, f"{sensor.name} to stay stopped", logs, step=2,
          state=lambda: f"stopped {len(stops)} time(s); state {instance.get_instigator_state(origin, selector).status}")
    return len(stops)


def _sample(instance, record: Record) -> dict[str, str]:
    statuses = {r.dagster_run.run_id: r.dagster_run.status.value for r in _runs(instance, "corpus_resync")}
    record.samples.append((time.time(), statuses))
    return statuses


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> Record:
    if find_bindir() is None:
        pytest.skip("PostgreSQL server binaries (initdb, postgres) not found: apt-get install postgresql (.ci/run installs it)")
    for binary in ("dagster", "dagster-daemon"):
        if not (BIN / binary).exists():
            pytest.skip(f"{binary} is not installed beside this Python")
    pytest.importorskip("dagster_postgres", reason="dagster-postgres is not installed (pip install 'searchsmith[deploy]')")
    pytest.importorskip("dagster_aws", reason="dagster-aws is not installed (pip install 'searchsmith[deploy]')")
    work = tmp_path_factory.mktemp("deployment")
    with ExitStack() as stack:
        monkeypatch = stack.enter_context(pytest.MonkeyPatch.context())
        pg = stack.enter_context(postgres_server())
        s3 = stack.enter_context(seaweed_s3())
        s3.client().create_bucket(Bucket=BUCKET)
        chroma_port = stack.enter_context(chroma_server(work / "chroma"))
        sites = {name: stack.enter_context(Website(work / "sites" / name)) for name in CUSTOMERS}
        yield from _run_scenario(work, pg, s3, chroma_port, sites, monkeypatch, stack)


def _environment(work: Path, pg, s3, chroma_port: int) -> dict[str, str]:
    return {
        **os.environ,
        **pg.env(),
        "DAGSTER_HOME": str(work / "dagster"),
        "SEARCHSMITH_HOME": str(work / "home"),
        "SEARCHSMITH_CUSTOMERS_DIR": str(work / "customers"),
        "SEARCHSMITH_ARTIFACTS": f"s3://{BUCKET}/artifacts",
        "SEARCHSMITH_COMPUTE_LOGS_BUCKET": BUCKET,
        "SEARCHSMITH_CHROMA_MODE": "http",
        "SEARCHSMITH_CHROMA_HOST": "127.0.0.1",
        "SEARCHSMITH_CHROMA_PORT": str(chroma_port),
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
        "AWS_DEFAULT_REGION": s3.region,
        "AWS_ENDPOINT_URL_S3": s3.endpoint_url,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "ANONYMIZED_TELEMETRY": "False",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",  # two run workers share two cores with the servers
        "DAGSTER_DISABLE_TELEMETRY": "1",
    }


def _run_scenario(work: Path, pg, s3, chroma_port: int, sites: dict, monkeypatch, stack: ExitStack):
    import dagster as dg
    import yaml

    from orchestration.instance import RunLimits, production_instance

    record = Record()
    began = time.monotonic()

    def mark(what: str) -> None:
        record.timeline.append((round(time.monotonic() - began, 1), what))
        print(f"[{record.timeline[-1][0]:6.1f}s] {what}", file=sys.stderr)

    env = _environment(work, pg, s3, chroma_port)
    for key in ("DAGSTER_HOME", "SEARCHSMITH_HOME", "SEARCHSMITH_CUSTOMERS_DIR", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "SEARCHSMITH_COMPUTE_LOGS_BUCKET", *pg.env()):
        monkeypatch.setenv(key, env[key])
    (work / "customers").mkdir()
    for name in CUSTOMERS:
        _write_customer(work / "customers", work / "corpora", name, sites[name])
    dagster_home = work / "dagster"
    dagster_home.mkdir()
    # The production file with this machine's numbers: no accelerators, so fine-tunes queue and never start.
    record.instance_config = production_instance(RunLimits(max_concurrent_runs=4, accelerators=0, dequeue_interval_seconds=1))
    (dagster_home / "dagster.yaml").write_text(yaml.safe_dump(record.instance_config), encoding="utf-8")
    (code_port,) = free_ports(1)
    workspace = work / "workspace.yaml"
    workspace.write_text(yaml.safe_dump({"load_from": [{"grpc_server": {"host": "127.0.0.1", "port": code_port, "location_name": LOCATION}}]}))
    logs = {"code server": work / "code-server.log", "daemon": work / "daemon.log", "postgres": pg.log_path}
    record.logs = logs

    code_server = _spawn([str(BIN / "dagster"), "api", "grpc", "--host", "127.0.0.1", "--port", str(code_port),
                          "--module-name", "orchestration.definitions", "--working-directory", str(ROOT),
                          "--location-name", LOCATION], env, logs["code server"])
    stack.callback(_stop, code_server)
    instance = stack.enter_context(dg.DagsterInstance.from_config(str(dagster_home)))
    assert type(instance.run_storage).__name__ == "PostgresRunStorage"
    instance.add_dynamic_partitions("customers", list(CUSTOMERS))
    _wait(lambda: _code_server_ready(code_port) or (code_server.poll() is not None and pytest.fail(log_tail(logs["code server"]))),
          120, "the code server", logs)
    mark("code server ready")
    resync_sensors = _start_instigators(instance, code_port, started_ago_s=90)
    # The forced tick fires as the daemon starts (give it 8 s); the crons' next tick (the second
    # resync of each customer) comes at the next minute, within 30 s, and the sensor requests it
    # within its 30 s interval, while the first resyncs still crawl (at least 30 s).
    to_next_minute = 60 - time.time() % 60
    if not 8 <= to_next_minute <= 30:
        time.sleep((to_next_minute - 20) % 60)

    daemon_command = [str(BIN / "dagster-daemon"), "run", "--workspace", str(workspace)]
    daemon = _spawn(daemon_command, env, logs["daemon"])
    stack.callback(lambda: _stop(daemon))
    mark("daemon started")

    def scheduled_enough():
        counts = Counter(_customer(r) for r in _runs(instance, "corpus_resync"))
        return all(counts[name] >= RUNS_PER_CUSTOMER for name in CUSTOMERS)

    _wait(lambda: _sample(instance, record) is not None and scheduled_enough(), 150, "two scheduled resyncs per customer", logs)
    stops = [_stop_sensor(instance, sensor, logs) for sensor in resync_sensors]
    mark(f"two resyncs per customer scheduled; resync sensor stopped (stops needed: {stops})")

    # Kill the daemon while the changed customer's first resync runs and its second waits in the
    # queue, at a moment the queue cannot be launching anything: no run is between the queue and
    # its worker (a daemon killed there leaves the run STARTING until run monitoring fails it,
    # minutes later), and every customer with a queued run has one running, so the per-customer
    # limit holds the whole queue. Under load the two first resyncs can start seconds apart.
    def running_with_one_queued():
        statuses = _sample(instance, record)
        owner = {r.dagster_run.run_id: _customer(r) for r in _runs(instance, "corpus_resync")}
        if any(status in ("NOT_STARTED", "STARTING") for status in statuses.values()):
            return None
        running = {owner.get(run_id): run_id for run_id, status in statuses.items() if status == "STARTED"}
        waiting = {owner.get(run_id) for run_id, status in statuses.items() if status == "QUEUED"}
        if record.changed_customer not in waiting or not waiting <= running.keys():
            return None
        return running[record.changed_customer]

    record.killed_run = _wait(running_with_one_queued, 120, f"a resync of {record.changed_customer} running with another queued", logs)
    _stop(daemon, first=signal.SIGKILL)
    record.killed_at = time.time()
    mark("daemon killed")
    queued_before = {run_id for run_id, status in _sample(instance, record).items() if status == "QUEUED"}

    def killed_run_done():
        return _sample(instance, record).get(record.killed_run) in ("SUCCESS", "FAILURE", "CANCELED")

    _wait(killed_run_done, 180, "the run in progress to finish without the daemon", logs, state=lambda: _unfinished_runs(instance))
    mark("the run in progress finished without the daemon")
    time.sleep(3)  # longer than the dequeue interval: a live queue would have started the next run
    final_down = _sample(instance, record)
    record.queued_while_down = queued_before
    record.started_while_down = {run_id for run_id in queued_before if final_down.get(run_id) != "QUEUED"}
    # The corpus changes while the daemon is down: 3 of its 8 documents deleted (37.5% > the 20% share).
    corpus = work / "corpora" / record.changed_customer
    for path in sorted(corpus.glob("*.md"))[:3]:
        path.unlink()
    daemon = _spawn(daemon_command, env, logs["daemon"])
    record.restarted_at = time.time()
    mark("daemon restarted")
    stack.callback(lambda: _stop(daemon))

    def resyncs_finished():
        statuses = _sample(instance, record)
        return statuses and all(status in ("SUCCESS", "FAILURE", "CANCELED") for status in statuses.values())

    _wait(resyncs_finished, 240, "every resync to finish", logs, state=lambda: _unfinished_runs(instance))
    mark("resyncs finished")
    last_sync = max(r.timestamp for r in instance.fetch_materializations(dg.AssetKey("raw_documents"), limit=100).records)

    def sensor_caught_up():
        """A tick that began after the last resync's documents were recorded (it saw them all),
        and a tick after the last one that requested runs (it must have requested nothing)."""
        ticks = [t for t in _sensor_ticks(instance) if t.status.value in ("SUCCESS", "SKIPPED")]
        requesting = [t.timestamp for t in ticks if t.run_ids]
        saw_all = any(t.timestamp > last_sync for t in ticks)
        return saw_all and requesting and any(t.timestamp > max(requesting) for t in ticks)

    _wait(sensor_caught_up, 200, "the corpus change sensor to see every resync and tick once more", logs, step=2)
    mark("sensor caught up")
    record.sensor_ticks = _sensor_ticks(instance)
    record.resyncs = list(_runs(instance, "corpus_resync"))
    record.finetunes = list(_runs(instance, "customer_finetune"))
    _collect_artifacts(record, instance, s3, chroma_port)
    yield record


def _sensor_ticks(instance):
    from dagster._core.definitions.run_request import InstigatorType

    states = [s for s in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR) if s.name == "corpus_change_sensor"]
    return [tick for state in states for tick in instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=50)]


def _collect_artifacts(record: Record, instance, s3, chroma_port: int) -> None:
    import io

    import dagster as dg
    import polars as pl

    from search.chroma_client import http_client

    client = s3.client()
    keys = [item["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET) for item in page.get("Contents", [])]
    record.artifact_keys = [key for key in keys if key.startswith("artifacts/")]
    record.compute_log_keys = [key for key in keys if key.startswith("dagster/compute-logs/")]
    chroma = http_client("127.0.0.1", chroma_port)
    for name in CUSTOMERS:
        body = client.get_object(Bucket=BUCKET, Key=f"artifacts/{name}/corpus/chunks.parquet")["Body"].read()
        record.chunk_rows[name] = pl.read_parquet(io.BytesIO(body)).height
        latest = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey("chroma_index"), asset_partitions=[name]), limit=1, ascending=False)
        metadata = latest.records[0].asset_materialization.metadata
        assert metadata["chroma_mode"].value == "http"
        record.chroma_counts[name] = chroma.get_collection(metadata["collection"].value).count()


# --- the properties ---------------------------------------------------------------------------


def test_instance_is_the_production_file_on_postgres(scenario):
    from orchestration.instance import production_instance

    expected = production_instance()
    assert scenario.instance_config["storage"] == expected["storage"]
    assert scenario.instance_config["run_coordinator"]["class"] == "QueuedRunCoordinator"
    assert scenario.instance_config["compute_logs"] == expected["compute_logs"]


def test_due_schedules_queue_resyncs_that_run_to_success(scenario):
    counts = Counter(_customer(r) for r in scenario.resyncs)
    assert all(counts[name] >= RUNS_PER_CUSTOMER for name in CUSTOMERS), counts
    for run in scenario.resyncs:
        tags = run.dagster_run.tags
        assert run.dagster_run.status.value == "SUCCESS", (run.dagster_run.run_id, tags)
        assert tags.get("dagster/sensor_name") == "customer_resync_sensor" and tags.get("searchsmith/trigger") == "schedule"
        assert tags.get("searchsmith/resync") == _customer(run), "the per-customer limit's tag"
    owner = {r.dagster_run.run_id: _customer(r) for r in scenario.resyncs}
    queued_together = [statuses for _, statuses in scenario.samples
                       if {owner.get(run_id) for run_id, status in statuses.items() if status == "QUEUED"} == set(CUSTOMERS)]
    assert queued_together, "no moment with both customers' resyncs waiting in the queue"


def test_one_resync_per_customer_at_a_time_but_customers_in_parallel(scenario):
    by_customer: dict[str, list] = {}
    for run in scenario.resyncs:
        by_customer.setdefault(_customer(run), []).append((run.start_time, run.end_time, run.dagster_run.run_id))
    for name, spans in by_customer.items():
        spans.sort()
        for (start_a, end_a, a), (start_b, _, b) in zip(spans, spans[1:]):
            assert end_a <= start_b, f"{name}: {b} started at {start_b} before {a} ended at {end_a}"
    owner = {r.dagster_run.run_id: _customer(r) for r in scenario.resyncs}
    for _, statuses in scenario.samples:  # the same from every poll of the run records
        running = Counter(owner.get(run_id) for run_id, status in statuses.items() if status == "STARTED")
        assert all(n <= 1 for n in running.values()), running
    alpha, beta = by_customer["alpha"], by_customer["beta"]
    assert any(a0 < b1 and b0 < a1 for a0, a1, _ in alpha for b0, b1, _ in beta), "different customers never ran together"


def test_artifacts_in_s3_index_in_the_chroma_server_and_logs_in_s3(scenario):
    for name in CUSTOMERS:
        assert f"artifacts/{name}/corpus/raw_documents.parquet" in scenario.artifact_keys
        assert f"artifacts/{name}/corpus/chunks.parquet" in scenario.artifact_keys
        assert any(key.startswith(f"artifacts/{name}/index/bm25/") for key in scenario.artifact_keys), "the BM25 index's durable copy"
        assert scenario.chunk_rows[name] > 0
        assert scenario.chroma_counts[name] == scenario.chunk_rows[name], (name, scenario.chroma_counts, scenario.chunk_rows)
    assert scenario.compute_log_keys, "no step logs were uploaded to the compute-log bucket"


def test_corpus_change_sensor_requests_one_finetune_per_qualifying_resync(scenario):
    requested = Counter(_customer(r) for r in scenario.finetunes)
    # alpha: its first sync (everything new) and the 37.5% change; beta: its first sync only.
    assert requested == {"alpha": 2, "beta": 1}, requested
    run_keys = [r.dagster_run.tags.get("dagster/run_key") for r in scenario.finetunes]
    assert all(key and key.startswith("retrain:") for key in run_keys) and len(set(run_keys)) == len(run_keys)
    for run in scenario.finetunes:
        assert run.dagster_run.tags.get("dagster/sensor_name") == "corpus_change_sensor"
        assert run.dagster_run.tags.get("searchsmith/finetune") == _customer(run)
        assert run.dagster_run.status.value == "QUEUED", "no accelerators: a fine-tune must wait in the queue"
    last_request = max(r.create_timestamp.timestamp() for r in scenario.finetunes)
    later = [t for t in scenario.sensor_ticks if t.timestamp > last_request + 1]
    assert later and all(not t.run_ids for t in later), "a later sensor tick launched runs"


def test_killing_the_daemon_mid_run_loses_and_duplicates_nothing(scenario):
    assert scenario.killed_run and scenario.queued_while_down, "the daemon was not killed with a run in progress and one queued"
    assert not scenario.started_while_down, "a queued run started with no daemon running"
    status = {r.dagster_run.run_id: r.dagster_run.status.value for r in scenario.resyncs}
    assert status[scenario.killed_run] == "SUCCESS"
    assert all(status[run_id] == "SUCCESS" for run_id in scenario.queued_while_down)
    run_keys = Counter(r.dagster_run.tags.get("dagster/run_key") for r in scenario.resyncs + scenario.finetunes)
    assert all(n == 1 for n in run_keys.values()), f"a run key launched twice: {run_keys}"
    resumed = [r for r in scenario.resyncs if r.start_time and r.start_time > scenario.restarted_at]
    assert resumed, "no queued run started after the daemon came back"
