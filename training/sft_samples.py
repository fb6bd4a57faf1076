"""Training samples: one chat sample per assistant turn, prompt = exactly the view the model saw.

Why per turn and not per trajectory: pruning rewrites earlier tool messages, so the context is
not append-only and no single conversation contains every turn's prompt. Each turn's recorded
`view_messages` are rendered with the base model's chat template (tools declared, earlier
assistant tool calls, tool results), the same call the `transformers` policy makes
(`apply_chat_template(template_messages(view), tools=..., add_generation_prompt=True)`), so the
student is trained on the very text it will continue at inference. The target is that turn's
assistant message: its text and all its tool calls (parallel calls stay one message), or the
final answer.

Loss mask: the prompt (rendered with the generation prompt) must be a text prefix of the full
render (prompt + assistant message); the sample is the prompt's tokens followed by the reply's
(the full render's tokens, or, when a token would merge across the boundary, the prompt and
the reply tokenized apart, which is what the model sees at inference). Labels are -100 on the
prompt and on whatever the template appends after the turn's end token (ChatML's trailing
newline), so exactly the assistant's tokens, end token included, carry loss. A template that
breaks the prefix property (some rewrite earlier turns once an assistant reply follows) raises
`TemplatePrefixError` rather than training on misaligned labels.

Samples longer than `max_length` are reported (counted and listed) and left out, never
truncated: a truncated sample would teach answers that lost their end, or lose the answer.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from retrieval.policies.transformers_policy import template_messages
from retrieval.policy_base import Message
from retrieval.trajectory import Trajectory, Turn

IGNORE_INDEX = -100
# End-of-turn markers of the chat formats we know (ChatML, Llama 3, gpt-oss harmony).
END_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<|return|>", "<|call|>")


class TemplatePrefixError(ValueError):
    """The chat template renders the prompt differently once the assistant reply follows it."""


@dataclass(frozen=True)
class SFTSample:
    trajectory_id: str
    task_id: str | None
    turn_index: int
    input_ids: list[int]
    labels: list[int]

    @property
    def n_loss_tokens(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE_INDEX)


@dataclass(frozen=True)
class OverlongSample:
    trajectory_id: str
    turn_index: int
    n_tokens: int


@dataclass
class SampleSet:
    """Samples within `max_length`, and the ones left out for being longer."""

    samples: list[SFTSample]
    overlong: list[OverlongSample] = field(default_factory=list)
    max_length: int = 0
    trajectories: int = 0

    def select(self, max_samples: int | None, seed: int = 0) -> SampleSet:
        """A seeded subset (order kept) of at most `max_samples` samples, for short runs."""
        if max_samples is None or len(self.samples) <= max_samples:
            return self
        chosen = sorted(random.Random(seed).sample(range(len(self.samples)), max_samples))
        return SampleSet([self.samples[i] for i in chosen], self.overlong, self.max_length, self.trajectories)

    def metadata(self) -> dict[str, Any]:
        lengths = [len(s.input_ids) for s in self.samples]
        return {
            "trajectories": self.trajectories,
            "samples": len(self.samples),
            "tokens": sum(lengths),
            "loss_tokens": sum(s.n_loss_tokens for s in self.samples),
            "max_tokens": max(lengths, default=0),
            "mean_tokens": round(sum(lengths) / len(lengths), 1) if lengths else 0.0,
            "max_length": self.max_length,
            "overlong": len(self.overlong),
            "overlong_samples": [f"{o.trajectory_id}#{o.turn_index}: {o.n_tokens}" for o in self.overlong[:50]],
        }

    def to_dataset(self):
        """`input_ids` + `labels` columns, the pre-tokenized form TRL's SFTTrainer trains on as is."""
        from datasets import Dataset

        return Dataset.from_dict({
            "input_ids": [s.input_ids for s in self.samples],
            "labels": [s.labels for s in self.samples],
        })


