"""Harness profiles: the compact view, the window check, the forced final on a full window."""

from __future__ import annotations

import pytest

from agent.compact_view import References, best_sentences, parse_reference_answer
from agent.harness import HarnessConfig, ProfileError, run_episode
from agent.policy_base import PolicyStep
from tests.test_harness import TINY_DOCS, ScriptedPolicy, tiny_index  # noqa: F401 - the fixture

COMPACT = HarnessConfig(view="compact", token_budget=4096, search_budget_tokens=512, response_reserve_tokens=256)


def _tool_contents(messages: list[dict]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "tool"]


def test_compact_view_shows_references_titles_and_no_ids(tiny_index):
    policy = ScriptedPolicy([[("search_corpus", {"query": "Mara Quell engineer"})]], final="[1]")
    trajectory = run_episode(tiny_index, policy, "Who designed the Alpha Lighthouse?", COMPACT)
    shown = _tool_contents(policy.views[1][0])[0]
    assert shown.startswith("search_corpus: ")
    assert "[1] " in shown and "[2] " in shown and "<Chunk" not in shown
    assert not any(chunk_id in shown for chunk_id in trajectory.chunk_docs)
    assert "Results are shown as [n] Title: text" in policy.views[0][0][0]["content"]


def test_compact_answer_by_references_resolves_to_documents(tiny_index):
    policy = ScriptedPolicy([[("search_corpus", {"query": "Alpha Lighthouse Mara Quell"})]], final="[2] [1] [2] [99]")
    trajectory = run_episode(tiny_index, policy, "Who designed the Alpha Lighthouse?", COMPACT)
    call = trajectory.tool_call_records()[0]
    first, second = call.result_chunk_ids[:2]
    expected = list(dict.fromkeys([trajectory.chunk_docs[second], trajectory.chunk_docs[first]]))
    assert trajectory.output_doc_ids() == expected
    assert any("[99]" in error for error in trajectory.parse_errors)


def test_compact_prune_and_read_take_references_and_record_them_as_written(tiny_index):
    plan = [
        [("search_corpus", {"query": "Mara Quell Lisbon"})],
        [("prune_chunks", {"chunk_ids": ["[1]"]}), ("read_document", {"doc_id": "2"})],
    ]
    policy = ScriptedPolicy(plan, final="[2]")
    trajectory = run_episode(tiny_index, policy, "Where did Mara Quell teach?", COMPACT)
    search, prune, read = trajectory.tool_call_records()
    assert prune.pruned_chunk_ids == [search.result_chunk_ids[0]] and prune.arguments == {"chunk_ids": ["[1]"]}
    assert read.error is None and read.arguments == {"doc_id": "2"}
    last_view = policy.views[-1][0]
    assert "[1] (pruned)" in _tool_contents(last_view)[0]
    read_doc = trajectory.chunk_docs[search.result_chunk_ids[1]]
    assert all(trajectory.chunk_docs[c] == read_doc for c in read.result_chunk_ids)


def test_references_number_every_chunk_once_in_order():
    refs = References()
    assert [refs.assign(c) for c in ("a", "b", "a", "c")] == [1, 2, 1, 3]
    assert refs.chunk("[2]") == "b" and refs.chunk(3) == "c" and refs.chunk("7") is None and refs.chunk("a") == "a"


def test_reference_answer_accepts_bare_numbers_and_the_full_form():
    refs = References()
    for chunk in ("c1", "c2"):
        refs.assign(chunk)
    docs = {"c1": "d1", "c2": "d2"}
    title = lambda doc: {"d1": "One", "d2": "Two"}.get(doc)  # noqa: E731
    assert [d.doc_id for d in parse_reference_answer("2, 1", refs, docs, document_title=title, max_docs=5).documents] == ["d2", "d1"]
    full = parse_reference_answer("<Document id=d1></Document>", refs, docs, document_title=title, max_docs=5)
    assert [d.doc_id for d in full.documents] == ["d1"]
    assert parse_reference_answer("no idea", refs, docs, document_title=title, max_docs=5).errors


def test_best_sentences_keep_the_first_and_the_question_sentences():
    text = "Mara Quell was an engineer. She liked tea. The lighthouse at Corven Point is hers. Rain fell."
    picked = best_sentences(text, {"lighthouse", "corven"}, max_sentences=2)
    assert picked == "Mara Quell was an engineer. The lighthouse at Corven Point is hers."


