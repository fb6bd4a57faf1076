"""Teacher rollouts: K per task, concurrent, saved one by one, resumed, failures retried not scored."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from agent.final_answer import format_final_answer
from agent.harness import HarnessConfig
from agent.policy_base import PolicyStep, ToolCall
from synth.schema import SupportingItem, SynthTask
from tests.support.tiny_models import TinyBackend
from training.kept_trajectories import filter_trajectories, golds_for_tasks, malformed_reason
from training.teacher_trajectories import TeacherFailed, collect_teacher_trajectories

CONFIG = HarnessConfig.for_training(token_budget=4096, response_reserve_tokens=256, search_budget_tokens=512)


def task(question: str, gold: list[str]) -> SynthTask:
    items = [SupportingItem(id=doc, contains_truth=i == 0) for i, doc in enumerate(gold)]
    return SynthTask(question=question, truth="x", supporting_items=items, passed_verification=True, split="train").with_id()


TASKS = [
    task("Who designed the Alpha Lighthouse?", ["lighthouse"]),
    task("Where did Mara Quell teach?", ["quell"]),
    task("When did the Tallis Railway close?", ["railway"]),
]


class WordCounter:
    def count(self, text: str) -> int:
        return len(text.split())


class CountingPolicy:
    """Searches the question, answers with the top document; `fail` maps questions to failures to raise."""

    name = "counting"

    def __init__(self, fail: dict[str, int] | None = None):
        self.fail = dict(fail or {})  # question -> attempts that fail (-1: always)
        self.episodes: Counter[tuple[str, int]] = Counter()
        self.lock = threading.Lock()

    def token_counter(self):
        return WordCounter()

    def new_episode(self, question: str, seed: int = 0):
        with self.lock:
            self.episodes[(question, seed)] += 1
            attempt = self.episodes[(question, seed)]
        left = self.fail.get(question, 0)
        return _Episode(failing=left < 0 or attempt <= left)


class _Episode:
    def __init__(self, failing: bool):
        self.failing = failing
        self.turn = 0

    def act(self, messages, tools) -> PolicyStep:
        if self.failing:
            raise ConnectionError("teacher endpoint unreachable")
        self.turn += 1
        if self.turn == 1:
            return PolicyStep(content=None, tool_calls=[ToolCall("s", "search_corpus", {"query": messages[1]["content"]})])
        doc = next(m["content"].split("doc=")[1].split()[0] for m in messages if m["role"] == "tool")
        return PolicyStep(content=format_final_answer([(doc, "top hit")]))


def test_k_rollouts_per_task_in_task_then_seed_order():
    policy = CountingPolicy()
    result = collect_teacher_trajectories(TASKS, TinyBackend(), policy, CONFIG, k_rollouts=2, workers=3, seed=5)
    assert [(t.task_id, t.seed) for t in result.trajectories] == [(x.id, s) for x in TASKS for s in (5, 6)]
    assert result.collected == 6 and result.reused == 0 and not result.failures
    assert all(t.error is None and t.turns[0].view_messages for t in result.trajectories)


def test_a_rerun_reuses_every_saved_rollout(tmp_path):
    first = collect_teacher_trajectories(TASKS, TinyBackend(), CountingPolicy(), CONFIG, k_rollouts=2, store=tmp_path)
    policy = CountingPolicy()
    again = collect_teacher_trajectories(TASKS, TinyBackend(), policy, CONFIG, k_rollouts=2, store=tmp_path)
    assert again.reused == 6 and again.collected == 0 and not policy.episodes
    assert [t.id for t in again.trajectories] == [t.id for t in first.trajectories]
    more = collect_teacher_trajectories(TASKS, TinyBackend(), policy, CONFIG, k_rollouts=3, store=tmp_path)
    assert more.reused == 6 and more.collected == 3 and set(policy.episodes) == {(x.question, 2) for x in TASKS}


def test_new_harness_settings_do_not_reuse_old_rollouts(tmp_path):
    collect_teacher_trajectories(TASKS[:1], TinyBackend(), CountingPolicy(), CONFIG, store=tmp_path)
    other = CONFIG.model_copy(update={"max_turns": 7})
    result = collect_teacher_trajectories(TASKS[:1], TinyBackend(), CountingPolicy(), other, store=tmp_path)
    assert result.reused == 0 and result.collected == 1


def test_failures_are_retried_recorded_and_never_scored(tmp_path):
    flaky, dead = TASKS[0].question, TASKS[1].question
    policy = CountingPolicy(fail={flaky: 1, dead: -1})
    result = collect_teacher_trajectories(TASKS, TinyBackend(), policy, CONFIG, store=tmp_path, max_attempts=2)
    assert policy.episodes[(flaky, 0)] == 2 and policy.episodes[(dead, 0)] == 2
    assert [t.task_id for t in result.trajectories] == [TASKS[0].id, TASKS[2].id]
    assert [(f.task_id, f.attempts) for f in result.failures] == [(TASKS[1].id, 2)]
    assert "unreachable" in result.failures[0].error and result.metadata()["failed"] == 1
    assert list(tmp_path.rglob("errors/*/0.json")), "the failure is recorded in the store"
    healed = CountingPolicy()
    again = collect_teacher_trajectories(TASKS, TinyBackend(), healed, CONFIG, store=tmp_path)
    assert list(healed.episodes) == [(dead, 0)] and again.reused == 2 and again.collected == 1
    assert not list(tmp_path.rglob("errors/*/0.json")), "a success clears the recorded failure"


def test_a_teacher_that_always_fails_raises():
    policy = CountingPolicy(fail={x.question: -1 for x in TASKS})
    with pytest.raises(TeacherFailed, match="every rollout failed"):
        collect_teacher_trajectories(TASKS, TinyBackend(), policy, CONFIG, max_attempts=1)


def test_heuristic_teacher_rollouts_go_through_the_filter():
    from agent.policies import load_policy

    result = collect_teacher_trajectories(TASKS, TinyBackend(), load_policy("heuristic"), CONFIG, k_rollouts=2, workers=2)
    assert all(malformed_reason(t) is None for t in result.trajectories)
    selected = filter_trajectories(result.trajectories, golds_for_tasks(TASKS))
    assert sum(selected.counts.values()) == 6 and selected.kept
    assert len({t.task_id for t in selected.kept if selected.reason_of(t.id) == "whole"}) == len(
        [t for t in selected.kept if selected.reason_of(t.id) == "whole"]), "one high-recall rollout per task"
