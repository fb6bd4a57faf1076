"""Training samples: whole episodes where the context only grew, one sample per turn where it did not.

Why not simply one sample per trajectory: pruning rewrites earlier tool messages, so the context
is not append-only and no single conversation contains every turn's prompt. Why not one sample
per turn either: an episode of six turns would cost six ever-longer prompts. So each turn is
tokenized against its own recorded view, and consecutive turns whose token sequences extend one
another (no pruning in between, the same tools offered) are merged into one sequence with loss
on every assistant turn in it: a trajectory costs about one sequence. Each turn's recorded
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
truncated: a truncated sample would teach answers that lost their end, or lose the answer. A merged
sequence that would pass `max_length` is closed and the next turn starts a new one. Turns are
counted by kind (search, grep, read, prune, final): when every turn of a kind present in the data
is too long, `build_samples` raises, naming the kind and the length that would fit, instead of
silently training a student that never sees, say, a final answer.

Each sample also marks which of its loss tokens belong to a final answer (`final_mask`): in a
merged episode the answer is about 15 of some 2,500 tokens, and the loss can weigh it more
(`SFTSettings.final_answer_weight`, `loss_weights`) without a second copy of the sequence.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.policies.transformers_policy import template_messages
from agent.policy_base import Message
from agent.trajectory import Trajectory, Turn

IGNORE_INDEX = -100
# End-of-turn markers of the chat formats we know (ChatML, Llama 3, gpt-oss harmony).
END_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<|return|>", "<|call|>")
HARMONY_TURN_ENDS = ("<|return|>", "<|call|>")


class TemplatePrefixError(ValueError):
    """The chat template renders the prompt differently once the assistant reply follows it."""


TURN_KINDS = ("search", "grep", "read", "prune", "final")
_KIND_OF_TOOL = {"search_corpus": "search", "grep_corpus": "grep", "read_document": "read", "prune_chunks": "prune"}


class MissingTurnKind(ValueError):
    """Every turn of one kind (e.g. every final answer) is longer than `max_length`."""


def turn_kinds(turn: Turn) -> set[str]:
    """What a turn teaches: the kinds of its tool calls, or `final` for an answer."""
    if not turn.tool_calls:
        return {"final"}
    return {_KIND_OF_TOOL.get(call.name, "other") for call in turn.tool_calls}


@dataclass(frozen=True)
class SFTSample:
    trajectory_id: str
    task_id: str | None
    turn_index: int  # the first turn of the sequence
    input_ids: list[int]
    labels: list[int]
    turn_indices: tuple[int, ...] = ()
    final_mask: tuple[int, ...] = ()  # 1 on the loss tokens of a final answer, aligned with labels

    @property
    def n_loss_tokens(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE_INDEX)

    @property
    def n_final_tokens(self) -> int:
        return sum(self.final_mask)

    def loss_weights(self, final_answer_weight: float) -> list[float]:
        """Per-token loss weights: 0 off the labels, `final_answer_weight` on a final answer's
        tokens and 1 on the rest, scaled so the labelled tokens average 1. The trainer sums
        weighted token losses over the batch's label count, as it sums unweighted ones, so the
        loss keeps its scale and only the share of the answer changes."""
        mask = self.final_mask or (0,) * len(self.labels)
        raw = [0.0 if label == IGNORE_INDEX else (final_answer_weight if final else 1.0)
               for label, final in zip(self.labels, mask)]
        labelled = self.n_loss_tokens
        scale = labelled / sum(raw) if labelled else 1.0
        return [weight * scale for weight in raw]


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
    kinds: dict[str, dict[str, int]] = field(default_factory=dict)  # kind -> {"kept": turns, "dropped": turns}

    def select(self, max_samples: int | None, seed: int = 0) -> SampleSet:
        """A seeded subset (order kept) of at most `max_samples` samples, for short runs."""
        if max_samples is None or len(self.samples) <= max_samples:
            return self
        chosen = sorted(random.Random(seed).sample(range(len(self.samples)), max_samples))
        return SampleSet([self.samples[i] for i in chosen], self.overlong, self.max_length, self.trajectories, self.kinds)

    def metadata(self) -> dict[str, Any]:
        lengths = [len(s.input_ids) for s in self.samples]
        return {
            "trajectories": self.trajectories,
            "samples": len(self.samples),
            "tokens": sum(lengths),
            "loss_tokens": sum(s.n_loss_tokens for s in self.samples),
            "final_answer_loss_tokens": sum(s.n_final_tokens for s in self.samples),
            "max_tokens": max(lengths, default=0),
            "mean_tokens": round(sum(lengths) / len(lengths), 1) if lengths else 0.0,
            "max_length": self.max_length,
            "turns": sum(len(s.turn_indices) or 1 for s in self.samples),
            "turns_by_kind": self.kinds,
            "overlong": len(self.overlong),
            "overlong_samples": [f"{o.trajectory_id}#{o.turn_index}: {o.n_tokens}" for o in self.overlong[:50]],
        }

    def to_dataset(self, final_answer_weight: float = 1.0):
        """`input_ids` + `labels` columns, the pre-tokenized form TRL's SFTTrainer trains on as is;
        with a final-answer weight other than 1, also `loss_weights` (`SFTSample.loss_weights`)."""
        from datasets import Dataset

        columns = {
            "input_ids": [s.input_ids for s in self.samples],
            "labels": [s.labels for s in self.samples],
        }
        if final_answer_weight != 1.0:
            columns["loss_weights"] = [s.loss_weights(final_answer_weight) for s in self.samples]
        return Dataset.from_dict(columns)


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
    """Ids that end an assistant turn: the tokenizer's eos plus known end markers in its vocabulary.

    Harmony (gpt-oss) is the exception: a turn ends at `<|call|>` or `<|return|>` only, because
    `<|end|>` closes messages inside a turn (its analysis, all but the last of several tool
    calls), so the loss must run past it to the turn's real end, where generation stops."""
    vocab = tokenizer.get_vocab()
    if "<|channel|>" in vocab and "<|call|>" in vocab:
        return {vocab[marker] for marker in HARMONY_TURN_ENDS if marker in vocab}
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
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
    """Every assistant turn of every trajectory, merged into episode sequences where the context
    only grew; overlong turns reported, not kept; a turn kind that loses every turn is an error."""
    end_ids = end_token_ids(tokenizer)
    samples: list[SFTSample] = []
    overlong: list[OverlongSample] = []
    kinds: dict[str, dict[str, int]] = {}
    shortest_dropped: dict[str, int] = {}
    for trajectory in trajectories:
        open_ids: list[int] = []
        open_labels: list[int] = []
        open_final: list[int] = []
        open_turns: list[int] = []

        def close() -> None:
            if open_turns:
                samples.append(SFTSample(trajectory.id, trajectory.task_id, open_turns[0], list(open_ids),
                                         list(open_labels), tuple(open_turns), tuple(open_final)))

        for turn in trajectory.turns:
            prompt, reply, tools = turn_chat(trajectory, turn)
            input_ids, labels = tokenize_turn(tokenizer, prompt, reply, tools, end_ids)
            is_final = "final" in turn_kinds(turn)
            final = [int(is_final and label != IGNORE_INDEX) for label in labels]
            for kind in turn_kinds(turn):
                kinds.setdefault(kind, {"kept": 0, "dropped": 0})
            if len(input_ids) > max_length:
                overlong.append(OverlongSample(trajectory.id, turn.index, len(input_ids)))
                for kind in turn_kinds(turn):
                    kinds[kind]["dropped"] += 1
                    shortest_dropped[kind] = min(shortest_dropped.get(kind, len(input_ids)), len(input_ids))
                close()
                open_ids, open_labels, open_final, open_turns = [], [], [], []
                continue
            for kind in turn_kinds(turn):
                kinds[kind]["kept"] += 1
            if open_turns and input_ids[: len(open_ids)] == open_ids:
                # The earlier turns' replies are prompt tokens here: give them their labels back.
                labels = [old if old != IGNORE_INDEX else new for old, new in zip(open_labels, labels)] + labels[len(open_labels):]
                final = [max(old, new) for old, new in zip(open_final, final)] + final[len(open_final):]
                open_ids, open_labels, open_final, open_turns = input_ids, labels, final, [*open_turns, turn.index]
                continue
            close()
            open_ids, open_labels, open_final, open_turns = input_ids, labels, final, [turn.index]
        close()
    lost = [kind for kind, counts in kinds.items() if counts["kept"] == 0 and counts["dropped"]]
    if lost:
        detail = ", ".join(f"{kind} (the shortest is {shortest_dropped[kind]:,} tokens)" for kind in sorted(lost))
        raise MissingTurnKind(
            f"sft.max_length {max_length:,} drops every turn of kind {detail}: the student would never be taught "
            f"them. Raise sft.max_length to at least {max(shortest_dropped[k] for k in lost):,} or use a shorter "
            "harness profile (the compact view, a smaller token budget).")
    return SampleSet(samples, overlong, max_length, len(trajectories), kinds)
