"""One CISPO optimizer step over training sequences: log-probs, accumulated loss, guards.

Log-probs are computed only where a completion token is predicted: the model is asked for
logits at a boolean mask of positions (`logits_to_keep`, transformers >= 4.5x), so a
2,000-token prompt with a 50-token completion projects 50 hidden states onto the vocabulary,
not 2,050. They are `log_softmax(logits / T)` at the sampling temperature, the same
distribution the sampler's recorded log-probs (pi_old) come from.

Accumulation: micro-batches are sized by padded tokens and each divides its loss by the
completion-token count of the WHOLE optimizer step, so the accumulated gradient equals the
full batch's (tested). Guards: a non-finite or exploding loss or gradient norm, or a non-finite
weight after the update, raises `CispoDiverged` naming the step; the trainer saves nothing
after it, so the last checkpoint stays the last good state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from training.cispo_loss import CispoStats, cispo_token_loss, merge_stats
from training.rl_batch import TurnSequence, collate, micro_batches


class CispoDiverged(RuntimeError):
    """Training produced NaN/inf or an exploding loss or gradient: the run stops here."""


def sequence_logprobs(model: Any, batch: dict[str, torch.Tensor], temperature: float = 1.0
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logp_new, logp_old, mask, advantages), each (1, N) over the N target tokens of the batch."""
    input_ids, targets = batch["input_ids"], batch["target_mask"] > 0
    # Position p predicts token p + 1: keep the hidden states of positions whose next token is a target.
    keep = torch.zeros_like(targets)
    keep[:, :-1] = targets[:, 1:]
    try:
        logits = model(input_ids=input_ids, attention_mask=batch["attention_mask"], logits_to_keep=keep,
                       use_cache=False).logits
        if logits.dim() == 3:  # an implementation that ignored the mask: select the positions here
            logits = logits[keep]
    except TypeError:  # a model without logits_to_keep: project every position, then select
        logits = model(input_ids=input_ids, attention_mask=batch["attention_mask"], use_cache=False).logits[keep]
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()  # log-softmax in fp32; fp64 models (tests) keep their precision
    if temperature != 1.0:
        logits = logits / temperature
    next_ids = input_ids[:, 1:][keep[:, :-1]]
    logp = logits.gather(-1, next_ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    old = batch["old_logprobs"][:, 1:][keep[:, :-1]]
    rows = torch.arange(input_ids.shape[0], device=input_ids.device).unsqueeze(1).expand_as(keep)[keep]
    advantages = batch["advantages"][rows]
    mask = torch.ones_like(logp)
    return logp.unsqueeze(0), old.unsqueeze(0), mask.unsqueeze(0), advantages.unsqueeze(0)


def accumulate_cispo_gradients(
    model: Any,
    sequences: Sequence[TurnSequence],
    *,
    pad_id: int,
    eps_low: float,
    eps_high: float,
    temperature: float = 1.0,
    micro_batch_tokens: int = 16_384,
    n_tokens: int | None = None,
    where: str = "",
    ratio_mins: list[float] | None = None,
) -> tuple[list[CispoStats], int]:
    """Backward the CISPO loss of `sequences` in micro-batches (gradients add up in `.grad`).

    `n_tokens` is the normalizer (default: the completion tokens of `sequences`); returns the
    per-micro-batch stats and the padded token count forwarded. `ratio_mins`, when given,
    receives each micro-batch's smallest importance ratio pi/pi_old (the stats carry mean and max).
    """
    total = n_tokens if n_tokens is not None else sum(s.completion_tokens for s in sequences)
    device = next(model.parameters()).device
    stats: list[CispoStats] = []
    padded = 0
    for part in micro_batches(sequences, micro_batch_tokens):
        batch = collate(part, pad_id, device)
        padded += int(batch["input_ids"].numel())
        logp, old, mask, adv = sequence_logprobs(model, batch, temperature)
        loss, part_stats = cispo_token_loss(logp, old, adv, mask, eps_low, eps_high, n_tokens=total)
        if ratio_mins is not None and logp.numel():
            ratio_mins.append(float(torch.exp(logp.detach() - old).min()))
        if not torch.isfinite(loss):
            raise CispoDiverged(f"{where}: the CISPO loss is {loss.item()} (non-finite) on a micro-batch of "
                                f"{len(part)} sequences; max ratio {part_stats.ratio_max:.3g}. The run stops here; "
                                "the last checkpoint is the last good state (lower the learning rate and resume).")
        loss.backward()
        stats.append(part_stats)
    return stats, padded


def cispo_optimizer_step(
    model: Any,
    optimizer: torch.optim.Optimizer,
    sequences: Sequence[TurnSequence],
    *,
    pad_id: int,
    eps_low: float,
    eps_high: float,
    temperature: float = 1.0,
    micro_batch_tokens: int = 16_384,
    max_grad_norm: float = 1.0,
    abort_loss: float = 1e3,
    abort_grad_norm: float = 1e5,
    where: str = "",
) -> dict[str, Any]:
    """Zero, accumulate, check, clip, step, check: one optimizer step (module docstring).

    The returned stats describe the importance ratio r = pi/pi_old before this update
    (`ratio_mean`, token-weighted; `ratio_min`, `ratio_max`): on the first substep of a step the
    weights are the sampler's own, so r is 1 up to float error (tested).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer.zero_grad(set_to_none=True)
    ratio_mins: list[float] = []
    try:
        parts, padded = accumulate_cispo_gradients(
            model, sequences, pad_id=pad_id, eps_low=eps_low, eps_high=eps_high, temperature=temperature,
            micro_batch_tokens=micro_batch_tokens, where=where, ratio_mins=ratio_mins,
        )
        merged = merge_stats(parts)
        if abs(merged["loss"]) > abort_loss:
            raise CispoDiverged(f"{where}: the CISPO loss exploded to {merged['loss']:.4g} (> abort_loss={abort_loss:g}); "
                                "the run stops here, the last checkpoint is the last good state.")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
        if not math.isfinite(grad_norm) or grad_norm > abort_grad_norm:
            raise CispoDiverged(f"{where}: the gradient norm is {grad_norm:.4g} (non-finite or > abort_grad_norm="
                                f"{abort_grad_norm:g}); the run stops here, the last checkpoint is the last good state.")
        optimizer.step()
    finally:
        optimizer.zero_grad(set_to_none=True)
    bad = [name for name, p in model.named_parameters() if p.requires_grad and not bool(torch.isfinite(p).all())]
    if bad:
        raise CispoDiverged(f"{where}: non-finite weights after the update in {len(bad)} tensors (e.g. {bad[0]}); "
                            "the run stops here, the last checkpoint is the last good state.")
    return {**merged, "ratio_min": min(ratio_mins, default=1.0), "grad_norm": grad_norm, "micro_batches": len(parts), "padded_tokens": padded,
            "sequences": len(sequences)}
