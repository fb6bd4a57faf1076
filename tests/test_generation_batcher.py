"""Greedy turns of concurrent episodes, batched: the same tokens and logprobs as one at a time."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from agent.policies.generation_batcher import GenerationBatcher, GreedyTurn, first_end, pick_batch

PROMPTS = [
    [{"role": "user", "content": "Who founded Acme?"}],
    [{"role": "user", "content": "Where does the river flow past the mill?"}],
    [{"role": "user", "content": "When was Acme founded by Jane Roe in Springfield?"}],
    [{"role": "user", "content": "Mill?"}],
]


def turn(length: int) -> GreedyTurn:
    return GreedyTurn(list(range(length)), 4)


def test_pick_batch_groups_the_oldest_turn_with_turns_of_similar_length():
    pending = [turn(100), turn(400), turn(120), turn(90), turn(149)]
    chosen = pick_batch(pending, max_batch=8, length_ratio=1.5)
    assert chosen[0] is pending[0]  # the oldest always goes
    assert sorted(len(t.prompt_ids) for t in chosen) == [90, 100, 120]  # 149 > 1.5 * 90 once 90 is in
    assert pick_batch(pending, max_batch=2, length_ratio=10.0) == [pending[0], pending[3]]  # the closest in length
    assert pick_batch([], max_batch=8, length_ratio=1.5) == []


def test_first_end_cuts_after_the_first_end_token():
    assert first_end([5, 6, 2, 7, 2], {2}) == 3
    assert first_end([5, 6], {2}) == 2


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from agent.small_model import build_tiny_model

    texts = ["Acme was founded by Jane Roe in 1901 in Springfield.", "The river flows north past the mill."] * 20
    return build_tiny_model(tmp_path_factory.mktemp("tiny-batch") / "model", texts, seed=11)


def _prompt_ids(policy, messages):
    lm = policy.loaded()
    return lm.tokenizer(policy.render_prompt(messages, None), add_special_tokens=False)["input_ids"]


def test_a_batch_gives_each_turn_the_tokens_and_logits_it_gets_alone(tiny_dir):
    from agent.policies.transformers_policy import TransformersPolicy

    policy = TransformersPolicy(str(tiny_dir), max_new_tokens=12, dtype="float32")
    lm = policy.loaded()
    prompts = [_prompt_ids(policy, messages) for messages in PROMPTS]
    alone = GenerationBatcher(lm.model, pad_token_id=lm.pad_token_id, eos_token_ids=lm.eos_token_ids,
                              lock=threading.Lock(), max_batch=1)
    together = GenerationBatcher(lm.model, pad_token_id=lm.pad_token_id, eos_token_ids=lm.eos_token_ids,
                                 lock=threading.Lock(), max_batch=8, length_ratio=10.0)
    # Different caps in one batch: each turn stops at its own.
    caps = [12, 5, 12, 8]
    expected = [alone.generate(ids, cap) for ids, cap in zip(prompts, caps)]
    with ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(lambda pair: together.generate(*pair), zip(prompts, caps)))
    assert alone.batch_sizes == [1, 1, 1, 1]
    assert max(together.batch_sizes) > 1 and sum(together.batch_sizes) == len(prompts)
    for one, batched, cap in zip(expected, got, caps):
        assert 0 < len(batched.completion_ids) <= cap
        assert batched.completion_ids == one.completion_ids
        assert batched.logits.shape == one.logits.shape
        assert batched.logits.float().allclose(one.logits.float(), atol=1e-4)


def test_concurrent_episodes_record_the_logprobs_of_a_forward_pass(tiny_dir):
    """Through the policy: threads' greedy turns are batched, and each step's recorded logprobs
    are those of its own tokens under a plain forward pass of its own prompt."""
    import torch

    from agent.policies.transformers_policy import TransformersPolicy

    policy = TransformersPolicy(str(tiny_dir), max_new_tokens=10, dtype="float32")
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        steps = list(pool.map(lambda messages: policy.new_episode("q").act(messages, []), PROMPTS))
    lm = policy.loaded()
    for messages, step in zip(PROMPTS, steps):
        prompt = _prompt_ids(policy, messages)
        assert step.prompt_tokens == len(prompt)
        ids = torch.tensor([prompt + step.completion_token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(lm.model(ids).logits[0, len(prompt) - 1:-1].float(), -1)
        forward = logp.gather(1, torch.tensor(step.completion_token_ids).unsqueeze(1)).squeeze(1).tolist()
        assert forward == pytest.approx(step.completion_logprobs, abs=1e-4)


def test_a_failing_batch_raises_in_every_waiting_thread(tiny_dir, monkeypatch):
    from agent.policies.transformers_policy import TransformersPolicy

    policy = TransformersPolicy(str(tiny_dir), max_new_tokens=4, dtype="float32")
    lm = policy.loaded()
    batcher = GenerationBatcher(lm.model, pad_token_id=lm.pad_token_id, eos_token_ids=lm.eos_token_ids,
                                lock=threading.Lock(), max_batch=4)

    def broken(**_kwargs):
        raise RuntimeError("out of memory in generate")

    monkeypatch.setattr(lm.model, "generate", broken)
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(batcher.generate, [1, 2, 3], 4) for _ in range(3)]
        for future in futures:
            with pytest.raises(RuntimeError, match="out of memory"):
                future.result(timeout=60)


def test_the_next_batch_waits_for_the_turns_the_last_batch_will_send(tiny_dir):
    """Episodes come back from their tool calls at different times: with a slow last batch the
    next one waits (a share of that time) for as many turns as it held; with a fast one it does not."""
    import time

    from agent.policies.transformers_policy import TransformersPolicy

    lm = TransformersPolicy(str(tiny_dir), max_new_tokens=2, dtype="float32").loaded()
    batcher = GenerationBatcher(lm.model, pad_token_id=lm.pad_token_id, eos_token_ids=lm.eos_token_ids,
                                lock=threading.Lock(), max_batch=4)

    def staggered(delay: float) -> GreedyTurn:
        time.sleep(delay)
        return batcher.generate([1, 2, 3, 4], 2)

    for last_seconds, expected in ((10.0, [3]), (0.0, [1, 1, 1])):
        batcher.batch_sizes, batcher.last_batch_seconds = [3], last_seconds
        assert batcher.gather_seconds() == (1.0 if last_seconds else 0.02)
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(staggered, [0.0, 0.4, 0.8]))
        assert batcher.batch_sizes[1:] == expected


def test_batch_size_setting_is_validated(monkeypatch):
    from agent.policies.transformers_policy import generation_batch_size

    monkeypatch.setenv("SEARCHSMITH_GENERATION_BATCH", "1")
    assert generation_batch_size() == 1
    monkeypatch.setenv("SEARCHSMITH_GENERATION_BATCH", "zero")
    with pytest.raises(ValueError, match="SEARCHSMITH_GENERATION_BATCH"):
        generation_batch_size()
    monkeypatch.setenv("SEARCHSMITH_GENERATION_BATCH", "0")
    with pytest.raises(ValueError, match="at least 1"):
        generation_batch_size()


def test_prefix_cache_continues_a_prompt_that_extends_an_earlier_one(tiny_dir):
    """A second turn's prompt extends the first's: only its new tokens are computed, and the
    batch gives the tokens and logits of a full prefill."""
    from agent.policies.prefix_cache import PrefixCache
    from agent.policies.transformers_policy import TransformersPolicy

    policy = TransformersPolicy(str(tiny_dir), max_new_tokens=10, dtype="float32")
    lm = policy.loaded()
    first = [{"role": "system", "content": "You are a search agent. Search, then answer."}, *PROMPTS[0]]
    second = [*first, {"role": "assistant", "content": "Acme."}, *PROMPTS[1]]
    prompts = [_prompt_ids(policy, first), _prompt_ids(policy, second)]
    assert prompts[1][: len(prompts[0]) - 2] == prompts[0][:-2]
    plain = GenerationBatcher(lm.model, pad_token_id=lm.pad_token_id, eos_token_ids=lm.eos_token_ids,
                              lock=threading.Lock(), max_batch=1)
    cache = PrefixCache(lm.model)
    cached = GenerationBatcher(lm.model, pad_token_id=lm.pad_token_id, eos_token_ids=lm.eos_token_ids,
                               lock=threading.Lock(), max_batch=4, prefix_cache=cache)
    for ids in prompts:
        expected, got = plain.generate(ids, 10), cached.generate(ids, 10)
        assert got.completion_ids == expected.completion_ids
        assert got.logits.float().allclose(expected.logits.float(), atol=1e-4)
    assert cache.reused_tokens >= len(prompts[0]) - 2  # the second prompt continued from the first
    assert cache.computed_tokens < sum(len(ids) for ids in prompts) - cache.reused_tokens + 1
    # A batch of both (different lengths, one batch): each row still matches its own prefill.
    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda ids: cached.generate(ids, 10), prompts))
    for ids, got in zip(prompts, both):
        assert got.completion_ids == plain.generate(ids, 10).completion_ids


def test_prefix_cache_forgets_states_of_weights_that_changed(tiny_dir):
    import torch
    from transformers import AutoModelForCausalLM

    from agent.policies.prefix_cache import PrefixCache

    model = AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float32).eval()
    cache = PrefixCache(model)
    ids = list(range(5, 60))
    before = cache.states(ids)[0][0].clone()
    assert cache.states(ids)[0][0].equal(before) and cache.reused_tokens == len(ids)
    with torch.no_grad():
        next(model.parameters()).mul_(1.5)  # an optimizer step, in place
    after = cache.states(ids)[0][0]
    assert not after.equal(before)


def test_prefix_cache_stands_aside_for_sliding_window_models():
    from transformers import GptOssConfig, LlamaConfig

    from agent.policies.prefix_cache import sliding_window_reason

    assert sliding_window_reason(LlamaConfig()) is None
    assert "sliding_attention" in sliding_window_reason(GptOssConfig())
