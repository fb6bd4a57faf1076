"""The trajectory viewer (issue 17): `GET /` of the search service serves a page that needs nothing
but the service, `POST /v1/search` returns the trajectory when asked, and in headless Chromium a
person's search through the page renders the ranked documents and the turns, and a saved
trajectory file opens in the same page. A real uvicorn server on loopback over a small real index
(hash embedder, heuristic policy)."""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from agent.trajectory import Trajectory, write_jsonl
from search.chroma_client import persistent_client
from serving.api import create_app
from serving.api_keys import ApiKeyStore
from serving.search import run_search
from tests.support.chromium import Browser, chromium_path
from tests.test_index import DATA, HashEmbedder, chunk_table, make_index

QUESTION = "Who is the father of the person who fulfilled the warning beware the man with one sandal?"


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    records = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    root = tmp_path_factory.mktemp("viewer-index")
    built = make_index(persistent_client(root / "chroma"), root, "acme", HashEmbedder())
    built.build_or_update(chunk_table(records[:3]))
    return built


@pytest.fixture(scope="module")
def service(index, tmp_path_factory):
    """The search service on a free loopback port; stopped after the module."""
    keys = ApiKeyStore(tmp_path_factory.mktemp("viewer-keys") / "api_keys.json")
    key = keys.create_key("acme")
    app = create_app(keys, lambda: {"acme"}, lambda customer: index, lambda customer: "heuristic")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, name="viewer-test-api", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the search service did not start"
        time.sleep(0.1)
    yield {"url": f"http://127.0.0.1:{port}", "key": key}
    server.should_exit = True
    thread.join(timeout=30)
    assert not thread.is_alive(), "the search service did not stop"


def search(service, **body) -> httpx.Response:
    return httpx.post(f"{service['url']}/v1/search", json={"customer": "acme", "query": QUESTION, "k": 3, **body},
                      headers={"Authorization": f"Bearer {service['key']}"}, timeout=120)


# -- the page and the API ----------------------------------------------------------------------


def test_the_page_needs_nothing_but_the_service(service):
    page = httpx.get(f"{service['url']}/", timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy and "connect-src 'self'" in policy
    linked = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sorted(linked) == ["/viewer/viewer.css", "/viewer/viewer.js"]
    for path, kind in (("/viewer/viewer.js", "text/javascript"), ("/viewer/viewer.css", "text/css")):
        asset = httpx.get(service["url"] + path, timeout=30)
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind)
        # No URL to another origin (the SVG namespace is a name, never fetched); fetch only our API.
        assert set(re.findall(r"https?://[^\s\"'`)]+", asset.text)) <= {"http://www.w3.org/2000/svg"}
        assert re.findall(r"fetch\(([^,)]+)", asset.text) in ([], ['"/v1/search"'])
    assert httpx.get(f"{service['url']}/viewer/secrets.txt", timeout=30).status_code == 404


def test_search_returns_the_trajectory_only_when_asked(service):
    plain = search(service)
    assert plain.status_code == 200 and "trajectory" not in plain.json()
    asked = search(service, trajectory=True)
    assert asked.status_code == 200, asked.text
    body = asked.json()
    trajectory = Trajectory.model_validate(body["trajectory"])  # the one schema, as files hold it
    assert trajectory.question == QUESTION and len(trajectory.turns) == body["summary"]["turns"]
    assert [d.doc_id for d in trajectory.final_ranking][:3] == [d["doc_id"] for d in body["documents"]]
    assert trajectory.tool_call_records() and any(turn.view_messages for turn in trajectory.turns)
    assert all(turn.completion_token_ids is None and turn.completion_logprobs is None for turn in trajectory.turns)
    assert body["documents"] == plain.json()["documents"]  # asking for it changes nothing else
    wrong = search(service, trajectory="yes")
    assert wrong.status_code == 422 and wrong.json()["fields"][0]["field"] == "trajectory"


# -- in headless Chromium ------------------------------------------------------------------------

needs_chromium = pytest.mark.skipif(chromium_path() is None, reason="Chromium not on PATH (Debian: apt-get install chromium; .ci/run installs it)")

