"""Incremental corpus sync: previous documents + connector scans -> new documents table.

Only new and changed items are fetched and parsed (connectors decide from version
fingerprints); an item the previous sync knew and the scan no longer lists becomes a tombstone.
Every input that could not be fetched or parsed lands in the quarantine table with its reason,
and is not recorded as synced, so the next run tries it again. That includes an input whose
name or text no table can hold (a file name that is not UTF-8): one bad item is a quarantine
row, never the end of the customer's sync. When a whole source cannot be
listed, its documents are kept as they were (never tombstoned on a failed listing), and its
status in `SyncResult.sources` is `failed` with the reason, so callers can report it and fail.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import polars as pl

from core.progress import Progress
from corpus.parsing import ParsedDocument, ParseError, parse_bytes
from corpus.sources.base import Connector, Failed, Fetched, PreviousItem, SourceError, Unchanged, is_utf8_name, printable_name

log = logging.getLogger(__name__)

DOCUMENT_SCHEMA = {
    "doc_id": pl.Utf8,
    "source": pl.Utf8,
    "uri": pl.Utf8,
    "part": pl.Utf8,
    "title": pl.Utf8,
    "text": pl.Utf8,
    "kind": pl.Utf8,
    "domain": pl.Utf8,
    "content_hash": pl.Utf8,
    "version": pl.Utf8,
    "validators": pl.Utf8,
    "metadata": pl.Utf8,
    "fetched_at": pl.Utf8,
    "deleted": pl.Boolean,
}
QUARANTINE_SCHEMA = {"source": pl.Utf8, "uri": pl.Utf8, "stage": pl.Utf8, "reason": pl.Utf8, "at": pl.Utf8}


def document_id(source: str, uri: str, part: str = "") -> str:
    return hashlib.sha256(f"{source}\x00{uri}\x00{part}".encode()).hexdigest()[:16]


def text_hash(title: str, text: str) -> str:
    return hashlib.sha256(f"{title}\x00{text}".encode()).hexdigest()


@dataclass
class SyncCounts:
    added: int = 0
    changed: int = 0
    deleted: int = 0
    unchanged: int = 0
    quarantined: int = 0
    fetched: int = 0

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in ("added", "changed", "deleted", "unchanged", "quarantined", "fetched")}


    def add(self, other: SyncCounts) -> None:
        for name in ("added", "changed", "deleted", "unchanged", "quarantined", "fetched"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class SourceStatus:
    """How one source fared in a sync: `ok`, or `failed` when it could not be listed as a whole
    (its documents were kept as they were, and `reason` says why)."""

    source: str
    status: str
    counts: SyncCounts
    reason: str | None = None

    def as_dict(self) -> dict:
        return {"source": self.source, "status": self.status, **({"reason": self.reason} if self.reason else {}), **self.counts.as_dict()}


@dataclass
class SyncResult:
    documents: pl.DataFrame
    quarantine: pl.DataFrame
    counts: SyncCounts
    touched_doc_ids: list[str] = field(default_factory=list)  # added or changed this run
    deleted_doc_ids: list[str] = field(default_factory=list)
    sources: list[SourceStatus] = field(default_factory=list)  # one per connector, in order

    @property
    def failed_sources(self) -> list[SourceStatus]:
        return [status for status in self.sources if status.status != "ok"]


def empty_documents() -> pl.DataFrame:
    return pl.DataFrame(schema=DOCUMENT_SCHEMA)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _previous_items(previous: pl.DataFrame, source: str) -> tuple[dict[str, PreviousItem], dict[str, list[dict]]]:
    rows_by_uri: dict[str, list[dict]] = defaultdict(list)
    for row in previous.filter((pl.col("source") == source) & ~pl.col("deleted")).iter_rows(named=True):
        rows_by_uri[row["uri"]].append(row)
    items = {
        uri: PreviousItem(rows[0]["version"], json.loads(rows[0]["validators"] or "{}")) for uri, rows in rows_by_uri.items()
    }
    return items, rows_by_uri


class _SourceSync:
    """Applies one connector's scan events against that source's previous rows."""

    def __init__(self, source: str, domain: str, previous_items: dict[str, PreviousItem], previous_rows: dict[str, list[dict]], counts: SyncCounts, stamp: str):
        self.source, self.domain, self.counts, self.stamp = source, domain, counts, stamp
        self.previous_items, self.previous_rows = previous_items, previous_rows
        self.rows: list[dict] = []
        self.quarantine: list[dict] = []
        self.seen_uris: set[str] = set()
        self.touched: list[str] = []
        self.deleted: list[str] = []

    def _quarantine(self, uri: str, stage: str, reason: str) -> None:
        self.quarantine.append({"source": self.source, "uri": uri, "stage": stage, "reason": reason, "at": self.stamp})
        self.counts.quarantined += 1
        # Keep what we had: a broken new version never erases a good old one.
        for row in self.previous_rows.get(uri, []):
            self.rows.append(row)

    def _tombstone(self, row: dict) -> None:
        self.rows.append({**row, "text": "", "deleted": True, "fetched_at": self.stamp})
        self.deleted.append(row["doc_id"])
        self.counts.deleted += 1

    def apply(self, event: Fetched | Unchanged | Failed) -> None:
        self.seen_uris.add(event.uri)
        if not is_utf8_name(event.uri):  # whatever the connector: no table can store this uri
            self._quarantine(printable_name(event.uri), "fetch", "name is not valid UTF-8; rename it to sync it")
            return
        if isinstance(event, Failed):
            self._quarantine(event.uri, "fetch", event.reason)
            return
        if isinstance(event, Unchanged):
            self._keep_unchanged(event)
            return
        self.counts.fetched += 1
        try:
            parsed = parse_bytes(event.data, event.name, event.media_type, event.title)
        except ParseError as error:
            self._quarantine(event.uri, "parse", str(error))
            return
        except Exception as error:  # a parser bug must not lose the rest of the corpus
            self._quarantine(event.uri, "parse", f"{type(error).__name__}: {error}")
            return
        try:
            rows, vanished = self._document_rows(event, parsed)
        except Exception as error:  # e.g. text with a lone surrogate, which no hash or table holds
            self._quarantine(event.uri, "parse", f"{type(error).__name__}: {error}")
            return
        self.rows.extend(rows)
        for row in vanished:  # parts that vanished from a multi-document file
            self._tombstone(row)

    def _keep_unchanged(self, event: Unchanged) -> None:
        rows = self.previous_rows.get(event.uri, [])
        known = self.previous_items.get(event.uri)
        same = not event.validators or (known is not None and dict(event.validators) == dict(known.validators))
        validators = None if same else json.dumps(dict(event.validators))
        for row in rows:
            self.rows.append(row if same else {**row, "validators": validators})
        self.counts.unchanged += len(rows)

    def _document_rows(self, event: Fetched, parsed: list[ParsedDocument]) -> tuple[list[dict], list[dict]]:
        """The rows of one fetched item and the previous rows it no longer has. Counts are only
        touched once every row was built, so a failure halfway leaves no trace but the quarantine."""
        old = {row["doc_id"]: row for row in self.previous_rows.get(event.uri, [])}
        rows, outcomes = [], []
        for document in parsed:
            doc_id = document_id(self.source, event.uri, document.part)
            digest = text_hash(document.title, document.text)
            previous = old.pop(doc_id, None)
            outcome = "added" if previous is None else ("changed" if previous["content_hash"] != digest else "unchanged")
            outcomes.append((doc_id, outcome))
            rows.append(
                {
                    "doc_id": doc_id,
                    "source": self.source,
                    "uri": event.uri,
                    "part": document.part,
                    "title": document.title,
                    "text": document.text,
                    "kind": document.kind,
                    "domain": self.domain,
                    "content_hash": digest,
                    "version": event.version,
                    "validators": json.dumps(dict(event.validators)),
                    "metadata": json.dumps({**event.metadata, **document.metadata}),
                    "fetched_at": previous["fetched_at"] if outcome == "unchanged" else self.stamp,
                    "deleted": False,
                }
            )
        for doc_id, outcome in outcomes:
            setattr(self.counts, outcome, getattr(self.counts, outcome) + 1)
            if outcome != "unchanged":
                self.touched.append(doc_id)
        return rows, list(old.values())

    def finish(self) -> None:
        for uri, rows in self.previous_rows.items():
            if uri not in self.seen_uris:
                for row in rows:
                    self._tombstone(row)


def sync_sources(
    connectors: Iterable[Connector],
    previous: pl.DataFrame | None,
    domain: str,
    on_event: Callable[[str], None] | None = None,
) -> SyncResult:
    previous = previous if previous is not None else empty_documents()
    counts = SyncCounts()
    stamp = _now()
    rows: list[dict] = []
    quarantine: list[dict] = []
    touched: list[str] = []
    deleted: list[str] = []
    live_sources = set()
    statuses: list[SourceStatus] = []
    for connector in connectors:
        key = connector.source_key
        live_sources.add(key)
        items, previous_rows = _previous_items(previous, key)
        source_counts = SyncCounts()
        state = _SourceSync(key, domain, items, previous_rows, source_counts, stamp)
        progress = Progress(log, f"documents scanned in {key}")
        try:
            for event in connector.scan(items):
                state.apply(event)
                progress.advance()
                if on_event:
                    on_event(event.uri)
            state.finish()
            statuses.append(SourceStatus(key, "ok", source_counts))
        except SourceError as error:
            log.warning("source %s could not be listed: %s", key, error)
            state.quarantine = [{"source": key, "uri": key, "stage": "list", "reason": str(error), "at": stamp}]
            # Nothing from a half-finished scan is trusted: keep every previous row of this source.
            state.rows = [row for uri_rows in previous_rows.values() for row in uri_rows]
            state.touched, state.deleted = [], []
            source_counts = SyncCounts(quarantined=1)  # nothing of the half-finished scan counts
            statuses.append(SourceStatus(key, "failed", source_counts, str(error)))
        counts.add(source_counts)
        rows.extend(state.rows)
        quarantine.extend(state.quarantine)
        touched.extend(state.touched)
        deleted.extend(state.deleted)
    # A source removed from the customer file: its documents become tombstones.
    for row in previous.filter(~pl.col("source").is_in(list(live_sources)) & ~pl.col("deleted")).iter_rows(named=True):
        rows.append({**row, "text": "", "deleted": True, "fetched_at": stamp})
        deleted.append(row["doc_id"])
        counts.deleted += 1
    documents = pl.DataFrame(rows, schema=DOCUMENT_SCHEMA) if rows else empty_documents()
    documents = documents.unique(subset="doc_id", keep="first", maintain_order=True)
    return SyncResult(documents, pl.DataFrame(quarantine, schema=QUARANTINE_SCHEMA), counts, touched, deleted, statuses)
