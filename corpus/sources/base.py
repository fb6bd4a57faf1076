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


def glob_match(path: str, include: list[str], exclude: list[str]) -> bool:
    """Gitignore-like globs: `**/*.md` also matches `a.md` at the top level."""

    def matches(pattern: str) -> bool:
        if fnmatch.fnmatchcase(path, pattern):
            return True
        return pattern.startswith("**/") and fnmatch.fnmatchcase(path, pattern[3:])

    included = not include or any(matches(p) for p in include)
    return included and not any(matches(p) for p in exclude)
