"""Progress of a long loop as throttled INFO records: "chunks embedded 1,200/5,834".

Why log records and not bars: stages are pure code that runs under Dagster, the CLI, tests and
benchmarks alike. A record costs nothing when nobody listens; the CLI's console turns our own
INFO records into the running step's status line on a terminal (`orchestration.console`) and
the event log file keeps them. One record every `every_s` seconds at most, plus the last one, so
a loop of a million items does not flood the log.

Lives in `core/`, which every stage may import.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import time
from collections.abc import Iterator


class Progress:
    """Counts items of one loop and reports `label done/total` (with an optional note)."""

    def __init__(self, log: logging.Logger, label: str, total: int | None = None, *, every_s: float = 2.0):
        self.log = log
        self.label = label
        self.total = total
        self.every_s = every_s
        self.done = 0
        self._last = time.monotonic()

    def advance(self, count: int = 1, note: str = "") -> None:
        """`count` more items done; reports when `every_s` passed since the last report or at the end."""
        self.done += count
        now = time.monotonic()
        finished = self.total is not None and self.done >= self.total
        if finished or now - self._last >= self.every_s:
            self._last = now
            self.log.info("%s", self.line(note))

    def line(self, note: str = "") -> str:
        counted = f"{self.done:,}/{self.total:,}" if self.total is not None else f"{self.done:,}"
        return f"{self.label} {counted}" + (f" ({note})" if note else "")


@contextlib.contextmanager
def library_bars_follow_hub_setting(*modules: str) -> Iterator[None]:
    """Silence the module-level `tqdm` bars of `modules` while huggingface_hub's progress bars are off.

    Why: the CLI turns hub bars off outside `-v` (model loading is not progress a person waits on),
    and transformers and sentence-transformers obey, except for a few bars drawn with tqdm directly
    (the GGUF reader's 272 tensor updates, sentence-transformers' model-card "widget examples"),
    which then land in a log file as one long line of carriage returns. A module that is missing, or
    draws no bar of that name in another version, is left alone: a cosmetic choice never stops a run."""
    from huggingface_hub.utils import are_progress_bars_disabled

    if not are_progress_bars_disabled():
        yield
        return
    from functools import partial

    with contextlib.ExitStack() as restore:
        for name in modules:
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            drawn = getattr(module, "tqdm", None)
            if drawn is None:
                continue
            module.tqdm = partial(drawn, disable=True)
            restore.callback(setattr, module, "tqdm", drawn)
        yield
