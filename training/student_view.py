"""Teacher trajectories rendered in the student's view (the compact profile), for SFT.

Why replay instead of running the teacher in the compact view: a teacher (the heuristic, or a
large model) decides from full chunk texts; the student only ever sees the compact rendering.
So the teacher runs in the full view and each kept trajectory is replayed through the harness
under the student's profile: the same tool calls in the same turns, and each search, grep or
read returns exactly the chunks the teacher was shown (a replay backend serves the recorded
result ids), so the student's trajectory has the teacher's evidence, budget accounting in the
student's tokenizer, and the student's messages. Read and prune calls and the final answer are
then rewritten from ids to the episode's `[n]` references, everywhere they appear (the turn's
record and every later turn's recorded view), because that is what the student writes.

The replayed trajectory keeps the teacher's task id and final ranking; its id is derived from
the teacher's, so reruns produce the same samples.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import defaultdict, deque
from collections.abc import Collection, Sequence
from typing import Any

from agent.compact_view import format_reference_answer
from agent.environment import open_harness
from agent.final_answer import format_final_answer
from agent.harness import HarnessConfig
from agent.policy_base import Message, Policy, PolicyStep, TokenCounter, ToolCall
from agent.prompts import GREP_CORPUS, PRUNE_CHUNKS, READ_DOCUMENT, SEARCH_CORPUS
from agent.trajectory import Trajectory
from search.backend import Hit, SearchBackend


class ReplayBackend:
    """Serves, per (tool, argument), the chunks the teacher was shown, in the teacher's order."""

    def __init__(self, backend: SearchBackend, trajectory: Trajectory):
        lookup = getattr(backend, "chunk", None)
        if not callable(lookup):
            raise TypeError(f"{type(backend).__name__} cannot look chunks up by id (needs .chunk(chunk_id))")
        self.backend = backend
        self._lock = threading.Lock()
        self._queues: dict[tuple[str, str], deque[list[str]]] = defaultdict(deque)
        for call in trajectory.tool_call_records():
            key = _key(call.name, call.arguments)
            if key is not None:
                self._queues[key].append(list(call.result_chunk_ids))

    def _hits(self, name: str, value: Any) -> list[Hit]:
        with self._lock:
            queue = self._queues.get((name, str(value)))
            ids = queue.popleft() if queue else []
        return [hit for hit in (self.backend.chunk(chunk_id) for chunk_id in ids) if hit is not None]

    def search(self, query: str, k: int = 50, exclude: Collection[str] = ()) -> list[Hit]:
        return self._hits(SEARCH_CORPUS, query)

    def grep(self, pattern: str, limit: int = 5, exclude: Collection[str] = ()) -> list[Hit]:
        return self._hits(GREP_CORPUS, pattern)

    def document_chunks(self, doc_id: str) -> list[Hit]:
        """The chunks the teacher was shown; when it was shown none (they were all in its context
        already), the document itself, so the student is told the same instead of "unknown id"."""
        return self._hits(READ_DOCUMENT, doc_id) or self.backend.document_chunks(doc_id)

    def document_title(self, doc_id: str) -> str | None:
        return self.backend.document_title(doc_id)

    def search_bm25(self, query: str, k: int = 50, exclude: Collection[str] = ()) -> list[Hit]:
        return self.search(query, k, exclude)

    def search_dense(self, query: str, k: int = 50, exclude: Collection[str] = ()) -> list[Hit]:
        return self.search(query, k, exclude)


def _key(name: str, arguments: dict[str, Any]) -> tuple[str, str] | None:
    argument = {SEARCH_CORPUS: "query", GREP_CORPUS: "pattern", READ_DOCUMENT: "doc_id"}.get(name)
    return (name, str(arguments.get(argument))) if argument else None


