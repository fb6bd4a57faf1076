"""The HTTP search service: keys hashed at rest, auth and isolation, limits, malformed bodies,
the OpenAPI document and the request logs, against two small real indexes (hash embedder,
heuristic policy), over Starlette's TestClient and once over a real uvicorn socket.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import httpx
import pytest
import uvicorn
from starlette.testclient import TestClient

from search.chroma_client import persistent_client
from search.index import IndexNotBuilt
from serving import api_keys as api_keys_module
from serving.api import ApiLimits, IndexCache, create_app
from serving.api_keys import ApiKeyStore, create_key
from serving.search import PolicyFailed, run_search
from tests.test_index import DATA, HashEmbedder, chunk_table, make_index

CUSTOMERS = {"acme", "beta"}


@pytest.fixture(scope="module")
def records() -> list[dict]:
    return [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def indexes(records, tmp_path_factory):
    """Two customers with disjoint corpora; doc ids carry the customer so leaks are visible."""
    root = tmp_path_factory.mktemp("api-indexes")
    client = persistent_client(root / "chroma")
    built = {}
    for customer, part in (("acme", records[:3]), ("beta", records[3:6])):
        index = make_index(client, root, customer, HashEmbedder())
        index.build_or_update(chunk_table(part, doc_prefix=f"{customer}-"))
        built[customer] = index
    return built


@pytest.fixture
def fresh_keys(tmp_path) -> ApiKeyStore:
    return ApiKeyStore(tmp_path / "keys" / "api_keys.json")


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> ApiKeyStore:
    """Shared by the tests that only read keys; tests that revoke use `fresh_keys`."""
    return ApiKeyStore(tmp_path_factory.mktemp("keys") / "api_keys.json")


@pytest.fixture(scope="module")
def issued(keys) -> dict[str, str]:
    return {customer: keys.create_key(customer) for customer in ("acme", "beta", "ghost")}


class Opener:
    """`open_index` that records which customers were opened."""

    def __init__(self, indexes):
        self.indexes, self.opened = indexes, []

    def __call__(self, customer):
        self.opened.append(customer)
        if customer not in self.indexes:
            raise IndexNotBuilt(f"no collection for {customer}")
        return self.indexes[customer]


def make_client(keys, indexes, limits=ApiLimits(), opener=None) -> TestClient:
    app = create_app(keys, lambda: set(CUSTOMERS), opener or Opener(indexes), lambda customer: "heuristic", limits)
    return TestClient(app)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# -- keys --------------------------------------------------------------------------------------


def test_keys_are_hashed_at_rest_and_verified_to_their_customer(fresh_keys):
    key = fresh_keys.create_key("acme")
    prefix, key_id, secret = key.split("_", 2)
    assert prefix == "ssk" and len(secret) >= 32
    stored = fresh_keys.path.read_text()
    assert key not in stored and secret not in stored
    assert stat.S_IMODE(os.stat(fresh_keys.path).st_mode) == 0o600
    record = json.loads(stored)["keys"][key_id]
    assert record["customer"] == "acme" and record["salt"] and record["hash"] and record["created_at"]
    assert fresh_keys.verify(key) == "acme"
    assert fresh_keys.verify(f"ssk_{key_id}_{'A' * len(secret)}") is None  # right id, wrong secret
    assert fresh_keys.verify("ssk_000000000000_" + secret) is None  # unknown id
    for garbage in ("", "Bearer x", key + "!", key.replace("ssk_", "sk_")):
        assert fresh_keys.verify(garbage) is None
    listed = fresh_keys.list()
    assert [(info.key_id, info.customer) for info in listed] == [(key_id, "acme")]
    assert secret not in repr(listed)


def test_two_keys_for_one_customer_get_their_own_salts_and_hashes(fresh_keys):
    first, second = fresh_keys.create_key("acme"), fresh_keys.create_key("acme")
    stored = json.loads(fresh_keys.path.read_text())["keys"]
    assert first != second and len(stored) == 2
    assert len({r["salt"] for r in stored.values()}) == 2 and len({r["hash"] for r in stored.values()}) == 2


def test_revocation_and_new_keys_reach_a_running_store(fresh_keys):
    server_side = ApiKeyStore(fresh_keys.path)  # what `searchsmith api` holds while `keys ...` runs
    key = fresh_keys.create_key("acme")
    assert server_side.verify(key) == "acme"
    assert fresh_keys.revoke(key.split("_")[1]) is True and fresh_keys.revoke(key.split("_")[1]) is False
    assert server_side.verify(key) is None and server_side.list() == []


def test_default_key_file_lives_under_searchsmith_home(searchsmith_home):
    key = create_key("acme")
    assert ApiKeyStore().verify(key) == "acme"
    assert (searchsmith_home / "api_keys.json").exists()


def test_customer_names_are_checked_on_create(fresh_keys):
    with pytest.raises(ValueError):
        fresh_keys.create_key("Acme Corp")


# -- a real search -----------------------------------------------------------------------------


@contextmanager
def served(app):
    """The app behind a real uvicorn on an ephemeral loopback port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def test_search_over_a_real_socket_answers_like_the_cli(keys, issued, indexes, records):
    question = records[0]["question"]
    app = create_app(keys, lambda: set(CUSTOMERS), Opener(indexes), lambda customer: "heuristic", ApiLimits(max_body_bytes=2048))
    with served(app) as base, httpx.Client(base_url=base, timeout=60) as http:
        assert http.get("/healthz").json()["status"] == "ok"
        reply = http.post("/v1/search", json={"customer": "acme", "query": question, "k": 3}, headers=auth(issued["acme"]))
        # a body without a Content-Length (chunked) is cut off at the limit too
        chunked = http.post("/v1/search", content=(b"x" * 1024 for _ in range(4)), headers={**auth(issued["acme"]), "Content-Type": "application/json"})
    assert reply.status_code == 200, reply.text
    payload = reply.json()
    assert payload["customer"] == "acme" and payload["policy"] == "heuristic"
    assert 1 <= len(payload["documents"]) <= 3
    for document in payload["documents"]:
        assert set(document) == {"doc_id", "chunk_id", "title", "justification"}
        assert document["doc_id"].startswith("acme-") and document["title"]
    assert set(payload["summary"]) == {"turns", "tool_calls", "peak_tokens", "pruned"} and payload["summary"]["turns"] >= 1
    cli = run_search(indexes["acme"], question, "heuristic", 3).as_dict()
    assert payload["documents"] == cli["documents"] and payload["summary"] == cli["summary"]
    assert chunked.status_code == 413 and chunked.json()["error"] == "body_too_large"


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestration.cli", *args], env=env, capture_output=True, text=True, timeout=300)


