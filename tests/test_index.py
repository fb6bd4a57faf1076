"""The hybrid per-customer index: fusion, incremental updates, exclusion, grep, isolation, modes.

Most tests use a cheap deterministic bag-of-words hash embedder (the index logic does not care
which model made the vectors); the real packaged all-MiniLM-L6-v2 runs on a ~40-chunk corpus,
memoized for the session, because it costs ~25-50 chunks/s on 2 CPU cores.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from corpus.chunk_sync import CHUNK_SCHEMA
from corpus.chunking import chunk_id_for
from search.backend import Hit, SearchBackend
from search.bm25 import BM25Index, tokenize
from search.chroma_client import http_client, persistent_client
from search.fusion import rrf
from search.collection_naming import collection_name
from search.index import SEARCH_EF, HybridIndex, IndexNotBuilt
from search.index_checks import dense_recall_vs_brute_force, index_count_matches_chunks, no_duplicate_ids

DATA = Path(__file__).parent / "data" / "multihop_sample.jsonl"
CHUNKER = "v1:test:512"


# -- fixtures: corpora and embedders ---------------------------------------------------------


def _records() -> list[dict]:
    return [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]


def chunk_table(records: list[dict], chunker: str = CHUNKER, doc_prefix: str = "") -> pl.DataFrame:
    """One chunk per unique paragraph; paragraphs sharing a title form one document."""
    rows, seen, index_of = [], set(), {}
    for record in records:
        for paragraph in record["paragraphs"]:
            key = (paragraph["title"], paragraph["text"])
            if key in seen:
                continue
            seen.add(key)
            doc_id = doc_prefix + hashlib.sha1(paragraph["title"].encode()).hexdigest()[:12]
            index = index_of.get(doc_id, 0)
            index_of[doc_id] = index + 1
            rows.append(
                {
                    "chunk_id": chunk_id_for(doc_id, paragraph["text"]),
                    "doc_id": doc_id,
                    "index": index,
                    "title": paragraph["title"],
                    "text": paragraph["text"],
                    "start": 0,
                    "end": len(paragraph["text"]),
                    "n_tokens": len(paragraph["text"].split()),
                    "source": "test",
                    "uri": f"test://{doc_id}",
                    "domain": "web",
                    "content_hash": hashlib.sha1(paragraph["title"].encode()).hexdigest(),
                    "chunker": chunker,
                }
            )
    return pl.DataFrame(rows, schema=CHUNK_SCHEMA)


_TOKEN_VECTORS: dict[tuple[str, int], np.ndarray] = {}


class HashEmbedder:
    """Bag-of-words random projection: cheap, deterministic, and similar texts stay similar."""

    name = "test-hash-bow"

    def __init__(self, dims: int = 64):
        self._dims = dims

    @property
    def dims(self) -> int:
        return self._dims

    def _token(self, token: str) -> np.ndarray:
        vector = _TOKEN_VECTORS.get((token, self._dims))
        if vector is None:
            seed = int.from_bytes(hashlib.sha256(token.encode()).digest()[:8], "little")
            vector = np.random.default_rng(seed).standard_normal(self._dims).astype(np.float32)
            _TOKEN_VECTORS[(token, self._dims)] = vector
        return vector

    def encode(self, texts):
        rows = np.zeros((len(texts), self._dims), dtype=np.float32)
        for row, text in enumerate(texts):
            rows[row] = np.sum([self._token(token) for token in tokenize(text) or ["<empty>"]], axis=0)
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        return rows / norms


class MemoEmbedder:
    """Wraps an embedder so each distinct text is embedded once per test session."""

    def __init__(self, inner):
        self.inner = inner
        self.name = inner.name
        self.cache: dict[str, np.ndarray] = {}

    @property
    def dims(self) -> int:
        return self.inner.dims

    def encode(self, texts):
        texts = list(texts)
        todo = [text for text in dict.fromkeys(texts) if text not in self.cache]
        if todo:
            for text, vector in zip(todo, self.inner.encode(todo)):
                self.cache[text] = vector
        return np.asarray([self.cache[text] for text in texts], dtype=np.float32).reshape(len(texts), -1)


class SpyEmbedder:
    """Counts the texts the index asks to embed (queries included)."""

    def __init__(self, inner):
        self.inner = inner
        self.name = inner.name
        self.calls: list[list[str]] = []

    @property
    def dims(self) -> int:
        return self.inner.dims

    @property
    def texts_embedded(self) -> int:
        return sum(len(call) for call in self.calls)

    def reset(self) -> None:
        self.calls.clear()

    def encode(self, texts):
        texts = list(texts)
        self.calls.append(texts)
        return self.inner.encode(texts)


@pytest.fixture(scope="session")
def records() -> list[dict]:
    return _records()


@pytest.fixture(scope="session")
def chunks(records) -> pl.DataFrame:
    return chunk_table(records[:24])


@pytest.fixture(scope="session")
def small_chunks(records) -> pl.DataFrame:
    return chunk_table(records[:2])


@pytest.fixture(scope="session")
def real_embedder():
    from search.embeddings import Embedder

    return MemoEmbedder(Embedder())


@pytest.fixture
def client(tmp_path):
    return persistent_client(tmp_path / "chroma")


def make_index(client, tmp_path, customer="acme", embedder=None, **options) -> HybridIndex:
    return HybridIndex(client, customer, embedder or HashEmbedder(), tmp_path / f"bm25-{customer}", **options)


def questions(records) -> list[str]:
    return [record["question"] for record in records]


# -- fusion ----------------------------------------------------------------------------------


def test_rrf_on_hand_made_rankings():
    fused = rrf([["a", "b", "c"], ["b", "c", "d"]], k=60)
    assert [item for item, _ in fused] == ["b", "c", "a", "d"]
    scores = dict(fused)
    assert scores["b"] == pytest.approx(1 / 62 + 1 / 61)
    assert scores["c"] == pytest.approx(1 / 63 + 1 / 62)
    assert scores["a"] == pytest.approx(1 / 61)
    assert scores["d"] == pytest.approx(1 / 63)


def test_rrf_ties_duplicates_and_edges():
    # equal scores: better best rank first, then first appearance
    assert [item for item, _ in rrf([["x", "y"], ["y", "x"]])] == ["x", "y"]
    assert [item for item, _ in rrf([["p"], ["q"]])] == ["p", "q"]
    # a duplicate inside one list counts once, at its best rank
    assert dict(rrf([["a", "a", "b"]]))["a"] == pytest.approx(1 / 61)
    assert rrf([]) == [] and rrf([[], []]) == []
    # a small k rewards the head much more
    assert dict(rrf([["a"]], k=0))["a"] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        rrf([["a"]], k=-1)


# -- building --------------------------------------------------------------------------------


def test_build_then_incremental_update_embeds_only_changes(client, tmp_path, chunks):
    spy = SpyEmbedder(HashEmbedder())
    index = make_index(client, tmp_path, embedder=spy)
    backend: SearchBackend = index  # the harness's interface
    for method in ("search", "search_bm25", "search_dense", "grep", "document_chunks", "document_title"):
        assert callable(getattr(backend, method))
    first = index.build_or_update(chunks)
    assert (first.embedded, first.deleted, first.kept, first.total, first.created) == (chunks.height, 0, 0, chunks.height, True)
    assert spy.texts_embedded == chunks.height

    spy.reset()
    again = index.build_or_update(chunks)
    assert (again.embedded, again.deleted, again.kept, again.created) == (0, 0, chunks.height, False)
    assert spy.texts_embedded == 0

    # change one chunk's text: a new content-hash id replaces the old one
    victim = chunks.row(5, named=True)
    new_text = victim["text"] + " Edited by the customer."
    new_id = chunk_id_for(victim["doc_id"], new_text)
    changed = chunks.with_columns(
        pl.when(pl.col("chunk_id") == victim["chunk_id"]).then(pl.lit(new_text)).otherwise(pl.col("text")).alias("text"),
        pl.when(pl.col("chunk_id") == victim["chunk_id"]).then(pl.lit(new_id)).otherwise(pl.col("chunk_id")).alias("chunk_id"),
    )
    kept_id = chunks.row(0, named=True)["chunk_id"]
    before = index.collection.get(ids=[kept_id], include=["embeddings"])["embeddings"][0]
    spy.reset()
    stats = index.build_or_update(changed)
    assert (stats.embedded, stats.deleted, stats.kept, stats.total) == (1, 1, chunks.height - 1, chunks.height)
    assert spy.calls == [[new_text]]
    after = index.collection.get(ids=[kept_id], include=["embeddings"])["embeddings"][0]
    np.testing.assert_array_equal(before, after)
    assert index.collection.get(ids=[victim["chunk_id"]])["ids"] == []
    assert index.chunk(new_id).text == new_text and index.chunk(victim["chunk_id"]) is None
    ok, details = index_count_matches_chunks(index, changed)
    assert ok, details

    # a deleted document leaves the index; BM25 follows
    gone = changed.row(0, named=True)["doc_id"]
    n_gone = changed.filter(pl.col("doc_id") == gone).height
    spy.reset()
    shrunk = index.build_or_update(changed.filter(pl.col("doc_id") != gone))
    assert (shrunk.embedded, shrunk.deleted) == (0, n_gone) and spy.texts_embedded == 0
    assert index.document_chunks(gone) == [] and index.document_title(gone) is None
    assert all(hit.doc_id != gone for hit in index.search_bm25(changed.row(0, named=True)["title"], k=50))


def test_service_workers_opening_one_customer_together_each_get_the_whole_bm25_copy(client, tmp_path, chunks, records):
    """Search-service workers start together and each pulls the customer's BM25 copy into the
    shared index cache; the pulls take turns (one writes, the others find it there), so no
    worker reads a copy another is still writing or removes one another is renaming."""
    from concurrent.futures import ThreadPoolExecutor

    from core.layout import chunks_key
    from core.storage import LocalArtifactStore
    from search.per_customer import build_customer_index, open_customer_index

    store = LocalArtifactStore(tmp_path / "store")
    store.write_parquet(chunks_key("acme"), chunks)
    built = build_customer_index("acme", store, client, HashEmbedder(), tmp_path / "pipeline-cache")
    for start in range(3):  # a few fresh caches: a race shows in some starts, not every one
        cache = tmp_path / f"worker-cache-{start}"
        with ThreadPoolExecutor(8) as pool:
            opened = list(pool.map(lambda _: open_customer_index("acme", store, client, HashEmbedder(), cache), range(8)))
        for question in questions(records[:3]):
            expected = [hit.chunk_id for hit in built.index.search_bm25(question, k=5)]
            assert expected and all([hit.chunk_id for hit in index.search_bm25(question, k=5)] == expected for index in opened)
        assert not (cache / "acme" / "bm25.pull").exists()


def test_small_write_batches_and_duplicate_rows(client, tmp_path, chunks):
    index = make_index(client, tmp_path, write_batch=60, embed_block=100, read_batch=100)
    doubled = pl.concat([chunks, chunks.head(3)])
    stats = index.build_or_update(doubled)
    assert stats.duplicates_dropped == 3 and stats.embedded == chunks.height
    assert index.collection.count() == chunks.height
    assert len(index.stored_ids()) == chunks.height  # paged reads see everything
    ok, details = no_duplicate_ids(index)
    assert ok, details
    ok, details = index_count_matches_chunks(index, doubled)
    assert ok, details


def test_collection_metadata_records_model_and_chunker(client, tmp_path, chunks):
    index = make_index(client, tmp_path)
    stats = index.build_or_update(chunks)
    meta = index.collection.metadata
    assert meta["embedding_model"] == "test-hash-bow" and meta["embedding_dims"] == 64
    assert meta["chunker"] == CHUNKER and meta["customer"] == "acme"
    assert stats.collection == collection_name("acme", "test-hash-bow", CHUNKER) == index.name
    assert index.collection.configuration["hnsw"]["space"] == "cosine"


def random_word_chunks(count: int, seed: int = 0) -> pl.DataFrame:
    """`count` one-chunk documents of eight random words: many near-ties for HNSW to get wrong."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(3000)]
    paragraphs = [{"title": f"t{i}", "text": " ".join(rng.choice(words, 8))} for i in range(count)]
    return chunk_table([{"paragraphs": paragraphs}])


