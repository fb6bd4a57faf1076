"""The Context-1 filter applied to hand-made trajectories: counts per rule, recalls, export, plot."""

from __future__ import annotations

import pytest

from agent.trajectory import RankedDocument, ToolCallRecord, Trajectory, Turn
from evaluation.metrics import Gold
from training.kept_trajectories import filter_trajectories, kept_dataset, malformed_reason, trajectories_from_dataset
from training.sft_plots import plot_recall_histograms

GOLD = Gold(doc_ids=frozenset({"g1", "g2"}))
GOLD3 = Gold(doc_ids=frozenset({"g1", "g2", "g3"}))


def make(task: str, seen: list[str], returned: list[str], tokens: int = 100, **fields) -> Trajectory:
    """One search turn that showed `seen` and an answer that returned `returned`."""
    view = [{"role": "system", "content": "s"}, {"role": "user", "content": task}]
    turn = Turn(index=0, prompt_tokens=tokens, view_messages=view, tool_calls=[
        ToolCallRecord(id="c", name="search_corpus", arguments={"query": task},
                       result_chunk_ids=[f"{d}#0" for d in seen], result_doc_ids=seen),
    ])
    answer = Turn(index=1, prompt_tokens=tokens, view_messages=view, completion="answer")
    return Trajectory(
        question=task, policy="teacher", task_id=task, turns=[turn, answer], total_prompt_tokens=tokens,
        final_ranking=[RankedDocument(doc_id=d) for d in returned], stop_reason="answer", **fields,
    )


def pool() -> tuple[list[Trajectory], dict[str, Gold]]:
    trajectories = [
        make("dup", ["g1", "g2"], ["g1", "g2"], tokens=300),
        make("dup", ["g1", "g2"], ["g1", "g2"], tokens=100),  # the cheaper twin is the one kept
        make("badend", ["g1", "g2"], ["x"]),  # explored well, concluded badly
        make("broken", ["g1", "g2"], ["g1", "g2"], error="endpoint down"),
        make("zero-a", ["x"], ["x"]),
        make("zero-b", ["y"], ["y"]),
    ]
    trajectories += [make(f"good{i}", ["g1", "g2"], ["g1", "g2"]) for i in range(18)]
    golds = {t.task_id: GOLD for t in trajectories}
    return trajectories, golds


def test_counts_per_rule():
    trajectories, golds = pool()
    result = filter_trajectories(trajectories, golds, seed=0)
    # 19 kept whole -> 5% of 20 allows exactly one zero-recall negative.
    assert result.counts == {
        "whole": 19, "dropped:duplicate_high_recall": 1, "dropped:explored_well_concluded_badly": 1,
        "dropped:malformed": 1, "negative": 1, "dropped:zero_recall": 1,
    }
    assert len(result.kept) == 20
    dup = [t for t in trajectories if t.task_id == "dup"]
    assert result.reason_of(dup[1].id) == "whole" and result.reason_of(dup[0].id) == "dropped:duplicate_high_recall"


def test_recall_distributions_before_and_after():
    trajectories, golds = pool()
    result = filter_trajectories(trajectories, golds, seed=0)
    assert len(result.recall_before["output_recall"]) == len(trajectories)
    assert len(result.recall_after["trajectory_recall"]) == len(result.kept)
    assert sorted(result.recall_after["output_recall"]) == [0.0] + [1.0] * 19
    meta = result.metadata()
    assert meta["kept"] == 20 and meta["rollouts"] == 24 and meta["counts"]["whole"] == 19
    assert meta["mean_output_recall_after"] > meta["mean_output_recall_before"]


def test_lower_recall_is_kept_at_a_diminishing_rate():
    low = [make(f"low{i}", ["g1"], ["g1"]) for i in range(300)]  # recalls 1/3: keep probability 4/9
    result = filter_trajectories(low, {t.task_id: GOLD3 for t in low}, seed=3)
    kept = result.counts.get("diminishing", 0)
    assert kept + result.counts.get("dropped:sampled_out", 0) == 300
    assert 0.3 < kept / 300 < 0.6
    again = filter_trajectories(low, {t.task_id: GOLD3 for t in low}, seed=3)
    assert [d.keep for d in again.decisions] == [d.keep for d in result.decisions]


@pytest.mark.parametrize("fields, turn_update, expected", [
    ({"error": "boom"}, {}, "policy error"),
    ({"stop_reason": "malformed"}, {}, "stopped"),
    ({}, {"policy_error": "no JSON"}, "unparseable"),
    ({"parse_errors": ["no <Document id=...> entries found"]}, {}, "final answer"),
    ({}, {"view_messages": []}, "views"),
])
def test_malformed_reasons(fields, turn_update, expected):
    trajectory = make("m", ["g1"], ["g1"])
    trajectory = trajectory.model_copy(update=fields)
    trajectory.turns[0] = trajectory.turns[0].model_copy(update=turn_update)
    assert expected in (malformed_reason(trajectory) or "")
    assert malformed_reason(make("ok", ["g1"], ["g1"])) is None


def test_a_task_without_gold_is_an_error_not_a_zero():
    with pytest.raises(KeyError, match="no gold"):
        filter_trajectories([make("orphan", [], [])], {})


def test_kept_trajectories_export_as_a_datasets_dataset(tmp_path):
    trajectories, golds = pool()
    result = filter_trajectories(trajectories, golds, seed=0)
    dataset = kept_dataset(result)
    assert len(dataset) == 20 and {"task_id", "output_recall", "reason", "trajectory_json"} <= set(dataset.column_names)
    dataset.save_to_disk(str(tmp_path / "ds"))
    from datasets import load_from_disk

    back = trajectories_from_dataset(load_from_disk(str(tmp_path / "ds")))
    assert [t.model_dump() for t in back] == [t.model_dump() for t in result.kept]


def test_recall_histogram_is_a_png(tmp_path):
    trajectories, golds = pool()
    result = filter_trajectories(trajectories, golds, seed=0)
    path = plot_recall_histograms(result.recall_before, result.recall_after, tmp_path / "recall.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
