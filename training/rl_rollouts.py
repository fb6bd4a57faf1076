"""Group rollouts through the harness, scored by THE reward, with group-relative advantages.

One CISPO step runs G rollouts (default 8) of each drawn task with the current policy, through
the same `Harness` evaluation and serving use, in training configuration
(`HarnessConfig.for_training`: the soft prune-or-finish hint is shown). Each trajectory is
recorded whole (every turn's view, sampled token ids and sampler log-probs), scored by
`evaluation.metrics.score_trajectory` and rewarded by `evaluation.reward.reward_from_score`
(the benchmark's scorer *is* the reward: nothing here re-derives a term), with every reward
component kept for the log. The output is scored at `k`, the benchmark's k (5 by default,
`CispoConfig.reward_k`), not at the harness's `max_output_docs`.

Crashes: a rollout whose harness raised, or whose policy raised (`Trajectory.error`: a model or
endpoint failure, not a model *behaviour*), is recorded in `crashes` and retried with a fresh
seed; a rollout still crashing after `max_retries` retries raises `RolloutCrashed`. A crash is
never scored: a zero reward would teach the policy that whatever it did was bad when the
infrastructure failed. (A malformed final answer is a behaviour: it is scored, and the reward
gives it 0 by design.)
"""

from __future__ import annotations

import hashlib
import time
import traceback
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from statistics import fmean, pstdev
from typing import Any

from agent.environment import open_harness
from agent.harness import Harness, HarnessConfig
from agent.trajectory import Trajectory
from core.training_settings import DEFAULT_EPS, DEFAULT_REWARD_K
from evaluation.metrics import Granularity, TaskScore, score_trajectory
from evaluation.reward import RewardBreakdown, reward_from_score
from evaluation.tasks import Task
from search.backend import SearchBackend
from training.cispo_loss import group_advantages
from training.curriculum import _mix, hops_of


class RolloutCrashed(RuntimeError):
    """A rollout kept crashing after its retries (see `crashes` for every attempt)."""

    def __init__(self, message: str, crashes: list[dict[str, Any]]):
        super().__init__(message)
        self.crashes = crashes


@dataclass
class Rollout:
    task: Task
    index: int
    seed: int
    trajectory: Trajectory
    score: TaskScore
    reward: RewardBreakdown
    attempts: int = 1


@dataclass
class RolloutGroup:
    task: Task
    rollouts: list[Rollout]
    advantages: list[float] | None  # None: all rewards equal, the group is dropped

    @property
    def dropped(self) -> bool:
        return self.advantages is None

    @property
    def rewards(self) -> list[float]:
        return [r.reward.reward for r in self.rollouts]


@dataclass
class RolloutBatch:
    groups: list[RolloutGroup]
    crashes: list[dict[str, Any]] = field(default_factory=list)
    rollout_s: float = 0.0
    scoring_s: float = 0.0
    beta: float = 4.0
    k: int = DEFAULT_REWARD_K  # the output size the rewards were scored at

    @property
    def rollouts(self) -> list[Rollout]:
        return [r for g in self.groups for r in g.rollouts]

    @property
    def kept(self) -> list[RolloutGroup]:
        return [g for g in self.groups if not g.dropped]


def rollout_seed(seed: int, step: int, task_id: str, index: int, attempt: int = 0) -> int:
    """The episode seed of one rollout: a function of (seed, step, task, index, attempt) only."""
    task_key = int.from_bytes(hashlib.blake2b(task_id.encode(), digest_size=8).digest(), "little")
    return _mix(seed, step, task_key, index, attempt) & 0x7FFF_FFFF


def crash_reason(trajectory: Trajectory) -> str | None:
    """Why a finished episode counts as crashed (its policy raised), or None."""
    return trajectory.error


def run_with_retries(harness: Harness, task: Task, index: int, step: int, seed: int, max_retries: int,
                     crashes: list[dict[str, Any]]) -> tuple[Trajectory, int, int]:
    """One rollout; crashed attempts are appended to `crashes` and retried with a fresh seed."""
    for attempt in range(max_retries + 1):
        episode_seed = rollout_seed(seed, step, task.task_id, index, attempt)
        metadata = {"rl_step": step, "group_index": index, "attempt": attempt, "hops": hops_of(task)}
        try:
            trajectory = harness.run(task.question, seed=episode_seed, task_id=task.task_id, metadata=metadata)
            reason = crash_reason(trajectory)
            detail = None
        except Exception as error:  # a harness, backend or engine failure: recorded, retried
            trajectory, reason, detail = None, f"{type(error).__name__}: {error}", traceback.format_exc(limit=8)
        if reason is None and trajectory is not None:
            return trajectory, attempt + 1, episode_seed
        crashes.append({"step": step, "task_id": task.task_id, "index": index, "attempt": attempt,
                        "seed": episode_seed, "error": reason, "traceback": detail})
    raise RolloutCrashed(
        f"rollout {index} of task {task.task_id} crashed {max_retries + 1} times; last error: {crashes[-1]['error']}",
        [c for c in crashes if c["task_id"] == task.task_id and c["index"] == index],
    )


