"""Distractors: near-miss chunks for a task, checked NOT to contain its answer.

Why mine them: a search agent trained only against random negatives learns to stop at the
first plausible chunk; Context-1 pairs each task with up to ten chunks that the clues'
own searches surface but that do not answer the question. We run every clue (and the
question) through the customer's hybrid index, fuse the rankings by RRF, skip chunks of the
supporting documents, and check each candidate in order until `n` pass:
- always by code: the normalized answer must not occur in the chunk (`contains_answer`);
- with a teacher, also by extraction: the LLM is asked for any occurrence of the answer in any
  form (another date format, a synonym, an abbreviation); a chunk it flags is dropped.
Rejected candidates are kept on the task with their reason; a check that could not run (the
teacher failed) rejects the candidate, because an unchecked distractor might be a positive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from core.text_match import QuoteMatcher, contains_answer
from search.backend import Hit, SearchBackend
from search.fusion import rrf
from synth.schema import Distractor, RejectedDistractor, SynthTask

DEFAULT_DISTRACTORS = 10
PER_QUERY_K = 20
MAX_CHECKED_FACTOR = 3  # check at most 3n candidates per task (bounds teacher calls)

AnswerChecker = Callable[[SynthTask, Hit], "CheckOutcome"]


@dataclass(frozen=True)
class CheckOutcome:
    contains_answer: bool
    reason: str | None = None  # why it was rejected (None when it passed)
    check: str = "code"


class _Searcher(Protocol):
    def search(self, query: str, k: int = 50, exclude=()) -> list[Hit]: ...


def code_check(task: SynthTask, hit: Hit) -> CheckOutcome:
    """Reject a chunk whose text (or title) states the answer string after normalization."""
    if contains_answer(hit.text, task.truth) or contains_answer(hit.title or "", task.truth):
        return CheckOutcome(True, "contains_answer_string")
    return CheckOutcome(False)


def _mined_for(task: SynthTask, clue_index: int | None) -> list[str]:
    """The supporting items whose clue quotes come from the clue that surfaced a candidate."""
    if clue_index is None:
        return task.supporting_ids
    clue = QuoteMatcher(task.clues[clue_index])
    owners = [item.id for item in task.supporting_items if any(clue.contains(q) for q in item.clue_quotes)]
    return owners or task.supporting_ids


def mine_distractors(
    task: SynthTask,
    backend: SearchBackend | _Searcher,
    *,
    n: int = DEFAULT_DISTRACTORS,
    per_query_k: int = PER_QUERY_K,
    exclude_chunks: set[str] | frozenset[str] = frozenset(),
    llm_check: AnswerChecker | None = None,
) -> tuple[list[Distractor], list[RejectedDistractor]]:
    """Up to `n` verified distractors for `task` and the candidates rejected on the way.

    Raises whatever the backend raises: a broken index is an error, not "no distractors".
    """
    queries: list[tuple[str, int | None]] = [(clue, i) for i, clue in enumerate(task.clues) if clue.strip()]
    if task.question.strip():
        queries.append((task.question, None))
    supporting = set(task.supporting_ids)
    rankings: list[list[str]] = []
    hits: dict[str, Hit] = {}
    found_by: dict[str, tuple[str, int | None]] = {}
    for query, clue_index in queries:
        ranked = []
        for hit in backend.search(query, k=per_query_k, exclude=exclude_chunks):
            if hit.doc_id in supporting:
                continue
            ranked.append(hit.chunk_id)
            hits.setdefault(hit.chunk_id, hit)
            found_by.setdefault(hit.chunk_id, (query, clue_index))
        rankings.append(ranked)
    accepted: list[Distractor] = []
    rejected: list[RejectedDistractor] = []
    for chunk_id, score in rrf(rankings)[: max(n, 1) * MAX_CHECKED_FACTOR]:
        if len(accepted) >= n:
            break
        hit = hits[chunk_id]
        outcome = code_check(task, hit)
        if not outcome.contains_answer and llm_check is not None:
            outcome = llm_check(task, hit)
        if outcome.contains_answer:
            rejected.append(RejectedDistractor(chunk_id=chunk_id, doc_id=hit.doc_id, reason=outcome.reason or "contains_answer"))
            continue
        query, clue_index = found_by[chunk_id]
        accepted.append(Distractor(chunk_id=chunk_id, doc_id=hit.doc_id, mined_for=_mined_for(task, clue_index),
                                   query=query, score=float(score), check=outcome.check))
    return accepted, rejected


def attach_distractors(task: SynthTask, backend: SearchBackend, **options) -> SynthTask:
    distractors, rejected = mine_distractors(task, backend, **options)
    return task.model_copy(update={"distractors": distractors, "rejected_distractors": rejected})