def test_keys_list_and_revoke_from_the_cli_reach_a_running_service(searchsmith_home, tmp_path, indexes, records):
    folder = tmp_path / "customers"
    folder.mkdir()
    (folder / "docs").mkdir()
    for name in ("acme", "beta"):
        (folder / f"{name}.yaml").write_text(f"name: {name}\nsources:\n  - {{type: local, path: ./docs}}\n")
    env = {**os.environ, "SEARCHSMITH_CUSTOMERS_DIR": str(folder)}
    created = [json.loads(_cli("keys", "create", name, "--json", env=env).stdout) for name in ("acme", "acme", "beta")]
    store = ApiKeyStore()  # what `searchsmith api` holds: the default file under SEARCHSMITH_HOME
    app = create_app(store, lambda: set(CUSTOMERS), Opener(indexes), lambda customer: "heuristic")
    body = {"customer": "acme", "query": records[0]["question"], "k": 2}
    with served(app) as base, httpx.Client(base_url=base, timeout=60) as http:
        assert http.post("/v1/search", json=body, headers=auth(created[0]["key"])).status_code == 200

        listed = _cli("keys", "list", "acme", "--json", env=env)
        assert listed.returncode == 0, listed.stderr[-2000:]
        payload = json.loads(listed.stdout)  # exactly one JSON object on stdout
        assert sorted(k["key_id"] for k in payload["keys"]) == sorted(c["key_id"] for c in created[:2])
        assert all(set(k) == {"key_id", "created_at"} and k["created_at"] for k in payload["keys"])
        stored = json.loads(store.path.read_text())["keys"]
        secrets_ = [c["key"] for c in created] + [c["key"].split("_", 2)[2] for c in created] + [r[f] for r in stored.values() for f in ("hash", "salt")]
        human = _cli("keys", "list", "acme", env=env).stdout
        assert created[0]["key_id"] in human and not [s for s in secrets_ if s in listed.stdout + human]

        revoked = _cli("keys", "revoke", created[0]["key_id"], "--json", env=env)
        assert revoked.returncode == 0 and json.loads(revoked.stdout) == {"revoked": created[0]["key_id"], "customer": "acme"}
        # the running service refuses the revoked key at once; the customer's other key still works
        assert http.post("/v1/search", json=body, headers=auth(created[0]["key"])).status_code == 401
        assert http.post("/v1/search", json=body, headers=auth(created[1]["key"])).status_code == 200
    again = _cli("keys", "revoke", created[0]["key_id"], "--json", env=env)
    assert again.returncode == 1 and created[0]["key_id"] in json.loads(again.stdout)["error"]
    assert [k["key_id"] for k in json.loads(_cli("keys", "list", "acme", "--json", env=env).stdout)["keys"]] == [created[1]["key_id"]]
    unknown = _cli("keys", "list", "nobody", "--json", env=env)
    assert unknown.returncode == 1 and "unknown customer" in json.loads(unknown.stdout)["error"]


