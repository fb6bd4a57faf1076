"""RL tasks and the hop curriculum: which tasks each CISPO step draws, and the reward's beta.

Context-1 §5 trains in two phases: early steps skewed to low-hop tasks, later steps to
multi-hop tasks that need long trajectories and pruning (after "Beyond Ten Turns"); the reward's
beta anneals from 4 towards 2 between epochs. We make the phase a smooth function of training
progress p in [0, 1]: a hop level's weight is `floor + (1 - p) * (1 - rank) + p * rank`, where
`rank` is the level's position among the levels present (0 = fewest hops, 1 = most), so step 0
favours one-hop tasks, the last step favours the deepest, and every level keeps at least
`floor` of weight (no level is starved). With one level the curriculum is uniform sampling.

Resumable by construction: the tasks of step s depend only on (seed, s), never on earlier
draws, so a run resumed from a checkpoint draws exactly what the uninterrupted run would have.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from evaluation.tasks import Task


def hops_of(task: Task) -> int:
    """The task's curriculum level: its hop count, 1 when unknown (an external benchmark's)."""
    return task.hops or 1


def hop_weights(levels: Sequence[int], progress: float, floor: float = 0.1) -> dict[int, float]:
    """Sampling weight of each hop level at training progress `progress` in [0, 1] (module doc)."""
    distinct = sorted(set(levels))
    p = min(1.0, max(0.0, progress))
    if len(distinct) == 1:
        return {distinct[0]: 1.0}
    weights = {}
    for position, level in enumerate(distinct):
        rank = position / (len(distinct) - 1)
        weights[level] = floor + (1.0 - p) * (1.0 - rank) + p * rank
    total = sum(weights.values())
    return {level: w / total for level, w in weights.items()}


class Curriculum:
    """Draws `tasks_per_step` distinct tasks for a step: a hop level by `hop_weights`, then a
    task of that level in a per-level shuffled order (so a level's tasks are used evenly)."""

    def __init__(self, tasks: Sequence[Task], tasks_per_step: int, total_steps: int, seed: int = 0,
                 enabled: bool = True, floor: float = 0.1):
        if not tasks:
            raise ValueError("the curriculum needs at least one task")
        if tasks_per_step <= 0 or total_steps <= 0:
            raise ValueError("tasks_per_step and total_steps must be positive")
        self.tasks = list(tasks)
        self.tasks_per_step = tasks_per_step
        self.total_steps = total_steps
        self.seed = seed
        self.enabled = enabled
        self.floor = floor
        self.by_level: dict[int, list[int]] = {}
        for index, task in enumerate(self.tasks):
            self.by_level.setdefault(hops_of(task), []).append(index)
        # Each level is walked in an order fixed by (seed, level), so its tasks are used evenly.
        self.order = {
            level: sorted(ids, key=lambda i, level=level: random.Random(_mix(seed, level, i)).random())
            for level, ids in self.by_level.items()
        }

    def progress(self, step: int) -> float:
        return 0.0 if self.total_steps <= 1 else step / (self.total_steps - 1)

    def epoch(self, step: int) -> int:
        """Epochs completed before `step` (one epoch = as many draws as there are tasks)."""
        return (step * min(self.tasks_per_step, len(self.tasks))) // len(self.tasks)

    def weights(self, step: int) -> dict[int, float]:
        if not self.enabled:
            counts = {level: len(ids) for level, ids in self.by_level.items()}
            total = sum(counts.values())
            return {level: n / total for level, n in counts.items()}
        return hop_weights(list(self.by_level), self.progress(step), self.floor)

    def tasks_for_step(self, step: int) -> list[Task]:
        rng = random.Random(_mix(self.seed, step))
        weights = self.weights(step)
        want = min(self.tasks_per_step, len(self.tasks))
        chosen: list[int] = []
        while len(chosen) < want:
            levels = [level for level, ids in self.order.items() if any(i not in chosen for i in ids)]
            level = rng.choices(levels, weights=[weights[level] for level in levels])[0]
            order = self.order[level]
            start = (step * want + len(chosen)) % len(order)
            rotated = order[start:] + order[:start]
            chosen.append(next(i for i in rotated if i not in chosen))
        return [self.tasks[i] for i in chosen]

    def hop_mix(self, tasks: Sequence[Task]) -> dict[str, int]:
        mix: dict[str, int] = {}
        for task in tasks:
            mix[f"{hops_of(task)}-hop"] = mix.get(f"{hops_of(task)}-hop", 0) + 1
        return dict(sorted(mix.items()))


def _mix(*parts: int) -> int:
    value = 0x9E3779B97F4A7C15
    for part in parts:
        value = (value ^ (int(part) & 0xFFFFFFFFFFFFFFFF)) * 0x100000001B3 & 0xFFFFFFFFFFFFFFFF
    return value


def steps_for_epochs(n_tasks: int, tasks_per_step: int, epochs: float) -> int:
    """Steps that make `epochs` passes over `n_tasks` at `tasks_per_step` draws a step."""
    return max(1, math.ceil(epochs * n_tasks / max(1, tasks_per_step)))
