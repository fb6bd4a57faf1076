"""The hybrid per-customer index: one Chroma collection (dense) + a BM25 folder (sparse).

One collection per customer, embedding model and chunker signature (`search.collection_naming`
says why); the collection metadata records what built it. The collection's lifecycle (open or
create, drop stale ones, incremental update) and the hybrid query live here; the in-memory chunk
rows (`search.chunk_table`), grep (`search.grep`) and the asset checks (`search.index_checks`)
are their own modules.

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

import logging
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
from search.chunk_table import ChunkTable, prepare_chunks
from search.collection_naming import INDEX_FORMAT_VERSION, collection_name
from search.embeddings import TextEmbedder
from search.fusion import RRF_K, rrf
from search.grep import grep_chunks

log = logging.getLogger(__name__)

FUSE_DEPTH = 50  # top 50 of each leg go into RRF (Context-1)
# Candidates Chroma's HNSW explores per query (its default is 100). At 100, two builds of the same
# embeddings (the dev file's 5,834 chunks, 200 queries, top 50 of 100 fetched) disagreed on 40
# lists and missed 127 of the 10,000 exact neighbours (builds insert in parallel, so the graph
# differs run to run): a benchmark's hybrid row moved by a question between two builds of one
# corpus. At 400 they disagreed on 1 list and missed 7, at the same 3-6 ms a query.
SEARCH_EF = 400
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


@dataclass(frozen=True)
class _State:
    """Everything a query reads, swapped as one object so searches during an update see
    either the old index or the new one, never half of each."""

    collection: Any
    name: str
    chunker: str
    table: ChunkTable
    bm25: BM25Index


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
        self.hnsw = {"space": "cosine", "ef_search": SEARCH_EF, **(hnsw or {})}
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
        self._raise_search_ef(collection)
        meta = collection.metadata or {}
        expected = self._metadata(chunker)
        for key in ("customer", "embedding_model", "embedding_dims", "chunker"):
            if key in meta and meta[key] != expected[key]:
                raise ValueError(f"collection {name!r} has {key}={meta[key]!r}, expected {expected[key]!r}")
        return collection, False

    def _raise_search_ef(self, collection: Any) -> None:
        """A collection created with a lower `ef_search` (before `SEARCH_EF`, or by another tool)
        is raised to this index's: it is a search-time setting, so no rebuild is needed, and
        without it an old cached index and a fresh build of the same corpus rank differently."""
        wanted = self.hnsw.get("ef_search")
        configuration = getattr(collection, "configuration", None) or {}
        current = (configuration.get("hnsw") or {}).get("ef_search")
        if not wanted or current is None or current >= wanted:
            return
        try:
            collection.modify(configuration={"hnsw": {"ef_search": wanted}})
        except Exception as error:  # noqa: BLE001 - a server that refuses keeps serving at its own setting
            log.warning("could not raise ef_search of %s from %s to %s: %s", collection.name, current, wanted, error)

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
            frame, duplicates = prepare_chunks(chunks)
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
        frame, _ = prepare_chunks(chunks)
        chunker = chunker or _chunker_of(frame, None)
        name = self.collection_name(chunker)
        collection = self._get_collection(name)
        self._raise_search_ef(collection)
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
        """First `limit` unseen chunks (reading order) whose text matches `pattern` (`search.grep`)."""
        state = self.state
        budget = self.grep_timeout_s if timeout_s is None else timeout_s
        positions = grep_chunks(state.table, pattern, limit, self._as_set(exclude), ignore_case=ignore_case, timeout_s=budget)
        return [state.table.hit(pos, 1.0, rank) for rank, pos in enumerate(positions, start=1)]

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