# -- auth and isolation ------------------------------------------------------------------------


def test_missing_bad_and_foreign_keys(fresh_keys, indexes):
    keys = fresh_keys
    issued = {customer: keys.create_key(customer) for customer in ("acme", "beta")}
    body = {"customer": "acme", "query": "who?", "k": 2}
    with make_client(keys, indexes) as client:
        missing = client.post("/v1/search", json=body)
        assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
        assert missing.json()["error"] == "missing_key"
        for header in ({"Authorization": "Bearer ssk_nope"}, {"Authorization": f"Basic {issued['acme']}"}, auth(issued["acme"][:-2])):
            assert client.post("/v1/search", json=body, headers=header).status_code == 401
        foreign = client.post("/v1/search", json=body, headers=auth(issued["beta"]))
        assert foreign.status_code == 403 and foreign.json()["error"] == "forbidden"
        keys.revoke(issued["acme"])
        assert client.post("/v1/search", json=body, headers=auth(issued["acme"])).status_code == 401


def test_each_key_sees_only_its_customers_index(keys, issued, indexes, records):
    opener = Opener(indexes)
    with make_client(keys, indexes, opener=opener) as client:
        reply = client.post("/v1/search", json={"customer": "beta", "query": records[0]["question"], "k": 5}, headers=auth(issued["beta"]))
        assert reply.status_code == 200, reply.text
        assert reply.json()["documents"] and all(d["doc_id"].startswith("beta-") for d in reply.json()["documents"])
        # a key for acme asking about a customer that does not exist learns nothing: 403, not 404
        assert client.post("/v1/search", json={"customer": "zzz", "query": "q"}, headers=auth(issued["acme"])).status_code == 403
        unknown = client.post("/v1/search", json={"customer": "ghost", "query": "q"}, headers=auth(issued["ghost"]))
        assert unknown.status_code == 404 and unknown.json()["error"] == "unknown_customer"
    assert opener.opened == ["beta"]


# -- limits ------------------------------------------------------------------------------------


def test_body_over_the_limit_is_413(keys, issued, indexes):
    with make_client(keys, indexes, ApiLimits(max_body_bytes=256)) as client:
        reply = client.post("/v1/search", json={"customer": "acme", "query": "x" * 400}, headers=auth(issued["acme"]))
    assert reply.status_code == 413 and "256 bytes" in reply.json()["message"]


