"""The one scorer on hand-made trajectories: every definition the benchmark, the SFT filter and
the reward share."""

from __future__ import annotations

import math

import pytest

from agent.trajectory import RankedDocument, ToolCallRecord, Trajectory, Turn
from core.text_match import answer_form, contains_answer
from evaluation.answers import answer_doc_ids
from evaluation.bootstrap import bootstrap_mean, paired_difference
from evaluation.metrics import Gold, f_beta, score_trajectory


def make_trajectory(
    seen: list[tuple[str, str]],
    returned: list[str],
    pruned: list[str] = (),
    error: str | None = None,
    prompt_tokens: tuple[int, ...] = (100, 300),
) -> Trajectory:
    """Turn 0 searches and shows `seen` (chunk, doc) pairs; turn 1 prunes; the answer returns docs."""
    chunk_docs = dict(seen)
    search = ToolCallRecord(
        id="c0", name="search_corpus", arguments={"query": "q"},
        result_chunk_ids=[c for c, _ in seen], result_doc_ids=list(dict.fromkeys(d for _, d in seen)),
    )
    turns = [Turn(index=0, prompt_tokens=prompt_tokens[0], tool_calls=[search])]
    if pruned:
        prune = ToolCallRecord(id="c1", name="prune_chunks", arguments={"chunk_ids": list(pruned)}, pruned_chunk_ids=list(pruned))
        turns.append(Turn(index=1, prompt_tokens=prompt_tokens[1], tool_calls=[prune], pruned_ids=list(pruned)))
    return Trajectory(
        question="q", policy="test", turns=turns, chunk_docs=chunk_docs, error=error,
        final_ranking=[RankedDocument(doc_id=d) for d in returned], stop_reason="answer",
        peak_tokens=max(t.prompt_tokens for t in turns), total_prompt_tokens=sum(t.prompt_tokens for t in turns), wall_s=1.5,
    )


SEEN = [("a1", "A"), ("b1", "B"), ("c1", "C"), ("d1", "D")]


def test_pruned_gold_counts_for_trajectory_recall_not_output_recall():
    gold = Gold(doc_ids=frozenset({"A", "B"}), answer="x", answer_doc_ids=frozenset({"B"}))
    trajectory = make_trajectory(SEEN, returned=["A", "C"], pruned=["b1", "d1"])
    score = score_trajectory(trajectory, gold, k=5)
    assert score.recall == 0.5
    assert score.trajectory_recall == 1.0
    assert score.precision == 0.5
    assert score.f1 == pytest.approx(0.5)
    assert score.answer_found == 0.0  # B held the answer and was pruned
    assert score.prune_accuracy == 0.5  # b1 is gold, d1 is not
    assert score.n_pruned == 2


def test_output_is_cut_to_k_and_deduplicated():
    gold = Gold(doc_ids=frozenset({"C"}), answer_doc_ids=frozenset({"C"}))
    trajectory = make_trajectory(SEEN, returned=["A", "A", "B", "C"])
    assert score_trajectory(trajectory, gold, k=2).recall == 0.0
    score = score_trajectory(trajectory, gold, k=3)
    assert (score.recall, score.n_returned, score.answer_found) == (1.0, 3, 1.0)
    assert score.precision == pytest.approx(1 / 3)


def test_no_prunes_leave_prune_accuracy_unmeasured():
    gold = Gold(doc_ids=frozenset({"A"}), answer_doc_ids=frozenset({"A"}))
    assert score_trajectory(make_trajectory(SEEN, ["A"]), gold).prune_accuracy is None


def test_costs_and_error_flags():
    gold = Gold(doc_ids=frozenset({"A"}), answer_doc_ids=frozenset({"A"}))
    score = score_trajectory(make_trajectory(SEEN, [], pruned=["d1"], error="boom"), gold)
    assert (score.turns, score.tool_calls, score.tool_calls_per_turn) == (2, 2, 1.0)
    assert (score.peak_tokens, score.total_prompt_tokens, score.wall_s) == (300, 400, 1.5)
    assert score.error and score.recall == 0.0 and score.precision == 0.0


def test_yes_no_answer_needs_every_gold_document():
    texts = {"A": "Ian Brown is not an actor.", "B": "Dee Snider is an actor, no doubt."}
    gold = Gold(doc_ids=frozenset(texts), answer="no", answer_doc_ids=answer_doc_ids("no", texts, among=texts))
    assert gold.answer_needs_all_gold
    assert score_trajectory(make_trajectory(SEEN, ["A", "C"]), gold).answer_found == 0.0
    assert score_trajectory(make_trajectory(SEEN, ["B", "C", "A"]), gold).answer_found == 1.0


def test_answer_outside_gold_falls_back_to_all_gold():
    texts = {"A": "The band formed in 1988.", "B": "It was released later."}
    gold = Gold(doc_ids=frozenset(texts), answer="1989", answer_doc_ids=answer_doc_ids("1989", texts, among=texts))
    assert gold.answer_needs_all_gold


