"""Blocking checks on verified tasks, as pure validators (the asset layer wraps them).

Nothing downstream may train on broken tasks: `verified_tasks` is blocked unless every split
has enough tasks and every quote of every verified task is found in the *current* text of
its document (a document edited after generation must not leave stale quotes behind). Each
returns `(passed, metadata)`, like the index checks in `search.index_checks`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Mapping

from core.text_match import QuoteMatcher
from synth.schema import SPLITS, SynthTask

MAX_LISTED = 20


def enough_tasks_per_split(tasks: Iterable[SynthTask], min_per_split: int = 1) -> tuple[bool, dict[str, Any]]:
    counts = Counter(task.split for task in tasks if task.passed_verification)
    by_split = {split: counts.get(split, 0) for split in SPLITS}
    short = [split for split, n in by_split.items() if n < min_per_split]
    return not short, {"by_split": by_split, "min_per_split": min_per_split, "short": short}


def supporting_quotes_found(tasks: Iterable[SynthTask], documents: Mapping[str, str]) -> tuple[bool, dict[str, Any]]:
    """Every item and answer quote of every verified task is found (cascade) in its document."""
    matchers: dict[str, QuoteMatcher] = {}
    bad: list[str] = []
    checked = 0
    for task in tasks:
        if not task.passed_verification:
            continue
        checked += 1
        for item in task.supporting_items:
            text = documents.get(item.id)
            if text is None:
                bad.append(f"{task.id}: missing document {item.id}")
                break
            matcher = matchers.setdefault(item.id, QuoteMatcher(text))
            missing = [q for q in item.item_quotes + item.truth_quotes if not matcher.contains(q)]
            if missing:
                bad.append(f"{task.id}: {len(missing)} quote(s) not in {item.id}")
                break
    return not bad, {"checked_tasks": checked, "failing_tasks": len(bad), "examples": bad[:MAX_LISTED]}