class GatedIndex:
    """A real index whose searches wait until the test opens the gate."""

    def __init__(self, inner):
        self.inner, self.gate = inner, threading.Event()

    def search(self, *args, **kwargs):
        self.gate.wait(30)
        return self.inner.search(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_slow_search_is_504_keeps_its_slot_then_frees_it(keys, issued, indexes, records):
    gated = GatedIndex(indexes["acme"])
    limits = ApiLimits(search_timeout_s=0.3, max_concurrent_searches=1, max_queued_searches=0)
    body = {"customer": "acme", "query": records[1]["question"], "k": 2}
    with make_client(keys, {"acme": gated}, limits) as client:
        try:
            slow = client.post("/v1/search", json=body, headers=auth(issued["acme"]))
            assert slow.status_code == 504 and slow.json()["error"] == "timeout"
            busy = client.post("/v1/search", json=body, headers=auth(issued["acme"]))  # the timed-out search still runs
            assert busy.status_code == 503 and busy.json()["error"] == "busy" and busy.headers["retry-after"]
        finally:
            gated.gate.set()
        assert client.app.state.slots.wait_idle(30)
        after = client.post("/v1/search", json=body, headers=auth(issued["acme"]))
    # the slot came back; whether this real search beats the tiny deadline depends on the machine
    assert after.status_code == 200 or after.json()["error"] == "timeout", after.text


def wait_until(condition, timeout_s: float = 30.0) -> None:
    """Poll a condition a bounded number of times (the test fails rather than hangs)."""
    for _ in range(int(timeout_s / 0.02)):
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached")


def test_requests_queue_behind_busy_workers_and_503_only_when_the_queue_is_full(keys, issued, indexes, records):
    gated = GatedIndex(indexes["acme"])
    app = create_app(keys, lambda: set(CUSTOMERS), Opener({"acme": gated}), lambda customer: "heuristic",
                     ApiLimits(max_concurrent_searches=1, max_queued_searches=1, retry_after_s=3))
    body = {"customer": "acme", "query": records[1]["question"], "k": 2}
    replies: dict[str, httpx.Response] = {}
    with served(app) as base, httpx.Client(base_url=base, timeout=60) as http:

        def post(name: str) -> None:
            replies[name] = http.post("/v1/search", json=body, headers=auth(issued["acme"]))

        threads = {}
        try:
            for name, admitted in (("running", 1), ("queued", 2)):
                threads[name] = threading.Thread(target=post, args=(name,), daemon=True)
                threads[name].start()
                wait_until(lambda: app.state.slots.active == admitted)
            full = http.post("/v1/search", json=body, headers=auth(issued["acme"]))
            assert http.get("/healthz").json() == {"status": "ok", "searches_in_flight": 2, "workers": 1, "queue": 1}
        finally:
            gated.gate.set()
            for thread in threads.values():
                thread.join(60)
    assert full.status_code == 503 and full.json()["error"] == "busy" and full.headers["retry-after"] == "3"
    assert replies["running"].status_code == 200 and replies["queued"].status_code == 200, {k: r.text for k, r in replies.items()}


def test_a_rejected_request_pays_for_no_key_hash_and_no_registry_read(keys, issued, indexes, records, monkeypatch):
    """Header shape, body size, body and queue admission come before scrypt and the customer registry."""
    derived, registry_reads = [], []
    real_derive = api_keys_module._derive
    monkeypatch.setattr(api_keys_module, "_derive", lambda *args: derived.append(1) or real_derive(*args))

    def known_customers():
        registry_reads.append(1)
        return set(CUSTOMERS)

    gated = GatedIndex(indexes["acme"])
    app = create_app(keys, known_customers, Opener({"acme": gated}), lambda customer: "heuristic",
                     ApiLimits(max_body_bytes=512, max_concurrent_searches=1, max_queued_searches=0))
    body = {"customer": "acme", "query": records[1]["question"], "k": 2}
    with served(app) as base, httpx.Client(base_url=base, timeout=60) as http:
        running = threading.Thread(target=http.post, args=("/v1/search",), kwargs={"json": body, "headers": auth(issued["acme"])}, daemon=True)
        try:
            running.start()
            wait_until(lambda: app.state.slots.active == 1)
            wait_until(lambda: len(registry_reads) == 1)  # the admitted search got past its checks
            derived.clear(), registry_reads.clear()
            rejected = [
                http.post("/v1/search", json=body, headers={"Authorization": "Bearer not-a-key"}),
                http.post("/v1/search", json={**body, "query": "x" * 600}, headers=auth(issued["acme"])),
                http.post("/v1/search", json={**body, "k": 0}, headers=auth(issued["acme"])),
                http.post("/v1/search", json=body, headers=auth(issued["acme"])),  # no free worker, no queue
            ]
        finally:
            gated.gate.set()
            running.join(60)
    assert [reply.status_code for reply in rejected] == [401, 413, 422, 503]
    assert derived == [] and registry_reads == []


def test_eight_clients_of_twenty_five_requests_are_all_answered(keys, issued, indexes, records):
    """Loopback load with the heuristic policy and the default limits: nothing is turned away.
    (Throughput and latency figures: bench/api_load.py; no timing is asserted here.)"""
    app = create_app(keys, lambda: set(CUSTOMERS), Opener(indexes), lambda customer: "heuristic")
    questions = [record["question"] for record in records[:3]]
    statuses: list[int] = []
    lock = threading.Lock()
    with served(app) as base:

        def client(number: int) -> None:
            with httpx.Client(base_url=base, timeout=120) as http:
                for i in range(25):
                    body = {"customer": "acme", "query": questions[(number + i) % len(questions)], "k": 3}
                    status = http.post("/v1/search", json=body, headers=auth(issued["acme"])).status_code
                    with lock:
                        statuses.append(status)

        threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
    assert len(statuses) == 200 and set(statuses) == {200}, {status: statuses.count(status) for status in set(statuses)}


def test_index_not_built_is_503_and_not_remembered(keys, issued, indexes, records):
    available: dict = {}
    with make_client(keys, indexes, opener=Opener(available)) as client:
        body = {"customer": "acme", "query": records[0]["question"], "k": 2}
        reply = client.post("/v1/search", json=body, headers=auth(issued["acme"]))
        assert reply.status_code == 503 and reply.json()["error"] == "index_not_built"
        assert "searchsmith sync acme" in reply.json()["message"]
        available["acme"] = indexes["acme"]  # `searchsmith sync acme` ran meanwhile
        assert client.post("/v1/search", json=body, headers=auth(issued["acme"])).status_code == 200


def closed_port() -> int:
    """A loopback port nothing listens on: a model endpoint that is down."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_failed_policy_is_502_not_an_empty_answer(keys, issued, indexes, records):
    down = f"openai:http://127.0.0.1:{closed_port()}/v1#served-model"
    app = create_app(keys, lambda: set(CUSTOMERS), Opener(indexes), lambda customer: down)
    with TestClient(app) as client:
        reply = client.post("/v1/search", json={"customer": "acme", "query": records[0]["question"]}, headers=auth(issued["acme"]))
    assert reply.status_code == 502 and reply.json()["error"] == "policy_failed"
    with pytest.raises(PolicyFailed, match="served-model"):  # the CLI's path: the same error, never an empty answer
        run_search(indexes["acme"], records[0]["question"], down, 3)


def test_a_failing_dependency_is_a_500_that_hides_its_details(keys, issued, indexes, caplog):
    def broken_policy_lookup(customer):
        raise RuntimeError("manifest at /srv/secret/path is corrupt")

    caplog.set_level(logging.INFO, logger="searchsmith.api")
    app = create_app(keys, lambda: set(CUSTOMERS), Opener(indexes), broken_policy_lookup)
    with TestClient(app) as client:
        reply = client.post("/v1/search", json={"customer": "acme", "query": "q"}, headers=auth(issued["acme"]))
    assert reply.status_code == 500 and reply.json()["error"] == "internal" and "/srv" not in reply.text
    logged = json.loads(caplog.records[-1].getMessage())
    assert logged["status"] == 500 and logged["cause"] == "RuntimeError" and "corrupt" in logged["traceback"]


def test_index_cache_opens_each_customer_once_and_reopens_after_its_ttl():
    now, opened, gate = [0.0], [], threading.Event()

    def slow_open(customer):
        gate.wait(10)
        opened.append(customer)
        return object()

    cache = IndexCache(slow_open, ttl_s=60, clock=lambda: now[0])
    threads = [threading.Thread(target=cache.get, args=("acme",)) for _ in range(6)]
    for thread in threads:
        thread.start()
    gate.set()
    for thread in threads:
        thread.join(10)
    assert opened == ["acme"]
    first = cache.get("acme")
    now[0] = 61.0
    assert cache.get("acme") is not first and opened == ["acme", "acme"]


# -- malformed requests ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{not json", "body"),
        (b"", "body"),
        (b"[1, 2]", "body"),
        (b'{"customer": "acme", "k": 3}', "query"),
        (b'{"query": "who?"}', "customer"),
        (b'{"customer": "acme", "query": ""}', "query"),
        (b'{"customer": "acme", "query": "   "}', "query"),
        (b'{"customer": "acme", "query": 42}', "query"),
        (b'{"customer": "acme", "query": "q", "k": 0}', "k"),
        (b'{"customer": "acme", "query": "q", "k": 51}', "k"),
        (b'{"customer": "acme", "query": "q", "k": "3"}', "k"),
        (b'{"customer": "acme", "query": "q", "k": 2.5}', "k"),
        (b'{"customer": "acme", "query": "q", "k": true}', "k"),
        (b'{"customer": "ACME", "query": "q"}', "customer"),
        (b'{"customer": "acme", "query": "q", "policy": "openai:x"}', "policy"),
    ],
)
def test_malformed_bodies_are_422_and_name_the_field(keys, issued, indexes, body, field):
    with make_client(keys, indexes) as client:
        reply = client.post("/v1/search", content=body, headers={**auth(issued["acme"]), "Content-Type": "application/json"})
    assert reply.status_code == 422, reply.text
    payload = reply.json()
    assert payload["error"] == "invalid_request" and payload["message"].startswith("invalid request")
    assert any(f["field"] == field or (field == "body" and f["field"] in ("body", "")) for f in payload["fields"]), payload


def test_unknown_paths_and_methods_answer_in_json(keys, indexes):
    with make_client(keys, indexes) as client:
        assert client.get("/v2/nothing").json()["error"] == "not_found"
        wrong = client.get("/v1/search")
    assert wrong.status_code == 405 and wrong.json()["error"] == "method_not_allowed"


# -- OpenAPI and logs --------------------------------------------------------------------------


def test_openapi_document_is_valid_and_describes_the_search(keys, issued, indexes, records):
    jsonschema = pytest.importorskip("jsonschema")
    with make_client(keys, indexes, ApiLimits(max_k=20)) as client:
        document = client.get("/openapi.json").json()
        answer = client.post("/v1/search", json={"customer": "acme", "query": records[2]["question"], "k": 2}, headers=auth(issued["acme"])).json()
        error = client.post("/v1/search", json={"customer": "acme", "query": ""}, headers=auth(issued["acme"])).json()
    try:
        from openapi_spec_validator import validate
    except ImportError:
        validate = None
    if validate is not None:
        validate(document)
    assert document["openapi"].startswith("3.")
    operation = document["paths"]["/v1/search"]["post"]
    assert operation["security"] == [{"bearerAuth": []}]
    assert document["components"]["securitySchemes"]["bearerAuth"] == {**document["components"]["securitySchemes"]["bearerAuth"], "type": "http", "scheme": "bearer"}
    assert {"200", "401", "403", "404", "413", "422", "503", "504"} <= set(operation["responses"])
    schemas = document["components"]["schemas"]
    request = schemas["SearchRequest"]
    assert set(request["required"]) == {"customer", "query"} and request["properties"]["k"]["maximum"] == 20
    # live answers match the schemas they are documented with
    for instance, name in ((answer, "SearchResult"), (error, "ErrorBody")):
        jsonschema.validate(instance, {"$ref": f"#/components/schemas/{name}", "components": document["components"]})


def test_one_json_log_line_per_request_without_secrets(keys, issued, indexes, records, caplog):
    caplog.set_level(logging.INFO, logger="searchsmith.api")
    with make_client(keys, indexes) as client:
        client.post("/v1/search", json={"customer": "acme", "query": records[0]["question"], "k": 2}, headers=auth(issued["acme"]))
        client.post("/v1/search", json={"customer": "acme", "query": "q"}, headers=auth(issued["beta"]))
        client.post("/v1/search", json={"customer": "acme", "query": "q"}, headers=auth(issued["acme"] + "x"))
    lines = [json.loads(record.getMessage()) for record in caplog.records if record.name == "searchsmith.api"]
    assert [line["status"] for line in lines] == [200, 403, 401]
    ok = lines[0]
    assert ok["customer"] == "acme" and ok["k"] == 2 and ok["turns"] >= 1 and ok["latency_ms"] >= 0 and ok["path"] == "/v1/search"
    assert lines[1]["error"] == "forbidden"
    stored = json.loads(keys.path.read_text())["keys"]
    secrets_ = [*issued.values(), *(key.split("_", 2)[2] for key in issued.values()), *(r["hash"] for r in stored.values()), *(r["salt"] for r in stored.values())]
    text = caplog.text + "".join(json.dumps(line) for line in lines)
    assert not [secret for secret in secrets_ if secret in text]


def test_a_bad_limit_is_named_by_its_flag_or_field():
    """`searchsmith api --timeout -1` said '--workers must be at least 1' before: each bad limit
    is now named, by the flag a person typed or the field a program set."""
    from serving.service_wiring import api_limits

    with pytest.raises(ValueError, match=r"^--timeout -1 must be positive \(seconds\)$"):
        api_limits(timeout_s=-1)
    with pytest.raises(ValueError, match=r"^--workers 0 must be at least 1; --queue -2 cannot be negative$"):
        api_limits(workers=0, queue=-2)
    assert api_limits(30, 2, 0) == ApiLimits(search_timeout_s=30, max_concurrent_searches=2, max_queued_searches=0)
    with pytest.raises(ValueError, match=r"^max_k 0 must be positive; search_timeout_s 0 must be positive$"):
        ApiLimits(max_k=0, search_timeout_s=0)
