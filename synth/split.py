"""Deterministic train / dev / test split of verified tasks, stratified by hop count.

Within each hop level, tasks are ordered by sha256(salt + task id) and cut at the cumulative
fractions, so every split gets its share of every hop level (a 4-hop test set is never empty
by bad luck when there are enough 4-hop tasks). Ids are content hashes, so the same task
lands in the same split on every rerun. The price of stratifying: adding tasks to a level can
move a task near a boundary to the neighbouring split; the order is the hash order, so only
tasks adjacent to a cut move, never a whole level. Groups of 3 or more tasks always give dev
and test at least one task each.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from typing import Iterable

from core.task_settings import DEFAULT_FRACTIONS
from synth.schema import SPLITS, Split, SynthTask


def _order_key(task_id: str, salt: str) -> str:
    return hashlib.sha256(f"{salt}\x00{task_id}".encode()).hexdigest()


def _quota(n: int, fractions: tuple[float, float, float]) -> tuple[int, int, int]:
    """Largest-remainder counts for (train, dev, test), dev and test >= 1 when n >= 3."""
    total = sum(fractions)
    raw = [n * f / total for f in fractions]
    counts = [int(r) for r in raw]
    for i in sorted(range(3), key=lambda i: (-(raw[i] - counts[i]), i))[: n - sum(counts)]:
        counts[i] += 1
    if n >= 3:
        for i in (1, 2):
            if counts[i] == 0 and fractions[i] > 0:
                counts[i] = 1
                counts[0] -= 1
    return counts[0], counts[1], counts[2]


def assign_splits(tasks: Iterable[SynthTask], fractions: tuple[float, float, float] = DEFAULT_FRACTIONS,
                  salt: str = "") -> dict[str, Split]:
    """task id -> split, for the given (verified) tasks."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or sum(fractions) <= 0:
        raise ValueError(f"split fractions must be three non-negative numbers with a positive sum, got {fractions}")
    by_level: dict[int, list[str]] = defaultdict(list)
    for task in tasks:
        by_level[task.level].append(task.id)
    out: dict[str, Split] = {}
    for level in sorted(by_level):
        ids = sorted(set(by_level[level]), key=lambda task_id: _order_key(task_id, salt))
        train, dev, _ = _quota(len(ids), fractions)
        for position, task_id in enumerate(ids):
            out[task_id] = SPLITS[0] if position < train else SPLITS[1] if position < train + dev else SPLITS[2]
    return out


def apply_splits(tasks: list[SynthTask], fractions: tuple[float, float, float] = DEFAULT_FRACTIONS,
                 salt: str = "") -> list[SynthTask]:
    """Verified tasks get a split; failed tasks get none."""
    splits = assign_splits([t for t in tasks if t.passed_verification], fractions, salt)
    return [task.model_copy(update={"split": splits.get(task.id) if task.passed_verification else None}) for task in tasks]
