"""Per-task scores of one trajectory against its gold: the numbers every report, filter and
reward is built from.

Why one function for all: the benchmark, the SFT filter and the RL reward must never disagree
on what "recall" means, so they all call `score_trajectory`. Definitions (Context-1 §6):

- output recall / precision / F1 / F-beta: over the first `k` distinct documents of the final
  ranking (every candidate is scored at the same output size).
- trajectory recall: gold that a tool result showed at any point, pruned ones included, and
  nothing else. An id only named in the final answer does not count (BrowseComp-Plus counts
  what the tools surfaced): the final-answer parser accepts any id in the corpus, and this
  number feeds the RL reward and the SFT filter, so counting the answer would reward guessing
  ids. An honest trajectory returns what it saw, so trajectory recall >= output recall for it;
  a trajectory whose output recall exceeds its trajectory recall returned ids it never saw.
- answer found: a returned document contains the answer (whole words, see `answers.py`); when
  no gold document contains it (yes/no questions), every gold document must be returned.
- prune accuracy: share of pruned chunks that are not gold; `None` when nothing was pruned
  (a policy that never prunes is not 100% accurate, it is unmeasured).

Two granularities: `document` (gold is a set of documents) and `fact` (a fact is a set of
chunks; it is found if any of its chunks is returned, and a returned document returns all its
chunks, because the final answer lists documents).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from agent.trajectory import Trajectory

Granularity = Literal["document", "fact"]


@dataclass(frozen=True)
class Gold:
    """What a task counts as correct.

    `answer_doc_ids` are the documents that contain the answer (computed once, when the task
    is built, with `answers.answer_doc_ids`), so scoring needs no index. An empty set with
    `answer` given means the answer is in no document (yes/no): the all-gold rule applies.
    `facts` are sets of chunk ids, `chunk_docs` maps those chunks to their documents.
    """

    doc_ids: frozenset[str]
    answer: str = ""
    answer_doc_ids: frozenset[str] = frozenset()
    facts: tuple[frozenset[str], ...] = ()
    chunk_docs: Mapping[str, str] = field(default_factory=dict)

    @property
    def answer_needs_all_gold(self) -> bool:
        return not self.answer_doc_ids


@dataclass(frozen=True)
class TaskScore:
    """One trajectory's scores. Rates are in [0, 1]; `prune_accuracy` is None without prunes."""

    answer_found: float
    recall: float
    precision: float
    f1: float
    trajectory_recall: float
    prune_accuracy: float | None
    n_returned: int
    n_gold: int
    n_pruned: int
    turns: int
    tool_calls: int
    tool_calls_per_turn: float
    peak_tokens: int
    total_prompt_tokens: int
    wall_s: float
    error: bool
    granularity: str = "document"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def output_doc_ids(trajectory: Trajectory, k: int | None = None) -> list[str]:
    """The final ranking's distinct documents, best first, cut to `k`."""
    ranked = list(dict.fromkeys(trajectory.output_doc_ids()))
    return ranked if k is None else ranked[:k]


def f_beta(precision: float, recall: float, beta: float) -> float:
    """(1 + b^2) P R / (b^2 P + R); beta > 1 weighs recall beta^2 times precision."""
    if precision <= 0 or recall <= 0:
        return 0.0
    b2 = beta * beta
    return (1 + b2) * precision * recall / (b2 * precision + recall)


def answer_found_in(returned: set[str], gold: Gold) -> float:
    """1 when `returned` holds a document with the answer (all gold documents when no single one has it)."""
    if gold.answer_needs_all_gold:
        return float(bool(gold.doc_ids) and gold.doc_ids <= returned)
    return float(bool(gold.answer_doc_ids & returned))


def _document_level(trajectory: Trajectory, gold: Gold, returned: list[str]) -> tuple[float, float, float, float | None, int, int]:
    returned_set = set(returned)
    seen = set(trajectory.seen_doc_ids())  # tool results only, never the final answer
    n_gold = len(gold.doc_ids)
    hits = len(returned_set & gold.doc_ids)
    recall = hits / n_gold if n_gold else 0.0
    precision = hits / len(returned_set) if returned_set else 0.0
    trajectory_recall = len(seen & gold.doc_ids) / n_gold if n_gold else 0.0
    pruned = trajectory.pruned_chunk_ids()
    chunk_docs = {**gold.chunk_docs, **trajectory.chunk_docs}
    pruned_ok = sum(1 for chunk in pruned if chunk_docs.get(chunk) not in gold.doc_ids)
    prune_accuracy = pruned_ok / len(pruned) if pruned else None
    return recall, precision, trajectory_recall, prune_accuracy, n_gold, len(pruned)


def _fact_level(trajectory: Trajectory, gold: Gold, returned: list[str]) -> tuple[float, float, float, float | None, int, int]:
    returned_set = set(returned)
    chunk_docs = {**gold.chunk_docs, **trajectory.chunk_docs}
    returned_chunks = {doc.chunk_id for doc in trajectory.final_ranking if doc.chunk_id}
    seen_chunks = set(trajectory.seen_chunk_ids())

    def fact_returned(fact: frozenset[str]) -> bool:
        return any(chunk in returned_chunks or chunk_docs.get(chunk) in returned_set for chunk in fact)

    def fact_seen(fact: frozenset[str]) -> bool:
        return bool(fact & seen_chunks)  # a tool showed one of its chunks; the answer alone is no evidence

    n_facts = len(gold.facts)
    recall = sum(fact_returned(f) for f in gold.facts) / n_facts if n_facts else 0.0
    trajectory_recall = sum(fact_seen(f) for f in gold.facts) / n_facts if n_facts else 0.0
    fact_chunks = set().union(*gold.facts) if gold.facts else set()
    fact_docs = {chunk_docs[c] for c in fact_chunks if c in chunk_docs}
    precision = len(returned_set & fact_docs) / len(returned_set) if returned_set else 0.0
    pruned = trajectory.pruned_chunk_ids()
    prune_accuracy = sum(1 for c in pruned if c not in fact_chunks) / len(pruned) if pruned else None
    return recall, precision, trajectory_recall, prune_accuracy, n_facts, len(pruned)


def score_trajectory(trajectory: Trajectory, gold: Gold, k: int | None = None, granularity: Granularity = "document") -> TaskScore:
    """Score one trajectory; see the module docstring for every definition."""
    if granularity not in ("document", "fact"):
        raise ValueError(f"unknown granularity {granularity!r} (document | fact)")
    if granularity == "fact" and not gold.facts:
        raise ValueError("fact-level scoring needs gold.facts")
    returned = output_doc_ids(trajectory, k)
    level = _fact_level if granularity == "fact" else _document_level
    recall, precision, trajectory_recall, prune_accuracy, n_gold, n_pruned = level(trajectory, gold, returned)
    turns = len(trajectory.turns)
    tool_calls = len(trajectory.tool_call_records())
    return TaskScore(
        answer_found=answer_found_in(set(returned), gold),
        recall=recall,
        precision=precision,
        f1=f_beta(precision, recall, 1.0),
        trajectory_recall=trajectory_recall,
        prune_accuracy=prune_accuracy,
        n_returned=len(returned),
        n_gold=n_gold,
        n_pruned=n_pruned,
        turns=turns,
        tool_calls=tool_calls,
        tool_calls_per_turn=tool_calls / turns if turns else 0.0,
        peak_tokens=trajectory.peak_tokens,
        total_prompt_tokens=trajectory.total_prompt_tokens,
        wall_s=trajectory.wall_s,
        error=trajectory.error is not None,
        granularity=granularity,
    )
