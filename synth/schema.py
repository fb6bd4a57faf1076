"""The task record, shaped like Context-1's so their tooling and ours read the same fields.

A task is a BrowseComp-style puzzle: obfuscated `clues`, each pointing at one supporting
document, a `question` combining them, the answer (`truth`) and its `truth_type`. Every
supporting item carries the quotes that justify it: `item_quotes` (verbatim spans of the
document), `clue_quotes` (spans of the clues it backs) and, when it holds the answer,
`truth_quotes`. `level` is the 0-based hop index of Context-1's chaining (a task extended
from a level-0 task is level 1 and carries a `bridging_item`). Failed tasks are kept, with
the reason, so a yield can be measured and a bad prompt pack diagnosed.

Ids are content hashes (Chroma's convention): the same generated task gets the same id on a
rerun, which is what makes the split deterministic and resumption safe.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Split = Literal["train", "dev", "test"]
SPLITS: tuple[Split, ...] = ("train", "dev", "test")


class SupportingItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str = Field(description="doc_id of the supporting document")
    reasoning: str = ""
    clue_quotes: list[str] = Field(default_factory=list)
    item_quotes: list[str] = Field(default_factory=list)
    contains_truth: bool = False
    truth_quotes: list[str] = Field(default_factory=list)


class BridgingItem(BaseModel):
    """How a chained task reaches its new document: `id` mentions the previous hop's answer,
    which was found in `relevant_prev_id`."""

    model_config = ConfigDict(extra="ignore")

    id: str
    relevant_prev_id: str = ""
    reasoning: str = ""


class Distractor(BaseModel):
    """A near-miss chunk that was checked NOT to contain the answer."""

    chunk_id: str
    doc_id: str
    mined_for: list[str] = Field(default_factory=list, description="supporting doc ids whose clues surfaced it")
    query: str = ""
    score: float = 0.0
    check: str = "code"  # code | llm


class RejectedDistractor(BaseModel):
    chunk_id: str
    doc_id: str
    reason: str


class SynthTask(BaseModel):
    """One generated task, verified or not (see `passed_verification` and `failure_reason`)."""

    model_config = ConfigDict(extra="ignore")

    id: str = ""
    level: int = 0
    clues: list[str] = Field(default_factory=list)
    question: str = ""
    truth: str = ""
    truth_type: str = ""
    supporting_items: list[SupportingItem] = Field(default_factory=list)
    bridging_item: BridgingItem | None = None
    parent_id: str | None = None
    seed_doc_id: str = ""
    distractors: list[Distractor] = Field(default_factory=list)
    rejected_distractors: list[RejectedDistractor] = Field(default_factory=list)
    passed_verification: bool = False
    failure_reason: str | None = None
    verification: dict[str, str] = Field(default_factory=dict, description="per supporting id: 'ok' or its reason")
    generator: str = ""
    domain: str = ""
    split: Split | None = None

    @property
    def hops(self) -> int:
        """Number of hops a solver must make: level 0 is one hop."""
        return self.level + 1

    @property
    def supporting_ids(self) -> list[str]:
        return [item.id for item in self.supporting_items]

    @property
    def clues_text(self) -> str:
        return "\n".join(self.clues)

    @property
    def agent_query(self) -> str:
        """What the search agent is asked: the clues, then the question that combines them.

        Extractive questions only name the masked span ("what is hidden behind [X1]?"), so the
        clues must travel with them; an LLM-written question that already states its clues
        repeats them, which costs a few tokens and loses nothing.
        """
        clues = "\n".join(f"- {clue}" for clue in self.clues if clue.strip() and clue.strip() not in self.question)
        return f"Clues:\n{clues}\n\nQuestion: {self.question}" if clues else self.question

    def with_id(self) -> "SynthTask":
        """A copy whose id is the content hash of what defines the task."""
        return self.model_copy(update={"id": task_id(self)})


def task_id(task: SynthTask) -> str:
    body = json.dumps(
        [task.generator, task.level, task.clues, task.question, task.truth, sorted(task.supporting_ids)],
        ensure_ascii=False,
    )
    return hashlib.sha256(body.encode("utf-8")).hexdigest()[:20]


class GeneratedItem(BaseModel):
    """A supporting item as the teacher writes it (the same fields; a separate name keeps the
    JSON schema we send to the model free of our bookkeeping fields)."""

    id: str
    reasoning: str = ""
    clue_quotes: list[str] = Field(default_factory=list)
    item_quotes: list[str] = Field(default_factory=list)
    contains_truth: bool = False
    truth_quotes: list[str] = Field(default_factory=list)


class GeneratedTask(BaseModel):
    """What the explore-and-generate loop must return as its final JSON answer."""

    clues: list[str]
    question: str
    truth: str
    truth_type: str
    supporting_items: list[GeneratedItem]


class GeneratedExtension(BaseModel):
    """What the chaining loop returns: one new hop bridged from the previous answer."""

    bridging_item: BridgingItem
    clues: list[str]
    question: str
    truth: str
    truth_type: str
    supporting_items: list[GeneratedItem]


class ExtractedQuotes(BaseModel):
    """The verifier's extraction for one supporting document."""

    clue_quotes: list[str] = Field(default_factory=list)
    item_quotes: list[str] = Field(default_factory=list)
    contains_truth: bool = False
    truth_quotes: list[str] = Field(default_factory=list)
    reasoning: str = ""


class AnswerCheck(BaseModel):
    """The distractor check: does this chunk state the answer in any form?"""

    contains_answer: bool
    quotes: list[str] = Field(default_factory=list)
    reasoning: str = ""