class ReplayPolicy:
    """Re-issues a teacher trajectory's tool calls turn by turn (ids as the teacher wrote them),
    then the teacher's final ranking; counts tokens with the student's tokenizer."""

    def __init__(self, teacher: Trajectory, counter: TokenCounter):
        self.name = teacher.policy
        self.teacher = teacher
        self.counter = counter
        self.tool_turns = [turn for turn in teacher.turns if turn.tool_calls]

    def token_counter(self) -> TokenCounter:
        return self.counter

    def new_episode(self, question: str, seed: int = 0) -> ReplayPolicy:
        self._next = 0
        return self

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> PolicyStep:
        if tools and self._next < len(self.tool_turns):
            turn = self.tool_turns[self._next]
            self._next += 1
            calls = [ToolCall(id=f"call_{turn.index}_{i}", name=c.name, arguments=dict(c.arguments)) for i, c in enumerate(turn.tool_calls)]
            return PolicyStep(content=turn.completion, tool_calls=calls)
        entries = [(d.chunk_id or d.doc_id, "") for d in self.teacher.final_ranking]
        return PolicyStep(content=format_final_answer(entries) or "no documents")


class _Student:
    """The student policy's name and tokenizer, with the window and template measurements the
    harness uses for the usage line (so replayed budgets are the student's real budgets)."""

    def __init__(self, student: Policy, teacher: Trajectory):
        self.student = student
        self.replay = ReplayPolicy(teacher, student.token_counter())
        self.name = teacher.policy
        for attribute in ("context_window", "tool_overhead_tokens"):
            if hasattr(student, attribute):
                setattr(self, attribute, getattr(student, attribute))

    def token_counter(self) -> TokenCounter:
        return self.replay.counter

    def new_episode(self, question: str, seed: int = 0) -> ReplayPolicy:
        return self.replay.new_episode(question, seed)


def render_in_student_view(
    trajectories: Sequence[Trajectory], backend: SearchBackend, student: Policy, profile: HarnessConfig,
) -> list[Trajectory]:
    """Each teacher trajectory replayed under the student's profile, ids rewritten to references."""
    rendered = []
    for teacher in trajectories:
        config = profile.model_copy(update={"raise_policy_errors": True, "record_view_messages": True})
        with open_harness(_Student(student, teacher), ReplayBackend(backend, teacher), config=config) as harness:
            replayed = harness.run(teacher.question, seed=teacher.seed, task_id=teacher.task_id, metadata=dict(teacher.metadata))
        if config.view == "compact":
            _write_references(replayed, config.max_output_docs)
        replayed.id = hashlib.sha256(f"{teacher.id}\0{json.dumps(config.profile(), sort_keys=True)}".encode()).hexdigest()[:32]
        replayed.metadata = {**replayed.metadata, "rendered_from": teacher.id, "teacher_view": teacher.config.get("view", "full")}
        rendered.append(replayed)
    return rendered


def _write_references(trajectory: Trajectory, max_docs: int) -> None:
    """Rewrite read/prune arguments and the final answer from ids to `[n]` references."""
    refs: dict[str, int] = {}
    first_of_doc: dict[str, int] = {}
    rewritten: dict[str, dict[str, Any]] = {}  # call id -> arguments as the student writes them
    for turn in trajectory.turns:
        for call in turn.tool_calls:
            if call.name == READ_DOCUMENT and call.arguments.get("doc_id") in first_of_doc:
                call.arguments = {"doc_id": str(first_of_doc[call.arguments["doc_id"]])}
                rewritten[call.id] = call.arguments
            elif call.name == PRUNE_CHUNKS:
                call.arguments = {"chunk_ids": [str(refs[c]) for c in call.pruned_chunk_ids if c in refs]}
                rewritten[call.id] = call.arguments
        for call in turn.tool_calls:  # this turn's results are numbered after its calls were written
            for chunk_id in call.result_chunk_ids:
                refs.setdefault(chunk_id, len(refs) + 1)
                first_of_doc.setdefault(trajectory.chunk_docs.get(chunk_id, ""), refs[chunk_id])
    for turn in trajectory.turns:
        for message in turn.view_messages:
            for tool_call in message.get("tool_calls") or []:
                if tool_call.get("id") in rewritten:
                    tool_call["function"]["arguments"] = json.dumps(rewritten[tool_call["id"]], ensure_ascii=False)
    answer = []
    for document in trajectory.final_ranking[:max_docs]:
        reference = refs.get(document.chunk_id or "") or first_of_doc.get(document.doc_id)
        if reference is not None and reference not in answer:
            answer.append(reference)
    final = next((turn for turn in reversed(trajectory.turns) if not turn.tool_calls), None)
    if final is not None:
        final.completion = format_reference_answer(answer)
        trajectory.final_text = final.completion
