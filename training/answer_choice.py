"""The final answer's choice, trained apart from the episode: the context frozen, the answer trained.

Why: a compact-view student trained on whole episodes counts its references (`[1] [2] [3] ...`)
instead of choosing them (`bench/answer_choice.py`: 84% of consecutive references in the shipped
searcher's answers count up by one, 20% in the teacher's it learned from). In an episode the
answer is about 15 of 2,500 loss tokens, so SFT teaches its form. An answer sample alone is a
3,000-token prompt and some 15 answer tokens, and with the gradient taken through the whole
prompt it costs what the episode costs (about 50 s on two CPU cores). Here the prompt's keys and
values are computed once without gradient (a prefill: about 9 s for 3,000 SmolLM2 tokens there)
and only the answer's positions are trained, so an answer costs about a fifth of an episode and a
CPU run can teach hundreds of choices instead of dozens.

Targets: `teacher` trains the teacher's answer as rendered in the student's view. `gold` relabels
it in hindsight with the verified task (the synthetic task's supporting documents are known): the
references of the documents that contain the answer first, then the other supporting documents,
each only where the episode showed it and it was not pruned, in the teacher's order where the
teacher named it, then the teacher's remaining choices, up to `max_docs`. A teacher that saw the
answer passage and ranked it low (or not at all) so teaches the student to keep it.

The answer's opening (`[`, the view's ANSWER_OPENING) is part of the prompt, not of what is
trained, unless `train_opening`: it is the decision to stop searching, which the episodes teach
in context. Trained here, on answers alone, it is taught in every context it is shown, and the
first run that did (30 steps, gold targets) made fewer tool calls (5.1 an episode against the
searcher's 7.0) and saw less (trajectory recall 0.808 against 0.867 on the dev questions). At
inference the forced final answer is begun with the same opening (`prefill_final_answer`).

Simplification: no gradient flows into the prompt's keys and values (they are constants, computed
with the weights of the moment); every weight still changes what the answer's own positions
attend to and emit, which is the choice. The episode SFT before this phase trains the rest.
Only compact-view answers (references) are relabelled; a full-view answer is trained as written.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.prompts import ANSWER_OPENING
from agent.trajectory import Trajectory, Turn
from training.sft_samples import IGNORE_INDEX, end_token_ids, tokenize_turn, turn_chat

LOG = logging.getLogger(__name__)

_REFERENCE = re.compile(r"\[\s*(\d{1,5})\s*\]")


@dataclass(frozen=True)
class AnswerSample:
    """One final answer: the prompt's tokens, then the answer's (`answer_start` on)."""

    trajectory_id: str
    input_ids: list[int]
    answer_start: int
    relabelled: bool = False

    @property
    def answer_tokens(self) -> int:
        return len(self.input_ids) - self.answer_start


def final_turn(trajectory: Trajectory) -> Turn | None:
    return next((turn for turn in reversed(trajectory.turns) if not turn.tool_calls), None)


def gold_first_answer(trajectory: Trajectory, gold_doc_ids: frozenset[str], answer_doc_ids: frozenset[str],
                      max_docs: int) -> list[int]:
    """The references of a hindsight answer (see the module docstring), most relevant first."""
    turn = final_turn(trajectory)
    if turn is None:
        return []
    chunks = trajectory.seen_chunk_ids()  # reference n is chunks[n - 1]: numbered as first shown
    doc_of = trajectory.chunk_docs
    pruned = set(trajectory.pruned_chunk_ids())
    first_reference: dict[str, int] = {}  # a document's first reference still in the view
    for number, chunk_id in enumerate(chunks, start=1):
        if chunk_id not in pruned and chunk_id in doc_of:
            first_reference.setdefault(doc_of[chunk_id], number)
    written = [n for n in (int(m) for m in _REFERENCE.findall(turn.completion or "")) if 1 <= n <= len(chunks)]
    teacher_rank: dict[str, int] = {}
    for position, number in enumerate(written):
        teacher_rank.setdefault(doc_of.get(chunks[number - 1], ""), position)

    def order(docs: set[str]) -> list[str]:
        return sorted((d for d in docs if d in first_reference), key=lambda d: (teacher_rank.get(d, len(written)), first_reference[d]))

    answer: list[int] = []
    named: set[str] = set()
    for doc in [*order(set(answer_doc_ids)), *order(set(gold_doc_ids) - set(answer_doc_ids))]:
        answer.append(first_reference[doc])
        named.add(doc)
    for number in written:
        doc = doc_of.get(chunks[number - 1], "")
        if doc not in named:
            answer.append(number)
            named.add(doc)
    return answer[:max_docs]


def in_reading_order(answer: str, max_docs: int) -> str:
    """A compact answer's first `max_docs` references, in the order they were shown (ascending).

    Why: the benchmark and the reward score the first k documents as a set (answer found, recall,
    the RL reward at k = `max_output_docs`), so the order inside such an answer carries nothing. A
    compact-view student writes its references counting up (`bench/answer_choice.py`); taught in
    reading order, an answer has the form the student already writes, and what is left to learn
    is the choice: which references to skip. An answer with no references is returned as it is."""
    numbers = list(dict.fromkeys(int(m) for m in _REFERENCE.findall(answer)))[:max_docs]
    return " ".join(f"[{n}]" for n in sorted(numbers)) if numbers else answer


def opening_tokens(tokenizer: Any, answer_ids: Sequence[int], opening: str) -> int:
    """How many of the answer's first tokens spell `opening` (leading whitespace aside); 0 when
    they do not begin with it."""
    text = ""
    for count, token in enumerate(answer_ids, start=1):
        text = (text + tokenizer.decode([token])).lstrip()
        if text == opening:
            return count
        if not opening.startswith(text):
            return 0
    return 0


def answer_samples(
    trajectories: Sequence[Trajectory], tokenizer: Any, *, golds: Mapping[str, Any] | None = None, max_docs: int = 5,
    max_length: int | None = None, train_opening: bool = False, reading_order: bool = False,
) -> list[AnswerSample]:
    """One sample per trajectory's final answer; with `golds` (task id -> `evaluation.metrics.Gold`)
    compact-view answers are relabelled gold-first, and with `reading_order` their first `max_docs`
    references are taught in the order shown (`in_reading_order`). Answers longer than `max_length`
    are left out. Unless `train_opening`, the answer's opening belongs to the prompt (see the module
    docstring)."""
    end_ids = end_token_ids(tokenizer)
    samples: list[AnswerSample] = []
    for trajectory in trajectories:
        turn = final_turn(trajectory)
        if turn is None or not turn.view_messages:
            continue
        prompt, reply, tools = turn_chat(trajectory, turn)
        gold = (golds or {}).get(trajectory.task_id or "")
        relabelled = False
        if gold is not None and trajectory.config.get("view") == "compact":
            references = gold_first_answer(trajectory, gold.doc_ids, gold.answer_doc_ids, max_docs)
            text = " ".join(f"[{n}]" for n in references)
            if text and text != (reply.get("content") or "").strip():
                reply, relabelled = {"role": "assistant", "content": text}, True
        if reading_order and trajectory.config.get("view") == "compact":
            written = (reply.get("content") or "").strip()
            text = in_reading_order(written, max_docs)
            if text != written:
                reply, relabelled = {"role": "assistant", "content": text}, True
        input_ids, labels = tokenize_turn(tokenizer, prompt, reply, tools, end_ids)
        if max_length is not None and len(input_ids) > max_length:
            continue
        start = next(i for i, label in enumerate(labels) if label != IGNORE_INDEX)
        end = max(i for i, label in enumerate(labels) if label != IGNORE_INDEX) + 1
        if not train_opening:
            opening = ANSWER_OPENING.get(str(trajectory.config.get("view") or "full"), "")
            start += opening_tokens(tokenizer, input_ids[start:end - 1], opening) if opening else 0
        samples.append(AnswerSample(trajectory.id, input_ids[:end], start, relabelled))
    return samples


def answer_loss(model: Any, sample: AnswerSample) -> Any:
    """Mean cross-entropy of the answer's tokens, the prompt's keys and values computed without gradient."""
    import torch
    from transformers import DynamicCache

    device = next(model.parameters()).device
    ids = sample.input_ids
    cache = DynamicCache()
    with torch.no_grad():  # every prompt token but the last: the last one predicts the answer's first token
        model(input_ids=torch.tensor([ids[: sample.answer_start - 1]], device=device), past_key_values=cache, use_cache=True)
    logits = model(input_ids=torch.tensor([ids[sample.answer_start - 1:]], device=device), past_key_values=cache,
                   use_cache=True).logits[0, :-1].float()
    return torch.nn.functional.cross_entropy(logits, torch.tensor(ids[sample.answer_start:], device=device))


def train_answer_choice(
    model: Any, samples: Sequence[AnswerSample], *, steps: int, batch_size: int, learning_rate: float, seed: int = 0,
    autocast_dtype: Any = None, on_step: Callable[[int, float], None] | None = None,
) -> dict[str, Any]:
    """`steps` AdamW steps of `batch_size` answers each (a seeded order, repeated past one pass),
    linear decay, on the trainable parameters of `model` (a peft model); dropout is off for the
    phase, as at inference. Returns the phase's figures for the checkpoint's metadata."""
    import torch

    if not samples:
        raise ValueError("no final answers to train the answer choice on")
    order: list[AnswerSample] = []
    rng = random.Random(seed)
    while len(order) < steps * batch_size:
        shuffled = list(samples)
        rng.shuffle(shuffled)
        order.extend(shuffled)
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / steps)
    was_training = model.training
    model.eval()  # no dropout: the answer is chosen at inference without it
    losses: list[float] = []
    started = time.perf_counter()
    try:
        for step in range(steps):
            batch = order[step * batch_size:(step + 1) * batch_size]
            total = 0.0
            for sample in batch:
                with torch.autocast(next(model.parameters()).device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                    loss = answer_loss(model, sample) / len(batch)
                loss.backward()
                total += loss.item()
            torch.nn.utils.clip_grad_norm_(parameters, 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(total)
            LOG.info("answer choice step %d/%d, loss %.3f", step + 1, steps, total)
            if on_step is not None:
                on_step(step + 1, total)
    finally:
        model.train(was_training)
    wall = time.perf_counter() - started
    return {
        "answer_steps": steps, "answer_samples": len(samples), "answer_relabelled": sum(s.relabelled for s in samples),
        "answer_first_loss": losses[0], "answer_final_loss": losses[-1], "answer_wall_s": round(wall, 2),
        "answer_s_per_sample": round(wall / (steps * batch_size), 2),
    }
