"""Rollouts through the real harness, THE reward's wiring, crash retries, per-turn sequences
with prefix merging, and the accumulation equivalence (split batch == full batch) on a tiny
model. Policies are scripted (they play fixed plans and record the tokens a canonical model
would sample), the backend is an in-memory one, the model is the tiny answer model."""

from __future__ import annotations

import threading

import pytest
import torch

from agent.harness import Harness, HarnessConfig
from evaluation.reward import reward as reference_reward
from tests.test_training_cispo_support import MemoryBackend, ScriptedPolicy, answer_model_dir, lighthouse_tasks, model_dir, one_thread  # noqa: F401 (fixtures)
from training.cispo_update import accumulate_cispo_gradients, sequence_logprobs
from training.rl_batch import MissingLogprobs, collate, sequences_from_groups, sequences_from_trajectory
from training.rl_rollouts import RolloutCrashed, RolloutGroup, collect_rollouts, rollout_metrics

ANSWER = "<Document id=d1><Justification>It names the designer.</Justification></Document>"
WRONG = "<Document id=d2><Justification>A river.</Justification></Document>"
PRUNING_PLAN = [
    ("call", "search_corpus", {"query": "lighthouse engineer"}),
    ("call", "search_corpus", {"query": "river sea"}),
    ("call", "prune_chunks", {"chunk_ids": ["d2-c0"]}),
    ("answer", ANSWER),
]


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    yield


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="module")
def lora_model(model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    return model


@pytest.fixture(scope="module")
def pruned_trajectory(tokenizer):
    policy = ScriptedPolicy(tokenizer, lambda seed: PRUNING_PLAN)
    with Harness(MemoryBackend(), policy, HarnessConfig.for_training(max_turns=6)) as harness:
        trajectory = harness.run("Who designed the Alpha Lighthouse?", seed=1)
    assert trajectory.turns[2].pruned_ids == ["d2-c0"] and trajectory.stop_reason == "answer"
    return trajectory


def test_turns_sharing_a_prefix_merge_and_a_prune_starts_a_new_sequence(tokenizer, pruned_trajectory):
    merged, counts = sequences_from_trajectory(tokenizer, pruned_trajectory, advantage=0.5)
    single, naive = sequences_from_trajectory(tokenizer, pruned_trajectory, advantage=0.5, merge=False)
    assert [s.n_turns for s in merged] == [3, 1]  # turns 0-2 grow the context; the prune rewrites it
    assert [s.n_turns for s in single] == [1, 1, 1, 1]
    assert counts.completion_tokens == naive.completion_tokens == sum(len(t.completion_token_ids) for t in pruned_trajectory.turns)
    assert counts.naive_prompt_tokens == naive.recomputed_prompt_tokens
    assert counts.recomputed_prompt_tokens < counts.naive_prompt_tokens
    assert counts.recomputed_prompt_tokens == sum(s.prompt_tokens for s in merged)
    assert all(s.advantage == 0.5 for s in merged)
    # the last sequence is the final turn's pruned view: the marker is in its prompt
    assert "[pruned chunk d2-c0]" in tokenizer.decode(merged[1].input_ids)


def test_a_merged_sequence_scores_each_turn_as_its_own_sequence_would(lora_model, tokenizer, pruned_trajectory):
    merged, _ = sequences_from_trajectory(tokenizer, pruned_trajectory, advantage=1.0)
    single, _ = sequences_from_trajectory(tokenizer, pruned_trajectory, advantage=1.0, merge=False)
    with torch.no_grad():
        a = torch.cat([sequence_logprobs(lora_model, collate([s], 0))[0][0] for s in merged])
        b = torch.cat([sequence_logprobs(lora_model, collate([s], 0))[0][0] for s in single])
    assert torch.allclose(a, b, atol=1e-5)


def test_split_batch_with_accumulation_equals_the_full_batch(lora_model, tokenizer, pruned_trajectory):
    sequences = []
    for advantage in (1.3, -0.4):
        seqs, _ = sequences_from_trajectory(tokenizer, pruned_trajectory, advantage=advantage, merge=advantage > 0)
        sequences.extend(seqs)
    generator = torch.Generator().manual_seed(0)
    for seq in sequences:  # pi_old off the current policy, so some weights are clipped
        seq.old_logprobs = [x + float(torch.randn(1, generator=generator)) * m for x, m in zip(seq.old_logprobs, seq.target_mask)]
    params = [p for p in lora_model.parameters() if p.requires_grad]

    def gradients(micro_batch_tokens: int):
        lora_model.zero_grad(set_to_none=True)
        # Both bounds are tight: the scripted pi_old is far from the random model's pi, so weights
        # are clipped whichever side the noise puts them on.
        stats, _ = accumulate_cispo_gradients(lora_model, sequences, pad_id=tokenizer.pad_token_id, eps_low=0.2,
                                              eps_high=0.2, micro_batch_tokens=micro_batch_tokens)
        return [p.grad.clone() for p in params], stats

    full, full_stats = gradients(10**9)
    split, split_stats = gradients(1)  # one sequence per micro-batch
    assert len(full_stats) == 1 and len(split_stats) == len(sequences)
    assert sum(s.loss for s in split_stats) == pytest.approx(full_stats[0].loss, rel=1e-5)
    assert any(s.clip_ratio > 0 for s in split_stats)
    for g_full, g_split in zip(full, split):
        assert torch.allclose(g_full, g_split, rtol=1e-4, atol=1e-7)
    assert any(float(g.abs().sum()) > 0 for g in full)


def _answer_plan(seed: int) -> list:
    return [("answer", ANSWER if seed % 2 else WRONG)]


def test_rollouts_are_scored_by_the_reward_module_with_every_component(tokenizer):
    tasks = lighthouse_tasks()
    policy = ScriptedPolicy(tokenizer, _answer_plan)
    batch = collect_rollouts(policy, MemoryBackend(), tasks, group_size=6, beta=3.0, step=2, seed=5, workers=4)
    assert [len(g.rollouts) for g in batch.groups] == [6, 6]
    for rollout in batch.rollouts:
        expected = reference_reward(rollout.trajectory, rollout.task.gold, beta=3.0, k=5)  # the benchmark's k
        assert rollout.reward == expected
        # answers without searching: F_beta and the answer bonus, no trajectory recall (nothing was surfaced)
        assert rollout.reward.reward in (0.0, pytest.approx(1.7))
        assert rollout.trajectory.config["soft_hint"] is True  # training configuration
    metrics = rollout_metrics(batch)
    rewards = [r.reward.reward for r in batch.rollouts]
    assert metrics["reward_mean"] == pytest.approx(sum(rewards) / len(rewards))
    assert set(metrics["reward_components"]) >= {"f_beta", "trajectory_recall", "answer_found", "p_prune", "p_turn", "pre_penalty"}
    assert metrics["reward_components"]["answer_found"] == pytest.approx(metrics["answer_found"])
    assert metrics["beta"] == 3.0 and metrics["crashes"] == 0
    # the same call is reproducible: seeds are a function of (seed, step, task, index)
    again = collect_rollouts(policy, MemoryBackend(), tasks, group_size=6, beta=3.0, step=2, seed=5, workers=1)
    assert [r.reward.reward for r in again.rollouts] == rewards


def test_groups_with_equal_rewards_are_dropped_and_contribute_nothing(tokenizer, pruned_trajectory):
    policy = ScriptedPolicy(tokenizer, lambda seed: [("answer", ANSWER)])
    batch = collect_rollouts(policy, MemoryBackend(), lighthouse_tasks()[:1], group_size=4, workers=1)
    assert batch.groups[0].dropped and rollout_metrics(batch)["groups_dropped"] == 1
    # a dropped group is never turned into sequences, even one that could not be (no logprobs)
    broken = pruned_trajectory.model_copy(deep=True)
    broken.turns[0].completion_logprobs = None
    dropped = RolloutGroup(batch.groups[0].task, [type(batch.rollouts[0])(
        batch.groups[0].task, 0, 0, broken, batch.rollouts[0].score, batch.rollouts[0].reward)], None)
    sequences, counts = sequences_from_groups(tokenizer, [dropped])
    assert sequences == [] and counts.completion_tokens == 0
    with pytest.raises(MissingLogprobs):
        sequences_from_trajectory(tokenizer, broken, 1.0)


def test_a_crashed_rollout_is_recorded_and_retried_never_scored_zero(tokenizer):
    lock, failures = threading.Lock(), {"left": 3}

    def crash_first_three(seed: int, turn: int) -> None:
        with lock:
            if failures["left"] > 0:
                failures["left"] -= 1
                raise ConnectionError("engine went away")

    policy = ScriptedPolicy(tokenizer, lambda seed: [("answer", ANSWER)], crash=crash_first_three)
    batch = collect_rollouts(policy, MemoryBackend(), lighthouse_tasks()[:1], group_size=4, workers=1, max_retries=3)
    assert len(batch.crashes) == 3 and "engine went away" in batch.crashes[0]["error"]
    assert all(r.reward.reward == pytest.approx(1.7) and r.trajectory.error is None for r in batch.rollouts)
    assert sum(r.attempts for r in batch.rollouts) == 4 + 3

    always = ScriptedPolicy(tokenizer, lambda seed: [("answer", ANSWER)],
                            crash=lambda seed, turn: (_ for _ in ()).throw(TimeoutError("no engine")))
    with pytest.raises(RolloutCrashed) as caught:
        collect_rollouts(always, MemoryBackend(), lighthouse_tasks()[:1], group_size=2, workers=1, max_retries=1)
    assert len(caught.value.crashes) == 2 and "no engine" in str(caught.value)
