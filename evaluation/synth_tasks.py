"""Verified synthetic tasks (synth's `SynthTask` JSONL) as bench tasks over a customer's index.

Gold documents are the supporting items; answer documents are the items the verifier marked
`contains_truth` (no such item: the all-gold rule). Facts (for fact-level scoring) are, per
supporting item, the chunks of its document that contain one of its verified `item_quotes`
(found by the verifier's own `QuoteMatcher`, so a quote that passed verification is located by
the same rules; every chunk of the document when no quote can be located in one chunk, e.g. a
quote split across a chunk boundary). Groups are hop counts, the curriculum's axis.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from core.text_match import QuoteMatcher
from evaluation.metrics import Gold
from evaluation.tasks import Task


def file_kind(path: str | Path) -> str:
    """`external` (question/answer/paragraphs) or `synth` (SynthTask records), from the first record."""
    if not Path(path).is_file():
        raise ValueError(f"{path}: task file not found")
    with Path(path).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}:{number}: not a JSON record ({error})") from None
                if not isinstance(row, dict):
                    raise ValueError(f"{path}:{number}: a record is a JSON object, not {type(row).__name__}")
                if "paragraphs" in row:
                    return "external"
                if "supporting_items" in row:
                    return "synth"
                raise ValueError(f"{path}: records have neither 'paragraphs' (benchmark file) nor 'supporting_items' (synth tasks)")
    raise ValueError(f"{path}: no records")


def read_synth_tasks(path: str | Path, split: str | None = "test", limit: int | None = None) -> list:
    """Verified tasks of one split (None: every split), in file order, first `limit`."""
    from synth.schema import SynthTask

    tasks = []
    from pydantic import ValidationError

    with Path(path).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                task = SynthTask.model_validate_json(line)
            except ValidationError as error:
                problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'record'}: {e['msg']}" for e in error.errors()[:3])
                raise ValueError(f"{path}:{number}: not a synthetic task ({problems})") from None
            if task.passed_verification and (split is None or task.split == split):
                tasks.append(task)
                if limit is not None and len(tasks) >= limit:
                    break
    return tasks


def tasks_from_synth(tasks: Iterable, chunks=None) -> list[Task]:
    """Tasks from SynthTasks (hops kept); `chunks` (the customer's chunk table) enables facts."""
    by_doc: dict[str, list[tuple[str, QuoteMatcher]]] = {}
    if chunks is not None:
        for row in chunks.select("chunk_id", "doc_id", "text").iter_rows(named=True):
            by_doc.setdefault(row["doc_id"], []).append((row["chunk_id"], QuoteMatcher(row["text"] or "")))
    bench = []
    for task in tasks:
        items = task.supporting_items
        facts: list[frozenset[str]] = []
        chunk_docs: dict[str, str] = {}
        for item in items:
            doc_chunks = by_doc.get(item.id, [])
            quotes = [q for q in item.item_quotes if q.strip()]
            located = {cid for cid, matcher in doc_chunks for q in quotes if matcher.contains(q)}
            fact = located or {cid for cid, _ in doc_chunks}
            if fact:
                facts.append(frozenset(fact))
                chunk_docs.update({cid: item.id for cid in fact})
        gold = Gold(
            doc_ids=frozenset(task.supporting_ids),
            answer=task.truth,
            answer_doc_ids=frozenset(item.id for item in items if item.contains_truth),
            facts=tuple(facts),
            chunk_docs=chunk_docs,
        )
        bench.append(Task(task.id, task.agent_query, gold, f"{task.hops}-hop", {"answer": task.truth, "domain": task.domain}, hops=task.hops))
    return bench