def test_two_builds_of_one_corpus_rank_alike(tmp_path):
    """Builds insert in parallel, so two HNSW graphs of the same vectors differ; the index
    explores enough candidates (`SEARCH_EF`) that they still return the same top 50. At Chroma's
    default of 100 these builds disagreed on about half of the lists."""
    chunks = random_word_chunks(4000)
    queries = [f"w{3 * i} w{3 * i + 1} w{7 * i % 3000}" for i in range(60)]
    rankings, index = [], None
    for build in range(2):
        index = HybridIndex(persistent_client(tmp_path / f"chroma-{build}"), "acme", HashEmbedder(), tmp_path / f"bm25-{build}")
        index.build_or_update(chunks, chunker=CHUNKER)
        assert index.collection.configuration["hnsw"]["ef_search"] == SEARCH_EF
        rankings.append([[hit.chunk_id for hit in index.search_dense(query, k=50)] for query in queries])
    assert sum(first != second for first, second in zip(*rankings)) <= 2
    assert dense_recall_vs_brute_force(index, queries, k=50) >= 0.995


def test_an_older_collection_is_searched_at_the_current_ef(client, tmp_path, chunks):
    """A collection built at Chroma's default `ef_search` is raised to the index's on open, so
    a cached index and a fresh build of one corpus rank the same way."""
    make_index(client, tmp_path, hnsw={"ef_search": 100}).build_or_update(chunks)
    assert make_index(client, tmp_path).load(chunks).collection.configuration["hnsw"]["ef_search"] == SEARCH_EF
    reopened = make_index(client, tmp_path)
    reopened.build_or_update(chunks)
    assert reopened.collection.configuration["hnsw"]["ef_search"] == SEARCH_EF


