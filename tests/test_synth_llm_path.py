"""The whole teacher path against a scripted OpenAI-protocol server on loopback.

The script plays a competent teacher for one seed (explore with tool calls, a two-document
task, quote extraction, a chained second hop, distractor checks) and an incompetent one for
the others (unparseable JSON, an unsupported answer, an invented document id). Faults are
injected on first sight of a request: a 500, a reply slower than the client's timeout and a
malformed HTTP body. The run must complete, record every failure with its reason, and a rerun
must not send a single request for answers it already has.
"""

from __future__ import annotations

import json
import re
import threading

import polars as pl
import pytest

from core.storage import LocalArtifactStore
from core.task_settings import TaskGenConfig
from core.text_match import contains_answer
from llm.client import LLMClient
from search.backend import Hit
from synth.generate import generate_tasks
from tests.support.openai_scripted import Reply, ScriptedOpenAI, completion

SECRET = "sk-path-test-secret-42"
DOCS = {
    "alder": ("Alder Bridge", "The Alder Bridge was completed in 1911 by the engineer Mara Quill. It spans the river Tessel."),
    "quill": ("Mara Quill", "Mara Quill was an engineer born in Ostwick. She designed seven bridges."),
    "ostwick": ("Ostwick", "Ostwick is a fishing village on the north coast. Its lighthouse was built in 1850 by the Harbour Board."),
    "tessel": ("River Tessel", "The Tessel is a slow river. Its lighthouse-keepers' cottages at the mouth are a museum."),
    "brinmoor": ("Brinmoor", "Brinmoor is a market town on the river Tessel. It has a weekly cattle market."),
}
CLUES = {
    "c_alder": "A crossing finished in the early 1910s by a female engineer.",
    "c_quill": "Its builder came from a fishing village on the coast.",
    "c_ostwick": "That village's landmark was put up by a local authority in the mid-19th century.",
    "c_purple": "A town known for a weekly trade in livestock.",
}
CLUE_DOC = {CLUES["c_alder"]: "alder", CLUES["c_quill"]: "quill", CLUES["c_ostwick"]: "ostwick", CLUES["c_purple"]: "brinmoor"}


def frames() -> tuple[pl.DataFrame, pl.DataFrame]:
    docs = pl.DataFrame([{"doc_id": d, "title": t, "text": x, "kind": "text", "content_hash": f"h-{d}", "deleted": False}
                         for d, (t, x) in DOCS.items()])
    chunks = pl.DataFrame([{"chunk_id": f"{d}#0", "doc_id": d, "index": 0, "title": t, "text": x}
                           for d, (t, x) in DOCS.items()])
    return chunks, docs


class WordBackend:
    """A tiny search backend: chunks ranked by shared words (the index is not under test)."""

    def __init__(self, chunks: pl.DataFrame):
        self.rows = chunks.to_dicts()

    def search(self, query, k=50, exclude=()):
        words = set(re.findall(r"\w+", query.lower()))
        scored = [(len(words & set(re.findall(r"\w+", r["text"].lower()))), r) for r in self.rows if r["chunk_id"] not in exclude]
        scored = sorted((s for s in scored if s[0] > 0), key=lambda s: (-s[0], s[1]["chunk_id"]))[:k]
        return [Hit(r["chunk_id"], r["doc_id"], r["title"], r["text"], float(s), rank=i + 1) for i, (s, r) in enumerate(scored)]


def _item(doc: str, clue_keys: list[str], truth: str | None = None) -> dict:
    text = DOCS[doc][1] if doc in DOCS else "Invented text."
    first = text.split(". ")[0] + "."
    return {"id": doc, "reasoning": "supports a clue", "clue_quotes": [CLUES[k] for k in clue_keys], "item_quotes": [first],
            "contains_truth": truth is not None, "truth_quotes": [truth] if truth else []}


