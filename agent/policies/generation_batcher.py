"""Greedy turns of many concurrent episodes generated as one batch on one in-process model.

Why: a small model's decode step costs about the same for eight sequences as for one (the step
reads every weight and pays the framework's per-step overhead; the arithmetic is small), so
episodes that run in threads (a benchmark's questions, the search service's requests, an RL
group) waste most of the machine when each turn holds the model alone. Here each thread queues
its turn and one worker thread generates the queued turns as a left-padded batch.

Prefill is the other half of a turn's cost. With a `PrefixCache` each prompt is prefilled alone,
continuing from the longest prefix an earlier prompt left behind (the previous turn, the shared
system prompt), and the rows' states are stacked, left-padded, for the batched decode. Without
one, a batch prefills its padded prompts together, so it only groups prompts of similar length
(`length_ratio`); the rest wait for the next batch, oldest first.

Only greedy decoding is batched. A sampled turn carries its own seed (what makes an RL rollout
reproducible), which a shared batch cannot honour; those run alone, as before. Greedy outputs of
a batched turn can differ from an unbatched one in the last bits of low-precision arithmetic
(padding changes the kernels' shapes), never in kind.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from agent.policies.prefix_cache import PrefixCache
from agent.policies.runaway import RunawayStop
from core.heap_memory import releasing_freed_memory

DEFAULT_MAX_BATCH = 8
DEFAULT_LENGTH_RATIO = 1.5
GATHER_SECONDS = 0.02  # lets threads that start together land in the first batch
# After a batch, its rows' episodes run their tool calls and come back at slightly different
# times; the next batch waits for as many turns as the last one held, at most this share of the
# last batch's duration (and at most MAX_GATHER_SECONDS), so one early row does not run alone
# while the others wait a whole batch behind it. Measured (`searchsmith bench`, the demo's
# checkpoint on 6 questions, 2 cores, one run each): without the wait, turn 2 ran one row alone
# and then the other five, 520 s in all; with it every turn was one batch of 6, 460 s, the same tokens.
GATHER_SHARE = 0.1
MAX_GATHER_SECONDS = 2.0


@dataclass
class GreedyTurn:
    """One queued turn: the prompt's token ids and how many tokens it may add."""

    prompt_ids: list[int]
    max_new_tokens: int
    stop_runaway: bool = False  # stop the row once it loops (agent.policies.runaway)
    done: threading.Event = field(default_factory=threading.Event)
    completion_ids: list[int] = field(default_factory=list)
    logits: Any = None  # [len(completion_ids), vocab], the logits each completion token was chosen from
    error: BaseException | None = None


def pick_batch(pending: list[GreedyTurn], max_batch: int, length_ratio: float) -> list[GreedyTurn]:
    """The oldest queued turn and the queued turns closest to it in length, while the longest of
    them is at most `length_ratio` times the shortest (so padding costs at most that factor)."""
    if not pending:
        return []
    anchor = pending[0]
    chosen = [anchor]
    shortest = longest = len(anchor.prompt_ids)
    for turn in sorted(pending[1:], key=lambda t: abs(len(t.prompt_ids) - len(anchor.prompt_ids))):
        if len(chosen) >= max_batch:
            break
        low, high = min(shortest, len(turn.prompt_ids)), max(longest, len(turn.prompt_ids))
        if high > length_ratio * max(low, 1):
            continue
        chosen.append(turn)
        shortest, longest = low, high
    return chosen


def first_end(token_ids: list[int], end_ids: set[int]) -> int:
    """Length of the completion up to and including its first end-of-turn token."""
    return next((i + 1 for i, token in enumerate(token_ids) if token in end_ids), len(token_ids))


