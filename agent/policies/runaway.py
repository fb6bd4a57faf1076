"""Stop a turn that has started repeating itself.

Why: a small or lightly trained model decodes greedily into loops. Measured on the learning
benchmark's SFT student (150 dev questions), 279 of its turns ran to the token cap writing the
same tool call again and again, or a query such as `"Sid Haig, 2020, 11, 2020, 11, ...`, so
almost every turn paid the full cap (in a batch, every row waits for the longest) and ended in a
cut-off call whose error text the model then copied into its next turn. A repeat adds nothing
the first copy did not say: the turn stops where the loop is evident, and a repeated call is
dropped (`distinct_calls`), so a loop of identical calls becomes the one call it meant.

A reply stops when its text ends with
- the same span of text at least `MIN_REPEATS` times in a row (period up to `MAX_PERIOD`
  characters, at least `MIN_SPAN` characters in all: `2020, 11, 2020, 11, ...`, `Brian [Brian [...`);
- a closed `<tool_call>` block identical to an earlier block of the same reply.
Neither occurs in a well-formed turn (references, arguments and calls differ from each other),
so the guard never changes a reply that was not already looping; it changes what a looping one
costs. The recorded completion is what was generated up to the stop, logprobs included.
"""

from __future__ import annotations

import re
from typing import Any

from agent.policies.tool_parsing import TOOL_CALL_CLOSE

MIN_REPEATS = 4
MIN_SPAN = 24
MAX_PERIOD = 48
_CLOSED_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def repeating_tail(text: str) -> bool:
    """Whether `text` ends with one span written `MIN_REPEATS` or more times in a row."""
    for period in range(1, MAX_PERIOD + 1):
        span = max(MIN_REPEATS * period, MIN_SPAN)
        span += -span % period  # a whole number of periods
        if len(text) < span:
            break
        tail = text[-span:]
        if tail[:-period] == tail[period:]:
            return True
    return False


def repeated_call_block(text: str) -> bool:
    """Whether the reply's last closed tool-call block repeats an earlier one."""
    if not text.rstrip().endswith(TOOL_CALL_CLOSE):
        return False
    blocks = [block.strip() for block in _CLOSED_BLOCK.findall(text)]
    return len(blocks) > 1 and blocks[-1] in blocks[:-1]


def is_runaway(text: str) -> bool:
    return repeated_call_block(text) or repeating_tail(text)


class RunawayStop:
    """A transformers stopping criterion (one verdict per row) over the rows' generated text.

    `prompt_width` is where generation starts in every row (prompts are left-padded to it);
    `rows` are the rows it watches (None: all). Subclassing `StoppingCriteria` is not needed: `generate` accepts any callable in a
    `StoppingCriteriaList`, and this keeps transformers out of the import.
    """

    def __init__(self, tokenizer: Any, prompt_width: int, rows: set[int] | None = None):
        self.tokenizer = tokenizer
        self.prompt_width = prompt_width
        self.rows = rows
        self.stopped_rows: set[int] = set()

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        verdicts = []
        for row, ids in enumerate(input_ids[:, self.prompt_width:].tolist()):
            if self.rows is not None and row not in self.rows:
                verdicts.append(False)
                continue
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
            runaway = is_runaway(text)
            if runaway:
                self.stopped_rows.add(row)
            verdicts.append(runaway)
        return torch.tensor(verdicts, dtype=torch.bool, device=input_ids.device)