class _WindowPolicy(ScriptedPolicy):
    """A scripted policy with a context window and tool-schema overhead it can tell."""

    def __init__(self, *args, window: int, overhead: int = 100, **kwargs):
        super().__init__(*args, **kwargs)
        self.window, self.overhead = window, overhead

    def context_window(self):
        return self.window

    def tool_overhead_tokens(self, tools):
        return self.overhead if tools else 0


def test_a_profile_that_does_not_fit_the_window_is_an_error_naming_the_numbers(tiny_index):
    policy = _WindowPolicy([], final="[1]", window=8192, overhead=500)
    with pytest.raises(ProfileError, match=r"8,192-token context window.*token_budget 32,768.*tool schemas 500"):
        run_episode(tiny_index, policy, "q", HarnessConfig())
    run_episode(tiny_index, policy, "q", HarnessConfig(token_budget=6000, response_reserve_tokens=512))


def test_usage_line_counts_the_tool_schemas(tiny_index):
    policy = _WindowPolicy([[("search_corpus", {"query": "salmon"})]], final="[1]", window=8192, overhead=300)
    trajectory = run_episode(tiny_index, policy, "salmon", COMPACT)
    assert trajectory.turns[0].prompt_tokens > 300
    bare = run_episode(tiny_index, ScriptedPolicy([[("search_corpus", {"query": "salmon"})]], final="[1]"), "salmon", COMPACT)
    # The same messages: the difference is the measured overhead against the schemas' JSON count.
    assert trajectory.turns[0].prompt_tokens - bare.turns[0].prompt_tokens == 300 - _schema_tokens(bare)


def _schema_tokens(trajectory) -> int:
    import json

    from search.embedding_window import load_token_offsets

    return load_token_offsets().count(json.dumps(trajectory.tools))


def test_a_full_window_forces_the_final_answer_instead_of_malformed_replies(tiny_index):
    full = PolicyStep(content=None, window_full=True, error="prompt leaves no room")

    def plan(turn, messages, tools):
        if turn == 0:
            return [("search_corpus", {"query": "Mara Quell"})]
        return full if tools else "[1]"

    policy = ScriptedPolicy(plan)
    trajectory = run_episode(tiny_index, policy, "Who is Mara Quell?", COMPACT)
    assert trajectory.stop_reason == "window"
    assert trajectory.turns[-1].forced_final and policy.views[-1][1] == []
    assert len(trajectory.output_doc_ids()) == 1


def test_profile_round_trip_keeps_the_training_settings_and_takes_overrides():
    trained = HarnessConfig.for_training(view="compact", token_budget=4096, search_budget_tokens=384, max_output_docs=5)
    profile = trained.profile()
    assert profile["prompt_version"] == "compact-1" and profile["soft_hint"] is True
    again = HarnessConfig.from_profile(profile, max_turns=4)
    assert (again.view, again.token_budget, again.search_budget_tokens, again.max_turns) == ("compact", 4096, 384, 4)
    # The samples it learned from ended past the soft threshold with the hint: it runs with it.
    assert again.soft_hint is True
    assert HarnessConfig.from_profile(profile, soft_hint=False).soft_hint is False  # a caller may still turn it off
    assert HarnessConfig.from_profile(None).soft_hint is False  # baselines have no profile and no hint


def test_a_profile_recorded_before_the_hint_was_part_of_it_runs_with_the_hint():
    """Every checkpoint was trained on `for_training` rollouts (hint on) before the profile said
    so; its sidecar's profile lacks the key, and it must not lose the hint it learned with."""
    legacy = HarnessConfig.for_training(view="compact", token_budget=4096).profile()
    del legacy["soft_hint"]
    assert HarnessConfig.from_profile(legacy).soft_hint is True


