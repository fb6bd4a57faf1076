"""Dense text embeddings for the index: a local sentence-transformers folder or an endpoint.

Why we embed ourselves instead of giving Chroma an embedding function: Chroma rebuilds an
embedding function from the collection's configuration on every `get_collection`, which would
reload the model (seconds) per call; and the index needs the vectors anyway to embed only new
chunks. So the model is loaded once per process (a module-level cache keyed by folder and
device) and vectors are handed to Chroma as `embeddings=`.

Two backends give the same vectors (to float32 rounding): sentence-transformers on torch, and
`search.numpy_encoder` where torch is not installed (a serving-only install). Measured on 2 CPU
cores (`bench/embedder_backends.py`): torch indexes dev-file paragraphs about 4x faster (49 vs 11
chunks/s), numpy embeds a single query faster (6 vs 9 ms); `auto` takes torch when installed.
Where the CPU computes bf16 natively, torch embeds batches under bf16 autocast
(`core.cpu_precision.encoder_autocast`): 2.6x the chunks/s, vectors within about 1e-3 of fp32.

Nothing is loaded at import time: torch and the weights load on the first `encode`.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np

from core.cpu_precision import encoder_autocast
from core.model_loading import MODEL_LOAD_LOCK
from search.embedding_window import DEFAULT_EMBEDDING_MODEL, embedding_model_info

DEFAULT_BATCH_SIZE = 32  # measured faster than 128 on 2 CPU cores for this model

_MODEL_CACHE: dict[tuple[str, str], Any] = {}


class TextEmbedder(Protocol):
    """What the index needs from an embedder.

    `name` identifies the vector space (it goes into the collection name and metadata, so two
    models never share a collection); `encode` returns L2-normalized float32 rows.
    """

    name: str

    @property
    def dims(self) -> int: ...

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


def default_device() -> str:
    """`cuda` when a GPU is visible, otherwise `cpu` (torch imported only when asked)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_sentence_transformer(path: str | Path, device: str | None = None):
    """The SentenceTransformer for a local folder, loaded at most once per process and device."""
    device = device or default_device()
    key = (str(Path(path).resolve()), device)
    model = _MODEL_CACHE.get(key)
    if model is not None:
        return model
    with MODEL_LOAD_LOCK:
        model = _MODEL_CACHE.get(key)
        if model is None:
            from sentence_transformers import SentenceTransformer

            model = SentenceTransformer(key[0], device=device, local_files_only=True)
            model.eval()
            _MODEL_CACHE[key] = model
    return model


def _normalize(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim == 1:
        vectors = vectors[None, :]
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return vectors / norms


def torch_available() -> bool:
    """Whether the torch backend can load (a serving-only install has neither package)."""
    return all(importlib.util.find_spec(name) is not None for name in ("torch", "sentence_transformers"))


def load_numpy_encoder(path: str | Path, max_seq_length: int):
    """The numpy encoder for a local folder, loaded at most once per process."""
    from search.numpy_encoder import NumpyBertEncoder

    key = (str(Path(path).resolve()), f"numpy:{max_seq_length}")
    with MODEL_LOAD_LOCK:
        encoder = _MODEL_CACHE.get(key)
        if encoder is None:
            encoder = _MODEL_CACHE[key] = NumpyBertEncoder(Path(key[0]), max_seq_length)
    return encoder


@dataclass
class Embedder:
    """Sentence-transformers embeddings from a local folder (default: packaged all-MiniLM-L6-v2).

    `model` is `None`/`"all-MiniLM-L6-v2"` for the packaged weights, or a folder path; models
    are never downloaded. `backend` is `torch`, `numpy`, or `auto` (torch when installed).
    """

    model: str | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    device: str | None = None
    backend: str = "auto"
    name: str = field(init=False)
    path: Path = field(init=False)
    max_seq_length: int = field(init=False)

    def __post_init__(self) -> None:
        info = embedding_model_info(self.model)
        self.name = info.name
        self.path = info.path
        self.max_seq_length = info.max_seq_length
        if self.backend == "auto":
            self.backend = "torch" if torch_available() else "numpy"
        if self.backend not in ("torch", "numpy"):
            raise ValueError(f"embedding backend {self.backend!r}: use torch, numpy or auto")

    def _model(self):
        if self.backend == "numpy":
            return load_numpy_encoder(self.path, self.max_seq_length)
        return load_sentence_transformer(self.path, self.device)

    @property
    def dims(self) -> int:
        model = self._model()
        if self.backend == "numpy":
            return model.dims
        getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        return int(getter())

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        if self.backend == "numpy":
            return self._model().encode(texts, batch_size=self.batch_size)
        model = self._model()
        with encoder_autocast(model.device.type, len(texts)):
            vectors = model.encode(
                texts,
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_tensor=True,
                show_progress_bar=False,
            )
        return np.ascontiguousarray(vectors.float().cpu().numpy(), dtype=np.float32)


@dataclass
class OpenAIEmbedder:
    """Embeddings from any OpenAI-compatible `/v1/embeddings` endpoint.

    The API key is read from the environment variable named by `api_key_env` (never stored in
    configuration); local servers that need no key get a placeholder. `dimensions` is sent
    only when set (models such as text-embedding-3-* can shorten their vectors).
    """

    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    batch_size: int = 256
    dimensions: int | None = None
    timeout_s: float = 60.0
    max_retries: int = 3
    name: str = field(init=False)
    _client: Any = field(default=None, init=False, repr=False)
    _dims: int | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.name = f"openai-{self.model}"
        self._dims = self.dimensions

    def _openai(self):
        if self._client is None:
            from openai import OpenAI

            self._client = OpenAI(
                base_url=self.base_url,
                api_key=os.environ.get(self.api_key_env) or "EMPTY",
                timeout=self.timeout_s,
                max_retries=self.max_retries,
            )
        return self._client

    @property
    def dims(self) -> int:
        if self._dims is None:
            self._dims = int(self.encode(["dimension probe"]).shape[1])
        return self._dims

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self._dims or 0), dtype=np.float32)
        extra = {"dimensions": self.dimensions} if self.dimensions else {}
        rows: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start : start + self.batch_size]
            response = self._openai().embeddings.create(model=self.model, input=batch, **extra)
            ordered = sorted(response.data, key=lambda item: item.index)
            rows.extend(item.embedding for item in ordered)
        vectors = _normalize(np.asarray(rows, dtype=np.float32))
        self._dims = int(vectors.shape[1])
        return vectors


def make_embedder(
    model: str | None = None,
    *,
    base_url: str | None = None,
    api_key_env: str = "OPENAI_API_KEY",
    batch_size: int | None = None,
    device: str | None = None,
) -> TextEmbedder:
    """Embedder from configuration: an endpoint when `base_url` is set, else a local folder."""
    if base_url:
        if not model:
            raise ValueError("an embeddings endpoint needs a model name")
        return OpenAIEmbedder(base_url=base_url, model=model, api_key_env=api_key_env, batch_size=batch_size or 256)
    return Embedder(model=model or DEFAULT_EMBEDDING_MODEL, batch_size=batch_size or DEFAULT_BATCH_SIZE, device=device)
