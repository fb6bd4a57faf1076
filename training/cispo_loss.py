"""The CISPO objective and group-relative advantages: pure tensor math, no model, no I/O.

CISPO (MiniMax-M1, arXiv 2506.13585; Context-1 §5) is two decisions, like every TRL loss variant:

1. The per-token objective: `sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * log pi_theta(o_t)`, with
   `r = pi_theta / pi_old`. The importance weight is clipped and detached, but `log pi` is not,
   so a clipped token still pushes its log-probability in the direction of its advantage (PPO
   and GRPO instead zero the gradient of a clipped token: the update is clipped, not the weight).
2. The normalization: the sum over every completion token of the batch divided by the number
   of those tokens, `1 / sum_i |o_i|` (token-level, so long trajectories are not down-weighted
   per token, unlike GRPO's per-sequence mean). The count is passed in explicitly as
   `n_tokens`, so a batch split into micro-batches whose losses are accumulated gives exactly
   the gradient of the whole batch (each micro-batch divides by the GLOBAL count).

Compared with TRL 1.16 `GRPOTrainer(loss_type="cispo")` (`trl/trainer/grpo_trainer.py`,
`_compute_loss`), the per-token loss is the same `-clamped_ratio.detach() * A * logp`, with
these differences:
- TRL clamps only from above and its `epsilon_high` is the ratio cap itself
  (`clamp(r, max=epsilon_high)`, ScaleRL's eps_max, recommended 5.0). We use the paper's
  two-sided `clip(r, 1 - eps_low, 1 + eps_high)`: `eps_low >= 1` (our default) means no lower
  bound, and then our `eps_high` equals TRL's `epsilon_high - 1`.
- TRL normalizes by `num_items_in_batch` (completion tokens of the generation batch), rescaled
  by gradient accumulation steps / steps_per_generation and the number of processes; we take
  the count directly, which is the same number when the batch is one optimizer step.
- TRL's pi_old is its own recomputed log-probs (or the live ones detached when fully on-policy)
  and it corrects vLLM sampling mismatch with a separate truncated importance weight; we use
  the sampler's recorded log-probs as pi_old directly, so the clipped ratio covers both the
  policy drift over substeps and the sampler/trainer mismatch.
- TRL's `cispo_clip_ratio` counts only tokens capped from above with A > 0; our `clip_ratio`
  counts every token whose weight was clipped on either side, whatever the advantage sign.
- No KL term and no entropy bonus (Context-1 mentions neither).

Advantages: reward minus the group mean, over the group standard deviation (population std,
ddof = 0; TRL uses the unbiased std, which only rescales every advantage of a group of G by
sqrt((G-1)/G)). A group whose rewards are all equal carries no signal and is dropped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

EQUAL_REWARD_TOL = 1e-9
DEFAULT_ADV_EPS = 1e-6


@dataclass(frozen=True)
class CispoStats:
    """Per-batch diagnostics of one loss evaluation (all detached Python floats).

    `entropy_proxy` is the mean negative log-probability of the sampled tokens under the
    current policy: an unbiased estimate of the per-token entropy when sampling is on-policy,
    and free (no full-vocabulary pass). A falling value is the entropy collapse CISPO avoids.
    """

    loss: float
    n_tokens: int  # tokens in this call (mask sum)
    n_tokens_global: float  # the normalizer
    clip_ratio: float  # share of tokens whose importance weight was clipped (either side)
    clip_low: float
    clip_high: float
    ratio_mean: float
    ratio_max: float
    entropy_proxy: float
    advantage_mean: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cispo_token_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    n_tokens: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, CispoStats]:
    """`-(1/n_tokens) * sum_{masked} sg(clip(r, 1-eps_low, 1+eps_high)) * A * logp_new`.

    Shapes: `logp_new`, `logp_old`, `mask` are (B, T); `advantages` is (B,) (one per sequence,
    broadcast over its tokens) or (B, T). `n_tokens` is the number of completion tokens of the
    whole batch this call is a part of (default: this call's `mask.sum()`). Masked-out positions
    contribute nothing, even when they hold NaN or inf (padding).
    """
    if logp_new.shape != logp_old.shape or logp_new.shape != mask.shape:
        raise ValueError(f"shape mismatch: logp_new {tuple(logp_new.shape)}, logp_old {tuple(logp_old.shape)}, mask {tuple(mask.shape)}")
    if eps_low < 0 or eps_high < 0:
        raise ValueError("eps_low and eps_high must be >= 0")
    weights = mask.to(logp_new.dtype)
    keep = weights > 0
    adv = advantages.to(logp_new.dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(1).expand_as(logp_new)
    # Zero the padding before exp/multiply so NaN or inf there cannot leak through 0 * x.
    new = torch.where(keep, logp_new, torch.zeros_like(logp_new))
    old = torch.where(keep, logp_old.to(logp_new.dtype), torch.zeros_like(logp_new))
    adv = torch.where(keep, adv, torch.zeros_like(adv))
    ratio = torch.exp(new.detach() - old)
    lower = max(0.0, 1.0 - eps_low)
    upper = 1.0 + eps_high
    clipped = ratio.clamp(min=lower, max=upper).detach()
    count = weights.sum()
    normalizer = count if n_tokens is None else torch.as_tensor(n_tokens, dtype=logp_new.dtype, device=logp_new.device)
    normalizer = normalizer.clamp(min=1.0)
    loss = -(clipped * adv * new * weights).sum() / normalizer
    with torch.no_grad():
        n = max(float(count), 1.0)
        low = ((ratio < lower) & keep).sum().item()
        high = ((ratio > upper) & keep).sum().item()
        stats = CispoStats(
            loss=float(loss.detach()),
            n_tokens=int(count.item()),
            n_tokens_global=float(normalizer),
            clip_ratio=(low + high) / n,
            clip_low=low / n,
            clip_high=high / n,
            ratio_mean=float((ratio * weights).sum()) / n,
            ratio_max=float(ratio[keep].max()) if bool(keep.any()) else 1.0,
            entropy_proxy=float(-(new.detach() * weights).sum()) / n,
            advantage_mean=float((adv * weights).sum()) / n,
        )
    return loss, stats


def group_advantages(rewards: Sequence[float], eps: float = DEFAULT_ADV_EPS) -> list[float] | None:
    """(r - mean) / (std + eps) over one group of rollouts of the same task; None when the
    rewards are all equal (no signal: the group is dropped, it contributes nothing)."""
    values = [float(r) for r in rewards]
    if not values:
        return None
    if any(not math.isfinite(v) for v in values):
        raise ValueError(f"non-finite reward in group: {values}")
    if max(values) - min(values) <= EQUAL_REWARD_TOL:
        return None
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return [(v - mean) / (std + eps) for v in values]


def merge_stats(parts: Sequence[CispoStats]) -> dict[str, float]:
    """Token-weighted means of several micro-batch stats (the loss is summed: each part is
    already divided by the global count)."""
    total = sum(p.n_tokens for p in parts)
    if total == 0:
        return {"loss": 0.0, "n_tokens": 0, "clip_ratio": 0.0, "clip_low": 0.0, "clip_high": 0.0,
                "ratio_mean": 1.0, "ratio_max": 1.0, "entropy_proxy": 0.0}

    def weighted(name: str) -> float:
        return sum(getattr(p, name) * p.n_tokens for p in parts) / total

    return {
        "loss": sum(p.loss for p in parts),
        "n_tokens": total,
        "clip_ratio": weighted("clip_ratio"),
        "clip_low": weighted("clip_low"),
        "clip_high": weighted("clip_high"),
        "ratio_mean": weighted("ratio_mean"),
        "ratio_max": max(p.ratio_max for p in parts),
        "entropy_proxy": weighted("entropy_proxy"),
    }
