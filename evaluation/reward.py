"""The RL reward, computed from the same scores the benchmark reports (the scorer *is* the reward).

r = clamp(0.7 * F_beta + 0.3 * traj_recall + 1.0 * answer_found - p_prune - p_turn, eps, r_pre)
(Context-1 §5). Each term answers a reward hack the report describes: F_beta alone let the
model stop after one broad search (hence the trajectory-recall process term) and return
topical documents without the answer (hence the answer bonus); pruning one chunk per turn
(hence p_prune); long diminishing-return episodes (hence p_turn).

Floor and cap: a trajectory that completes without error gets at least `eps`, so any success
beats a failure (which gets 0); the result never exceeds the pre-penalty value `r_pre`, so the
floor cannot lift a trajectory above what it earned (a completed episode that found nothing,
r_pre = 0, stays at 0 rather than being inflated to eps). The report does not give eps; 0.01
is our choice.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from agent.trajectory import Trajectory
from core.training_settings import DEFAULT_EPS
from evaluation.metrics import Gold, Granularity, TaskScore, f_beta, score_trajectory

PRUNE_TOOL = "prune_chunks"

W_F_BETA = 0.7
W_TRAJ_RECALL = 0.3
W_ANSWER = 1.0
PRUNE_STREAK_FREE = 3
PRUNE_PENALTY_PER_CALL = 0.1
PRUNE_PENALTY_CAP = 0.5
TURN_PENALTY_START = 64
TURN_PENALTY_FULL = 128
TURN_PENALTY_MAX = 0.5
FAILED_STOPS = frozenset({"policy_error", "malformed"})


@dataclass(frozen=True)
class RewardBreakdown:
    """Every component of one reward, so a training log can show why a rollout scored as it did."""

    reward: float
    pre_penalty: float
    f_beta: float
    beta: float
    trajectory_recall: float
    answer_found: float
    p_prune: float
    p_turn: float
    excess_prunes: int
    turns: int
    completed: bool
    floored: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def prune_call_streaks(trajectory: Trajectory) -> list[int]:
    """Lengths of the runs of consecutive prune calls, over all tool calls in order."""
    streaks: list[int] = []
    run = 0
    for call in trajectory.tool_call_records():
        if call.name == PRUNE_TOOL:
            run += 1
            continue
        if run:
            streaks.append(run)
        run = 0
    if run:
        streaks.append(run)
    return streaks


def prune_penalty(streaks: list[int]) -> tuple[float, int]:
    """0.1 per prune call beyond the first 3 of each streak, capped at 0.5; also the excess count."""
    excess = sum(max(0, length - PRUNE_STREAK_FREE) for length in streaks)
    return min(PRUNE_PENALTY_CAP, PRUNE_PENALTY_PER_CALL * excess), excess


def turn_penalty(turns: int) -> float:
    """0 up to 64 turns, rising linearly to 0.5 at 128, flat beyond."""
    if turns <= TURN_PENALTY_START:
        return 0.0
    share = (turns - TURN_PENALTY_START) / (TURN_PENALTY_FULL - TURN_PENALTY_START)
    return TURN_PENALTY_MAX * min(1.0, share)


def completed_without_error(trajectory: Trajectory) -> bool:
    """An episode with no harness or policy error and a final answer that was not malformed
    (running out of turns or budget still completes: the harness forces a final answer)."""
    return trajectory.error is None and trajectory.stop_reason not in FAILED_STOPS


def reward_from_score(
    trajectory: Trajectory,
    score: TaskScore,
    beta: float,
    eps: float = DEFAULT_EPS,
) -> RewardBreakdown:
    """The reward of a trajectory already scored (lets a trainer score once and log both)."""
    fb = f_beta(score.precision, score.recall, beta)
    pre = W_F_BETA * fb + W_TRAJ_RECALL * score.trajectory_recall + W_ANSWER * score.answer_found
    p_prune, excess = prune_penalty(prune_call_streaks(trajectory))
    p_turn = turn_penalty(score.turns)
    completed = completed_without_error(trajectory)
    penalized = pre - p_prune - p_turn
    if completed:
        value = min(max(penalized, eps), pre)
    else:
        value = 0.0
    return RewardBreakdown(
        reward=value,
        pre_penalty=pre,
        f_beta=fb,
        beta=beta,
        trajectory_recall=score.trajectory_recall,
        answer_found=score.answer_found,
        p_prune=p_prune,
        p_turn=p_turn,
        excess_prunes=excess,
        turns=score.turns,
        completed=completed,
        floored=completed and penalized < eps <= pre,
    )


def reward(
    trajectory: Trajectory,
    gold: Gold,
    beta: float,
    k: int | None = None,
    eps: float = DEFAULT_EPS,
    granularity: Granularity = "document",
) -> RewardBreakdown:
    """Score the trajectory with the benchmark's scorer, then combine the terms (module docstring)."""
    score = score_trajectory(trajectory, gold, k=k, granularity=granularity)
    return reward_from_score(trajectory, score, beta=beta, eps=eps)


def annealed_beta(epoch: int, n_epochs: int, start: float = 4.0, end: float = 2.0) -> float:
    """beta from `start` (recall 16x precision) to `end` (4x), linearly over epochs (Context-1 §5)."""
    if n_epochs <= 1:
        return start
    share = min(1.0, max(0.0, epoch / (n_epochs - 1)))
    return start + (end - start) * share