def test_changing_chunker_or_model_builds_a_new_collection(client, tmp_path, chunks):
    spy = SpyEmbedder(HashEmbedder())
    index = make_index(client, tmp_path, embedder=spy)
    old = index.build_or_update(chunks)
    rechunked = chunks.with_columns(pl.lit("v2:test:256").alias("chunker"))
    spy.reset()
    new = index.build_or_update(rechunked)
    assert new.collection != old.collection and new.created and new.embedded == chunks.height
    assert spy.texts_embedded == chunks.height  # nothing reused across chunkers
    assert index.collection.metadata["chunker"] == "v2:test:256"
    assert index.customer_collections() == sorted([old.collection, new.collection])
    assert index.drop_stale_collections() == [old.collection]
    assert index.customer_collections() == [new.collection]

    other_model = HashEmbedder(dims=32)
    other_model.name = "test-hash-bow-32"
    assert collection_name("acme", other_model.name, CHUNKER) != old.collection
    with pytest.raises(ValueError):
        index.build_or_update(pl.concat([chunks, rechunked.head(1).with_columns(pl.lit("x").alias("chunk_id"))]))


def test_load_attaches_without_embedding_and_reuses_bm25(client, tmp_path, chunks, records):
    builder = make_index(client, tmp_path)
    builder.build_or_update(chunks)
    spy = SpyEmbedder(HashEmbedder())
    reader = make_index(client, tmp_path, embedder=spy)
    reader.load(chunks)
    assert spy.texts_embedded == 0
    assert BM25Index.read_manifest(tmp_path / "bm25-acme")["collection"] == builder.name
    query = records[0]["question"]
    assert [h.chunk_id for h in reader.search(query, k=10)] == [h.chunk_id for h in builder.search(query, k=10)]
    assert spy.texts_embedded == 1  # the query
    with pytest.raises(IndexNotBuilt):
        make_index(client, tmp_path, customer="nobody").load(chunks)


