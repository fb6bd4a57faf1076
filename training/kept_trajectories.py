"""Context-1's SFT filter applied to teacher trajectories, and the kept ones as a `datasets` dataset.

Why a thin layer: the rules live in `evaluation.sft_filter` and the recalls come from
`evaluation.metrics.score_trajectory`, the benchmark's own scorer, so distillation keeps
exactly what the benchmark would call good; this module only scores, decides what
"malformed" means for a recorded trajectory, and reports counts and recall distributions.

Malformed (dropped before any recall rule): the policy failed (`error`), a turn's reply could
not be parsed (`policy_error`: training on it would teach the broken format), the final answer
had parse errors, or no per-turn views were recorded (no samples can be built without them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.trajectory import Trajectory
from evaluation.metrics import Gold, TaskScore, score_trajectory
from evaluation.sft_filter import EXPLORED_GAP, Candidate, Decision, select_for_sft

RECALL_KEYS = ("trajectory_recall", "output_recall")


def malformed_reason(trajectory: Trajectory) -> str | None:
    """Why a trajectory cannot be a training example, or None when it is well formed."""
    if trajectory.error:
        return f"policy error: {trajectory.error}"
    if trajectory.stop_reason in ("malformed", "policy_error"):
        return f"stopped: {trajectory.stop_reason}"
    broken = [turn.index for turn in trajectory.turns if turn.policy_error]
    if broken:
        return f"unparseable replies at turns {broken}"
    if trajectory.parse_errors:
        return f"final answer: {trajectory.parse_errors[0]}"
    if not trajectory.turns or any(not turn.view_messages for turn in trajectory.turns):
        return "per-turn views were not recorded"
    return None


@dataclass
class FilterResult:
    """What the filter kept, why each rollout was kept or dropped, and the recall distributions."""

    kept: list[Trajectory]
    decisions: list[Decision]  # aligned with the input trajectories
    scores: dict[str, TaskScore]  # trajectory id -> scores
    counts: dict[str, int]  # reason -> rollouts (whole, diminishing, negative, dropped:<why>)
    recall_before: dict[str, list[float]] = field(default_factory=dict)
    recall_after: dict[str, list[float]] = field(default_factory=dict)

    def reason_of(self, trajectory_id: str) -> str:
        return next(d.reason for d in self.decisions if d.key == trajectory_id)

    def metadata(self) -> dict[str, Any]:
        def mean(values: list[float]) -> float | None:
            return round(sum(values) / len(values), 4) if values else None

        return {
            "rollouts": len(self.decisions),
            "kept": len(self.kept),
            "counts": dict(sorted(self.counts.items())),
            "tasks_kept": len({t.task_id for t in self.kept}),
            **{f"mean_{key}_before": mean(self.recall_before.get(key, [])) for key in RECALL_KEYS},
            **{f"mean_{key}_after": mean(self.recall_after.get(key, [])) for key in RECALL_KEYS},
        }


def filter_trajectories(
    trajectories: Sequence[Trajectory],
    golds: Mapping[str, Gold],
    *,
    k: int | None = None,
    seed: int = 0,
    gap: float = EXPLORED_GAP,
) -> FilterResult:
    """Score every trajectory against its task's gold and apply the Context-1 rules.

    `golds` maps task ids to gold (see `golds_for_tasks`); a trajectory whose task has no gold
    is an error (it would otherwise be scored as zero recall and kept as a negative).
    """
    missing = sorted({str(t.task_id) for t in trajectories if t.task_id not in golds})
    if missing:
        raise KeyError(f"no gold for {len(missing)} task(s), e.g. {missing[:3]}")
    ids = [t.id for t in trajectories]
    if len(set(ids)) != len(ids):
        raise ValueError("trajectory ids must be unique")
    scores: dict[str, TaskScore] = {}
    candidates: list[Candidate] = []
    for trajectory in trajectories:
        score = score_trajectory(trajectory, golds[str(trajectory.task_id)], k=k)
        scores[trajectory.id] = score
        candidates.append(Candidate(
            key=trajectory.id, query=str(trajectory.task_id), trajectory_recall=score.trajectory_recall,
            output_recall=score.recall, malformed=malformed_reason(trajectory) is not None,
            tokens=trajectory.total_prompt_tokens,
        ))
    decisions = select_for_sft(candidates, seed=seed, gap=gap)
    keep = {d.key for d in decisions if d.keep}
    kept = [t for t in trajectories if t.id in keep]

    def recalls(items: Sequence[Trajectory]) -> dict[str, list[float]]:
        return {
            "trajectory_recall": [scores[t.id].trajectory_recall for t in items],
            "output_recall": [scores[t.id].recall for t in items],
        }

    return FilterResult(
        kept=kept, decisions=decisions, scores=scores, counts=dict(Counter(d.reason for d in decisions)),
        recall_before=recalls(trajectories), recall_after=recalls(kept),
    )


def golds_for_tasks(tasks: Sequence[Any], chunks: Any = None) -> dict[str, Gold]:
    """Task id -> gold for `SynthTask`s (through the benchmark's own conversion) or `Task`s."""
    from evaluation.synth_tasks import tasks_from_synth

    golds: dict[str, Gold] = {}
    synth = [task for task in tasks if not hasattr(task, "gold")]
    for bench in tasks_from_synth(synth, chunks) if synth else []:
        golds[bench.task_id] = bench.gold
    for task in tasks:
        if hasattr(task, "gold"):
            golds[task.task_id] = task.gold
    return golds


# ---- Hugging Face datasets export -------------------------------------------------------------


def kept_dataset(result: FilterResult):
    """The kept trajectories as a `datasets.Dataset`: summary columns plus the lossless record."""
    from datasets import Dataset, Features, Value

    reasons = {d.key: d.reason for d in result.decisions}
    rows: dict[str, list[Any]] = {name: [] for name in (
        "id", "task_id", "question", "policy", "seed", "turns", "tool_calls", "trajectory_recall",
        "output_recall", "reason", "trajectory_json")}
    for t in result.kept:
        score = result.scores[t.id]
        for name, value in (
            ("id", t.id), ("task_id", t.task_id or ""), ("question", t.question), ("policy", t.policy),
            ("seed", t.seed), ("turns", len(t.turns)), ("tool_calls", len(t.tool_call_records())),
            ("trajectory_recall", score.trajectory_recall), ("output_recall", score.recall),
            ("reason", reasons[t.id]), ("trajectory_json", t.model_dump_json()),
        ):
            rows[name].append(value)
    features = Features({
        "id": Value("string"), "task_id": Value("string"), "question": Value("string"), "policy": Value("string"),
        "seed": Value("int64"), "turns": Value("int64"), "tool_calls": Value("int64"),
        "trajectory_recall": Value("float64"), "output_recall": Value("float64"), "reason": Value("string"),
        "trajectory_json": Value("string"),
    })
    return Dataset.from_dict(rows, features=features)


def trajectories_from_dataset(dataset: Any) -> list[Trajectory]:
    """Inverse of `kept_dataset` (reads the lossless JSON column)."""
    return [Trajectory.model_validate_json(text) for text in dataset["trajectory_json"]]
