"""The reward (built on the scorer) and the SFT filter predicates on hand-made cases."""

from __future__ import annotations

import pytest

from agent.trajectory import RankedDocument, ToolCallRecord, Trajectory, Turn
from evaluation.metrics import Gold, score_trajectory
from evaluation.reward import annealed_beta, prune_call_streaks, prune_penalty, reward, turn_penalty
from evaluation.sft_filter import Candidate, explored_well_concluded_badly, keep_probability, keep_whole, select_for_sft

GOLD = Gold(doc_ids=frozenset({"A", "B"}), answer="x", answer_doc_ids=frozenset({"B"}))


def trajectory_with(calls_per_turn: list[list[str]], returned: list[str], seen: list[str] = ("A", "B", "C"), **fields) -> Trajectory:
    """Turns of tool calls by name; the first search shows one chunk of each `seen` document."""
    turns = []
    for index, names in enumerate(calls_per_turn):
        calls = []
        for position, name in enumerate(names):
            shown = [f"{d}1" for d in seen] if (index, position) == (0, 0) else []
            calls.append(ToolCallRecord(id=f"c{index}_{position}", name=name, result_chunk_ids=shown, result_doc_ids=[c[0] for c in shown]))
        turns.append(Turn(index=index, prompt_tokens=10, tool_calls=calls))
    return Trajectory(
        question="q", policy="test", turns=turns, chunk_docs={f"{d}1": d for d in seen},
        final_ranking=[RankedDocument(doc_id=d) for d in returned], stop_reason=fields.pop("stop_reason", "answer"), **fields,
    )


def test_components_of_a_clean_success():
    t = trajectory_with([["search_corpus"]], returned=["A", "B"])
    r = reward(t, GOLD, beta=2.0)
    assert (r.f_beta, r.trajectory_recall, r.answer_found) == (1.0, 1.0, 1.0)
    assert r.pre_penalty == pytest.approx(0.7 + 0.3 + 1.0)
    assert r.reward == pytest.approx(2.0)
    assert (r.p_prune, r.p_turn, r.completed, r.floored) == (0.0, 0.0, True, False)


def test_reward_uses_the_scorer_numbers():
    t = trajectory_with([["search_corpus"]], returned=["A", "C"])
    score = score_trajectory(t, GOLD)
    r = reward(t, GOLD, beta=4.0)
    precision, recall = score.precision, score.recall  # 0.5, 0.5
    expected_f = (1 + 16) * precision * recall / (16 * precision + recall)
    assert r.f_beta == pytest.approx(expected_f)
    assert r.pre_penalty == pytest.approx(0.7 * expected_f + 0.3 * 1.0 + 0.0)


def test_prune_streaks_beyond_three_are_penalized_and_capped():
    three = trajectory_with([["search_corpus"], ["prune_chunks"], ["prune_chunks"], ["prune_chunks"], ["search_corpus"]], ["A", "B"])
    assert prune_call_streaks(three) == [3]
    assert reward(three, GOLD, beta=2.0).p_prune == 0.0
    five = trajectory_with([["search_corpus"]] + [["prune_chunks"]] * 5, ["A", "B"])
    r = reward(five, GOLD, beta=2.0)
    assert (r.excess_prunes, r.p_prune) == (2, pytest.approx(0.2))
    assert r.reward == pytest.approx(2.0 - 0.2)
    # A streak is over calls, not turns: parallel prunes in one turn extend it.
    parallel = trajectory_with([["search_corpus"], ["prune_chunks", "prune_chunks"], ["prune_chunks", "prune_chunks"]], ["A", "B"])
    assert prune_call_streaks(parallel) == [4]
    assert prune_penalty([20]) == (0.5, 17)
    assert prune_penalty([4, 5]) == (pytest.approx(0.3), 3)


def test_turn_penalty_is_linear_from_64_to_128():
    assert turn_penalty(10) == 0.0 and turn_penalty(64) == 0.0
    assert turn_penalty(96) == pytest.approx(0.25)
    assert turn_penalty(128) == pytest.approx(0.5) and turn_penalty(500) == pytest.approx(0.5)
    long = trajectory_with([["search_corpus"]] + [["grep_corpus"]] * 95, ["A", "B"])
    assert reward(long, GOLD, beta=2.0).p_turn == pytest.approx(0.25)


def test_floor_for_completed_episodes_and_cap_at_pre_penalty():
    # Found little, penalized heavily: floored at eps, never above what it earned.
    weak = trajectory_with([["search_corpus"]] + [["prune_chunks"]] * 10 + [["grep_corpus"]] * 120, ["C"], seen=["A", "C"])
    r = reward(weak, GOLD, beta=2.0, eps=0.05)
    assert r.pre_penalty == pytest.approx(0.15)  # only trajectory recall 0.5
    assert r.reward == pytest.approx(0.05) and r.floored
    # Found nothing at all: the floor does not inflate a zero pre-penalty value.
    nothing = trajectory_with([["search_corpus"]], ["C"], seen=["C"])
    assert reward(nothing, GOLD, beta=2.0, eps=0.05).reward == 0.0
    # Failures (policy error, malformed answer) get 0, below every success.
    failed = trajectory_with([["search_corpus"]], ["A", "B"], error="endpoint down")
    assert reward(failed, GOLD, beta=2.0).reward == 0.0
    malformed = trajectory_with([["search_corpus"]], ["A", "B"], stop_reason="malformed")
    assert reward(malformed, GOLD, beta=2.0).completed is False


def test_beta_anneals_from_4_to_2():
    assert annealed_beta(0, 5) == 4.0 and annealed_beta(4, 5) == 2.0 and annealed_beta(2, 5) == pytest.approx(3.0)


def test_sft_filter_predicates():
    assert keep_whole(0.6, 0.5) and not keep_whole(0.5, 0.5) and not keep_whole(0.6, 0.4)
    assert explored_well_concluded_badly(1.0, 0.0) and not explored_well_concluded_badly(1.0, 0.6)
    assert keep_probability(0.6, 0.5) == 1.0 and keep_probability(0.5, 0.0) == 0.0
    assert 0.0 < keep_probability(0.25, 0.2) < keep_probability(0.45, 0.35) < 1.0


def test_sft_selection_rules():
    pool = [
        Candidate("w1", "q1", 1.0, 1.0, tokens=900),
        Candidate("w2", "q1", 1.0, 1.0, tokens=500),  # same recall, cheaper: the one kept
        Candidate("bad", "q2", 1.0, 0.0),  # explored well, concluded badly
        Candidate("mal", "q3", 1.0, 1.0, malformed=True),
    ] + [Candidate(f"k{i}", f"p{i}", 0.9, 0.8) for i in range(40)] + [
        Candidate("z1", "z", 0.0, 0.0), Candidate("z2", "z", 0.0, 0.0), Candidate("z3", "y", 0.0, 0.0),
    ]
    decisions = {d.key: d for d in select_for_sft(pool, seed=1)}
    assert decisions["w2"].keep and not decisions["w1"].keep
    assert decisions["bad"].reason == "dropped:explored_well_concluded_badly"
    assert decisions["mal"].reason == "dropped:malformed"
    kept = [d for d in decisions.values() if d.keep]
    negatives = [d for d in kept if d.reason == "negative"]
    assert len(negatives) <= 0.05 * len(kept) and len(negatives) == 2  # 41 positives allow 2
    assert not (decisions["z1"].keep and decisions["z2"].keep)  # one per query
    assert select_for_sft(pool, seed=1) == select_for_sft(pool, seed=1)