def collect_rollouts(
    policy: Any,
    backend: SearchBackend,
    tasks: Sequence[Task],
    *,
    group_size: int = 8,
    harness_config: HarnessConfig | None = None,
    beta: float = 4.0,
    step: int = 0,
    seed: int = 0,
    k: int = DEFAULT_REWARD_K,
    reward_eps: float = DEFAULT_EPS,
    granularity: Granularity = "document",
    max_retries: int = 2,
    workers: int = 8,
) -> RolloutBatch:
    """G rollouts of every task (concurrent episodes), scored at top-`k`, with group advantages."""
    config = harness_config or HarnessConfig.for_training()
    crashes: list[dict[str, Any]] = []
    jobs = [(task, i) for task in tasks for i in range(group_size)]
    start = time.perf_counter()
    with open_harness(policy, backend, config=config) as harness:
        if workers <= 1 or len(jobs) == 1:
            results = [run_with_retries(harness, t, i, step, seed, max_retries, crashes) for t, i in jobs]
        else:
            with ThreadPoolExecutor(min(workers, len(jobs)), thread_name_prefix="cispo-rollout") as pool:
                futures = [pool.submit(run_with_retries, harness, t, i, step, seed, max_retries, crashes) for t, i in jobs]
                results = [f.result() for f in futures]
    rollout_s = time.perf_counter() - start
    start = time.perf_counter()
    groups = []
    for position, task in enumerate(tasks):
        rollouts = []
        for i in range(group_size):
            trajectory, attempts, episode_seed = results[position * group_size + i]
            score = score_trajectory(trajectory, task.gold, k=k, granularity=granularity)
            breakdown = reward_from_score(trajectory, score, beta=beta, eps=reward_eps)
            rollouts.append(Rollout(task, i, episode_seed, trajectory, score, breakdown, attempts))
        groups.append(RolloutGroup(task, rollouts, group_advantages([r.reward.reward for r in rollouts])))
    crashes.sort(key=lambda c: (c["task_id"], c["index"], c["attempt"]))
    return RolloutBatch(groups, crashes, rollout_s, time.perf_counter() - start, beta, k)


def rollout_metrics(batch: RolloutBatch) -> dict[str, Any]:
    """Every reward component and the scores behind it, averaged over the batch's rollouts."""
    rollouts = batch.rollouts
    if not rollouts:
        return {}
    rewards = [r.reward.reward for r in rollouts]

    def mean(values: Sequence[float]) -> float:
        return fmean(values) if values else 0.0

    by_hops: dict[str, list[float]] = {}
    for r in rollouts:
        by_hops.setdefault(f"{hops_of(r.task)}-hop", []).append(r.reward.reward)
    return {
        "reward_mean": mean(rewards),
        "reward_std": pstdev(rewards) if len(rewards) > 1 else 0.0,
        "reward_components": {
            name: mean([float(getattr(r.reward, name)) for r in rollouts])
            for name in ("pre_penalty", "f_beta", "trajectory_recall", "answer_found", "p_prune", "p_turn",
                         "excess_prunes", "completed", "floored")
        },
        "beta": batch.beta,
        "reward_k": batch.k,
        "answer_found": mean([r.score.answer_found for r in rollouts]),
        "recall": mean([r.score.recall for r in rollouts]),
        "precision": mean([r.score.precision for r in rollouts]),
        "trajectory_recall": mean([r.score.trajectory_recall for r in rollouts]),
        "turns_mean": mean([r.score.turns for r in rollouts]),
        "tool_calls_mean": mean([r.score.tool_calls for r in rollouts]),
        "peak_tokens_mean": mean([r.score.peak_tokens for r in rollouts]),
        "stop_reasons": _counts(r.trajectory.stop_reason for r in rollouts),
        "reward_by_hops": {hops: mean(values) for hops, values in sorted(by_hops.items())},
        "groups": len(batch.groups),
        "groups_kept": len(batch.kept),
        "groups_dropped": len(batch.groups) - len(batch.kept),
        "rollouts": len(rollouts),
        "crashes": len(batch.crashes),
        "retried_rollouts": sum(1 for r in rollouts if r.attempts > 1),
    }


def _counts(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for value in values:
        out[value or "?"] = out.get(value or "?", 0) + 1
    return dict(sorted(out.items()))
