"""The agent harness: the four tools' semantics, the token budget, parallel calls, answers,
Nx mode, the trajectory schema, and the heuristic policy on real multi-hop questions.

Backends are real `HybridIndex`es (embedded Chroma + BM25) over a tiny hand-written chunk table
and over a pooled corpus of dev-set paragraphs. Test policies are small scripted policies
(they emit a fixed plan of tool calls); they are policies, not mocks.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable

import polars as pl
import pytest

from agent.final_answer import format_final_answer, parse_final_answer
from agent.harness import Harness, HarnessConfig, merge_rankings, run_episode
from agent.harness_view import View
from agent.policy_base import PolicyStep, ToolCall
from agent.prompts import tool_schemas
from agent.trajectory import RankedDocument, Trajectory, read_jsonl, read_parquet, write_jsonl, write_parquet
from search.embedding_window import load_token_offsets

DEV_FILE = Path("/work/shared/data/multihop_dev.jsonl")
if not DEV_FILE.exists():
    DEV_FILE = Path(__file__).resolve().parents[2] / "shared" / "data" / "multihop_dev.jsonl"

TINY_DOCS = {
    "lighthouse": ("Alpha Lighthouse", [
        "The Alpha Lighthouse stands on Corven Point. It was designed by the engineer Mara Quell in 1901.",
        "Mara Quell later moved to Lisbon, where she taught harbour engineering until 1930.",
        "The lighthouse keeper's cottage was converted into a small museum of navigation in 1987.",
        "Visitors climb 212 steps to reach the lantern room of the Alpha Lighthouse.",
    ]),
    "river": ("Corven River", [
        "The Corven River rises in the Tallis Hills and flows into the Grey Sea near Corven Point.",
        "Salmon return to the Corven River every autumn; fishing is regulated by the river trust.",
    ]),
    "bakery": ("Quell Bakery", [
        "Quell Bakery in Lisbon was founded by Tomas Quell, a cousin of the engineer Mara Quell.",
        "Its almond pastry won a national prize in 1954.",
    ]),
    "railway": ("Tallis Railway", [
        "The Tallis Railway connected the Tallis Hills to the coast from 1888 to 1962.",
        "Steam locomotives of the Tallis Railway were built in Leeds.",
        "A preserved section of the Tallis Railway opened to tourists in 1999.",
    ]),
    "chess": ("Grey Sea Chess Club", [
        "The Grey Sea Chess Club meets every Thursday in the old harbour office.",
        "Its founder, Ida Brann, was a correspondence chess champion.",
    ]),
}


def _chunk_id(doc_id: str, text: str) -> str:
    return hashlib.sha256(f"{doc_id}\x00{text}".encode()).hexdigest()[:20]


def _build_index(path: Path, customer: str, rows: list[dict[str, Any]]):
    from search.chroma_client import persistent_client
    from search.embeddings import make_embedder
    from search.index import HybridIndex

    index = HybridIndex(persistent_client(path), customer, make_embedder())
    index.build_or_update(pl.DataFrame(rows))
    return index


@pytest.fixture(scope="module")
def tiny_index(tmp_path_factory):
    counter = load_token_offsets()
    rows = [
        {"chunk_id": _chunk_id(doc, text), "doc_id": doc, "text": text, "title": title,
         "n_tokens": counter.count(text), "index": i, "chunker": "test-v1"}
        for doc, (title, texts) in TINY_DOCS.items() for i, text in enumerate(texts)
    ]
    return _build_index(tmp_path_factory.mktemp("tiny-chroma"), "tiny", rows)


def _paragraph_doc_id(title: str, text: str) -> str:
    return "p" + hashlib.sha1(f"{title}\x00{text}".encode()).hexdigest()[:12]


@pytest.fixture(scope="module")
def pooled(tmp_path_factory):
    """A pooled corpus: the paragraphs of the first 20 dev questions, one chunk per paragraph."""
    if not DEV_FILE.exists():
        pytest.skip(f"dev file missing: {DEV_FILE}")
    questions = [json.loads(line) for line in DEV_FILE.read_text().splitlines()[:20]]
    counter = load_token_offsets()
    rows: dict[str, dict[str, Any]] = {}
    for record in questions:
        for paragraph in record["paragraphs"]:
            doc_id = _paragraph_doc_id(paragraph["title"], paragraph["text"])
            rows.setdefault(doc_id, {
                "chunk_id": _chunk_id(doc_id, paragraph["text"]), "doc_id": doc_id, "text": paragraph["text"],
                "title": paragraph["title"], "n_tokens": counter.count(paragraph["text"]), "index": 0, "chunker": "pool-v1",
            })
    index = _build_index(tmp_path_factory.mktemp("pool-chroma"), "pool", list(rows.values()))
    return index, questions


class ScriptedPolicy:
    """Emits a fixed plan: each entry is a list of (tool, arguments) or a final text.

    `plan` may also be a callable (turn, messages, tools) -> entry, for plans that depend on
    what came back. Every view it is shown is kept in `views` (with the tools it was offered).
    """

    name = "scripted"

    def __init__(self, plan: list | Callable, *, final: str = "", counter=None):
        self.plan = plan
        self.final = final
        self.views: list[tuple[list[dict], list]] = []
        self._counter = counter or load_token_offsets()

    def token_counter(self):
        return self._counter

    def new_episode(self, question: str, seed: int = 0):
        return self

    def act(self, messages, tools) -> PolicyStep:
        turn = len(self.views)
        self.views.append((messages, tools))
        if callable(self.plan):
            entry = self.plan(turn, messages, tools)
        else:
            entry = self.plan[turn] if turn < len(self.plan) else self.final
        if isinstance(entry, PolicyStep):
            return entry
        if isinstance(entry, str):
            return PolicyStep(content=entry)
        return PolicyStep(content=None, tool_calls=[
            ToolCall(id=f"c{turn}_{i}", name=name, arguments=arguments) for i, (name, arguments) in enumerate(entry)
        ])


def _tool_messages(messages: list[dict]) -> list[dict]:
    return [m for m in messages if m["role"] == "tool"]


def _calls(trajectory: Trajectory):
    return trajectory.tool_call_records()


# ---- search_corpus -------------------------------------------------------------------------


def test_search_never_returns_a_chunk_twice_across_turns_and_within_a_turn(tiny_index):
    query = {"query": "Mara Quell engineer Lisbon"}
    policy = ScriptedPolicy([[("search_corpus", query)], [("search_corpus", query), ("search_corpus", query)]], final="done")
    trajectory = run_episode(tiny_index, policy, "Where did Mara Quell teach?")
    shown = [chunk for call in _calls(trajectory) for chunk in call.result_chunk_ids]
    assert shown, "the first search must return chunks"
    assert len(shown) == len(set(shown))
    assert set(shown) == set(trajectory.seen_chunk_ids())


def test_search_results_are_cut_to_the_per_call_budget(tiny_index):
    config = HarnessConfig(search_budget_tokens=120)
    policy = ScriptedPolicy([[("search_corpus", {"query": "Tallis Railway lighthouse river"})]], final="done")
    trajectory = run_episode(tiny_index, policy, "railway", config)
    call = _calls(trajectory)[0]
    assert 1 <= len(call.result_chunk_ids) < call.candidates
    assert call.tokens <= 120
    assert "did not fit the budget" in _tool_messages(policy.views[1][0])[0]["content"]


def test_search_results_are_cut_to_the_remaining_budget(tiny_index):
    config = HarnessConfig(token_budget=1400, response_reserve_tokens=100, search_budget_tokens=5000, hard_cutoff=1.0)
    policy = ScriptedPolicy([[("search_corpus", {"query": "Tallis Railway"})]], final="done")
    trajectory = run_episode(tiny_index, policy, "railway", config)
    assert trajectory.turns[0].view_token_usage <= 1400 - 100 + 30  # + the usage line itself


# ---- grep_corpus ---------------------------------------------------------------------------


def test_grep_returns_at_most_five_unseen_chunks_then_the_rest(tiny_index):
    pattern = {"pattern": r"\b(?:Quell|Tallis|Corven)\b"}
    policy = ScriptedPolicy([[("grep_corpus", pattern)], [("grep_corpus", pattern)]], final="done")
    trajectory = run_episode(tiny_index, policy, "q")
    first, second = _calls(trajectory)
    assert len(first.result_chunk_ids) == 5
    assert second.result_chunk_ids and not set(first.result_chunk_ids) & set(second.result_chunk_ids)


def test_invalid_grep_pattern_is_an_error_message_not_a_crash(tiny_index):
    policy = ScriptedPolicy([[("grep_corpus", {"pattern": "([unclosed"})]], final="done")
    trajectory = run_episode(tiny_index, policy, "q")
    call = _calls(trajectory)[0]
    assert call.error and not call.result_chunk_ids
    assert _tool_messages(policy.views[1][0])[0]["content"].startswith("Error:")
    assert trajectory.error is None and trajectory.stop_reason == "answer"


# ---- read_document -------------------------------------------------------------------------


def test_read_document_reranks_against_the_question_and_skips_chunks_in_view(tiny_index):
    question = "How many steps lead to the lantern room?"
    plan = [[("grep_corpus", {"pattern": "designed by"})], [("read_document", {"doc_id": "lighthouse"})]]
    policy = ScriptedPolicy(plan, final="done")
    trajectory = run_episode(tiny_index, policy, question)
    grep, read = _calls(trajectory)
    assert len(read.result_chunk_ids) == 3 and grep.result_chunk_ids[0] not in read.result_chunk_ids
    steps_chunk = _chunk_id("lighthouse", TINY_DOCS["lighthouse"][1][3])
    assert read.result_chunk_ids[0] == steps_chunk


def test_read_document_is_cut_to_the_remaining_budget(tiny_index):
    schemas = load_token_offsets().count(json.dumps(tool_schemas()))  # the view counts them too
    budget = 700 + schemas
    config = HarnessConfig(token_budget=budget, response_reserve_tokens=100, hard_cutoff=1.0)
    policy = ScriptedPolicy([[("read_document", {"doc_id": "lighthouse"})]], final="done")
    trajectory = run_episode(tiny_index, policy, "lighthouse", config)
    read = _calls(trajectory)[0]
    assert 0 < len(read.result_chunk_ids) < len(TINY_DOCS["lighthouse"][1])
    assert "did not fit the budget" in _tool_messages(policy.views[1][0])[0]["content"]
    assert trajectory.turns[0].view_token_usage <= budget - 100 + 30


def test_read_document_unknown_id_is_reported(tiny_index):
    policy = ScriptedPolicy([[("read_document", {"doc_id": "no-such-doc"})]], final="done")
    call = _calls(run_episode(tiny_index, policy, "q"))[0]
    assert call.error and "unknown document id" in call.error


# ---- prune_chunks --------------------------------------------------------------------------


def _prune_first_result(turn, messages, tools):
    if turn == 0:
        return [("search_corpus", {"query": "Corven River salmon"})]
    if turn == 1:
        ids = re.findall(r"<Chunk id=(\S+)", _tool_messages(messages)[0]["content"])
        return [("prune_chunks", {"chunk_ids": ids[:2] + ["not-a-chunk"]})]
    if turn == 2:
        return [("search_corpus", {"query": "Corven River salmon"})]
    return "done"


def test_pruned_chunks_leave_the_view_but_stay_in_the_trajectory(tiny_index):
    policy = ScriptedPolicy(_prune_first_result)
    trajectory = run_episode(tiny_index, policy, "salmon")
    search, prune, search_again = _calls(trajectory)
    pruned = search.result_chunk_ids[:2]
    assert prune.pruned_chunk_ids == pruned and prune.unknown_chunk_ids == ["not-a-chunk"]
    view_after = policy.views[2][0]
    content = "\n".join(m["content"] for m in view_after if m["role"] == "tool")
    for chunk_id in pruned:
        assert f"[pruned chunk {chunk_id}]" in content and f"<Chunk id={chunk_id}" not in content
    assert "Unknown chunk ids" in _tool_messages(view_after)[-1]["content"]
    freed = int(re.search(r"\(([\d,]+) tokens freed\)", _tool_messages(view_after)[-1]["content"]).group(1).replace(",", ""))
    assert freed > 0
    assert set(pruned) <= set(trajectory.seen_chunk_ids()) and trajectory.pruned_chunk_ids() == pruned
    assert not set(pruned) & set(search_again.result_chunk_ids), "pruned chunks are not searched up again"
    assert trajectory.summary()["pruned"] == 2
    # the earlier turn's recorded view still shows the chunk: each turn keeps the view it had
    assert f"<Chunk id={pruned[0]}" in "\n".join(m["content"] for m in trajectory.turns[1].view_messages)


# ---- budget --------------------------------------------------------------------------------


def _search_each_turn(turns: int):
    queries = ["lighthouse", "river", "bakery", "railway", "chess", "Lisbon", "museum", "steam"]
    return [[("search_corpus", {"query": queries[i % len(queries)]})] for i in range(turns)]


def test_every_observation_ends_with_the_token_usage(tiny_index):
    policy = ScriptedPolicy(_search_each_turn(3), final="done")
    trajectory = run_episode(tiny_index, policy, "q")
    for turn, (messages, _) in zip(trajectory.turns[1:], policy.views[1:]):
        last = messages[-1]["content"]
        match = re.search(r"\[Token usage: ([\d,]+)/32,768\]$", last)
        assert match, last[-80:]
        assert int(match.group(1).replace(",", "")) <= turn.prompt_tokens


def test_soft_hint_only_past_half_and_only_when_enabled(tiny_index):
    for enabled in (True, False):
        config = HarnessConfig(token_budget=3000, search_budget_tokens=250, soft_hint=enabled, hard_cutoff=1.0)
        policy = ScriptedPolicy(_search_each_turn(8), final="done")
        trajectory = run_episode(tiny_index, policy, "q", config)
        shown = [t.hint_shown for t in trajectory.turns if t.tool_calls]
        past = [t.view_token_usage >= 1500 for t in trajectory.turns if t.tool_calls]
        assert any(past) and not all(past)
        assert shown == (past if enabled else [False] * len(past))
        hints = ["more than 50% full" in messages[-1]["content"] for messages, _ in policy.views[1:]]
        assert hints[: len(shown)] == shown


def test_hard_cutoff_rejects_every_tool_but_prune(tiny_index):
    config = HarnessConfig(token_budget=2000, search_budget_tokens=400, hard_cutoff=0.5)

    def plan(turn, messages, tools):
        if turn < 4:
            return [("search_corpus", {"query": ["lighthouse", "river", "railway", "bakery"][turn]})]
        if turn == 4:
            ids = re.findall(r"<Chunk id=(\S+)", "\n".join(m["content"] for m in _tool_messages(messages)))
            return [("grep_corpus", {"pattern": "Quell"}), ("prune_chunks", {"chunk_ids": ids[:1]})]
        return "done"

    policy = ScriptedPolicy(plan)
    trajectory = run_episode(tiny_index, policy, "q", config)
    turn = next(t for t in trajectory.turns if t.past_hard_cutoff)
    rejected = [c for c in turn.tool_calls if c.rejected]
    assert rejected and all(c.name != "prune_chunks" for c in rejected)
    assert all("Only prune_chunks is allowed" in c.error for c in rejected)
    if any(c.name == "prune_chunks" for c in turn.tool_calls):
        assert next(c for c in turn.tool_calls if c.name == "prune_chunks").pruned_chunk_ids


@pytest.mark.parametrize("cutoff", [0.49, 1.01])
def test_hard_cutoff_must_lie_between_half_and_full_budget(cutoff):
    with pytest.raises(ValueError):
        HarnessConfig(hard_cutoff=cutoff)


def test_view_token_count_matches_a_full_recount(tiny_index):
    counter = load_token_offsets()
    policy = ScriptedPolicy(_prune_first_result)
    trajectory = run_episode(tiny_index, policy, "salmon")
    schemas = counter.count(json.dumps(trajectory.tools))  # shown to the model by the chat template
    for turn in trajectory.turns:
        full = schemas + sum(counter.count(m.get("content") or "") for m in turn.view_messages)
        assert abs(turn.prompt_tokens - full) <= 0.1 * full + 8 * len(turn.view_messages)


# ---- parallel calls, max turns, malformed replies, policy errors ----------------------------


class RecordingBackend:
    """The real index, with searches slowed to 0.2 s and their intervals recorded."""

    def __init__(self, index):
        self.index = index
        self.intervals: list[tuple[float, float, str]] = []
        self.lock = threading.Lock()

    def search(self, query, k=50, exclude=()):
        start = time.perf_counter()
        time.sleep(0.2)
        hits = self.index.search(query, k=k, exclude=exclude)
        with self.lock:
            self.intervals.append((start, time.perf_counter(), threading.current_thread().name))
        return hits

    def __getattr__(self, name):
        return getattr(self.index, name)


def test_parallel_tool_calls_run_concurrently_and_results_keep_call_order(tiny_index):
    backend = RecordingBackend(tiny_index)
    queries = ["lighthouse", "river", "railway", "chess"]
    policy = ScriptedPolicy([[("search_corpus", {"query": q}) for q in queries]], final="done")
    trajectory = run_episode(backend, policy, "q")
    assert len(backend.intervals) == 4
    assert max(start for start, _, _ in backend.intervals) < min(end for _, end, _ in backend.intervals)
    assert len({thread for _, _, thread in backend.intervals}) == 4
    records = trajectory.turns[0].tool_calls
    assert [r.arguments["query"] for r in records] == queries
    tool_ids = [m["tool_call_id"] for m in _tool_messages(policy.views[1][0])]
    assert tool_ids == [r.id for r in records]


def test_max_turns_forces_one_final_answer_request(tiny_index):
    config = HarnessConfig(max_turns=3)
    final = format_final_answer([("river", "It names the river.")])

    def plan(turn, messages, tools):
        return final if not tools else [("search_corpus", {"query": f"query {turn}"})]

    policy = ScriptedPolicy(plan)
    trajectory = run_episode(tiny_index, policy, "q", config)
    assert len(trajectory.turns) == 4 and trajectory.turns[-1].forced_final
    assert trajectory.stop_reason == "max_turns" and policy.views[-1][1] == []
    assert "Give your final answer now" in policy.views[-1][0][-1]["content"]
    assert trajectory.output_doc_ids() == ["river"]


def test_malformed_reply_gets_feedback_then_the_episode_goes_on(tiny_index):
    plan = [PolicyStep(content="<tool_call>{broken", error="invalid tool call JSON"), format_final_answer([("chess", "club")])]
    policy = ScriptedPolicy(plan)
    trajectory = run_episode(tiny_index, policy, "q")
    assert trajectory.turns[0].policy_error == "invalid tool call JSON"
    assert "could not be parsed" in policy.views[1][0][-1]["content"]
    assert trajectory.output_doc_ids() == ["chess"] and trajectory.stop_reason == "answer"


def test_unknown_tool_and_missing_arguments_are_reported_to_the_model(tiny_index):
    plan = [[("web_search", {"query": "x"}), ("search_corpus", {}), ("prune_chunks", {"chunk_ids": []})]]
    trajectory = run_episode(tiny_index, ScriptedPolicy(plan, final="done"), "q")
    errors = [c.error for c in _calls(trajectory)]
    assert "unknown tool" in errors[0] and "non-empty 'query'" in errors[1] and "non-empty 'chunk_ids'" in errors[2]


class FailingPolicy(ScriptedPolicy):
    def act(self, messages, tools):
        if self.views:
            raise RuntimeError("endpoint down")
        return super().act(messages, tools)


def test_a_policy_exception_is_recorded_and_reraised_only_on_request(tiny_index):
    plan = [[("search_corpus", {"query": "river"})]]
    trajectory = run_episode(tiny_index, FailingPolicy(plan), "q")
    assert trajectory.error == "RuntimeError: endpoint down" and trajectory.stop_reason == "policy_error"
    assert len(trajectory.turns) == 1 and trajectory.seen_chunk_ids()
    with pytest.raises(RuntimeError, match="endpoint down"):
        run_episode(tiny_index, FailingPolicy(plan), "q", HarnessConfig(raise_policy_errors=True))


# ---- final answers -------------------------------------------------------------------------

_TITLES = {"a": "Doc A", "b": "Doc B", "c c": "Doc C"}


def _parse(text, **kwargs):
    return parse_final_answer(text, document_title=_TITLES.get, **kwargs)


def test_answer_parsing_keeps_order_dedupes_and_accepts_quotes_and_missing_justifications():
    text = (
        'Plan first.\n<Document id=b><Justification>B has it.</Justification></Document>\n'
        "<Document id='a'>A without tags</Document><Document id=\"c c\"><Justification>C"
        "<Document id=b><Justification>again</Justification></Document>"
    )
    parsed = _parse(text)
    assert [d.doc_id for d in parsed.documents] == ["b", "a", "c c"]
    assert [d.justification for d in parsed.documents] == ["B has it.", "A without tags", "C"]
    assert parsed.errors == []


@pytest.mark.parametrize("text, expected", [
    ("", "empty final answer"),
    ("I could not find anything useful.", "no <Document id=...> entries"),
    ("<Document><Justification>x</Justification></Document>", "without an id"),
    ("<Document id=zzz><Justification>x</Justification></Document>", "unknown document id 'zzz'"),
])
def test_malformed_answers_are_recorded_not_fatal(text, expected):
    parsed = _parse(text)
    assert parsed.documents == [] and expected in parsed.errors[0]


def test_answer_maps_a_cited_chunk_id_to_its_document_and_caps_the_list():
    parsed = _parse("<Document id=ch1></Document><Document id=a></Document><Document id=b></Document>", chunk_docs={"ch1": "c c"}, max_docs=2)
    assert [(d.doc_id, d.chunk_id) for d in parsed.documents] == [("c c", "ch1"), ("a", None)]
    assert "beyond the limit of 2" in parsed.errors[0]


def test_garbage_final_answer_ends_the_episode_with_parse_errors(tiny_index):
    trajectory = run_episode(tiny_index, ScriptedPolicy([], final="<<garbage>> <Document id=nope>"), "q")
    assert trajectory.final_ranking == [] and trajectory.parse_errors and trajectory.error is None


# ---- Nx mode -------------------------------------------------------------------------------


class SeededAnswerPolicy(ScriptedPolicy):
    """Answers with a seed-dependent ranking after one search (so rollouts differ)."""

    rankings = {0: ["river", "lighthouse", "chess"], 1: ["lighthouse", "river"], 2: ["lighthouse", "bakery"]}

    def new_episode(self, question, seed=0):
        ranking = self.rankings[seed]
        return ScriptedPolicy([[("search_corpus", {"query": question})]], final=format_final_answer([(d, f"seed {seed}") for d in ranking]))


def test_nx_mode_runs_independent_rollouts_and_merges_by_rrf(tiny_index):
    with Harness(tiny_index, SeededAnswerPolicy([])) as harness:
        result = harness.run_nx("Corven Point", 3)
    assert [t.seed for t in result.trajectories] == [0, 1, 2]
    assert [d.doc_id for d in result.ranking] == ["lighthouse", "river", "bakery", "chess"]
    assert result.ranking[0].justification == "seed 1"  # the entry from its best-ranked rollout
    assert result.scores["lighthouse"] == pytest.approx(1 / 62 + 1 / 61 + 1 / 61)
    assert result.summary()["turns"] == 6


def test_merge_rankings_of_hand_made_trajectories():
    def trajectory(ids):
        return Trajectory(question="q", policy="p", final_ranking=[RankedDocument(doc_id=i) for i in ids])

    ranking, scores = merge_rankings([trajectory(["x", "y"]), trajectory(["y", "z"]), trajectory([])], limit=2)
    assert [d.doc_id for d in ranking] == ["y", "x"]
    assert scores["z"] == pytest.approx(1 / 62)


# ---- trajectory storage --------------------------------------------------------------------


def test_trajectory_round_trips_through_jsonl_and_parquet(tiny_index, tmp_path):
    policy = ScriptedPolicy(_prune_first_result)
    trajectories = [run_episode(tiny_index, policy, "salmon", seed=0, task_id="t1")]
    trajectories[0].turns[0].completion_logprobs = [-0.5, -1.25]
    trajectories.append(Trajectory(question="empty", policy="p", error="boom", parse_errors=["x"]))
    for write, read, name in ((write_jsonl, read_jsonl, "t.jsonl"), (write_parquet, read_parquet, "t.parquet")):
        loaded = read(write(trajectories, tmp_path / name))
        assert [t.model_dump() for t in loaded] == [t.model_dump() for t in trajectories]
    frame = pl.read_parquet(tmp_path / "t.parquet")
    assert frame["pruned"].to_list() == [2, 0] and frame["task_id"].to_list() == ["t1", None]


# ---- the heuristic policy on real multi-hop questions --------------------------------------


def _gold(record) -> set[str]:
    return {_paragraph_doc_id(p["title"], p["text"]) for p in record["paragraphs"] if p["is_supporting"]}


def test_heuristic_answers_a_multihop_question_with_a_gold_paragraph(pooled):
    from agent.policies import load_policy

    index, questions = pooled
    record = next(q for q in questions if q["id"].startswith("2hop"))
    trajectory = run_episode(index, load_policy("heuristic"), record["question"])
    assert trajectory.error is None and trajectory.parse_errors == [] and trajectory.stop_reason == "answer"
    assert _gold(record) & set(trajectory.output_doc_ids())
    first_turn = trajectory.turns[0].tool_calls
    assert len(first_turn) >= 2 and all(c.name == "search_corpus" for c in first_turn)
    hops = {c.name for t in trajectory.turns[1:] for c in t.tool_calls}
    assert "search_corpus" in hops  # the second hop searches again with what it found
    assert all(d.justification for d in trajectory.final_ranking)


def test_heuristic_finds_gold_paragraphs_for_most_pooled_questions(pooled):
    from agent.policies.heuristic import HeuristicPolicy

    index, questions = pooled
    with Harness(index, HeuristicPolicy()) as harness:
        recalls = []
        for record in questions:
            gold = _gold(record)
            output = set(harness.run(record["question"]).output_doc_ids())
            recalls.append(len(gold & output) / len(gold))
    assert sum(r > 0 for r in recalls) >= 0.9 * len(recalls)
    assert sum(recalls) / len(recalls) >= 0.6


def test_heuristic_is_deterministic(pooled):
    from agent.policies.heuristic import HeuristicPolicy

    index, questions = pooled
    runs = [run_episode(index, HeuristicPolicy(), questions[3]["question"]) for _ in range(2)]
    assert runs[0].output_doc_ids() == runs[1].output_doc_ids()
    assert [[c.arguments for c in t.tool_calls] for t in runs[0].turns] == [[c.arguments for c in t.tool_calls] for t in runs[1].turns]


def test_view_keeps_parts_consistent_after_pruning():
    counter = load_token_offsets()
    view = View(counter)
    view.add_text("system", "sys")
    from agent.harness_view import ChunkPart

    parts = ["header\n", ChunkPart("c1", "d1", "<Chunk id=c1>one two</Chunk>\n", 9), ChunkPart("c2", "d1", "<Chunk id=c2>three</Chunk>\n", 7)]
    view.add_tool_result("t1", "search_corpus", parts, [2, 9, 7])
    total = view.total_tokens
    removed, already, unknown, freed = view.prune(["c1", "c1", "zz"])
    assert removed == ["c1"] and unknown == ["zz"] and freed > 0 and view.total_tokens == total - freed
    assert view.prune(["c1"])[1] == ["c1"]
    assert "[pruned chunk c1]" in view.messages[1]["content"] and "three" in view.messages[1]["content"]
    assert view.recount() == view.total_tokens
