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
import stat
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

    def _entries(self) -> Iterator[tuple[str, os.DirEntry, str | None]]:
        """(relative path, entry, why it is not synced or None) of the included entries;
        os.scandir keeps a 10k-file stat cheap.

        Only regular files are read. A symbolic link is never followed (it could reach outside
        the source folder) and a named pipe, socket or device is never opened (a read could
        block the sync forever or never end), but each is reported with its reason rather than
        skipped in silence. A link to a folder is reported unless an exclude glob covers it,
        since include globs name files and cannot say whether the folder held any.
        """
        stack = [("", str(self.root))]
        while stack:
            prefix, folder = stack.pop()
            with os.scandir(folder) as entries:
                ordered = sorted(entries, key=lambda e: e.name)
            for entry in ordered:
                hidden = entry.name.startswith(".")
                if hidden and entry.is_dir(follow_symlinks=False):
                    continue
                relative = f"{prefix}{entry.name}"
                if entry.is_symlink():
                    to_folder = _is_dir(entry)
                    if to_folder and not hidden and glob_match(relative + "/", [], self.exclude):
                        yield relative, entry, "symbolic link to a folder: links are not followed, so a source never reaches outside its folder"
                    elif not to_folder and glob_match(relative, self.include, self.exclude):
                        yield relative, entry, "symbolic link: links are not followed, so a source never reaches outside its folder; copy the file in instead"
                elif entry.is_dir(follow_symlinks=False):
                    stack.append((relative + "/", entry.path))
                elif glob_match(relative, self.include, self.exclude):
                    yield relative, entry, None if entry.is_file(follow_symlinks=False) else _special_reason(entry)

    def scan(self, previous: Mapping[str, PreviousItem]) -> Iterator[ScanEvent]:
        if not self.root.is_dir():
            raise SourceError(f"local source {self.root} is not a folder")
        for relative, entry, unusable in self._entries():
            if not is_utf8_name(relative):
                yield Failed(printable_name(relative), "file name is not valid UTF-8; rename the file to sync it")
                continue
            uri = relative  # relative, so moving the folder does not make every document new
            if unusable is not None:
                yield Failed(uri, unusable)
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError as error:
                yield Failed(uri, f"cannot stat: {error}")
                continue
            fingerprint = f"{info.st_size}:{info.st_mtime_ns}"
            known = previous.get(uri)
            if known and known.validators.get("stat") == fingerprint:
                yield Unchanged(uri, known.version, {"stat": fingerprint})
                continue
            if info.st_size > self.max_bytes:
                yield Failed(uri, f"over the size limit ({info.st_size} > {self.max_bytes} bytes)")
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


def _is_dir(entry: os.DirEntry) -> bool:
    """Whether a link points at a folder (a stat of the target; nothing is read or listed)."""
    try:
        return entry.is_dir(follow_symlinks=True)
    except OSError:  # a loop or a target we may not stat
        return False


def _special_reason(entry: os.DirEntry) -> str:
    try:
        mode = entry.stat(follow_symlinks=False).st_mode
    except OSError as error:
        return f"cannot stat: {error}"
    if stat.S_ISFIFO(mode):
        kind = "named pipe (FIFO)"
    elif stat.S_ISSOCK(mode):
        kind = "socket"
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        kind = "device file"
    else:
        kind = "special file"
    return f"{kind}: not a regular file, never opened (reading it could block the sync)"
