"""A decode cache sized once: the tokens and logits of transformers' DynamicCache, written in place."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from agent.policies.preallocated_cache import (
    PreallocatedLayer,
    decode_cache,
    preallocated_cache,
    stacked_cache,
)

NEW_TOKENS = 10


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(config).eval()


def left_padded(prompts: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = [[pad] * (width - len(p)) + p for p in prompts]
    mask = [[0] * (width - len(p)) + [1] * len(p) for p in prompts]
    return torch.tensor(ids), torch.tensor(mask)


def greedy(model, ids, mask, cache=None):
    extra = {"cache": cache} if cache is not None else {}
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                             do_sample=False, pad_token_id=0, return_dict_in_generate=True, output_logits=True,
                             **extra)
    return out.sequences[:, ids.shape[1]:].tolist(), torch.stack(out.logits, 1)


PROMPTS = [[5, 9, 14, 2, 33, 61, 7, 7, 20], [41, 3, 3, 88], [12, 19, 25, 30, 44, 50, 51]]


@pytest.mark.parametrize("capacity", [9 + NEW_TOKENS, 4])  # exact bound; too small (grows by doubling)
def test_generation_into_a_preallocated_cache_gives_dynamic_caches_tokens_and_logits(model, capacity):
    ids, mask = left_padded(PROMPTS)
    expected_tokens, expected_logits = greedy(model, ids, mask)
    cache = preallocated_cache(capacity)
    tokens, logits = greedy(model, ids, mask, cache)
    assert tokens == expected_tokens
    torch.testing.assert_close(logits, expected_logits, rtol=1e-5, atol=1e-5)
    assert all(isinstance(layer, PreallocatedLayer) for layer in cache.layers)
    assert cache.get_seq_length() == ids.shape[1] + NEW_TOKENS - 1  # the last token is never fed back


def test_decode_steps_write_into_the_buffer_instead_of_reallocating_it(model):
    seen: list[tuple[int, int]] = []

    class Watched(PreallocatedLayer):
        def update(self, key_states, value_states, *args, **kwargs):
            keys, values = super().update(key_states, value_states, *args, **kwargs)
            seen.append((self.key_buffer.data_ptr(), keys.data_ptr()))
            return keys, values

    ids, mask = left_padded(PROMPTS)
    cache = preallocated_cache(ids.shape[1] + NEW_TOKENS)
    cache.layer_class_to_replicate = lambda: Watched(ids.shape[1] + NEW_TOKENS)
    greedy(model, ids, mask, cache)
    assert len(seen) == NEW_TOKENS * len(cache.layers)  # the prefill and each decode step but the last
    assert len({buffer for buffer, _ in seen}) == len(cache.layers)  # one buffer per layer, never reallocated
    assert all(keys == buffer for buffer, keys in seen)  # what attention reads is a view of it, not a copy


def test_stacked_prefix_states_decode_as_a_full_prefill_does(model):
    """Each row's states computed alone (as the prefix cache does), stacked left-padded, then
    decoded: the tokens of prefilling the padded batch at once."""
    ids, mask = left_padded(PROMPTS)
    expected_tokens, expected_logits = greedy(model, ids, mask)
    rows = []
    with torch.inference_mode():
        for prompt in PROMPTS:
            alone = DynamicCache()
            model(input_ids=torch.tensor([prompt[:-1]]), cache=alone, use_cache=True)
            rows.append([(layer.keys, layer.values) for layer in alone.layers])
    width = ids.shape[1]
    cache = stacked_cache(rows, width - 1, width + NEW_TOKENS)
    assert cache.get_seq_length() == width - 1
    for layer, states in zip(cache.layers, zip(*rows)):
        assert float(layer.keys[1, :, : width - 1 - states[1][0].shape[2]].abs().sum()) == 0  # padding is zeros
    tokens, logits = greedy(model, ids, mask, cache)
    assert tokens == expected_tokens
    torch.testing.assert_close(logits, expected_logits, rtol=1e-4, atol=1e-4)


def test_sliding_window_models_keep_transformers_own_cache(model):
    from transformers import GptOssConfig

    class Sliding:
        config = GptOssConfig()

    assert decode_cache(Sliding(), 100) == {}
    assert isinstance(decode_cache(model, 100)["cache"], DynamicCache)


def test_crop_and_batch_selection_keep_the_filled_positions():
    layer = PreallocatedLayer(8)
    keys = torch.arange(2 * 1 * 3 * 2, dtype=torch.float32).reshape(2, 1, 3, 2)
    layer.update(keys, keys + 100)
    layer.crop(-1)
    assert layer.get_seq_length() == 2 and torch.equal(layer.keys, keys[:, :, :2])
    layer.batch_select_indices(torch.tensor([1]))
    assert torch.equal(layer.values, keys[1:, :, :2] + 100)
    with pytest.raises(ValueError, match="negative"):
        layer.crop(2)
