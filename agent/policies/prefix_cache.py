"""Attention keys and values of recent prompts, so a prompt that extends one computes only its new tokens.

Why: an agent's turn re-sends the whole conversation, and every prompt of every episode opens with
the same system prompt and tool schemas; on a CPU, prefill of those shared tokens is about half of
what an episode costs. A turn's prompt extends the previous turn's (until the agent prunes), so
keeping the last few prompts' states and continuing from the longest shared prefix computes each
token about once per episode instead of once per turn.

Entries are dropped when any weight changes in place (an RL trainer's live model) and evicted
oldest-first past `max_tokens` cached tokens (about 23 KB per token for
SmolLM2-135M in bf16). Used by one thread (the generation batcher's worker), so it has no lock.
Continuing from cached states gives the logits of a full prefill up to the last bits of
low-precision arithmetic.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

DEFAULT_MAX_TOKENS = 65_536
MIN_REUSE_TOKENS = 16  # a shorter shared prefix is recomputed: not worth a copy


class PrefixCache:
    """Per-layer (keys, values) of recently prefilled prompts, keyed by their token ids."""

    def __init__(self, model: Any, max_tokens: int = DEFAULT_MAX_TOKENS):
        self.model = model
        self.max_tokens = max(0, max_tokens)
        self.entries: OrderedDict[tuple[int, ...], list[tuple[Any, Any]]] = OrderedDict()
        self.reused_tokens = 0
        self.computed_tokens = 0
        self.unsupported: str | None = sliding_window_reason(getattr(model, "config", None))
        self._weights_version = self._version()

    def _version(self) -> int:
        """Changes whenever a weight is updated in place (an optimizer step on a live RL model)."""
        return sum(parameter._version for parameter in self.model.parameters())

    def states(self, token_ids: list[int]) -> list[tuple[Any, Any]] | None:
        """Keys and values of `token_ids` (one pair per layer, each [1, heads, len, dim]),
        computed only past the longest prefix already cached; None for a model whose cache does
        not keep every position (sliding-window layers), which must prefill as usual."""
        if self.unsupported:
            return None
        import torch
        from transformers import DynamicCache

        version = self._version()
        if version != self._weights_version:  # states of other weights: never reuse them
            self.entries.clear()
            self._weights_version = version
        key = tuple(token_ids)
        if key in self.entries:
            self.entries.move_to_end(key)
            self.reused_tokens += len(key)
            return self.entries[key]
        shared, source = self._longest_prefix(key)
        cache = DynamicCache()
        if shared:
            for layer, (keys, values) in enumerate(self.entries[source]):
                cache.update(keys[:, :, :shared], values[:, :, :shared], layer)
        device = next(self.model.parameters()).device
        with torch.inference_mode():
            self.model(input_ids=torch.tensor([token_ids[shared:]], device=device), cache=cache, use_cache=True,
                       logits_to_keep=1)
        states = [(layer.keys, layer.values) for layer in cache.layers]
        kept = {keys.shape[2] for keys, _ in states}
        if kept != {len(key)}:
            self.unsupported = f"layers keep {sorted(kept)} of {len(key)} positions"
            self.entries.clear()
            return None
        self.reused_tokens += shared
        self.computed_tokens += len(key) - shared
        self._store(key, states)
        return states

    def _longest_prefix(self, key: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        best, source = 0, ()
        for cached in self.entries:
            shared = len(os.path.commonprefix([cached, key]))
            if shared > best:
                best, source = shared, cached
        best = min(best, len(key) - 1)  # the model must see at least one new token
        return (best, source) if best >= MIN_REUSE_TOKENS else (0, ())

    def _store(self, key: tuple[int, ...], states: list[tuple[Any, Any]]) -> None:
        if len(key) > self.max_tokens:
            return
        self.entries[key] = states
        while sum(len(k) for k in self.entries) > self.max_tokens:
            self.entries.popitem(last=False)


def sliding_window_reason(config: Any) -> str | None:
    """Why a model's states cannot be stacked into one plain cache (its sliding-window layers
    keep only the last positions), or None."""
    layer_types = getattr(config, "layer_types", None) or []
    if any(kind != "full_attention" for kind in layer_types):
        return f"layer types {sorted(set(layer_types))}"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return f"sliding window of {config.sliding_window} tokens"
    return None
