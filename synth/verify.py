"""The deterministic half of verification: code that checks quotes against real text.

Context-1's rule, kept exactly: a supporting document passes when at least ceil(2/3) of its
clue quotes are found in the clues and at least ceil(2/3) of its document quotes are found in
the document, and, where it claims to contain the answer, *every* answer quote is found in the
document. A task passes when every supporting document passes and at least one of them
contains the answer.

Three additions, each a hole a generator could otherwise slip through, all switchable:
- an item with no document quotes or no clue quotes fails (Context-1's ceil(2/3 * 0) = 0 would
  pass a document that quotes nothing);
- an item that claims the answer must give at least one answer quote;
- the answer must not be spelled out in the clues (the question would be trivial).
`truth_in_quotes` (on for the extractive generator, whose answers are verbatim spans) also
requires the answer text inside an answer quote and inside the document itself: the ordered
rung only looks at a quote's first five long words, so without this an answer swapped near the
end of its quote would still "match".

Reasons are short stable strings: they become the keys of the `failed` counts in the CLI.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from core.text_match import QuoteMatcher, contains_answer
from synth.schema import SupportingItem, SynthTask

QUOTE_FRACTION = 2 / 3
MIN_LEAK_CHECK_CHARS = 2  # a one-character answer ("3", "B") occurs in clues by accident


@dataclass(frozen=True)
class VerifyRules:
    quote_fraction: float = QUOTE_FRACTION
    require_quotes: bool = True
    require_truth_quotes: bool = True
    reject_truth_in_clues: bool = True
    truth_in_quotes: bool = False


@dataclass
class ItemCheck:
    item_id: str
    passed: bool
    reason: str | None
    clue_matched: int = 0
    clue_total: int = 0
    item_matched: int = 0
    item_total: int = 0
    truth_matched: int = 0
    truth_total: int = 0
    contains_truth: bool = False
    rungs: list[str | None] = field(default_factory=list)


@dataclass
class TaskCheck:
    passed: bool
    reason: str | None
    items: list[ItemCheck]

    def per_item(self) -> dict[str, str]:
        return {check.item_id: "ok" if check.passed else str(check.reason) for check in self.items}


def required_matches(total: int, fraction: float = QUOTE_FRACTION) -> int:
    """ceil(fraction * total), computed so that 2/3 of 3 is exactly 2 (no float drift)."""
    return math.ceil(round(total * fraction, 9))


def check_item(
    item: SupportingItem,
    clues: QuoteMatcher,
    document: QuoteMatcher | None,
    truth: str,
    rules: VerifyRules = VerifyRules(),
) -> ItemCheck:
    """Check one supporting item's quotes; the first broken rule is the reason."""
    check = ItemCheck(item.id, False, None, contains_truth=item.contains_truth)
    if document is None:
        check.reason = "missing_document"
        return check
    clue_quotes = [q for q in item.clue_quotes if q and q.strip()]
    item_quotes = [q for q in item.item_quotes if q and q.strip()]
    truth_quotes = [q for q in item.truth_quotes if q and q.strip()]
    clue_rungs = [clues.match(q) for q in clue_quotes]
    item_rungs = [document.match(q) for q in item_quotes]
    truth_rungs = [document.match(q) for q in truth_quotes] if item.contains_truth else []
    check.rungs = item_rungs + clue_rungs + truth_rungs
    check.clue_total, check.clue_matched = len(clue_quotes), sum(r is not None for r in clue_rungs)
    check.item_total, check.item_matched = len(item_quotes), sum(r is not None for r in item_rungs)
    check.truth_total, check.truth_matched = len(truth_rungs), sum(r is not None for r in truth_rungs)
    if rules.require_quotes and not item_quotes:
        check.reason = "no_item_quotes"
    elif rules.require_quotes and not clue_quotes:
        check.reason = "no_clue_quotes"
    elif check.item_matched < required_matches(check.item_total, rules.quote_fraction):
        check.reason = "item_quotes_unmatched"
    elif check.clue_matched < required_matches(check.clue_total, rules.quote_fraction):
        check.reason = "clue_quotes_unmatched"
    elif item.contains_truth and rules.require_truth_quotes and not truth_quotes:
        check.reason = "truth_quotes_missing"
    elif item.contains_truth and check.truth_matched < check.truth_total:
        check.reason = "truth_quotes_unmatched"
    elif item.contains_truth and rules.truth_in_quotes and not any(contains_answer(q, truth) for q in truth_quotes):
        check.reason = "truth_not_in_quotes"
    elif item.contains_truth and rules.truth_in_quotes and not contains_answer(document.text, truth):
        check.reason = "truth_not_in_document"  # the ordered rung forgives words after the fifth
    else:
        check.passed = True
    return check


def check_task(task: SynthTask, documents: Mapping[str, str], rules: VerifyRules = VerifyRules()) -> TaskCheck:
    """Check every supporting item of `task` against the documents (doc_id -> text)."""
    if not task.supporting_items:
        return TaskCheck(False, "no_supporting_items", [])
    if not task.truth.strip() or not task.question.strip():
        return TaskCheck(False, "empty_question_or_truth", [])
    clues = QuoteMatcher(task.clues_text)
    checks = []
    for item in task.supporting_items:
        text = documents.get(item.id)
        checks.append(check_item(item, clues, QuoteMatcher(text) if text is not None else None, task.truth, rules))
    failed = next((c for c in checks if not c.passed), None)
    if failed is not None:
        return TaskCheck(False, failed.reason, checks)
    if len(set(task.supporting_ids)) != len(task.supporting_ids):
        return TaskCheck(False, "duplicate_supporting_items", checks)
    if not any(c.contains_truth for c in checks):
        return TaskCheck(False, "no_item_contains_truth", checks)
    if rules.reject_truth_in_clues and len(task.truth.strip()) >= MIN_LEAK_CHECK_CHARS and contains_answer(task.clues_text, task.truth):
        return TaskCheck(False, "truth_in_clues", checks)
    return TaskCheck(True, None, checks)


def apply_check(task: SynthTask, check: TaskCheck, prefix: str = "") -> SynthTask:
    """The task with its verification outcome recorded (never dropped)."""
    reason = None if check.passed else f"{prefix}{check.reason}"
    return task.model_copy(update={"passed_verification": check.passed, "failure_reason": reason, "verification": check.per_item()})


def keep_matched_quotes(task: SynthTask, documents: Mapping[str, str]) -> SynthTask:
    """A passing task may carry up to a third of unmatched clue or document quotes (the 2/3
    rule); downstream users treat quotes as evidence, so a verified task keeps only the quotes
    that were found (answer quotes all matched already)."""
    clues = QuoteMatcher(task.clues_text)
    items = []
    for item in task.supporting_items:
        page = QuoteMatcher(documents.get(item.id) or "")
        items.append(item.model_copy(update={
            "item_quotes": [q for q in item.item_quotes if page.contains(q)],
            "clue_quotes": [q for q in item.clue_quotes if clues.contains(q)],
        }))
    return task.model_copy(update={"supporting_items": items})


def verify_task(task: SynthTask, documents: Mapping[str, str], rules: VerifyRules = VerifyRules()) -> SynthTask:
    """Code-only verification of the task's own quotes (the extractive path); a passing task
    keeps only its matched quotes."""
    checked = apply_check(task, check_task(task, documents, rules))
    return keep_matched_quotes(checked, documents) if checked.passed_verification else checked
