"""The forced final answer begun with the view's answer opening (`HarnessSettings.prefill_final_answer`).

Why it matters: a student trained on teacher episodes that always answered on their own keeps
writing tool calls when the harness asks for the answer with no tools offered (28 of 150 dev
episodes of one SmolLM2 checkpoint ended with no ranking that way). The harness now asks a
policy that renders its own prompt to *answer*, begun with `[` (compact) or `<Document id=`
(full); the sampled tokens exclude that opening, and the RL trainer must condition on it.
The policy side runs a real tiny model; the harness side a scripted policy that records what
it was asked.
"""

from __future__ import annotations

import pytest
import torch

from agent.final_answer import format_final_answer
from agent.harness import HarnessConfig, run_episode
from agent.policy_base import PolicyStep
from agent.prompts import COMPACT_FORCE_FINAL
from agent.trajectory import Trajectory, Turn
from tests.test_harness import ScriptedPolicy, tiny_index  # noqa: F401 - the fixture

QUESTION = "Who designed the Alpha Lighthouse?"
MESSAGES = [
    {"role": "system", "content": "You are a search agent."},
    {"role": "user", "content": QUESTION},
    {"role": "user", "content": COMPACT_FORCE_FINAL.format(reason="You have used all 1 turns.", max_docs=5)},
]


class AnsweringPolicy(ScriptedPolicy):
    """A scripted policy that can begin its reply (`AnsweringEpisode`): records each opening."""

    def __init__(self, plan, *, final_after_opening: str):
        super().__init__(plan)
        self.openings: list[str] = []
        self.final_after_opening = final_after_opening

    def answer(self, messages, opening: str) -> PolicyStep:
        self.openings.append(opening)
        self.views.append((messages, []))
        return PolicyStep(content=opening + self.final_after_opening, prefill=opening)


@pytest.mark.parametrize("view, opening, rest", [
    ("compact", "[", "1]"),
    ("full", "<Document id=", format_final_answer([("lighthouse", "Names the designer.")]).removeprefix("<Document id=")),
])
def test_the_forced_final_asks_the_policy_to_answer_begun_with_the_views_opening(tiny_index, view, opening, rest):
    config = HarnessConfig(view=view, token_budget=4096, search_budget_tokens=512, response_reserve_tokens=256, max_turns=1)
    policy = AnsweringPolicy([[("search_corpus", {"query": "Alpha Lighthouse engineer"})]], final_after_opening=rest)
    trajectory = run_episode(tiny_index, policy, QUESTION, config)
    assert policy.openings == [opening]
    final = trajectory.turns[-1]
    assert final.forced_final and final.prefill == opening and trajectory.stop_reason == "max_turns"
    assert len(trajectory.output_doc_ids()) == 1 and not trajectory.parse_errors


def test_without_prefill_the_forced_final_is_an_ordinary_turn_with_no_tools(tiny_index):
    config = HarnessConfig(view="compact", token_budget=4096, search_budget_tokens=512, response_reserve_tokens=256,
                           max_turns=1, prefill_final_answer=False)
    policy = AnsweringPolicy([[("search_corpus", {"query": "Alpha Lighthouse engineer"})]], final_after_opening="1]")
    policy.final = "[1]"
    trajectory = run_episode(tiny_index, policy, QUESTION, config)
    assert policy.openings == [] and policy.views[-1][1] == []
    assert trajectory.turns[-1].forced_final and trajectory.turns[-1].prefill is None
    assert len(trajectory.output_doc_ids()) == 1


@pytest.fixture(scope="module")
def tiny_chatml(tmp_path_factory):
    from agent.small_model import build_tiny_model

    texts = [QUESTION, *(m["content"] for m in MESSAGES), "[1] [2] [3] [4] [5]"] * 10
    return build_tiny_model(tmp_path_factory.mktemp("prefill") / "model", texts, seed=5)


def test_a_transformers_answer_continues_the_opening_and_samples_only_what_follows(tiny_chatml):
    from agent.policies.transformers_policy import TransformersPolicy

    policy = TransformersPolicy(str(tiny_chatml), max_new_tokens=12, temperature=1.0, seed=3, dtype="float32")
    step = policy.new_episode(QUESTION, seed=1).answer(MESSAGES, "[")
    lm = policy.loaded()
    assert step.prefill == "[" and step.content is not None and step.content.startswith("[")
    assert step.prompt_tokens == len(lm.tokenizer(policy.render_prompt(MESSAGES, None) + "[", add_special_tokens=False)["input_ids"])
    assert not step.raw_text.startswith("["), "the raw text is what was sampled, after the opening"
    assert len(step.completion_token_ids) == len(step.completion_logprobs) == step.completion_tokens > 0


def test_the_rl_trainer_conditions_a_forced_final_on_the_opening_the_sampler_continued(tiny_chatml):
    """The recomputed log-probs of the sampled tokens equal the sampler's (ratio 1) only if the
    trainer's prompt holds the opening; without it they differ."""
    from agent.policies.transformers_policy import TransformersPolicy
    from training.rl_batch import turn_prompt_ids

    policy = TransformersPolicy(str(tiny_chatml), max_new_tokens=12, temperature=1.0, seed=3, dtype="float32")
    step = policy.new_episode(QUESTION, seed=2).answer(MESSAGES, "[")
    turn = Turn(index=1, prompt_tokens=0, view_messages=MESSAGES, completion=step.content, completion_tokens=step.completion_tokens,
                completion_token_ids=step.completion_token_ids, completion_logprobs=step.completion_logprobs,
                raw_text=step.raw_text, prefill=step.prefill, forced_final=True)
    trajectory = Trajectory(question=QUESTION, policy=policy.name, tools=[{"type": "function", "function": {"name": "search_corpus"}}],
                            turns=[turn])
    lm = policy.loaded()

    def recomputed(prompt: list[int]) -> list[float]:
        ids = torch.tensor([prompt + step.completion_token_ids])
        with torch.no_grad():
            logits = lm.model(ids).logits[0, len(prompt) - 1:-1].float()
        logp = torch.log_softmax(logits, -1)  # temperature 1
        return logp.gather(1, torch.tensor(step.completion_token_ids).unsqueeze(1)).squeeze(1).tolist()

    prompt = turn_prompt_ids(lm.tokenizer, trajectory, turn)
    assert recomputed(prompt) == pytest.approx(step.completion_logprobs, abs=1e-4)
    without = turn_prompt_ids(lm.tokenizer, trajectory, turn.model_copy(update={"prefill": None}))
    assert without != prompt
    assert recomputed(without) != pytest.approx(step.completion_logprobs, abs=1e-4)