def test_a_checkpoint_is_shown_the_hint_it_was_trained_with_and_a_baseline_is_not(tiny_index):
    queries = ["Mara Quell", "Corven River salmon", "Tallis Railway", "Grey Sea Chess Club"]
    plan = [[("search_corpus", {"query": q}) for q in queries], [("search_corpus", {"query": "Quell Bakery Lisbon"})]]
    settings = {"view": "compact", "token_budget": 900, "search_budget_tokens": 400, "response_reserve_tokens": 120}
    trained = HarnessConfig.from_profile(HarnessConfig.for_training(**settings).profile())
    for config, shown in ((trained, True), (HarnessConfig(**settings), False)):
        policy = ScriptedPolicy(plan, final="[1]")
        trajectory = run_episode(tiny_index, policy, "Who is Mara Quell?", config)
        assert any(turn.hint_shown for turn in trajectory.turns) is shown
        observations = "\n".join(str(m["content"]) for view in policy.views for m in view[0] if m["role"] == "tool")
        assert ("more than 50% full" in observations) is shown


def test_headers_usage_lines_and_hints_never_push_a_view_past_the_budget(tiny_index):
    """Issue 13 item 15: every part of an observation is paid for before results are cut."""
    question = "Mara Quell Lisbon lighthouse river railway chess bakery"
    queries = ["Mara Quell", "Corven River salmon", "Tallis Railway", "Grey Sea Chess Club", "Quell Bakery Lisbon"]
    plan = [[("search_corpus", {"query": q}) for q in queries], [("read_document", {"doc_id": "lighthouse"})]]
    for view in ("full", "compact"):
        budget = 900 if view == "compact" else 1500
        config = HarnessConfig(view=view, token_budget=budget, search_budget_tokens=400, response_reserve_tokens=120,
                               hard_cutoff=1.0, soft_threshold=0.5, soft_hint=True)
        trajectory = run_episode(tiny_index, ScriptedPolicy(plan, final="[1]"), question, config)
        usages = [turn.view_token_usage for turn in trajectory.turns if turn.tool_calls]
        # Results are cut to leave the reply reserve; a call made when the view is already full still
        # gets its one-line header, which the reserve absorbs: the view never passes the budget.
        assert usages and all(usage <= budget for usage in usages), (view, usages)
        assert any(turn.hint_shown for turn in trajectory.turns), "the hint was shown and paid for"


def test_a_served_checkpoint_reached_through_an_endpoint_runs_under_its_sidecars_profile(tiny_index, tmp_path):
    """vLLM serves an adapter as `openai:URL#NAME`; the search still runs it under the profile its
    sidecar records (here with the heuristic standing in for the endpoint's policy)."""
    import json

    from serving.search import run_search

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "smollm2"}))
    profile = HarnessConfig(token_budget=9000, search_budget_tokens=300, max_turns=3).profile()
    (adapter / "searchsmith_adapter.json").write_text(json.dumps({"base_model": "smollm2", "harness_profile": profile}))
    response = run_search(tiny_index, "Who designed the Alpha Lighthouse?", "heuristic", k=2, profile_spec=f"transformers:{adapter}")
    config = response.trajectories[0].config
    assert (config["token_budget"], config["search_budget_tokens"], config["max_turns"], config["max_output_docs"]) == (9000, 300, 3, 2)
    plain = run_search(tiny_index, "Who designed the Alpha Lighthouse?", "heuristic", k=2).trajectories[0].config
    assert plain["token_budget"] == 32_768


def test_a_markdown_title_line_is_not_shown_twice():
    from agent.compact_view import render_compact_chunk

    rendered = render_compact_chunk(4, "Cecil Parker", "# Cecil Parker\n\nCecil Parker was an English actor.", set())
    assert rendered == "[4] Cecil Parker: Cecil Parker was an English actor.\n"
    assert render_compact_chunk(1, "T", "No heading here.", set()) == "[1] T: No heading here.\n"


def test_the_heuristic_cannot_run_in_a_view_it_cannot_read(tiny_index):
    """In the compact view the heuristic would parse no results and answer that nothing was found:
    a zero that reads like a score. It is a ProfileError naming the view instead."""
    from agent.policies.heuristic import HeuristicPolicy

    with pytest.raises(ProfileError, match=r"heuristic policy reads only the full view.*'compact' view.*benchmark\.harness\.view"):
        run_episode(tiny_index, HeuristicPolicy(), "salmon", COMPACT)
    assert run_episode(tiny_index, HeuristicPolicy(), "salmon", COMPACT.model_copy(update={"view": "full"})).final_ranking
