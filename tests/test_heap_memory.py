"""`release_freed_memory` hands pages freed inside the heap back to the kernel: resident memory
drops after it even though live blocks still pin the heap around the freed ones.

Each scenario measures its process's resident memory, so each runs in a fresh interpreter: inside
the test run's own process, memory earlier tests freed is reused by the scenario's blocks and
other threads allocate meanwhile (stop 30's CI: the 200 MB of blocks grew a 1.47 GB process by
4 MB), and the figures say nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from core.heap_memory import (
    available_memory_bytes,
    release_freed_memory,
    releasing_freed_memory,
    resident_bytes,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status (Linux)")

BLOCK = 64 * 1024  # under glibc's smallest mmap threshold: served from the heap, not mmap
BLOCKS = 3000  # about 200 MB


def _alone(scenario) -> None:
    """Run `scenario` (a function of this module) in a fresh interpreter; its assertion, if
    any, is the failure."""
    if not release_freed_memory():
        pytest.skip("this C library has no malloc_trim")
    root = Path(__file__).resolve().parents[1]
    child = subprocess.run([sys.executable, "-c", f"from tests.test_heap_memory import {scenario.__name__}; {scenario.__name__}()"],
                           cwd=root, capture_output=True, text=True, timeout=120, check=False)
    assert child.returncode == 0, child.stderr[-3000:]


def _resident_bytes() -> int:
    resident = resident_bytes()
    assert resident is not None
    return resident


def _fragmented_heap() -> list[bytearray]:
    """About 200 MB of resident blocks, all freed but every 50th (the last one included), so
    live blocks pin the heap around the freed pages; returns the survivors."""
    blocks = [bytearray(BLOCK) for _ in range(BLOCKS)]
    for block in blocks:  # touch every page so it is resident
        block[::4096] = b"\x01" * len(block[::4096])
    return blocks[49::50]


def test_freed_blocks_between_live_ones_leave_the_process():
    _alone(_freed_blocks_between_live_ones_leave_the_process)


def _freed_blocks_between_live_ones_leave_the_process():
    pinned = _fragmented_heap()
    before = _resident_bytes()
    assert release_freed_memory()
    after = _resident_bytes()
    freed = BLOCK * (BLOCKS - len(pinned))
    assert before - after >= freed // 2, (before, after, freed)
    assert all(block[0] == 1 for block in pinned)


def test_a_block_run_inside_the_context_is_trimmed_while_it_runs_and_the_trimmer_stops_after():
    _alone(_a_block_run_inside_the_context_is_trimmed_while_it_runs_and_the_trimmer_stops_after)


def _a_block_run_inside_the_context_is_trimmed_while_it_runs_and_the_trimmer_stops_after():
    with releasing_freed_memory(every_seconds=0.05, above_bytes=0):
        before_free = _resident_bytes()
        pinned = _fragmented_heap()
        grown = _resident_bytes()
        assert grown - before_free > BLOCK * BLOCKS // 2, (before_free, grown)  # the blocks grew this process
        deadline = time.monotonic() + 10
        while _resident_bytes() > before_free + (grown - before_free) // 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        during = _resident_bytes()
        assert any(thread.name == "heap-trim" for thread in threading.enumerate())
    assert during - before_free < (grown - before_free) // 2, (before_free, grown, during)
    assert not any(thread.name == "heap-trim" for thread in threading.enumerate())
    assert len(pinned) == BLOCKS // 50


def test_below_the_ceiling_nothing_is_trimmed():
    _alone(_below_the_ceiling_nothing_is_trimmed)


def _below_the_ceiling_nothing_is_trimmed():
    with releasing_freed_memory(every_seconds=0.02, above_bytes=available_memory_bytes()):
        pinned = _fragmented_heap()
        grown = _resident_bytes()
        time.sleep(0.3)  # 15 of the side thread's checks
        kept = _resident_bytes()
    assert kept >= grown - BLOCK * BLOCKS // 4, (grown, kept)
    release_freed_memory()
    assert len(pinned) == BLOCKS // 50


def test_the_memory_ceiling_is_a_positive_share_of_the_machine():
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < available_memory_bytes() <= total
    assert 0 < resident_bytes() < total