RENDERED = "document.querySelectorAll('#documents li.doc').length > 0 && document.querySelectorAll('.turn[data-turn]').length > 0"


@pytest.fixture
def browser(tmp_path):
    with Browser(tmp_path / "profile") as opened:
        yield opened


@pytest.mark.integration
@needs_chromium
def test_a_search_through_the_page_shows_documents_and_turns(service, browser):
    browser.navigate(service["url"] + "/")
    browser.type_into("#key", service["key"])
    browser.type_into("#customer", "acme")
    browser.type_into("#query", QUESTION)
    browser.type_into("#k", "3")
    browser.click("#search")
    browser.wait_for(RENDERED)
    expected = search(service, trajectory=True).json()
    shown_ids = browser.evaluate("[...document.querySelectorAll('#documents .doc-id')].map(e => e.textContent)")
    assert shown_ids == [f"[{d['doc_id']}]" for d in expected["documents"]]
    assert browser.evaluate("document.getElementById('question').textContent") == QUESTION
    turns = expected["trajectory"]["turns"]
    assert browser.evaluate("document.querySelectorAll('.turn[data-turn]').length") == len(turns)
    first = browser.evaluate("""(() => { const d = document.querySelector('.turn[data-turn="1"] details.call');
        return {open: d.open, name: d.querySelector('.call-name').textContent, result: d.querySelector('pre').textContent}; })()""")
    first_call = turns[0]["tool_calls"][0]
    assert first["name"] == first_call["name"] and first["open"] is False  # results start collapsed
    assert first["result"].startswith(f"{first_call['name']}(")  # what the tool returned, as the model saw it
    points = browser.evaluate("document.querySelectorAll('#chart svg circle').length")
    assert points >= len(turns) and browser.evaluate("!!document.querySelector('#chart polyline.usage')")
    pruned = sum(len(turn["pruned_ids"]) for turn in turns)
    shown_pruned = browser.evaluate("[...document.querySelectorAll('.pruned')].map(e => e.textContent)")
    assert (pruned > 0) == bool(shown_pruned)
    assert browser.console_errors() == []


@pytest.mark.integration
@needs_chromium
def test_a_wrong_key_is_shown_as_an_error(service, browser):
    browser.navigate(service["url"] + "/")
    browser.type_into("#key", "ssk_000000000000_" + "A" * 43)
    browser.type_into("#customer", "acme")
    browser.type_into("#query", QUESTION)
    browser.click("#search")
    message = browser.wait_for("document.getElementById('status').className === 'error' && document.getElementById('status').textContent")
    assert message.startswith("search failed: 401")
    assert browser.evaluate("document.getElementById('result').hidden") is True


@pytest.mark.integration
@needs_chromium
def test_a_saved_trajectory_file_opens_in_the_page(service, index, browser, tmp_path):
    """A file as `searchsmith search --parallel 2 --save FILE` writes it: JSONL, one rollout a line."""
    response = run_search(index, QUESTION, "heuristic", 3, parallel=2)
    saved = write_jsonl(response.trajectories, tmp_path / "saved.jsonl")
    browser.navigate(service["url"] + "/")
    browser.set_files("#file", [saved])
    browser.wait_for(RENDERED)
    assert browser.evaluate("document.getElementById('status').textContent") == "saved.jsonl: 2 trajectories"
    assert browser.evaluate("document.getElementById('pick').hidden") is False
    assert browser.evaluate("document.getElementById('pick').options.length") == 2
    first = response.trajectories[0]
    assert browser.evaluate("document.querySelectorAll('.turn[data-turn]').length") == len(first.turns)
    assert browser.evaluate("[...document.querySelectorAll('#documents .doc-id')].map(e => e.textContent)") == [f"[{d.doc_id}]" for d in first.final_ranking]
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"not": "a trajectory"}\n')
    browser.set_files("#file", [broken])
    message = browser.wait_for("document.getElementById('status').className === 'error' && document.getElementById('status').textContent")
    assert message.startswith("broken.jsonl: no trajectory in this file")
    assert browser.console_errors() == []
