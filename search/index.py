"""The hybrid per-customer index: one Chroma collection (dense) + a BM25 folder (sparse).

Why one collection per customer, named by customer, embedding model and chunker signature:
customers are hard-partitioned at build time (a query can never reach another customer's
vectors, with no filter to forget), and a changed model or chunker builds a *new* collection
instead of mixing incomparable vectors; the collection metadata records what built it.

Why incremental: embedding dominates CPU ingest (~40 chunks/s on 2 cores), and chunk ids are
content hashes, so an id already in the collection already has the right vector. An update
embeds only ids missing from the collection and deletes ids no longer in the chunk table.
BM25 is rebuilt from the whole table each time (no embedding; seconds at 100k chunks).

Why exclusion by over-fetching: Chroma silently ignores `$nin` on ids, and a metadata `$nin`
costs ~0.3 s per query at 100k chunks. Each leg fetches `k + |exclude|` and drops seen ids in
code, which is exact for BM25 and as good as HNSW for the dense leg.

The chunk texts, titles and token counts are held in memory (`ChunkTable`): hits, grep and
`read_document` never round-trip to Chroma for text.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from core.progress import Progress
from search.backend import Hit
from search.bm25 import BM25Index, ids_fingerprint
from search.embeddings import TextEmbedder
from search.fusion import RRF_K, rrf

log = logging.getLogger(__name__)

INDEX_FORMAT_VERSION = "1"
FUSE_DEPTH = 50  # top 50 of each leg go into RRF (Context-1)
DEFAULT_WRITE_BATCH = 300  # Chroma Cloud accepts at most 300 records per write
DEFAULT_READ_BATCH = 5000
DEFAULT_EMBED_BLOCK = 1024  # texts per embedder call: length-sorting pays off over large blocks
DEFAULT_GREP_TIMEOUT_S = 2.0
_QUERY_CACHE_SIZE = 4096

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """One process-wide pool runs the dense leg beside the caller's BM25 leg (both mostly
    release the GIL: Chroma's Rust core and numpy)."""
    global _POOL
    if _POOL is None:
        with _POOL_LOCK:
            if _POOL is None:
                _POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="searchsmith-dense")
    return _POOL


class IndexNotBuilt(LookupError):
    """The customer's collection for this model and chunker does not exist yet."""


@dataclass(frozen=True)
class IndexStats:
    """What one `build_or_update` did (the asset attaches it as metadata)."""

    collection: str
    embedded: int
    deleted: int
    kept: int
    total: int
    seconds: float
    embed_seconds: float
    created: bool
    duplicates_dropped: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _slug(text: str, limit: int) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:limit].strip("-") or "x"


def collection_name(customer: str, embedding_model: str, chunker: str) -> str:
    """`<customer>-<model>-<hash>`: readable, valid for Chroma ([a-zA-Z0-9._-], 3-512 chars),
    and different whenever the customer, the embedding model or the chunker signature is."""
    digest = hashlib.sha256(f"{customer}\x00{embedding_model}\x00{chunker}\x00{INDEX_FORMAT_VERSION}".encode()).hexdigest()[:12]
    return f"{_slug(customer, 48)}-{_slug(embedding_model, 32)}-{digest}"


