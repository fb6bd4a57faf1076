"""The connector contract: each source lists what it has and fetches only what changed.

A connector receives what the previous sync knew about each of its items (a version
fingerprint and, for HTTP, validators) and yields one event per item it currently holds:
`Unchanged` (nothing fetched), `Fetched` (new bytes) or `Failed` (recorded, retried next run).
Items the previous sync knew but the scan did not yield are deletions; that inference is only
made when the scan completed, which is why a listing failure raises `SourceError` instead.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
from functools import lru_cache
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Protocol


class SourceError(RuntimeError):
    """The source as a whole could not be listed (auth failure, missing bucket, unreachable repo)."""


@dataclass(frozen=True)
class PreviousItem:
    version: str
    validators: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Fetched:
    uri: str
    version: str
    data: bytes
    name: str  # file name or URL path, used to pick a parser
    media_type: str | None = None
    title: str | None = None
    validators: Mapping[str, str] = field(default_factory=dict)
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Unchanged:
    uri: str
    version: str
    validators: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Failed:
    uri: str
    reason: str
    version: str | None = None


ScanEvent = Fetched | Unchanged | Failed


class Connector(Protocol):
    source_key: str

    def scan(self, previous: Mapping[str, PreviousItem]) -> Iterator[ScanEvent]: ...


def content_version(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def printable_name(name: str) -> str:
    """A name as text that any table can store: undecodable bytes spelled as backslash escapes."""
    try:
        raw = os.fsencode(name)  # surrogate-escaped bytes from the OS back to the bytes on disk
    except UnicodeEncodeError:  # a lone surrogate of another origin (an escaped JSON string, say)
        return name.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def is_utf8_name(name: str) -> bool:
    """False for a name that came from bytes that are not UTF-8 (they arrive as lone surrogates)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@lru_cache(maxsize=256)
def _glob_regex(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    """One compiled regex per pattern set; `**/x` also matches `x` at the top level."""
    if not patterns:
        return None
    expanded = []
    for pattern in patterns:
        expanded.append(fnmatch.translate(pattern))
        if pattern.startswith("**/"):
            expanded.append(fnmatch.translate(pattern[3:]))
    return re.compile("|".join(f"(?:{p})" for p in expanded))


def glob_match(path: str, include: list[str], exclude: list[str]) -> bool:
    """Gitignore-like globs over '/'-separated relative paths (`*` may cross folders, as in fnmatch)."""
    included = _glob_regex(tuple(include))
    excluded = _glob_regex(tuple(exclude))
    if included is not None and not included.match(path):
        return False
    return excluded is None or not excluded.match(path)
