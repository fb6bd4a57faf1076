"""An advisory lock on a file, held across processes, for read-modify-write and build-once work.

Why: two processes that share a Searchsmith home (two `searchsmith bench` runs, `keys create`
from two shells) otherwise both do the same paid work or lose each other's writes: two
benchmarks over one dev file both embedded its 5,600 chunks into the same Chroma folder. The
second process waits on the lock and then finds the first one's result. `fcntl.flock` is
released by the kernel when the holder dies, so a crashed builder never leaves a stale lock.
"""

from __future__ import annotations

import fcntl
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOG = logging.getLogger(__name__)


@contextmanager
def exclusive_file_lock(path: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created, with its folder, when absent) for the block."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # say why nothing happens for a while (an index build takes minutes)
            LOG.info("waiting for %s: another process holds it", path)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