class ChunkTable:
    """The chunk rows the index serves, as plain lists (fast to index from any thread)."""

    def __init__(self, frame: pl.DataFrame):
        n = frame.height
        self.ids: list[str] = frame.get_column("chunk_id").to_list()
        self.doc_ids: list[str] = frame.get_column("doc_id").to_list()
        self.texts: list[str] = [text or "" for text in frame.get_column("text").to_list()]
        self.titles: list[str] = (
            [title or "" for title in frame.get_column("title").to_list()] if "title" in frame.columns else [""] * n
        )
        self.n_tokens: list[int] = (
            [int(v or 0) for v in frame.get_column("n_tokens").to_list()] if "n_tokens" in frame.columns else [0] * n
        )
        order: list[int] = frame.get_column("index").to_list() if "index" in frame.columns else list(range(n))
        self.order: list[int] = [int(v) if v is not None else i for i, v in enumerate(order)]
        self.positions: dict[str, int] = {chunk_id: pos for pos, chunk_id in enumerate(self.ids)}
        by_doc: dict[str, list[int]] = {}
        for pos, doc_id in enumerate(self.doc_ids):
            by_doc.setdefault(doc_id, []).append(pos)
        for positions in by_doc.values():
            positions.sort(key=lambda pos: (self.order[pos], pos))
        self.doc_positions = by_doc
        self._haystack: tuple[str, list[int]] | None = None
        self._haystack_lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.ids)

    def haystack(self) -> tuple[str, list[int]]:
        """All texts joined by newlines, and where each starts: one C-level regex scan over it
        is ~10x faster than a Python loop over 100k chunks (built on the first grep)."""
        if self._haystack is None:
            with self._haystack_lock:
                if self._haystack is None:
                    starts, offset = [], 0
                    for text in self.texts:
                        starts.append(offset)
                        offset += len(text) + 1
                    self._haystack = ("\n".join(self.texts), starts)
        return self._haystack

    def hit(self, pos: int, score: float = 0.0, rank: int = 0) -> Hit:
        return Hit(
            chunk_id=self.ids[pos],
            doc_id=self.doc_ids[pos],
            title=self.titles[pos],
            text=self.texts[pos],
            score=float(score),
            n_tokens=self.n_tokens[pos],
            rank=rank,
        )


@dataclass(frozen=True)
class _State:
    """Everything a query reads, swapped as one object so searches during an update see
    either the old index or the new one, never half of each."""

    collection: Any
    name: str
    chunker: str
    table: ChunkTable
    bm25: BM25Index