# -- searching -------------------------------------------------------------------------------


def test_hits_carry_table_fields_and_documents_read_in_order(client, tmp_path, chunks, records):
    index = make_index(client, tmp_path)
    index.build_or_update(chunks)
    hits = index.search(records[1]["question"], k=10)
    assert 0 < len(hits) <= 10 and [h.rank for h in hits] == list(range(1, len(hits) + 1))
    assert all(isinstance(h, Hit) for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    row = chunks.filter(pl.col("chunk_id") == hits[0].chunk_id).row(0, named=True)
    assert (hits[0].text, hits[0].title, hits[0].doc_id, hits[0].n_tokens) == (row["text"], row["title"], row["doc_id"], row["n_tokens"])

    multi = chunks.group_by("doc_id").len().filter(pl.col("len") > 1)
    doc_id = multi.row(0, named=True)["doc_id"] if multi.height else row["doc_id"]
    document = index.document_chunks(doc_id)
    expected = chunks.filter(pl.col("doc_id") == doc_id).sort("index")
    assert [h.chunk_id for h in document] == expected.get_column("chunk_id").to_list()
    assert index.document_title(doc_id) == expected.row(0, named=True)["title"]
    assert index.document_chunks("no-such-doc") == [] and index.document_title("no-such-doc") is None


def test_seen_chunks_never_come_back(client, tmp_path, chunks, records):
    index = make_index(client, tmp_path)
    index.build_or_update(chunks)
    for method in (index.search, index.search_bm25, index.search_dense):
        seen: set[str] = set()
        for question in questions(records[:24]) * 2:
            hits = method(question, k=8, exclude=seen)
            ids = [h.chunk_id for h in hits]
            assert not seen & set(ids), method.__name__
            assert len(ids) == len(set(ids))
            seen.update(ids)
    # the dense leg keeps returning k unseen chunks until the corpus runs out
    seen = set()
    while True:
        hits = index.search_dense("anything at all", k=25, exclude=list(seen))
        if not hits:
            break
        assert not seen & {h.chunk_id for h in hits}
        seen.update(h.chunk_id for h in hits)
    assert len(seen) == chunks.height


def test_hybrid_fuses_both_legs(client, tmp_path, chunks, records):
    index = make_index(client, tmp_path)
    index.build_or_update(chunks)
    query = records[2]["question"]
    sparse = [h.chunk_id for h in index.search_bm25(query, k=50)]
    dense = [h.chunk_id for h in index.search_dense(query, k=50)]
    expected = [chunk_id for chunk_id, _ in rrf([sparse, dense])][:20]
    assert [h.chunk_id for h in index.search(query, k=20)] == expected
    vector = index.embed_query(query)
    assert [h.chunk_id for h in index.search(query, k=20, query_embedding=vector)] == expected
    assert index.search_bm25("zzzqqqxxx unknownword", k=5) == []


# -- grep ------------------------------------------------------------------------------------


def _grep_index(client, tmp_path, chunks) -> HybridIndex:
    evil = {
        **chunks.row(0, named=True),
        "chunk_id": "evil",
        "doc_id": "evil-doc",
        "text": "a" * 5000 + "b",
        "title": "evil",
    }
    index = make_index(client, tmp_path, grep_timeout_s=0.5)
    index.build_or_update(pl.concat([chunks, pl.DataFrame([evil], schema=CHUNK_SCHEMA)]))
    return index


def test_grep_limit_unseen_and_errors(client, tmp_path, chunks):
    index = _grep_index(client, tmp_path, chunks)
    matching = [row["chunk_id"] for row in chunks.iter_rows(named=True) if " the " in row["text"]]
    assert len(matching) > 10
    first = index.grep(r"\bthe\b")
    assert len(first) == 5 and [h.chunk_id for h in first] == matching[:5]
    second = index.grep(r"\bthe\b", exclude={h.chunk_id for h in first})
    assert len(second) == 5 and not {h.chunk_id for h in first} & {h.chunk_id for h in second}
    assert len(index.grep(r"\bthe\b", limit=2)) == 2
    assert index.grep(r"THE", ignore_case=True, limit=1)
    assert index.grep(r"no such phrase anywhere 12345") == []
    for bad in ["(unclosed", "[a-", "*x", "a{2,1}", "(?P<1>x)"]:
        with pytest.raises(ValueError):
            index.grep(bad)


def test_grep_matches_a_chunk_by_chunk_scan(client, tmp_path, chunks):
    """The fast path scans all texts joined; it must agree with per-chunk semantics,
    anchors and patterns that could run across chunk edges included."""
    import regex

    index = _grep_index(client, tmp_path, chunks)
    texts = {row["chunk_id"]: row["text"] for row in chunks.iter_rows(named=True)}
    texts["evil"] = "a" * 5000 + "b"
    patterns = [r"^The", r"\.$", r"^[A-Z][a-z]+ \(", r"\bof\b", r"[0-9]{4}", r"(?i)river", "", r"\s", r"b$", r"(?s)a.{3}T", r"(?=The)T", r"\Aa+b\Z"]
    for pattern in patterns:
        expected = [chunk_id for chunk_id, text in texts.items() if regex.search(pattern, text)]
        assert [h.chunk_id for h in index.grep(pattern, limit=10_000)] == expected, pattern
        seen = set(expected[::2])
        assert [h.chunk_id for h in index.grep(pattern, limit=3, exclude=seen)] == [c for c in expected if c not in seen][:3], pattern


def test_grep_bounds_catastrophic_backtracking(client, tmp_path, chunks):
    index = _grep_index(client, tmp_path, chunks)
    for pattern in [r"(a+)+$", r"(a|a)+$"]:
        started = time.perf_counter()
        try:
            result = index.grep(pattern)
        except ValueError as error:
            assert "longer than" in str(error)
        else:
            assert all(h.chunk_id != "evil" for h in result)
        assert time.perf_counter() - started < 3.0, pattern
    started = time.perf_counter()
    with pytest.raises(ValueError, match="longer than"):
        index.grep(r"(a|aa)+$")
    assert time.perf_counter() - started < 3.0


# -- isolation, modes, recall -----------------------------------------------------------------


def test_customer_isolation_in_one_client(client, tmp_path, records):
    chunks_a = chunk_table(records[:20], doc_prefix="a-")
    chunks_b = chunk_table(records[20:40], doc_prefix="b-")
    index_a = make_index(client, tmp_path, customer="alpha")
    index_b = make_index(client, tmp_path, customer="beta")
    index_a.build_or_update(chunks_a)
    index_b.build_or_update(chunks_b)
    assert index_a.name != index_b.name
    ids_a = set(chunks_a.get_column("chunk_id").to_list())
    ids_b = set(chunks_b.get_column("chunk_id").to_list())
    assert not ids_a & ids_b
    for question in questions(records[20:45]) + questions(records[:25]):  # 50 queries, half aimed at B
        for hits in (index_a.search(question, k=20), index_a.search_dense(question, k=50), index_a.grep(r"\bof\b", limit=5)):
            assert {h.chunk_id for h in hits} <= ids_a
        assert {h.chunk_id for h in index_b.search(question, k=20)} <= ids_b
    assert index_a.collection.count() == len(ids_a) and index_b.collection.count() == len(ids_b)


def test_dense_recall_against_brute_force(client, tmp_path, records):
    corpus = chunk_table(records)  # every sample paragraph: a few hundred chunks
    assert corpus.height >= 300
    index = make_index(client, tmp_path, embedder=HashEmbedder(dims=384))
    index.build_or_update(corpus)
    recall = dense_recall_vs_brute_force(index, questions(records), k=10)
    assert recall > 0.9, recall
    random_queries = np.random.default_rng(0).standard_normal((20, 384)).astype(np.float32)
    assert dense_recall_vs_brute_force(index, random_queries, k=10) > 0.9


def test_real_model_end_to_end(client, tmp_path, small_chunks, records, real_embedder):
    spy = SpyEmbedder(real_embedder)
    index = make_index(client, tmp_path, embedder=spy)
    stats = index.build_or_update(small_chunks)
    assert stats.embedded == small_chunks.height and index.collection.metadata["embedding_model"] == "all-MiniLM-L6-v2"
    assert index.collection.metadata["embedding_dims"] == 384
    record = records[0]
    gold = {p["title"] for p in record["paragraphs"] if p["is_supporting"]}
    top = index.search(record["question"], k=10)
    assert gold & {h.title for h in top}
    spy.reset()
    assert index.build_or_update(small_chunks).embedded == 0 and spy.texts_embedded == 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def chroma_server(tmp_path):
    binary = Path(sys.executable).parent / "chroma"
    if not binary.exists():
        pytest.skip("the chroma CLI is not installed beside this Python")
    port = _free_port()
    log = open(tmp_path / "chroma-server.log", "wb")
    process = subprocess.Popen(
        [str(binary), "run", "--host", "127.0.0.1", "--port", str(port), "--path", str(tmp_path / "server-data")],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "ANONYMIZED_TELEMETRY": "False"},
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                pytest.fail(f"chroma run exited with {process.returncode}: {(tmp_path / 'chroma-server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/heartbeat", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("chroma run did not answer its heartbeat within 60 s")
            time.sleep(0.2)
        yield port
    finally:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=10)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        log.close()


@pytest.mark.integration
def test_chroma_run_server_mode(chroma_server, tmp_path, small_chunks, chunks, records, real_embedder):
    client = http_client("127.0.0.1", chroma_server)
    index = make_index(client, tmp_path, embedder=real_embedder, write_batch=50)
    stats = index.build_or_update(small_chunks)
    assert stats.created and stats.embedded == small_chunks.height
    assert index.collection.count() == small_chunks.height
    record = records[0]
    gold = {p["title"] for p in record["paragraphs"] if p["is_supporting"]}
    hits = index.search(record["question"], k=10)
    assert gold & {h.title for h in hits}
    seen = {h.chunk_id for h in hits}
    assert not seen & {h.chunk_id for h in index.search(record["question"], k=10, exclude=seen)}
    assert index.build_or_update(small_chunks).embedded == 0
    ok, details = index_count_matches_chunks(index, small_chunks)
    assert ok, details
    # a second customer on the same server stays apart
    other = make_index(client, tmp_path, customer="beta")
    other.build_or_update(chunk_table(records[30:34], doc_prefix="b-"))
    assert {h.chunk_id for h in other.search(record["question"], k=20)}.isdisjoint(small_chunks.get_column("chunk_id").to_list())


# -- embedders -------------------------------------------------------------------------------


def test_sentence_transformer_loaded_once_per_process(real_embedder):
    from search.embeddings import Embedder

    first, second = Embedder(), Embedder(batch_size=8)
    assert first._model() is second._model()
    assert first.name == "all-MiniLM-L6-v2" and first.dims == 384
    vectors = second.encode(["a short text", "another one"])
    assert vectors.dtype == np.float32 and vectors.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    assert first.encode([]).shape == (0, 384)


def test_openai_compatible_embeddings_endpoint(monkeypatch):
    """A loopback stand-in for `/v1/embeddings`: batching, order by `index`, normalization,
    and the key read from the named environment variable."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from search.embeddings import OpenAIEmbedder, make_embedder

    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
            data = [{"object": "embedding", "index": i, "embedding": [float(len(text)), 1.0, 0.0]} for i, text in enumerate(body["input"])]
            payload = json.dumps({"object": "list", "data": data[::-1], "model": body["model"], "usage": {"prompt_tokens": 1, "total_tokens": 1}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("TEST_EMBED_KEY", "sekrit")
        embedder = make_embedder("tiny-embed", base_url=f"http://127.0.0.1:{server.server_port}/v1", api_key_env="TEST_EMBED_KEY", batch_size=2)
        assert isinstance(embedder, OpenAIEmbedder) and embedder.name == "openai-tiny-embed"
        vectors = embedder.encode(["a", "bbb", "cc"])
        assert vectors.shape == (3, 3) and embedder.dims == 3
        expected = np.array([[1, 1, 0], [3, 1, 0], [2, 1, 0]], dtype=np.float32)
        np.testing.assert_allclose(vectors, expected / np.linalg.norm(expected, axis=1, keepdims=True), rtol=1e-6)
        assert [len(call["body"]["input"]) for call in seen] == [2, 1]
        assert all(call["path"] == "/v1/embeddings" and call["auth"] == "Bearer sekrit" for call in seen)
    finally:
        server.shutdown()
        server.server_close()
