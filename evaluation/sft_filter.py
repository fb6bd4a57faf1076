"""The SFT filter (Context-1 §4) as pure functions over scores, so distillation keeps exactly the
trajectories the benchmark would call good.

Rules: keep in full when trajectory recall > 0.5 and output recall > 0.4; include lower-recall
ones at a diminishing rate; keep up to 5% zero-recall trajectories as negatives, one per query;
drop "explored well, concluded badly" (trajectory recall far above output recall); keep one of
several high-recall rollouts per query; drop malformed ones. The report gives no formula for
the diminishing rate nor a threshold for "far above"; ours are `keep_probability` (squared
shortfall ratio) and a 0.5 recall gap, both parameters.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

KEEP_TRAJ_RECALL = 0.5
KEEP_OUTPUT_RECALL = 0.4
EXPLORED_GAP = 0.5
ZERO_RECALL_SHARE = 0.05


@dataclass(frozen=True)
class Candidate:
    """One rollout as the filter sees it: its query, its scores and whether it parsed cleanly."""

    key: str  # the trajectory id (what the caller gets back)
    query: str
    trajectory_recall: float
    output_recall: float
    malformed: bool = False
    tokens: int = 0  # tie-breaker among high-recall rollouts: the cheaper one is kept


@dataclass(frozen=True)
class Decision:
    key: str
    keep: bool
    reason: str  # whole | diminishing | negative | dropped:<why>


def keep_whole(trajectory_recall: float, output_recall: float) -> bool:
    return trajectory_recall > KEEP_TRAJ_RECALL and output_recall > KEEP_OUTPUT_RECALL


def is_zero_recall(output_recall: float) -> bool:
    return output_recall <= 0.0


def explored_well_concluded_badly(trajectory_recall: float, output_recall: float, gap: float = EXPLORED_GAP) -> bool:
    """Saw the gold but did not return it: teaching this would teach dropping good evidence."""
    return trajectory_recall - output_recall >= gap


def keep_probability(trajectory_recall: float, output_recall: float, power: float = 2.0) -> float:
    """1 for keep-whole rollouts, falling as the recalls fall below the thresholds, 0 at zero recall."""
    if keep_whole(trajectory_recall, output_recall):
        return 1.0
    if is_zero_recall(output_recall):
        return 0.0
    ratio = min(1.0, trajectory_recall / KEEP_TRAJ_RECALL, output_recall / KEEP_OUTPUT_RECALL)
    return max(0.0, ratio) ** power


def select_for_sft(candidates: Sequence[Candidate], seed: int = 0, gap: float = EXPLORED_GAP) -> list[Decision]:
    """Apply every rule to a pool of rollouts; decisions come back in input order.

    Deterministic under `seed`. Negatives (zero recall) are at most 5% of all kept rollouts,
    one per query, chosen at random among the queries that have one.
    """
    rng = random.Random(seed)
    decisions: dict[str, Decision] = {}
    best_whole: dict[str, Candidate] = {}
    negatives: dict[str, Candidate] = {}
    for cand in candidates:
        if cand.malformed:
            decisions[cand.key] = Decision(cand.key, False, "dropped:malformed")
        elif explored_well_concluded_badly(cand.trajectory_recall, cand.output_recall, gap):
            decisions[cand.key] = Decision(cand.key, False, "dropped:explored_well_concluded_badly")
        elif keep_whole(cand.trajectory_recall, cand.output_recall):
            current = best_whole.get(cand.query)
            if current is None or (-cand.output_recall, cand.tokens) < (-current.output_recall, current.tokens):
                best_whole[cand.query] = cand
        elif is_zero_recall(cand.output_recall):
            negatives.setdefault(cand.query, cand)
        else:
            keep = rng.random() < keep_probability(cand.trajectory_recall, cand.output_recall)
            decisions[cand.key] = Decision(cand.key, keep, "diminishing" if keep else "dropped:sampled_out")
    for cand in candidates:
        if cand.key in decisions or cand.malformed:
            continue
        if keep_whole(cand.trajectory_recall, cand.output_recall):
            chosen = best_whole[cand.query].key == cand.key
            decisions[cand.key] = Decision(cand.key, chosen, "whole" if chosen else "dropped:duplicate_high_recall")
    kept_positive = sum(1 for d in decisions.values() if d.keep)
    # n negatives make up at most 5% of everything kept: n <= 0.05 * (kept_positive + n).
    budget = int(ZERO_RECALL_SHARE * kept_positive / (1 - ZERO_RECALL_SHARE) + 1e-9)
    chosen_negatives = set(rng.sample(sorted(negatives), min(budget, len(negatives))))
    groups: dict[str, list[Candidate]] = defaultdict(list)
    for cand in candidates:
        if cand.key not in decisions:
            groups[cand.query].append(cand)
    for query, group in groups.items():
        for cand in group:
            keep = query in chosen_negatives and negatives[query].key == cand.key
            decisions[cand.key] = Decision(cand.key, keep, "negative" if keep else "dropped:zero_recall")
    return [decisions[cand.key] for cand in candidates]
