"""The one task type every stage runs: a question, its gold, and how many hops it takes.

Evaluation (the benchmark on a customer's test split or an external file), teacher rollouts, RL
and SFT selection all take `Task`s, whatever produced them: `evaluation.synth_tasks` converts
verified synthetic tasks (hops known), `evaluation.external` benchmark records (hops unknown:
None; the curriculum treats them as one level).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from evaluation.metrics import Gold


@dataclass(frozen=True)
class Task:
    task_id: str
    question: str
    gold: Gold
    group: str = ""  # the breakdown a report groups by: `2-hop` for synthetic tasks, the source dataset for files
    metadata: dict[str, Any] = field(default_factory=dict)
    hops: int | None = None  # supporting documents chained to answer it, when known
