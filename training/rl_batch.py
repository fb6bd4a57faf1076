"""Trajectories to CISPO training sequences: one per assistant turn, merged where the context grew.

Why per turn: the harness prunes, so the context is not append-only; turn t's prompt is the view
as the model saw it at turn t (`Turn.view_messages`), re-rendered with the same chat template
and tools the sampler used (`TransformersPolicy.render_prompt`: the tools are omitted on the
harness's forced-final turn), followed by the exact sampled completion token ids
(`Turn.completion_token_ids`, end-of-turn token included) and the sampler's log-probs
(`Turn.completion_logprobs`, pi_old). The prompt comes from the SFT samples' per-turn
construction (`training.sft_samples.turn_chat`), so SFT and RL condition on the same text; the
SFT *target* (the assistant message re-rendered by the template) is not reused: it would train
on tokens that were never sampled and whose pi_old is unknown.

Recomputed prompt tokens: a sequence per turn recomputes every turn's whole prompt, quadratic
in the number of turns. Where nothing was pruned between turn t and t+1, turn t's prompt plus
its completion is usually a token prefix of turn t+1's prompt, and then both turns are one
sequence: one forward over the longer one scores both completions (causal attention makes the
logits at turn t's positions identical). The merge is checked on token ids, never assumed: it
fails when the template re-renders the assistant message differently from what was sampled
(e.g. tool-call JSON re-serialized with other spacing), and after a prune. `TokenCounts`
reports both figures so a run shows what merging saved.

Every sequence of a trajectory carries the trajectory's advantage (Context-1: all turns share
the outcome's credit); the loss normalizes over all completion tokens of the batch.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from agent.trajectory import Trajectory, Turn


class MissingLogprobs(ValueError):
    """A sampled turn lacks token ids or sampler log-probs: the engine is misconfigured for RL."""


@dataclass
class TurnSequence:
    """Tokens of one forward pass; `target_mask[j]` = 1 where token j is a sampled completion token
    (predicted from position j - 1) with sampler log-prob `old_logprobs[j]`."""

    input_ids: list[int] = field(default_factory=list)
    target_mask: list[int] = field(default_factory=list)
    old_logprobs: list[float] = field(default_factory=list)
    advantage: float = 0.0
    n_turns: int = 0
    trajectory_id: str = ""

    def append(self, ids: Sequence[int], logprobs: Sequence[float] | None = None) -> None:
        self.input_ids.extend(ids)
        if logprobs is None:
            self.target_mask.extend([0] * len(ids))
            self.old_logprobs.extend([0.0] * len(ids))
        else:
            self.target_mask.extend([1] * len(ids))
            self.old_logprobs.extend(float(x) for x in logprobs)

    @property
    def completion_tokens(self) -> int:
        return sum(self.target_mask)

    @property
    def prompt_tokens(self) -> int:
        return len(self.input_ids) - self.completion_tokens


@dataclass
class TokenCounts:
    """Per-batch token figures: what was trained on, and what context had to be recomputed."""

    sequences: int = 0
    turns: int = 0
    completion_tokens: int = 0
    naive_prompt_tokens: int = 0  # one sequence per turn: every turn's prompt recomputed
    recomputed_prompt_tokens: int = 0  # after merging turns that share a prefix
    forward_tokens: int = 0  # prompt + completion tokens actually forwarded (unpadded)

    def add(self, other: TokenCounts) -> None:
        for name in asdict(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = asdict(self)
        saved = self.naive_prompt_tokens - self.recomputed_prompt_tokens
        out["prompt_tokens_saved_share"] = saved / self.naive_prompt_tokens if self.naive_prompt_tokens else 0.0
        return out


def turn_prompt_ids(tokenizer: Any, trajectory: Trajectory, turn: Turn) -> list[int]:
    """Token ids of the prompt the model continued at this turn: the SFT samples' per-turn prompt
    (`sft_samples.turn_chat`: the recorded view, no tools on the forced final turn) rendered with
    the generation prompt and any reply opening the policy appended (`Turn.prefill`), exactly as
    the `transformers` policy rendered it when sampling."""
    from agent.policies.transformers_policy import template_messages
    from training.sft_samples import turn_chat

    prompt, _reply, tools = turn_chat(trajectory, turn)
    text = tokenizer.apply_chat_template(template_messages(prompt), tools=tools, add_generation_prompt=True, tokenize=False)
    text += turn.prefill or ""  # a forced final reply the sampler began (its tokens were not sampled)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def sequences_from_trajectory(tokenizer: Any, trajectory: Trajectory, advantage: float, *,
                              merge: bool = True) -> tuple[list[TurnSequence], TokenCounts]:
    """The training sequences of one trajectory (module docstring) and their token counts."""
    sequences: list[TurnSequence] = []
    counts = TokenCounts()
    current: TurnSequence | None = None
    for turn in trajectory.turns:
        ids = turn.completion_token_ids
        if not ids:
            continue  # nothing was sampled (e.g. the prompt no longer fit the model's window)
        logprobs = turn.completion_logprobs
        if logprobs is None or len(logprobs) != len(ids):
            raise MissingLogprobs(f"turn {turn.index} of trajectory {trajectory.id}: {len(ids)} sampled tokens but "
                                  f"{'no' if logprobs is None else len(logprobs)} sampler log-probs")
        prompt = turn_prompt_ids(tokenizer, trajectory, turn)
        counts.turns += 1
        counts.naive_prompt_tokens += len(prompt)
        counts.completion_tokens += len(ids)
        if merge and current is not None and len(prompt) >= len(current.input_ids) \
                and prompt[: len(current.input_ids)] == current.input_ids:
            current.append(prompt[len(current.input_ids):])
        else:
            current = TurnSequence(advantage=advantage, trajectory_id=trajectory.id)
            current.append(prompt)
            sequences.append(current)
        current.append(ids, logprobs)
        current.n_turns += 1
    counts.sequences = len(sequences)
    counts.recomputed_prompt_tokens = sum(s.prompt_tokens for s in sequences)
    counts.forward_tokens = sum(len(s.input_ids) for s in sequences)
    return sequences, counts


def sequences_from_groups(tokenizer: Any, groups: Sequence[Any], *, merge: bool = True) -> tuple[list[TurnSequence], TokenCounts]:
    """Sequences of every rollout of every kept group (`RolloutGroup`s), with their advantages."""
    sequences: list[TurnSequence] = []
    counts = TokenCounts()
    for group in groups:
        if group.advantages is None:
            continue  # all rewards equal: no signal, nothing to train on
        for rollout, advantage in zip(group.rollouts, group.advantages):
            seqs, c = sequences_from_trajectory(tokenizer, rollout.trajectory, advantage, merge=merge)
            sequences.extend(seqs)
            counts.add(c)
    return sequences, counts


def split_substeps(sequences: Sequence[TurnSequence], substeps: int, seed: int) -> list[list[TurnSequence]]:
    """Shuffle (seeded) and split into `substeps` parts of about equal completion tokens: one
    optimizer step each (Tinker's `num_substeps`, which Context-1 trained with)."""
    items = list(sequences)
    random.Random(seed).shuffle(items)
    parts = max(1, min(substeps, len(items)))
    total = sum(s.completion_tokens for s in items)
    out: list[list[TurnSequence]] = [[] for _ in range(parts)]
    running = 0
    for item in items:
        position = min(parts - 1, int(running * parts / total)) if total else 0
        out[position].append(item)
        running += item.completion_tokens
    return [part for part in out if part]


def micro_batches(sequences: Sequence[TurnSequence], max_tokens: int) -> list[list[TurnSequence]]:
    """Group sequences (longest first) so each micro-batch's padded size (rows x longest) stays
    within `max_tokens`; a sequence longer than that forms its own micro-batch."""
    ordered = sorted(sequences, key=lambda s: len(s.input_ids), reverse=True)
    batches: list[list[TurnSequence]] = []
    for seq in ordered:
        if batches:
            last = batches[-1]
            width = max(len(last[0].input_ids), len(seq.input_ids))
            if width * (len(last) + 1) <= max_tokens:
                last.append(seq)
                continue
        batches.append([seq])
    return batches


def collate(sequences: Sequence[TurnSequence], pad_id: int, device: Any = "cpu") -> dict[str, Any]:
    """Right-padded tensors: input_ids, attention_mask, target_mask, old_logprobs, advantages."""
    import torch

    width = max(len(s.input_ids) for s in sequences)

    def pad(values: list, fill: Any) -> list:
        return values + [fill] * (width - len(values))

    return {
        "input_ids": torch.tensor([pad(s.input_ids, pad_id) for s in sequences], dtype=torch.long, device=device),
        "attention_mask": torch.tensor([pad([1] * len(s.input_ids), 0) for s in sequences], dtype=torch.long, device=device),
        "target_mask": torch.tensor([pad(s.target_mask, 0) for s in sequences], dtype=torch.float32, device=device),
        "old_logprobs": torch.tensor([pad(s.old_logprobs, 0.0) for s in sequences], dtype=torch.float32, device=device),
        "advantages": torch.tensor([s.advantage for s in sequences], dtype=torch.float32, device=device),
    }