TASKS = {
    "alder": {"clues": [CLUES["c_alder"], CLUES["c_quill"]], "question": "In which village was the builder of this crossing born?",
              "truth": "Ostwick", "truth_type": "location",
              "supporting_items": [_item("alder", ["c_alder"]), _item("quill", ["c_quill"], "born in Ostwick")]},
    "quill": {"clues": [CLUES["c_purple"]], "question": "What colour is the town's flag?", "truth": "purple",
              "truth_type": "other", "supporting_items": [_item("brinmoor", ["c_purple"])]},
    "ostwick": {"clues": [CLUES["c_quill"]], "question": "Which village?", "truth": "Ostwick", "truth_type": "location",
                "supporting_items": [_item("nowhere", ["c_quill"], "Ostwick")]},
}
EXTENSION = {"bridging_item": {"id": "ostwick", "relevant_prev_id": "quill", "reasoning": "names Ostwick"},
             "clues": [CLUES["c_ostwick"]], "question": "In which year was the village's landmark built?", "truth": "1850",
             "truth_type": "year", "supporting_items": [_item("ostwick", ["c_ostwick"], "built in 1850")]}


class Teacher:
    """The scripted responder, deciding by request content (seeds run in parallel threads)."""

    def __init__(self):
        self.seen: set[str] = set()
        self.lock = threading.Lock()
        self.faults = {"explore:alder:0": Reply(500, {"error": {"message": "overloaded"}}),
                       "verify:quill:Ostwick": Reply(200, completion("{}"), delay_s=2.5),
                       "explore:quill:0": Reply(200, '{"choices": [')}

    def fault(self, key: str) -> Reply | None:
        with self.lock:
            if key in self.faults and key not in self.seen:
                self.seen.add(key)
                return self.faults[key]
        return None

    def __call__(self, request: dict, n: int) -> Reply:
        messages = request["messages"]
        system = messages[0]["content"] if messages[0]["role"] == "system" else ""
        user = next(m["content"] for m in messages if m["role"] == "user")
        tools_done = sum(m["role"] == "tool" for m in messages)
        if system.startswith("You are building one search task"):
            seed = re.search(r"Seed document (\S+)", user).group(1)
            fault = self.fault(f"explore:{seed}:{tools_done}")
            if fault:
                return fault
            if "tools" in request and tools_done == 0:
                return Reply(200, completion(tool_calls=[{"name": "search_corpus", "arguments": {"query": DOCS[seed][0]}}]))
            if "tools" in request and tools_done == 1:
                return Reply(200, completion(tool_calls=[{"name": "read_document", "arguments": {"doc_id": "quill"}}]))
            if seed in TASKS:
                return Reply(200, completion("Here is the task:\n```json\n" + json.dumps(TASKS[seed]) + "\n```"))
            return Reply(200, completion("I would rather describe the task in prose."))
        if system.startswith("You are extending"):
            if "tools" in request and tools_done == 0:
                return Reply(200, completion(tool_calls=[{"name": "search_corpus", "arguments": {"query": "Ostwick"}}]))
            return Reply(200, completion(json.dumps(EXTENSION)))
        if user.startswith("You check one document"):
            doc = re.search(r"Document (\S+):", user).group(1)
            truth = re.search(r"Answer: (.*)", user).group(1).strip()
            fault = self.fault(f"verify:{doc}:{truth}")
            if fault:
                return fault
            clues = [c for c in CLUE_DOC if c in user and CLUE_DOC[c] == doc]
            text = DOCS[doc][1]
            holds = contains_answer(text, truth)
            sentence = next((s for s in text.split(". ") if truth in s), "")
            body = {"item_quotes": [text.split(". ")[0]], "clue_quotes": clues, "contains_truth": holds,
                    "truth_quotes": [sentence] if holds else [], "reasoning": "copied"}
            return Reply(200, completion(json.dumps(body)))
        if user.startswith("You check whether a passage"):
            passage = user.split("<passage>")[1]
            return Reply(200, completion(json.dumps({"contains_answer": "lighthouse" in passage, "quotes": []})))
        return Reply(400, {"error": {"message": "unexpected request"}})