def assistant_message(turn: Turn) -> Message:
    """The turn's reply as the harness put it in the view (OpenAI form, arguments as JSON text)."""
    message: Message = {"role": "assistant", "content": turn.completion or ""}
    if turn.tool_calls:
        calls = []
        for call in turn.tool_calls:
            use_raw = call.raw_arguments is not None and not call.arguments
            arguments = call.raw_arguments if use_raw else json.dumps(call.arguments, ensure_ascii=False)
            calls.append({"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}})
        message["tool_calls"] = calls
    return message


def turn_chat(trajectory: Trajectory, turn: Turn) -> tuple[list[Message], Message, list[dict[str, Any]] | None]:
    """(prompt messages, target assistant message, tools offered) of one turn.

    The forced final turn is offered no tools (the harness asks for the answer with none).
    """
    if not turn.view_messages:
        raise ValueError(f"trajectory {trajectory.id} turn {turn.index}: no recorded view (record_view_messages off)")
    tools = None if turn.forced_final else (trajectory.tools or None)
    return [dict(m) for m in turn.view_messages], assistant_message(turn), tools


def end_token_ids(tokenizer: Any) -> set[int]:
    """Ids that end an assistant turn: the tokenizer's eos plus known end markers in its vocabulary."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    vocab = tokenizer.get_vocab()
    ids.update(vocab[marker] for marker in END_MARKERS if marker in vocab)
    return ids


def tokenize_turn(
    tokenizer: Any, prompt: list[Message], reply: Message, tools: list[dict[str, Any]] | None,
    end_ids: set[int] | None = None,
) -> tuple[list[int], list[int]]:
    """(input_ids, labels) of prompt + reply, labels -100 everywhere but the reply's tokens."""
    prompt_text = tokenizer.apply_chat_template(
        template_messages(prompt), tools=tools, add_generation_prompt=True, tokenize=False)
    full_text = tokenizer.apply_chat_template(
        template_messages([*prompt, reply]), tools=tools, add_generation_prompt=False, tokenize=False)
    if not full_text.startswith(prompt_text):
        at = next((i for i, (a, b) in enumerate(zip(prompt_text, full_text)) if a != b), min(len(prompt_text), len(full_text)))
        raise TemplatePrefixError(
            f"the chat template renders the prompt differently once an assistant reply follows (texts differ at "
            f"character {at}: {prompt_text[at:at + 40]!r} vs {full_text[at:at + 40]!r}); per-turn SFT needs the "
            "prompt to be a prefix of prompt + reply. Use a template that keeps earlier turns unchanged.")
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    full_ids = tokenizer(full_text, add_special_tokens=False)["input_ids"]
    if full_ids[: len(prompt_ids)] != prompt_ids:
        # A token merged across the generation prompt's end (e.g. a reply starting with a newline).
        # At inference the prompt is tokenized alone and the reply's tokens follow it, so that is
        # the sequence to train on.
        full_ids = prompt_ids + tokenizer(full_text[len(prompt_text):], add_special_tokens=False)["input_ids"]
    if len(full_ids) == len(prompt_ids):
        raise ValueError("the assistant reply rendered to no tokens")
    end_ids = end_token_ids(tokenizer) if end_ids is None else end_ids
    stop = len(full_ids)
    for position in range(len(prompt_ids), len(full_ids)):
        if full_ids[position] in end_ids:
            stop = position + 1
            break
    labels = [IGNORE_INDEX] * len(prompt_ids) + full_ids[len(prompt_ids):stop] + [IGNORE_INDEX] * (len(full_ids) - stop)
    return full_ids, labels


def build_samples(trajectories: Sequence[Trajectory], tokenizer: Any, max_length: int) -> SampleSet:
    """Every assistant turn of every trajectory as one sample; overlong ones reported, not kept."""
    end_ids = end_token_ids(tokenizer)
    samples: list[SFTSample] = []
    overlong: list[OverlongSample] = []
    for trajectory in trajectories:
        for turn in trajectory.turns:
            prompt, reply, tools = turn_chat(trajectory, turn)
            input_ids, labels = tokenize_turn(tokenizer, prompt, reply, tools, end_ids)
            if len(input_ids) > max_length:
                overlong.append(OverlongSample(trajectory.id, turn.index, len(input_ids)))
                continue
            samples.append(SFTSample(trajectory.id, trajectory.task_id, turn.index, input_ids, labels))
    return SampleSet(samples, overlong, max_length, len(trajectories))