class GenerationBatcher:
    """Queues greedy turns for one model and generates them in batches on a worker thread.

    `lock` is the model's own lock: sampled turns and training steps take it too, so a batch
    never runs while the model is used elsewhere.
    """

    def __init__(
        self,
        model: Any,
        *,
        pad_token_id: int | None,
        eos_token_ids: list[int],
        lock: threading.Lock,
        max_batch: int = DEFAULT_MAX_BATCH,
        length_ratio: float = DEFAULT_LENGTH_RATIO,
        prefix_cache: PrefixCache | None = None,
        tokenizer: Any = None,
    ):
        self.model = model
        self.tokenizer = tokenizer  # decodes rows for the runaway guard; None turns the guard off
        self.prefix_cache = prefix_cache
        self.pad_token_id = pad_token_id if pad_token_id is not None else (eos_token_ids[0] if eos_token_ids else 0)
        self.eos_token_ids = list(eos_token_ids)
        self.lock = lock
        self.max_batch = max(1, max_batch)
        self.length_ratio = max(1.0, length_ratio)
        self.batch_sizes: list[int] = []  # one entry per batch run: how well turns were grouped
        self.last_batch_seconds = 0.0
        self._pending: list[GreedyTurn] = []
        self._ready = threading.Condition()
        self._worker: threading.Thread | None = None

    def generate(self, prompt_ids: list[int], max_new_tokens: int, *, stop_runaway: bool = False) -> GreedyTurn:
        """Queue one turn and wait for it; raises what generation raised."""
        turn = GreedyTurn(list(prompt_ids), max(1, max_new_tokens), stop_runaway)
        with self._ready:
            self._pending.append(turn)
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._serve, name="generation-batcher", daemon=True)
                self._worker.start()
            self._ready.notify()
        turn.done.wait()
        if turn.error is not None:
            raise turn.error
        return turn

    def gather_seconds(self) -> float:
        """How long the next batch may wait for the turns the last batch's episodes will send."""
        return max(GATHER_SECONDS, min(MAX_GATHER_SECONDS, GATHER_SHARE * self.last_batch_seconds))

    def _serve(self) -> None:
        while True:
            with self._ready:
                while not self._pending:
                    self._ready.wait()
                expected = min(self.max_batch, self.batch_sizes[-1] if self.batch_sizes else self.max_batch)
                deadline = time.monotonic() + self.gather_seconds()
                while len(self._pending) < expected and (left := deadline - time.monotonic()) > 0:
                    self._ready.wait(left)
                # Rows prefilled one by one (prefix cache) pad only their decode: any lengths may share a batch.
                ratio = float("inf") if self.prefix_cache is not None else self.length_ratio
                batch = pick_batch(self._pending, self.max_batch, ratio)
                self._pending = [turn for turn in self._pending if turn not in batch]
            started = time.monotonic()
            try:
                # Prefill of long prompts (and a sliding-window model's growing cache) frees large
                # blocks the process would otherwise keep; trimmed only above the ceiling
                # (core.heap_memory), so a machine with room pays nothing.
                with releasing_freed_memory():
                    self._run(batch)
            except BaseException as error:  # noqa: BLE001 - handed to the waiting threads
                for turn in batch:
                    turn.error = error
            finally:
                self.last_batch_seconds = time.monotonic() - started
                for turn in batch:
                    turn.done.set()

    def _run(self, batch: list[GreedyTurn]) -> None:
        import torch
        from transformers import GenerationConfig

        from agent.policies.preallocated_cache import decode_cache, stacked_cache

        width = max(len(turn.prompt_ids) for turn in batch)
        rows = [[self.pad_token_id] * (width - len(t.prompt_ids)) + t.prompt_ids for t in batch]
        mask = [[0] * (width - len(t.prompt_ids)) + [1] * len(t.prompt_ids) for t in batch]
        config = GenerationConfig(
            max_new_tokens=max(turn.max_new_tokens for turn in batch),
            do_sample=False,
            # Explicit neutral values: unset fields are filled from the model's generation_config.
            temperature=None, top_k=None, top_p=None, repetition_penalty=1.0, no_repeat_ngram_size=0,
            min_new_tokens=0,
            eos_token_id=self.eos_token_ids or None,
            pad_token_id=self.pad_token_id,
            return_dict_in_generate=True,
            output_logits=True,
        )
        device = next(self.model.parameters()).device
        with self.lock, torch.inference_mode():
            was_training = self.model.training
            self.model.eval()
            try:
                extra: dict[str, Any] = {}
                capacity = width + config.max_new_tokens
                if self.prefix_cache is not None and width > 1 and min(len(t.prompt_ids) for t in batch) > 1:
                    # Every row's prompt but its last token comes from the prefix cache; generate
                    # runs the last tokens and decodes, as after a prefill of its own.
                    states = [self.prefix_cache.states(turn.prompt_ids[:-1]) for turn in batch]
                    if all(state is not None for state in states):
                        extra["cache"] = stacked_cache(states, width - 1, capacity)
                if "cache" not in extra:
                    extra.update(decode_cache(self.model, capacity))
                watched = {row for row, turn in enumerate(batch) if turn.stop_runaway}
                if watched and self.tokenizer is not None:
                    extra["stopping_criteria"] = [RunawayStop(self.tokenizer, width, watched)]
                out = self.model.generate(
                    input_ids=torch.tensor(rows, device=device),
                    attention_mask=torch.tensor(mask, device=device),
                    generation_config=config,
                    **extra,
                )
            finally:
                self.model.train(was_training)
        self.batch_sizes.append(len(batch))
        end_ids = set(self.eos_token_ids)
        steps = torch.stack(list(out.logits), dim=1) if out.logits else None  # [batch, steps, vocab]
        for row, turn in enumerate(batch):
            generated = out.sequences[row, width:].tolist()[: turn.max_new_tokens]
            turn.completion_ids = generated[: first_end(generated, end_ids)]
            turn.logits = steps[row, : len(turn.completion_ids)] if steps is not None else None
