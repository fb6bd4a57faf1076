"""The sparse leg: BM25 over chunk texts, kept beside the Chroma collection.

Why not Chroma's own sparse index: local Chroma refuses sparse indexes ("not enabled in
local"), so the index keeps a bm25s index of the same chunk table and fuses in our code. It is
rebuilt from the full chunk table on every update (seconds at 100k chunks, no embedding) and
saved to a folder that the caller syncs to the artifact store, so it is versioned with the
collection it belongs to (`manifest.json` names the collection and a fingerprint of the ids).

Tokenization is deliberately simple and stemming-free: lowercase word characters minus English
stopwords; the agent writes keyword queries and the dense leg covers morphology.
Scoring reads bm25s's precomputed CSC score matrix and sums the query tokens' columns with
`numpy.bincount` (several times faster than bm25s's pure-numpy path without numba).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Collection, Sequence

import numpy as np

BM25_FORMAT_VERSION = "1"
_TOKEN = re.compile(r"\w+", flags=re.UNICODE)


def _stopwords() -> frozenset[str]:
    from bm25s.tokenization import STOPWORDS_EN

    return frozenset(STOPWORDS_EN)


_STOPWORDS: frozenset[str] | None = None


def tokenize(text: str) -> list[str]:
    """Lowercased word tokens without English stopwords (no stemming)."""
    global _STOPWORDS
    if _STOPWORDS is None:
        _STOPWORDS = _stopwords()
    stop = _STOPWORDS
    return [token for token in _TOKEN.findall(text.lower()) if token not in stop]


def ids_fingerprint(ids: Sequence[str]) -> str:
    """Order-sensitive digest of the indexed ids: tells a saved index from a stale one."""
    digest = hashlib.sha256()
    for chunk_id in ids:
        digest.update(chunk_id.encode())
        digest.update(b"\x00")
    return digest.hexdigest()[:32]


class BM25Index:
    """BM25 over a fixed, ordered list of chunk ids; `search` returns `(chunk_id, score)`."""

    def __init__(self, ids: Sequence[str], model=None, k1: float = 1.5, b: float = 0.75):
        self.ids: list[str] = list(ids)
        self.k1 = k1
        self.b = b
        self._model = model  # None for an empty corpus
        self._prepare()

    def _prepare(self) -> None:
        if self._model is None:
            self._vocab: dict[str, int] = {}
            return
        scores = self._model.scores
        self._data = np.asarray(scores["data"])
        self._indices = np.asarray(scores["indices"])
        self._indptr = np.asarray(scores["indptr"])
        self._num_docs = int(scores["num_docs"])
        self._vocab = self._model.vocab_dict
        self._nonoccurrence = getattr(self._model, "nonoccurrence_array", None)

    @classmethod
    def build(cls, ids: Sequence[str], texts: Sequence[str], k1: float = 1.5, b: float = 0.75) -> "BM25Index":
        if len(ids) != len(texts):
            raise ValueError("ids and texts differ in length")
        if not ids:
            return cls([], None, k1, b)
        import bm25s

        model = bm25s.BM25(k1=k1, b=b)
        # An empty document would break bm25s's vocabulary; give it a token no query produces.
        corpus = [tokenize(text) or [""] for text in texts]
        model.index(corpus, show_progress=False)
        return cls(ids, model, k1, b)

    def __len__(self) -> int:
        return len(self.ids)

    def scores(self, query: str) -> np.ndarray | None:
        """Scores for every indexed chunk, or None when no query token is in the vocabulary."""
        if self._model is None:
            return None
        token_ids = sorted({self._vocab[token] for token in tokenize(query) if token in self._vocab})
        if not token_ids:
            return None
        starts = self._indptr[token_ids]
        ends = self._indptr[np.asarray(token_ids) + 1]
        if len(token_ids) == 1:
            columns = np.arange(starts[0], ends[0])
        else:
            columns = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)])
        scores = np.bincount(self._indices[columns], weights=self._data[columns], minlength=self._num_docs)
        if self._nonoccurrence is not None:
            scores = scores + float(self._nonoccurrence[token_ids].sum())
        return scores

    def top_positions(self, query: str, n: int) -> list[tuple[int, float]]:
        """Positions (into `ids`) and scores of the best `n` chunks with a positive score."""
        scores = self.scores(query)
        if scores is None or n <= 0:
            return []
        # Only chunks holding a query token can score; selecting among them is cheaper than
        # partitioning the whole corpus.
        candidates = np.flatnonzero(scores > 0)
        values = scores[candidates]
        if n < candidates.shape[0]:
            # the n-th best score; ties at that score go to the earliest chunks, as a full
            # sort would order them (results must not depend on partition internals)
            cutoff = np.partition(values, candidates.shape[0] - n)[candidates.shape[0] - n]
            above = np.flatnonzero(values > cutoff)
            tied = np.flatnonzero(values == cutoff)[: n - above.shape[0]]
            keep = np.concatenate([above, tied])
            candidates, values = candidates[keep], values[keep]
        order = np.lexsort((candidates, -values))
        return list(zip(candidates[order].tolist(), values[order].tolist()))

    def search(self, query: str, k: int = 50, exclude: Collection[str] = ()) -> list[tuple[str, float]]:
        """Top `k` chunk ids not in `exclude`.

        Over-fetches by the number of excluded ids, so the answer is exact: at most that many
        of the fetched chunks can be dropped.
        """
        if k <= 0:
            return []
        excluded = len(exclude) if exclude else 0
        results: list[tuple[str, float]] = []
        for pos, score in self.top_positions(query, k + excluded):
            chunk_id = self.ids[pos]
            if exclude and chunk_id in exclude:
                continue
            results.append((chunk_id, score))
            if len(results) == k:
                break
        return results

    # -- persistence -------------------------------------------------------------------------

    def save(self, folder: str | Path, collection: str = "") -> None:
        """Write the index to `folder`, replacing what was there only once the new one is whole."""
        folder = Path(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
        try:
            if self._model is not None:
                self._model.save(str(staging / "bm25s"), show_progress=False)
            (staging / "ids.json").write_text(json.dumps(self.ids))
            manifest = {
                "format": BM25_FORMAT_VERSION,
                "collection": collection,
                "n": len(self.ids),
                "fingerprint": ids_fingerprint(self.ids),
                "k1": self.k1,
                "b": self.b,
            }
            (staging / "manifest.json").write_text(json.dumps(manifest, indent=1))
            old = None
            if folder.exists():
                old = folder.parent / f".{folder.name}.old-{os.getpid()}"
                shutil.rmtree(old, ignore_errors=True)
                os.replace(folder, old)
            os.replace(staging, folder)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    @staticmethod
    def read_manifest(folder: str | Path) -> dict | None:
        path = Path(folder) / "manifest.json"
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    @classmethod
    def load(cls, folder: str | Path) -> "BM25Index":
        folder = Path(folder)
        manifest = cls.read_manifest(folder)
        if manifest is None or manifest.get("format") != BM25_FORMAT_VERSION:
            raise FileNotFoundError(f"no BM25 index (format {BM25_FORMAT_VERSION}) in {folder}")
        ids = json.loads((folder / "ids.json").read_text())
        model = None
        if ids:
            import bm25s

            model = bm25s.BM25.load(str(folder / "bm25s"), show_progress=False)
        return cls(ids, model, manifest.get("k1", 1.5), manifest.get("b", 0.75))
