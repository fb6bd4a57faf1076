"""Teacher trajectories replayed in the student's compact view, and the SFT samples they give."""

from __future__ import annotations

import re

import pytest

from agent.harness import HarnessConfig, run_episode
from agent.policies.heuristic import HeuristicPolicy
from agent.prompts import PRUNE_CHUNKS, READ_DOCUMENT
from bench.answer_choice import shown_references
from search.embedding_window import load_token_offsets
from tests.test_harness import pooled  # noqa: F401 - the fixture: real multi-hop paragraphs
from training.student_view import render_in_student_view

TEACHER = HarnessConfig.for_training(token_budget=8192, search_budget_tokens=512, response_reserve_tokens=512, max_turns=6)
STUDENT = TEACHER.model_copy(update={"view": "compact", "max_output_docs": 5})


class _Student:
    """Stands for the student model: its tokenizer is what the budget is counted with."""

    name = "student"

    def token_counter(self):
        return load_token_offsets()


@pytest.fixture(scope="module")
def replayed(pooled):
    index, questions = pooled
    teachers = [run_episode(index, HeuristicPolicy(), q["question"], TEACHER, task_id=q["id"]) for q in questions[:6]]
    return index, teachers, render_in_student_view(teachers, index, _Student(), STUDENT)


def test_the_student_sees_exactly_the_teachers_evidence(replayed):
    _, teachers, students = replayed
    for teacher, student in zip(teachers, students):
        assert [t.index for t in student.turns if t.tool_calls] == [t.index for t in teacher.turns if t.tool_calls]
        teacher_calls, student_calls = teacher.tool_call_records(), student.tool_call_records()
        assert [c.name for c in student_calls] == [c.name for c in teacher_calls]
        for mine, theirs in zip(student_calls, teacher_calls):
            assert sorted(mine.result_chunk_ids) == sorted(theirs.result_chunk_ids)
        assert student.output_doc_ids() == teacher.output_doc_ids()[:5]
        assert student.config["view"] == "compact" and student.metadata["rendered_from"] == teacher.id


def test_ids_become_references_in_calls_views_and_the_answer(replayed):
    _, teachers, students = replayed
    reads_or_prunes = 0
    for student in students:
        seen_ids = set(student.chunk_docs) | set(student.chunk_docs.values())
        for turn in student.turns:
            for call in turn.tool_calls:
                if call.name in (READ_DOCUMENT, PRUNE_CHUNKS):
                    reads_or_prunes += 1
                    values = call.arguments.get("chunk_ids") or [call.arguments.get("doc_id")]
                    assert all(str(v).isdigit() for v in values), call.arguments
            for message in turn.view_messages:
                assert not any(i in message.get("content", "") for i in seen_ids if len(i) > 8)
                for tool_call in message.get("tool_calls") or []:
                    assert not any(i in tool_call["function"]["arguments"] for i in seen_ids if len(i) > 8)
        final = student.turns[-1]
        assert not final.tool_calls and final.completion.startswith("[") and "<Document" not in final.completion
    assert reads_or_prunes > 0, "the teacher reads and prunes: the rewrite must have been exercised"


def test_rendering_is_deterministic(replayed):
    index, teachers, students = replayed
    again = render_in_student_view(teachers[:2], index, _Student(), STUDENT)

    def essence(trajectory):
        return (trajectory.id, trajectory.final_text, trajectory.output_doc_ids(),
                [(t.completion, [(c.name, c.arguments, c.result_chunk_ids) for c in t.tool_calls]) for t in trajectory.turns],
                [t.view_messages for t in trajectory.turns])

    assert [essence(t) for t in again] == [essence(t) for t in students[:2]]


def test_answer_choice_numbers_references_as_the_student_was_shown_them(replayed):
    """`bench/answer_choice.py` rebuilds each episode's reference numbers from its tool calls;
    they must be the ones the compact view showed, or its counting figures describe nothing."""
    _, _, students = replayed
    for student in students:
        numbers = shown_references(student)
        named = [int(n) for n in re.findall(r"\[(\d+)\]", student.turns[-1].completion)]
        assert [numbers[doc.chunk_id] for doc in student.final_ranking] == named

