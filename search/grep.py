"""`grep_corpus` over a chunk table: a regular expression, first matches in reading order.

Why a joined scan: one C-level regex pass over all texts joined by newlines is about ten times
faster than a Python loop over 100k chunks; each candidate is confirmed on its own chunk, and
patterns whose match could depend on text beyond a chunk's edges are scanned chunk by chunk.
"""

from __future__ import annotations

import bisect
import re
import time
from collections.abc import Collection
from typing import Any

from search.chunk_table import ChunkTable


def compile_grep(pattern: str, ignore_case: bool, multiline: bool = False):
    import regex

    flags = (regex.IGNORECASE if ignore_case else 0) | (regex.MULTILINE if multiline else 0)
    try:
        return regex.compile(pattern, flags=flags)
    except (regex.error, TypeError, ValueError, OverflowError, RecursionError) as error:
        raise ValueError(f"invalid regular expression {pattern!r}: {error}") from None


# Constructs whose outcome can depend on text beyond a chunk's edges (lookarounds, atomic
# groups, possessive quantifiers, absolute anchors, \K, unusual inline flags): for these a
# scan of the joined texts could miss a chunk-level match, so grep scans chunk by chunk.
_GROUP_OPENING = re.compile(r"\(\?(?!:|P<|P=|#|[imsx]+[:)]|<[A-Za-z_])")
_CONTEXT_ESCAPES = re.compile(r"\\[AZzGK]|[*+?}]\+")


def chunk_local(pattern: str) -> bool:
    """True when every match of `pattern` in a chunk is also a match at the same place in the
    newline-joined texts (compiled MULTILINE), so the joined scan can find candidates."""
    return not (_GROUP_OPENING.search(pattern) or _CONTEXT_ESCAPES.search(pattern))


def grep_chunks(table: ChunkTable, pattern: str, limit: int, exclude: Collection[str], *, ignore_case: bool, timeout_s: float) -> list[int]:
    """Positions of the first `limit` chunks (table order) not in `exclude` whose text matches `pattern`.

    Uses the `regex` package's per-call timeout against a deadline for the whole scan, so
    catastrophic backtracking costs at most `timeout_s`; raises ValueError for an invalid
    pattern or a timeout (the harness shows the message to the model).
    """
    compiled = compile_grep(pattern, ignore_case)
    if limit <= 0:
        return []
    deadline = time.monotonic() + timeout_s

    def remaining() -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        return left

    try:
        if chunk_local(pattern):
            return _grep_joined(table, compile_grep(pattern, ignore_case, True), compiled, limit, exclude, remaining)
        return _grep_each(table, compiled, limit, exclude, remaining)
    except TimeoutError:
        raise ValueError(
            f"regular expression {pattern!r} took longer than {timeout_s:.1f}s (catastrophic backtracking?); simplify it"
        ) from None


def _grep_each(table: ChunkTable, compiled: Any, limit: int, exclude: Collection[str], remaining) -> list[int]:
    found: list[int] = []
    for pos, text in enumerate(table.texts):
        if exclude and table.ids[pos] in exclude:
            continue
        if compiled.search(text, timeout=remaining()) is not None:
            found.append(pos)
            if len(found) >= limit:
                break
    return found


def _grep_joined(table: ChunkTable, joined: Any, compiled: Any, limit: int, exclude: Collection[str], remaining) -> list[int]:
    """Find candidates with one scan of the joined texts, confirm each on its own chunk,
    and resume at the next chunk's start (a match that ran across chunks never hides
    the next chunk's own match)."""
    haystack, starts = table.haystack()
    found: list[int] = []
    cursor, n = 0, len(starts)
    while cursor <= len(haystack) and len(found) < limit:
        match = joined.search(haystack, cursor, timeout=remaining())
        if match is None:
            break
        pos = bisect.bisect_right(starts, match.start()) - 1
        if not (exclude and table.ids[pos] in exclude) and compiled.search(table.texts[pos], timeout=remaining()) is not None:
            found.append(pos)
        if pos + 1 >= n:
            break
        cursor = starts[pos + 1]
    return found