def _prepare_chunks(chunks: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    missing = {"chunk_id", "doc_id", "text"} - set(chunks.columns)
    if missing:
        raise ValueError(f"chunk table lacks columns: {sorted(missing)}")
    unique = chunks.unique("chunk_id", keep="first", maintain_order=True)
    return unique, chunks.height - unique.height


EMPTY_CHUNKER = "none"  # signature used for an empty first build (no chunk says which chunker)


def _chunker_of(chunks: pl.DataFrame, fallback: str | None) -> str:
    if chunks.height == 0:
        return fallback or EMPTY_CHUNKER
    if "chunker" not in chunks.columns:
        if fallback is None:
            raise ValueError("pass chunker=... (the chunk table has no 'chunker' column)")
        return fallback
    signatures = chunks.get_column("chunker").unique().to_list()
    if len(signatures) != 1 or signatures[0] is None:
        raise ValueError(f"chunks come from several chunker signatures {signatures}; re-chunk first")
    return str(signatures[0])


def _compile_grep(pattern: str, ignore_case: bool, multiline: bool = False):
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


def _chunk_local(pattern: str) -> bool:
    """True when every match of `pattern` in a chunk is also a match at the same place in the
    newline-joined texts (compiled MULTILINE), so the joined scan can find candidates."""
    return not (_GROUP_OPENING.search(pattern) or _CONTEXT_ESCAPES.search(pattern))


class HybridIndex:
    """A customer's hybrid index; implements `search.backend.SearchBackend`.

    `build_or_update(chunks)` makes the collection match the chunk table (embedding only new
    ids); `load(chunks)` attaches to an existing collection for search without embedding.
    `bm25_dir` is where the BM25 index is saved (the caller syncs it to the artifact store);
    `None` keeps it in memory only.
    """

    def __init__(
        self,
        client: Any,
        customer: str,
        embedder: TextEmbedder,
        bm25_dir: str | Path | None = None,
        *,
        write_batch: int = DEFAULT_WRITE_BATCH,
        read_batch: int = DEFAULT_READ_BATCH,
        embed_block: int = DEFAULT_EMBED_BLOCK,
        fuse_depth: int = FUSE_DEPTH,
        rrf_k: int = RRF_K,
        grep_timeout_s: float = DEFAULT_GREP_TIMEOUT_S,
        store_documents: bool = True,
        hnsw: dict[str, Any] | None = None,
    ):
        self.client = client
        self.customer = customer
        self.embedder = embedder
        self.bm25_dir = Path(bm25_dir) if bm25_dir is not None else None
        self.write_batch = max(1, int(write_batch))
        self.read_batch = max(1, int(read_batch))
        self.embed_block = max(1, int(embed_block))
        self.fuse_depth = fuse_depth
        self.rrf_k = rrf_k
        self.grep_timeout_s = grep_timeout_s
        self.store_documents = store_documents
        self.hnsw = {"space": "cosine", **(hnsw or {})}
        self._state: _State | None = None
        self._query_cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._query_lock = threading.Lock()
        self._update_lock = threading.Lock()

    # -- naming and collections --------------------------------------------------------------

    def collection_name(self, chunker: str) -> str:
        return collection_name(self.customer, self.embedder.name, chunker)

    def _metadata(self, chunker: str) -> dict[str, Any]:
        return {
            "customer": self.customer,
            "embedding_model": self.embedder.name,
            "embedding_dims": int(self.embedder.dims),
            "chunker": chunker,
            "index_format": INDEX_FORMAT_VERSION,
            "space": self.hnsw["space"],
        }

    def _get_collection(self, name: str):
        try:
            return self.client.get_collection(name, embedding_function=None)
        except Exception as error:  # NotFoundError / ValueError / InvalidCollectionException by version
            if "not exist" in str(error).lower() or "not found" in str(error).lower() or type(error).__name__ in {
                "NotFoundError",
                "InvalidCollectionException",
            }:
                raise IndexNotBuilt(f"no collection {name!r} for customer {self.customer!r}") from None
            raise

    def _open_or_create(self, chunker: str) -> tuple[Any, bool]:
        name = self.collection_name(chunker)
        try:
            collection = self._get_collection(name)
        except IndexNotBuilt:
            collection = self.client.create_collection(
                name,
                metadata=self._metadata(chunker),
                configuration={"hnsw": dict(self.hnsw)},
                embedding_function=None,
                get_or_create=True,
            )
            return collection, True
        meta = collection.metadata or {}
        expected = self._metadata(chunker)
        for key in ("customer", "embedding_model", "embedding_dims", "chunker"):
            if key in meta and meta[key] != expected[key]:
                raise ValueError(f"collection {name!r} has {key}={meta[key]!r}, expected {expected[key]!r}")
        return collection, False

    def customer_collections(self) -> list[str]:
        """Names of every collection built for this customer (any model or chunker)."""
        names = []
        for item in self.client.list_collections():
            collection = item if hasattr(item, "metadata") else self._get_collection(str(item))
            if (collection.metadata or {}).get("customer") == self.customer:
                names.append(collection.name)
        return sorted(names)

    def drop_stale_collections(self) -> list[str]:
        """Delete this customer's collections other than the current one (after a model or
        chunker change has been promoted)."""
        current = self.state.name
        dropped = [name for name in self.customer_collections() if name != current]
        for name in dropped:
            self.client.delete_collection(name)
        return dropped

    @property
    def state(self) -> _State:
        state = self._state
        if state is None:
            raise IndexNotBuilt(f"index for {self.customer!r} is neither built nor loaded")
        return state

    @property
    def collection(self):
        return self.state.collection

    @property
    def name(self) -> str:
        return self.state.name

    def count(self) -> int:
        """Chunks served (0 before build/load); the collection count is checked separately."""
        state = self._state
        return len(state.table) if state else 0

    # -- building ----------------------------------------------------------------------------

    def stored_ids(self, collection: Any | None = None) -> list[str]:
        """All ids in the collection, paged (Cloud caps the records per request)."""
        collection = collection if collection is not None else self.collection
        ids: list[str] = []
        offset = 0
        while True:
            page = collection.get(include=[], limit=self.read_batch, offset=offset)["ids"]
            ids.extend(page)
            if len(page) < self.read_batch:
                return ids
            offset += len(page)

    def build_or_update(self, chunks: pl.DataFrame, chunker: str | None = None) -> IndexStats:
        """Make the customer's collection and BM25 index match `chunks`, embedding only new ids."""
        started = time.perf_counter()
        with self._update_lock:
            frame, duplicates = _prepare_chunks(chunks)
            chunker = chunker or _chunker_of(frame, self._state.chunker if self._state else None)
            collection, created = self._open_or_create(chunker)
            table = ChunkTable(frame)
            stored = set() if created else set(self.stored_ids(collection))
            wanted = table.positions
            stale = [chunk_id for chunk_id in stored if chunk_id not in wanted]
            new_positions = [pos for pos, chunk_id in enumerate(table.ids) if chunk_id not in stored]

            for start in range(0, len(stale), self.write_batch):
                collection.delete(ids=stale[start : start + self.write_batch])
            embed_seconds = self._embed_and_write(collection, table, new_positions)

            bm25 = BM25Index.build(table.ids, table.texts)
            name = collection.name
            if self.bm25_dir is not None:
                bm25.save(self.bm25_dir, collection=name)
            self._state = _State(collection, name, chunker, table, bm25)
        return IndexStats(
            collection=name,
            embedded=len(new_positions),
            deleted=len(stale),
            kept=len(table) - len(new_positions),
            total=len(table),
            seconds=time.perf_counter() - started,
            embed_seconds=embed_seconds,
            created=created,
            duplicates_dropped=duplicates,
        )

    def _embed_and_write(self, collection: Any, table: ChunkTable, positions: Sequence[int]) -> float:
        """Embed new chunks block by block and upsert each block in write batches, so a crash
        keeps what was written and the next update resumes from there."""
        embed_seconds = 0.0
        progress = Progress(log, "chunks embedded", len(positions))
        for block_start in range(0, len(positions), self.embed_block):
            block = positions[block_start : block_start + self.embed_block]
            tick = time.perf_counter()
            vectors = self.embedder.encode([table.texts[pos] for pos in block])
            embed_seconds += time.perf_counter() - tick
            self._write(collection, table, block, vectors)
            progress.advance(len(block))
        return embed_seconds

    def _write(self, collection: Any, table: ChunkTable, positions: Sequence[int], vectors: np.ndarray) -> None:
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.shape[0] != len(positions):
            raise ValueError(f"embedder returned {vectors.shape[0]} vectors for {len(positions)} texts")
        for start in range(0, len(positions), self.write_batch):
            batch = positions[start : start + self.write_batch]
            record: dict[str, Any] = {
                "ids": [table.ids[pos] for pos in batch],
                "embeddings": vectors[start : start + len(batch)],
                "metadatas": [
                    {"doc_id": table.doc_ids[pos], "index": table.order[pos], "n_tokens": table.n_tokens[pos], "title": table.titles[pos]}
                    for pos in batch
                ],
            }
            if self.store_documents:
                record["documents"] = [table.texts[pos] for pos in batch]
            collection.upsert(**record)

    def load(self, chunks: pl.DataFrame, chunker: str | None = None) -> HybridIndex:
        """Attach to the built collection for `chunks` without embedding anything.

        BM25 is loaded from `bm25_dir` when its manifest matches this collection and these
        chunk ids, and rebuilt in memory otherwise (the caller may have synced an older one).
        """
        frame, _ = _prepare_chunks(chunks)
        chunker = chunker or _chunker_of(frame, None)
        name = self.collection_name(chunker)
        collection = self._get_collection(name)
        table = ChunkTable(frame)
        bm25 = None
        if self.bm25_dir is not None:
            manifest = BM25Index.read_manifest(self.bm25_dir)
            if manifest and manifest.get("collection") == name and manifest.get("fingerprint") == ids_fingerprint(table.ids):
                try:
                    bm25 = BM25Index.load(self.bm25_dir)
                except (OSError, ValueError):
                    bm25 = None
        if bm25 is None:
            bm25 = BM25Index.build(table.ids, table.texts)
        self._state = _State(collection, name, chunker, table, bm25)
        return self

    # -- queries -----------------------------------------------------------------------------

    def embed_query(self, query: str) -> np.ndarray:
        """The query's vector, cached (agents repeat queries; the model costs ~10 ms a query)."""
        with self._query_lock:
            vector = self._query_cache.get(query)
            if vector is not None:
                self._query_cache.move_to_end(query)
                return vector
        vector = np.asarray(self.embedder.encode([query]), dtype=np.float32)[0]
        with self._query_lock:
            self._query_cache[query] = vector
            if len(self._query_cache) > _QUERY_CACHE_SIZE:
                self._query_cache.popitem(last=False)
        return vector

    @staticmethod
    def _as_set(exclude: Collection[str]) -> Collection[str]:
        if not exclude:
            return frozenset()
        return exclude if isinstance(exclude, (set, frozenset, dict)) else set(exclude)

    @staticmethod
    def _overfetch(table: ChunkTable, exclude: Collection[str]) -> int:
        """How many of this index's chunks `exclude` can remove (a C-level set intersection)."""
        if not exclude:
            return 0
        return len(table.positions.keys() & exclude)

    def _bm25_ranked(self, state: _State, query: str, k: int, exclude: Collection[str]) -> list[tuple[str, float]]:
        return state.bm25.search(query, k, exclude)

    def _dense_ranked(
        self, state: _State, query: str, k: int, exclude: Collection[str], query_embedding: np.ndarray | None
    ) -> list[tuple[str, float]]:
        n_stored = len(state.table)
        if k <= 0 or n_stored == 0:
            return []
        vector = self.embed_query(query) if query_embedding is None else np.asarray(query_embedding, dtype=np.float32)
        vector = vector.reshape(1, -1)
        needed = min(n_stored, k + self._overfetch(state.table, exclude))
        # Cheap first try (HNSW cost grows with n_results past ef_search): k plus at most k
        # extra; only when seen chunks ate into that do we pay for the full over-fetch.
        n_results = min(needed, 2 * k)
        positions = state.table.positions
        while True:
            result = state.collection.query(query_embeddings=vector, n_results=n_results, include=["distances"])
            ranked: list[tuple[str, float]] = []
            for chunk_id, distance in zip(result["ids"][0], result["distances"][0]):
                if chunk_id in exclude or chunk_id not in positions:
                    continue
                ranked.append((chunk_id, 1.0 - float(distance)))
                if len(ranked) == k:
                    return ranked
            if n_results >= needed:
                return ranked
            n_results = needed

    @staticmethod
    def _to_hits(state: _State, ranked: Iterable[tuple[str, float]]) -> list[Hit]:
        positions = state.table.positions
        return [state.table.hit(positions[chunk_id], score, rank) for rank, (chunk_id, score) in enumerate(ranked, start=1)]

    def search_bm25(self, query: str, k: int = 50, exclude: Collection[str] = ()) -> list[Hit]:
        state = self.state
        return self._to_hits(state, self._bm25_ranked(state, query, k, self._as_set(exclude)))

    def search_dense(
        self, query: str, k: int = 50, exclude: Collection[str] = (), query_embedding: np.ndarray | None = None
    ) -> list[Hit]:
        """Dense leg alone; `query_embedding` skips embedding the query (benchmarks, callers
        that embedded a batch of queries at once)."""
        state = self.state
        return self._to_hits(state, self._dense_ranked(state, query, k, self._as_set(exclude), query_embedding))

    def search(
        self, query: str, k: int = 50, exclude: Collection[str] = (), query_embedding: np.ndarray | None = None
    ) -> list[Hit]:
        """BM25 and dense top-`fuse_depth` in parallel (dense in the pool, BM25 here), RRF,
        best `k` unseen chunks; `Hit.score` is the RRF score, `Hit.rank` 1-based."""
        state = self.state
        exclude = self._as_set(exclude)
        depth = max(self.fuse_depth, k)
        dense_future = _pool().submit(self._dense_ranked, state, query, depth, exclude, query_embedding)
        try:
            sparse = self._bm25_ranked(state, query, depth, exclude)
        finally:
            dense = dense_future.result()
        fused = rrf([[chunk_id for chunk_id, _ in sparse], [chunk_id for chunk_id, _ in dense]], k=self.rrf_k)
        return self._to_hits(state, fused[:k])

    def grep(
        self,
        pattern: str,
        limit: int = 5,
        exclude: Collection[str] = (),
        *,
        ignore_case: bool = False,
        timeout_s: float | None = None,
    ) -> list[Hit]:
        """First `limit` unseen chunks (reading order) whose text matches `pattern`.

        Uses the `regex` package's per-call timeout against a deadline for the whole scan, so
        catastrophic backtracking costs at most `timeout_s`; raises ValueError for an invalid
        pattern or a timeout (the harness shows the message to the model).
        """
        state = self.state
        compiled = _compile_grep(pattern, ignore_case)
        if limit <= 0:
            return []
        exclude = self._as_set(exclude)
        budget = self.grep_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + budget

        def remaining() -> float:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            return left

        try:
            if _chunk_local(pattern):
                positions = self._grep_joined(state.table, _compile_grep(pattern, ignore_case, True), compiled, limit, exclude, remaining)
            else:
                positions = self._grep_each(state.table, compiled, limit, exclude, remaining)
        except TimeoutError:
            raise ValueError(
                f"regular expression {pattern!r} took longer than {budget:.1f}s (catastrophic backtracking?); simplify it"
            ) from None
        return [state.table.hit(pos, 1.0, rank) for rank, pos in enumerate(positions, start=1)]

    @staticmethod
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

    @staticmethod
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

    def document_chunks(self, doc_id: str) -> list[Hit]:
        state = self._state
        if state is None:
            return []
        return [state.table.hit(pos, 0.0, rank) for rank, pos in enumerate(state.table.doc_positions.get(doc_id, []), start=1)]

    def document_title(self, doc_id: str) -> str | None:
        state = self._state
        if state is None:
            return None
        positions = state.table.doc_positions.get(doc_id)
        return state.table.titles[positions[0]] if positions else None

    def has_chunk(self, chunk_id: str) -> bool:
        state = self._state
        return bool(state and chunk_id in state.table.positions)

    def chunk(self, chunk_id: str) -> Hit | None:
        state = self._state
        if state is None or chunk_id not in state.table.positions:
            return None
        return state.table.hit(state.table.positions[chunk_id])


# -- asset checks (pure functions over a built index) ----------------------------------------


def index_count_matches_chunks(index: HybridIndex, chunks: pl.DataFrame) -> tuple[bool, dict[str, Any]]:
    """The collection, BM25 and in-memory table each hold exactly the table's unique chunk ids."""
    expected = set(chunks.get_column("chunk_id").to_list())
    stored = set(index.stored_ids())
    state = index.state
    details = {
        "chunks": len(expected),
        "collection": index.collection.count(),
        "bm25": len(state.bm25),
        "table": len(state.table),
        "missing": len(expected - stored),
        "extra": len(stored - expected),
    }
    ok = details["missing"] == 0 and details["extra"] == 0 and details["chunks"] == details["collection"] == details["bm25"] == details["table"]
    return ok, details


def no_duplicate_ids(index: HybridIndex) -> tuple[bool, dict[str, Any]]:
    """No chunk id appears twice in the collection, the BM25 id list or the in-memory table."""
    stored = index.stored_ids()
    state = index.state
    details = {
        "collection_duplicates": len(stored) - len(set(stored)),
        "bm25_duplicates": len(state.bm25.ids) - len(set(state.bm25.ids)),
        "table_duplicates": len(state.table.ids) - len(set(state.table.ids)),
    }
    return all(value == 0 for value in details.values()), details


def stored_embeddings(index: HybridIndex) -> tuple[list[str], np.ndarray]:
    """Every id and vector in the collection, paged."""
    collection = index.collection
    ids: list[str] = []
    blocks: list[np.ndarray] = []
    offset = 0
    while True:
        page = collection.get(include=["embeddings"], limit=index.read_batch, offset=offset)
        ids.extend(page["ids"])
        if len(page["ids"]):
            blocks.append(np.asarray(page["embeddings"], dtype=np.float32))
        if len(page["ids"]) < index.read_batch:
            break
        offset += len(page["ids"])
    dims = blocks[0].shape[1] if blocks else 0
    return ids, (np.concatenate(blocks) if blocks else np.zeros((0, dims), dtype=np.float32))


def dense_recall_vs_brute_force(index: HybridIndex, sample_queries: Sequence[str] | np.ndarray, k: int = 10) -> float:
    """Mean overlap of Chroma's HNSW top-k with exact cosine top-k over all stored vectors.

    `sample_queries` are texts (embedded with the index's embedder) or a 2-D array of vectors.
    """
    ids, matrix = stored_embeddings(index)
    if not len(ids) or not len(sample_queries):
        return 1.0
    if isinstance(sample_queries, np.ndarray):
        queries = np.asarray(sample_queries, dtype=np.float32).reshape(len(sample_queries), -1)
    else:
        queries = np.stack([index.embed_query(query) for query in sample_queries])
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    unit = matrix / norms
    k = min(k, len(ids))
    recalls = []
    for vector in queries:
        q = vector / (np.linalg.norm(vector) or 1.0)
        exact = {ids[i] for i in np.argsort(-(unit @ q), kind="stable")[:k]}
        approx = index.collection.query(query_embeddings=vector.reshape(1, -1), n_results=k, include=[])["ids"][0]
        recalls.append(len(exact & set(approx)) / k)
    return float(np.mean(recalls))
