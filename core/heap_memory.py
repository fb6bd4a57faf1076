"""Give the heap's freed pages back to the operating system when resident memory runs high.

Why: an in-process model's turns allocate and free gigabytes of short-lived tensors from several
threads (every decode step reallocates each layer's attention cache one position longer and
frees the old one). glibc keeps what is freed inside its arenas for reuse, and its threshold
for handing large blocks straight back to the kernel rises with every such block freed, so the
process's resident memory grows with the work done, not with what is alive: `searchsmith bench`
of the demo's SmolLM2 checkpoint, 16 dev questions, 8 episodes at once, 2 cores, peaked at
13.4 GB (18.3 GB on 40 questions, on a machine with 23 GB).

`malloc_trim(0)` returns the free pages of every arena, not only the heap's top. Once after each
batch it did not help (12.1 GB 7.5 minutes into the same run): the growth happens inside a
batch. Every 2 s during generation it halved the peak (7.0 GB, the same answers) but made the
run 1.24x slower (1,336 s against 1,075 s): trimmed pages come back as page faults. So the side
thread trims only while the process holds more than `trim_above_bytes()` (40% of the memory the
machine or its cgroup grants): a machine with room pays nothing, one without does not run out.
On a C library without `malloc_trim` (musl, macOS) nothing runs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TRIM_EVERY_SECONDS = 2.0
TRIM_ABOVE_SHARE = 0.4  # of the memory this process may use
CGROUP_LIMIT_FILES = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


@functools.cache
def _glibc() -> Any:
    try:
        library = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        library.malloc_trim.argtypes = [ctypes.c_size_t]
        library.malloc_trim.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return library


def release_freed_memory() -> bool:
    """Return freed heap pages to the operating system; False where the C library cannot."""
    library = _glibc()
    if library is None:
        return False
    library.malloc_trim(0)
    return True


def resident_bytes() -> int | None:
    """This process's resident memory (Linux `/proc/self/statm`), or None elsewhere."""
    try:
        resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def available_memory_bytes() -> int:
    """The machine's physical memory, or its cgroup's limit when that is lower (a container)."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in CGROUP_LIMIT_FILES:
        try:
            limit = int(path.read_text().strip())
        except (OSError, ValueError):  # absent, or "max"
            continue
        return min(physical, limit)
    return physical


def trim_above_bytes() -> int:
    return int(TRIM_ABOVE_SHARE * available_memory_bytes())


@contextmanager
def releasing_freed_memory(every_seconds: float = TRIM_EVERY_SECONDS, above_bytes: int | None = None) -> Iterator[None]:
    """Run the block while a side thread, every `every_seconds`, returns freed heap pages if the
    process holds more than `above_bytes` (default `trim_above_bytes()`; 0: always)."""
    if _glibc() is None:
        yield
        return
    ceiling = trim_above_bytes() if above_bytes is None else above_bytes
    stop = threading.Event()

    def trim_when_high() -> None:
        while not stop.wait(every_seconds):
            resident = resident_bytes()
            if resident is None or resident > ceiling:
                release_freed_memory()

    worker = threading.Thread(target=trim_when_high, name="heap-trim", daemon=True)
    worker.start()
    try:
        yield
    finally:
        stop.set()
        worker.join()
