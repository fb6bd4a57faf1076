"""The teacher client over real HTTP on loopback: retries, timeouts, malformed bodies, the
cache, structured outputs and their fallback, the concurrency limit, and key hygiene."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from pydantic import BaseModel

from core.storage import LocalArtifactStore
from llm.cache import ResponseCache
from llm.client import LLMClient, LLMError, ReplyParseError, parse_json_reply
from tests.support.openai_scripted import Reply, ScriptedOpenAI, completion

SECRET = "sk-test-never-logged-0123456789"


class Answer(BaseModel):
    answer: str


def make_llm(server: ScriptedOpenAI, store=None, **overrides) -> LLMClient:
    settings = dict(base_url=server.base_url, model="teacher-x", api_key_env="SYNTH_TEST_KEY", timeout_s=1.5,
                    max_retries=3, backoff_s=0.01, backoff_max_s=0.05)
    settings.update(overrides)
    cache = ResponseCache(store, "acme/synth/llm_cache") if store is not None else None
    return LLMClient(cache=cache, **settings)


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv("SYNTH_TEST_KEY", SECRET)


def ask(llm: LLMClient, text: str = "hello"):
    return llm.chat([{"role": "user", "content": text}])


def test_a_500_a_timeout_and_a_malformed_body_are_retried_and_counted():
    script = {1: Reply(500, {"error": {"message": "boom"}}), 2: Reply(200, completion("late"), delay_s=2.5),
              3: Reply(200, "{this is not json")}

    with ScriptedOpenAI(lambda request, n: script.get(n, Reply(200, completion("fine")))) as server:
        llm = make_llm(server)
        reply = ask(llm)
    assert reply.content == "fine"
    usage = llm.usage.as_dict()
    # >= 3: a starved CPU can add a spurious timeout; each failure is retried, none given up on.
    assert usage["failures"] >= 3 and usage["retries"] == usage["failures"] and usage["calls"] == 1 and usage["errors"] == 0
    assert usage["prompt_tokens"] == 11 and usage["completion_tokens"] == 7


def test_gives_up_after_the_retries_and_does_not_retry_a_400():
    with ScriptedOpenAI(lambda request, n: Reply(503, {"error": {"message": "down"}})) as server:
        llm = make_llm(server, max_retries=2)
        with pytest.raises(LLMError, match="gave up after 3 attempts"):
            ask(llm)
        assert server.count == 3
    with ScriptedOpenAI(lambda request, n: Reply(401, {"error": {"message": "bad key"}})) as server:
        llm = make_llm(server)
        with pytest.raises(LLMError, match="HTTP 401"):
            ask(llm)
        assert server.count == 1
    assert llm.usage.as_dict()["errors"] == 1


def test_cached_replies_are_never_paid_twice(tmp_path):
    store = LocalArtifactStore(tmp_path)
    with ScriptedOpenAI(lambda request, n: Reply(200, completion(f"reply {n}"))) as server:
        first = ask(make_llm(server, store), "q1")
        again = make_llm(server, store)  # a new process: a new client over the same store
        assert ask(again, "q1").content == first.content == "reply 1"
        assert server.count == 1
        assert again.usage.as_dict()["cached"] == 1 and again.usage.as_dict()["calls"] == 0
        assert ask(again, "q2").content == "reply 2"  # a different request is a different key
        assert again.chat([{"role": "user", "content": "q1"}], attempt=1).content == "reply 3"
        assert server.count == 3


def test_structured_outputs_are_requested_and_replies_parsed_tolerantly():
    replies = iter(['Sure! ```json\n{"answer": "Ostwick"}\n```', 'The answer is {"answer": "x {y}"} as asked.', "no json here"])
    with ScriptedOpenAI(lambda request, n: Reply(200, completion(next(replies)))) as server:
        llm = make_llm(server)
        value, _ = llm.chat_json([{"role": "user", "content": "a"}], Answer, name="answer")
        assert value.answer == "Ostwick"
        assert server.requests[0]["response_format"]["type"] == "json_schema"
        assert server.requests[0]["response_format"]["json_schema"]["schema"]["required"] == ["answer"]
        assert llm.chat_json([{"role": "user", "content": "b"}], Answer, name="answer")[0].answer == "x {y}"
        with pytest.raises(ReplyParseError):
            llm.chat_json([{"role": "user", "content": "c"}], Answer, name="answer")
    assert llm.usage.as_dict()["parse_failures"] == 1


def test_an_endpoint_without_json_schema_support_falls_back_once():
    def responder(request, n):
        if "response_format" in request:
            return Reply(400, {"error": {"message": "response_format is not supported"}})
        return Reply(200, completion('{"answer": "ok"}'))

    with ScriptedOpenAI(responder) as server:
        llm = make_llm(server)
        assert llm.chat_json([{"role": "user", "content": "a"}], Answer, name="answer")[0].answer == "ok"
        assert llm.chat_json([{"role": "user", "content": "b"}], Answer, name="answer")[0].answer == "ok"
        assert server.count == 3 and llm.structured_outputs is False


def test_concurrency_is_bounded_by_the_semaphore():
    with ScriptedOpenAI(lambda request, n: Reply(200, completion("x"), delay_s=0.1)) as server:
        llm = make_llm(server, concurrency=2, timeout_s=5)
        with ThreadPoolExecutor(max_workers=6) as pool:
            list(pool.map(lambda i: ask(llm, f"q{i}"), range(6)))
        assert server.count == 6 and server.max_in_flight == 2


def test_the_key_is_sent_but_never_stored_or_shown(tmp_path):
    store = LocalArtifactStore(tmp_path)
    with ScriptedOpenAI(lambda request, n: Reply(200, completion("x"))) as server:
        llm = make_llm(server, store)
        ask(llm)
        assert server.headers[0].get("authorization") == f"Bearer {SECRET}"
    exposed = [repr(llm), json.dumps(llm.describe()), json.dumps(llm.usage.as_dict())]
    exposed += [path.read_text() for path in tmp_path.rglob("*.json")]
    assert all(SECRET not in text for text in exposed)
    assert llm.describe()["api_key_env"] == "SYNTH_TEST_KEY"


def test_parse_json_reply_variants():
    assert parse_json_reply('{"a": 1}') == {"a": 1}
    assert parse_json_reply('prefix {"a": "}"} suffix {"b": 2}') == {"a": "}"}
    assert parse_json_reply("```\n{\"a\": [1, 2]}\n```") == {"a": [1, 2]}
    for bad in ["", "[1, 2]", "{broken", None]:
        with pytest.raises(ReplyParseError):
            parse_json_reply(bad)


def test_backoff_grows_and_is_capped():
    llm = LLMClient(base_url="http://127.0.0.1:9/v1", model="m", backoff_s=1.0, backoff_max_s=3.0)
    delays = [llm._backoff(attempt) for attempt in (1, 2, 3, 6)]
    assert 0.5 <= delays[0] <= 1.5 and 1.0 <= delays[1] <= 3.0 and delays[3] <= 3.0
    assert len(set(delays)) > 1  # jittered
