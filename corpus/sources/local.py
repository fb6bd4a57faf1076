"""Local folder source: include/exclude globs, change detection by size + mtime, then content hash.

Size and mtime decide whether to read a file at all (cheap stat), and the content hash decides
whether it really changed, so a `touch` does not count as a change.

A file whose name is not valid UTF-8 (a byte 0xff written by a Latin-1 tool) is quarantined,
not synced: Python hands such a name over with surrogate escapes, which no parquet table or
hash can hold, and its printable form (the byte spelled as backslash-x-f-f) is also the name
of a real, different file, so it cannot serve as the document's stable uri. The quarantine
entry carries the printable form so the operator can find and rename the file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, Mapping

from corpus.sources.base import (
    Failed,
    Fetched,
    PreviousItem,
    ScanEvent,
    SourceError,
    Unchanged,
    content_version,
    glob_match,
    is_utf8_name,
    printable_name,
)


class LocalConnector:
    def __init__(self, root: Path, include: list[str], exclude: list[str], source_key: str, max_bytes: int):
        self.root = root
        self.include = include
        self.exclude = exclude
        self.source_key = source_key
        self.max_bytes = max_bytes

    def _entries(self) -> Iterator[tuple[str, os.DirEntry]]:
        """(relative path, entry) of included regular files; os.scandir keeps a 10k-file stat cheap."""
        stack = [("", str(self.root))]
        while stack:
            prefix, folder = stack.pop()
            with os.scandir(folder) as entries:
                ordered = sorted(entries, key=lambda e: e.name)
            for entry in ordered:
                if entry.name.startswith(".") and entry.is_dir(follow_symlinks=False):
                    continue
                relative = f"{prefix}{entry.name}"
                if entry.is_symlink():
                    continue  # never follow links out of the source folder
                if entry.is_dir(follow_symlinks=False):
                    stack.append((relative + "/", entry.path))
                elif entry.is_file(follow_symlinks=False) and glob_match(relative, self.include, self.exclude):
                    yield relative, entry

    def scan(self, previous: Mapping[str, PreviousItem]) -> Iterator[ScanEvent]:
        if not self.root.is_dir():
            raise SourceError(f"local source {self.root} is not a folder")
        for relative, entry in self._entries():
            if not is_utf8_name(relative):
                yield Failed(printable_name(relative), "file name is not valid UTF-8; rename the file to sync it")
                continue
            uri = relative  # relative, so moving the folder does not make every document new
            try:
                stat = entry.stat(follow_symlinks=False)
            except OSError as error:
                yield Failed(uri, f"cannot stat: {error}")
                continue
            fingerprint = f"{stat.st_size}:{stat.st_mtime_ns}"
            known = previous.get(uri)
            if known and known.validators.get("stat") == fingerprint:
                yield Unchanged(uri, known.version, {"stat": fingerprint})
                continue
            if stat.st_size > self.max_bytes:
                yield Failed(uri, f"over the size limit ({stat.st_size} > {self.max_bytes} bytes)")
                continue
            try:
                data = Path(entry.path).read_bytes()
            except OSError as error:
                yield Failed(uri, f"cannot read: {error}")
                continue
            version = content_version(data)
            if known and known.version == version:
                yield Unchanged(uri, version, {"stat": fingerprint})
                continue
            yield Fetched(
                uri=uri,
                version=version,
                data=data,
                name=relative,
                validators={"stat": fingerprint},
                metadata={"path": entry.path},
            )