@pytest.fixture
def teacher_env(monkeypatch):
    monkeypatch.setenv("SYNTH_PATH_KEY", SECRET)
    teacher = Teacher()
    with ScriptedOpenAI(teacher) as server:
        yield server


def run(server: ScriptedOpenAI, store: LocalArtifactStore):
    chunks, docs = frames()
    llm = LLMClient(base_url=server.base_url, model="scripted-teacher", api_key_env="SYNTH_PATH_KEY", timeout_s=1.5,
                     max_retries=3, backoff_s=0.01, backoff_max_s=0.02, concurrency=3)
    config = TaskGenConfig(generator="llm", domain="web", max_seeds=5, max_hops=2, max_turns=4, distractors_per_task=3,
                           workers=3, exclude_kinds=[])
    return generate_tasks(chunks, docs, WordBackend(chunks), config, llm, store, prefix="acme/synth")


def test_llm_path_completes_records_failures_and_never_pays_twice(teacher_env, tmp_path):
    server, store = teacher_env, LocalArtifactStore(tmp_path / "store")
    first = run(server, store)
    paid = server.count

    # The competent seed gave a verified 1-hop task and a verified chained 2-hop task.
    verified = {t.level: t for t in first.verified_tasks}
    assert set(verified) == {0, 1}, first.failed_reasons
    assert verified[0].truth == "Ostwick" and verified[0].generator == "llm:scripted-teacher"
    assert verified[1].truth == "1850" and verified[1].bridging_item.id == "ostwick"
    assert verified[1].parent_id == verified[0].id and verified[1].supporting_ids == ["alder", "quill", "ostwick"]
    assert first.by_hops == {"1": 1, "2": 1}

    # Every other seed failed, and says why.
    assert first.failed_reasons.get("generation_unparseable", 0) >= 1
    assert first.failed_reasons.get("no_item_contains_truth") == 1
    assert first.failed_reasons.get("missing_document") == 1
    assert first.generated == first.verified + sum(first.failed_reasons.values())

    # Distractors: the lighthouse passages were rejected (by code: they name the answer; or by the
    # teacher: it found the answer), and every kept one carries the ids it was mined for.
    for task in first.verified_tasks:
        assert all(d.doc_id not in task.supporting_ids and d.mined_for for d in task.distractors)
        assert {r.reason for r in task.rejected_distractors} <= {"contains_answer_string", "llm_found_answer"}
    level1 = verified[1]
    assert any(r.reason == "llm_found_answer" for r in level1.rejected_distractors)
    assert first.distractors_count == sum(len(t.distractors) for t in first.verified_tasks)

    # The 500, the timeout and the malformed body were retried, counted, and did not stop the run.
    usage = first.llm_usage
    assert usage["failures"] >= 3 and usage["retries"] == usage["failures"] and usage["errors"] == 0  # > 3 only on a starved CPU
    assert usage["calls"] == paid - usage["failures"] and usage["cached"] == 0
    assert usage["prompt_tokens"] > 0

    # A rerun (same store) skips finished seeds and replays nothing from the server.
    second = run(server, store)
    assert server.count == paid
    assert second.summary() == first.summary()
    assert second.seeds_resumed == second.seeds and second.llm_usage["calls"] == 0

    # Even with the seed records lost (a crash before they were written), the cache answers all.
    for key in list(store.list("acme/synth/seeds")):
        store.delete(key)
    third = run(server, store)
    assert server.count == paid
    assert third.summary() == first.summary() and third.llm_usage["calls"] == 0 and third.llm_usage["cached"] > 0

    # The key was sent, and is nowhere in what we keep or report.
    assert all(h.get("authorization") == f"Bearer {SECRET}" for h in server.headers)
    kept = [json.dumps(first.metadata())] + [p.read_text() for p in (tmp_path / "store").rglob("*.json")]
    assert all(SECRET not in text for text in kept)


def test_llm_generator_requires_a_teacher(tmp_path):
    chunks, docs = frames()
    with pytest.raises(ValueError, match="needs a LLMClient"):
        generate_tasks(chunks, docs, WordBackend(chunks), TaskGenConfig(generator="llm"), None, None)
