"""SFT loss with per-token weights: a final answer can count more than the tool calls around it.

Why: a merged episode carries its final answer in about 15 of some 2,500 tokens, and the
learning benchmark's student learned the answer's form (`[1] [2] [3] ...`) rather than which
references to keep (`bench/answer_choice.py`). TRL's SFT loss weighs every label token alike,
so the weights travel as a `loss_weights` column (`SFTSample.loss_weights`: labelled tokens
average 1), the collator pads them like the labels, and the loss is the weighted sum of the
token losses over the batch's label count, the same normalisation TRL uses, so a weight of 1
everywhere gives TRL's loss.
"""

from __future__ import annotations

from typing import Any

WEIGHTS = "loss_weights"


def weighted_token_loss(logits: Any, labels: Any, weights: Any, num_items_in_batch: Any = None) -> Any:
    """Sum over label tokens of weight x cross-entropy (next-token: position t predicts t+1),
    divided by the label count (`num_items_in_batch` when gradient accumulation gives one)."""
    import torch

    logits = logits[:, :-1].float()
    targets = labels[:, 1:]
    weights = weights[:, 1:].to(logits.dtype)
    losses = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100, reduction="none")
    count = (targets != -100).sum() if num_items_in_batch is None else num_items_in_batch
    return (losses * weights.reshape(-1)).sum() / torch.as_tensor(count, device=losses.device).clamp(min=1)


class WeightPaddingCollator:
    """TRL's language-modelling collator, plus `loss_weights` padded with 0 on the same (right) side."""

    def __init__(self, pad_token_id: int) -> None:
        from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

        self.base = DataCollatorForLanguageModeling(pad_token_id=pad_token_id)

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        weights = [example[WEIGHTS] for example in examples]
        batch = self.base([{k: v for k, v in example.items() if k != WEIGHTS} for example in examples])
        padded = torch.zeros(batch["labels"].shape, dtype=torch.float32)
        for row, values in enumerate(weights):
            padded[row, : len(values)] = torch.as_tensor(values, dtype=torch.float32)
        batch[WEIGHTS] = padded
        return batch


def weighted_sft_trainer_class() -> type:
    """`SFTTrainer` whose loss reads the batch's `loss_weights` (built lazily: TRL is a heavy import)."""
    from trl import SFTTrainer

    class WeightedSFTTrainer(SFTTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            weights = inputs.pop(WEIGHTS)
            labels = inputs.pop("labels")
            outputs = model(**inputs, use_cache=False)
            loss = weighted_token_loss(outputs.logits, labels, weights, num_items_in_batch)
            return (loss, outputs) if return_outputs else loss

    return WeightedSFTTrainer
