"""An attention cache sized once for prompt + new tokens, so a decode step writes one position.

Why: transformers' `DynamicCache` grows every layer's keys and values with `torch.cat` at each
decode step, so each step copies the whole cache and frees the old one. On a CPU that copy is a
large share of a long prompt's decode step (SmolLM2-135M, 8 rows of 2,000 tokens: 435 ms per step
against 354 ms written in place, `bench/decode_cache.py`), and the freed blocks are what grows the
process's heap (core/heap_memory.py): the demo checkpoint's benchmark on 8 dev questions took
0.76x the wall time and 0.63x the peak memory with the same answers (`bench/inference_memory.py`).
A generation knows its bound (prompt + `max_new_tokens`), so each layer allocates that once and
exposes the filled part as a view.

Only for models whose every layer keeps every position (`sliding_window_reason` is None): a
sliding-window layer keeps the last positions only and stays transformers' own.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from transformers.cache_utils import DynamicCache, DynamicLayer

from agent.policies.prefix_cache import sliding_window_reason


class PreallocatedLayer(DynamicLayer):
    """One layer's keys and values in buffers of `capacity` positions, written in place.

    `keys` and `values` are views of the filled positions, as `DynamicLayer`'s tensors are, so
    attention, masks and `get_seq_length` see the same shapes. Past `capacity` the buffers grow by
    doubling (one copy), so a wrong bound costs time, never a wrong answer.
    """

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = max(1, capacity)
        self.length = 0

    def lazy_initialization(self, key_states: Any, value_states: Any) -> None:
        self.allocate(key_states.shape[0], key_states, value_states)

    def allocate(self, rows: int, key_like: Any, value_like: Any) -> None:
        """Empty buffers for `rows` rows with the heads, head size, dtype and device of the
        given keys and values (every position below `length` is written before it is read, so
        nothing is zeroed)."""
        import torch

        self.device = key_like.device
        self.key_buffer = torch.empty((rows, key_like.shape[1], self.capacity, key_like.shape[3]), dtype=key_like.dtype,
                                      device=self.device)
        self.value_buffer = torch.empty((rows, value_like.shape[1], self.capacity, value_like.shape[3]),
                                        dtype=value_like.dtype, device=self.device)
        self.length = 0
        self._expose()
        self.is_initialized = True

    def _expose(self) -> None:
        self.keys = self.key_buffer[:, :, : self.length]
        self.values = self.value_buffer[:, :, : self.length]

    def _ensure_room(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        import torch

        capacity = max(needed, 2 * self.capacity)
        for name in ("key_buffer", "value_buffer"):
            old = getattr(self, name)
            grown = torch.empty((*old.shape[:2], capacity, old.shape[3]), dtype=old.dtype, device=old.device)
            grown[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, grown)
        self.capacity = capacity

    def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """Append positions in place; returns every filled position (views of the buffers)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        self._ensure_room(end)
        self.key_buffer[:, :, self.length : end] = key_states
        self.value_buffer[:, :, self.length : end] = value_states
        self.length = end
        self._expose()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def reset(self) -> None:
        self.length = 0
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of positions to remove, got {tokens_to_remove}")
        if tokens_to_remove and self.is_initialized:
            self.length = max(0, self.length + tokens_to_remove)
            self._expose()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self.key_buffer = self.key_buffer.repeat_interleave(repeats, dim=0)
            self.value_buffer = self.value_buffer.repeat_interleave(repeats, dim=0)
            self._expose()

    def batch_select_indices(self, indices: Any) -> None:
        if self.is_initialized:
            self.key_buffer = self.key_buffer[indices, ...]
            self.value_buffer = self.value_buffer[indices, ...]
            self._expose()


def preallocated_cache(capacity: int) -> Any:
    """An empty cache whose layers (created on first use) each hold `capacity` positions."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = partial(PreallocatedLayer, capacity)
    return cache


def decode_cache(model: Any, capacity: int) -> dict[str, Any]:
    """`generate`'s cache argument for a generation of at most `capacity` positions: a
    preallocated cache where every layer keeps every position, else nothing (transformers'
    own cache, which knows sliding windows)."""
    if sliding_window_reason(getattr(model, "config", None)) is not None:
        return {}
    return {"cache": preallocated_cache(capacity)}


def stacked_cache(rows: list[list[tuple[Any, Any]]], width: int, capacity: int) -> Any:
    """One cache for a left-padded batch: each row's states (one [1, heads, length, dim] pair per
    layer) shifted right to end at `width`, written straight into layers of `capacity` positions
    (width + the tokens the decode may add). The padding positions hold zeros and are masked out
    by the attention mask."""
    cache = preallocated_cache(capacity)
    for layer_index in range(len(rows[0])):
        layer = PreallocatedLayer(max(capacity, width))
        layer.allocate(len(rows), *rows[0][layer_index])
        for row, states in enumerate(rows):
            for buffer, state in zip((layer.key_buffer, layer.value_buffer), states[layer_index]):
                pad = width - state.shape[2]
                buffer[row, :, :pad] = 0
                buffer[row, :, pad:width] = state[0]
        layer.length = width
        layer._expose()
        cache.layers.append(layer)
    return cache