def test_whole_word_answer_matching():
    assert not contains_answer("This is not the case.", "no")
    assert contains_answer("No, it is not.", "no")
    assert not contains_answer("founded in 19880", "1988")
    assert contains_answer("founded in 1988.", "1988")
    assert contains_answer("He edited ARTHUR'S   magazine in 1844", "Arthur's Magazine")
    assert contains_answer("Café Müller opened", "cafe muller")
    assert contains_answer("the Beatles played", "The Beatles")
    assert not contains_answer("anything at all", "the")  # normalizes to nothing: matches nothing
    assert answer_form("The  Quick, brown—fox!") == "quick brown fox"


def test_answer_doc_ids_uses_whole_words():
    texts = {"A": "This is not it.", "B": "Paris is the capital.", "C": "Parisian cafes."}
    assert answer_doc_ids("Paris", texts) == frozenset({"B"})
    assert answer_doc_ids("yes", {"A": "yes indeed"}) == frozenset()


def test_fact_level_a_fact_is_found_by_any_of_its_chunks():
    # Fact 1 lives in chunks a1 or c1 (docs A, C); fact 2 in b1 (doc B). Returning C finds fact 1.
    gold = Gold(
        doc_ids=frozenset({"A", "B"}), answer_doc_ids=frozenset({"A"}),
        facts=(frozenset({"a1", "c1"}), frozenset({"b1"})), chunk_docs=dict(SEEN),
    )
    trajectory = make_trajectory(SEEN, returned=["C", "D"], pruned=["b1", "d1"])
    score = score_trajectory(trajectory, gold, granularity="fact")
    assert score.recall == 0.5
    assert score.trajectory_recall == 1.0
    assert score.precision == 0.5  # C holds a fact chunk, D does not
    assert score.prune_accuracy == 0.5
    assert score.n_gold == 2
    with pytest.raises(ValueError):
        score_trajectory(trajectory, Gold(doc_ids=frozenset({"A"})), granularity="fact")


def test_f_beta_weights_recall():
    assert f_beta(0.0, 1.0, 2.0) == 0.0
    assert f_beta(0.5, 0.5, 1.0) == pytest.approx(0.5)
    assert f_beta(0.2, 1.0, 4.0) > f_beta(1.0, 0.2, 4.0)
    p, r, b = 0.25, 0.8, 2.0
    assert f_beta(p, r, b) == pytest.approx(5 * p * r / (4 * p + r))


def test_bootstrap_is_deterministic_under_a_seed():
    values = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    first = bootstrap_mean(values, resamples=500, seed=7)
    again = bootstrap_mean(values, resamples=500, seed=7)
    other = bootstrap_mean(values, resamples=500, seed=8)
    assert first == again
    assert first.mean == pytest.approx(0.7)
    assert first.low <= first.mean <= first.high
    assert other.mean == first.mean
    assert bootstrap_mean([0.4]).low == bootstrap_mean([0.4]).high == 0.4
    assert math.isnan(bootstrap_mean([]).mean)


def test_a_paired_difference_is_narrower_than_the_two_intervals_side_by_side():
    """Two rows on the same 60 questions, one better on 6 of them: the rows' own intervals
    overlap widely, the paired interval of the difference excludes zero."""
    tasks = [f"q{i}" for i in range(60)]
    theirs = {task: float(i % 2) for i, task in enumerate(tasks)}  # half the questions
    ours = {task: 1.0 if i < 12 else theirs[task] for i, task in enumerate(tasks)}  # and 6 more
    difference = paired_difference(ours, theirs)
    assert difference.mean == pytest.approx(0.1) and difference.n == 60
    assert 0.0 < difference.low < 0.1 < difference.high
    a, b = bootstrap_mean(list(ours.values())), bootstrap_mean(list(theirs.values()))
    assert a.low < b.high  # side by side, the two rows' intervals overlap
    assert paired_difference(theirs, theirs).as_list() == [0.0, 0.0]
    with pytest.raises(ValueError, match="q59"):
        paired_difference({task: 1.0 for task in tasks[:-1]}, theirs)  # a question scored on one side only


def test_ids_only_named_in_the_answer_do_not_count_for_trajectory_recall():
    """Guessed ids (never shown by a tool) may earn output recall but never trajectory recall,
    which feeds the reward and the SFT filter."""
    gold = Gold(doc_ids=frozenset({"A", "G"}), answer_doc_ids=frozenset({"G"}))
    trajectory = make_trajectory(SEEN, returned=["A", "G"])  # G was never in a tool result
    score = score_trajectory(trajectory, gold, k=5)
    assert score.recall == 1.0
    assert score.trajectory_recall == 0.5


def test_fact_seen_only_through_the_answer_does_not_count_for_trajectory_recall():
    gold = Gold(
        doc_ids=frozenset({"A", "G"}), answer_doc_ids=frozenset({"G"}),
        facts=(frozenset({"a1"}), frozenset({"g1"})), chunk_docs={"a1": "A", "g1": "G"},
    )
    score = score_trajectory(make_trajectory(SEEN, returned=["A", "G"]), gold, k=5, granularity="fact")
    assert score.recall == 1.0
    assert score.trajectory_recall == 0.5
