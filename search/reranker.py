"""The judge of the selection step: scores (question, chunk) pairs, higher is more relevant.

Two kinds, told apart by the folder itself (`folder_kind`):
- `bi`: a sentence-transformers bi-encoder; a pair scores as the cosine of the two embeddings.
  The packaged all-MiniLM-L6-v2 already ranks by relevance, and a customer's copy fine-tuned on
  its own verified tasks (`training.reranker`, the default kind) judges the surfaced documents
  of real questions better than a cross-encoder trained on the same pairs (module doc of
  `core.training_settings.RerankerSettings`).
- `cross`: a sentence-transformers `CrossEncoder` (a `...ForSequenceClassification` head), which
  reads question and chunk together. Its untrained start is the packaged encoder with a fresh
  one-logit head, whose scores mean nothing until it is trained.
Either is too slow for a whole corpus at query time, so it only reorders what search or an
episode already surfaced (tens of chunks). Nothing is downloaded; a model is loaded once per process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from core.cpu_precision import encoder_autocast
from core.model_loading import MODEL_LOAD_LOCK
from search.embedding_window import default_embedding_model_path

MAX_LENGTH = 256  # word pieces per (question, chunk) pair: MiniLM's window
# Beside a trained reranker's weights: how much selection trusts the policy's order against this
# reranker's (`policy_weight`) and whether it judges by chains (`chain_anchors`), chosen on the
# customer's dev split when it was trained (training.selection_weight). A folder without it gets
# selection's defaults: weight 1, judged by the question alone.
SELECTION_FILE = "searchsmith_selection.json"
START_SEED = 0  # the untrained start's head is drawn with this seed, so "untrained" is one model

_CACHE: dict[tuple[str, str], Any] = {}


def pair_text(title: str | None, text: str) -> str:
    """A chunk as the reranker reads it, in training and in use alike: its title, then its text."""
    return f"{title}\n{text}" if title and not text.startswith(title) else text


def start_model_dir() -> Path:
    """The packaged all-MiniLM-L6-v2 folder: the reranker's default starting point."""
    return default_embedding_model_path()


@contextmanager
def fresh_head_quietly() -> Iterator[None]:
    """Build a CrossEncoder without transformers' load report: a bi-encoder folder has no
    classification head by design (the start gets a seeded one), and the report of the "missing"
    head is noise on a terminal (`make demo`)."""
    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous)


def folder_kind(folder: str | Path) -> str:
    """`cross` for a folder with a sequence-classification head, `bi` for an encoder without one."""
    import json

    config = Path(folder) / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"reranker folder not found or not a model: {folder} (models are never downloaded)")
    architectures = json.loads(config.read_text(encoding="utf-8")).get("architectures") or []
    return "cross" if any(name.endswith("ForSequenceClassification") for name in architectures) else "bi"


def load_cross_encoder(path: str | Path, device: str = "cpu", max_length: int = MAX_LENGTH, backend: str = "auto") -> Any:
    """The `CrossEncoder` for a local folder, loaded at most once per process and device. A folder
    without a classification head (a bi-encoder) gets a one-logit head drawn with `START_SEED`.
    `backend`: `torch`, `numpy` (`search.numpy_encoder`: a trained head only), or `auto` (torch
    when installed: a serving-only install scores with numpy)."""
    from search.embeddings import torch_available

    folder = Path(path).expanduser().resolve()
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"reranker folder not found or not a model: {path} (models are never downloaded)")
    if backend == "auto":
        backend = "torch" if torch_available() else "numpy"
    if backend not in ("torch", "numpy"):
        raise ValueError(f"reranker backend {backend!r}: use torch, numpy or auto")
    key = (str(folder), device if backend == "torch" else f"numpy:{max_length}")
    with MODEL_LOAD_LOCK:
        if key not in _CACHE and backend == "numpy":
            from search.numpy_encoder import NumpyCrossEncoder

            _CACHE[key] = NumpyCrossEncoder(folder, max_length)
        if key not in _CACHE:
            import torch
            from sentence_transformers.cross_encoder import CrossEncoder

            with torch.random.fork_rng(devices=[]), fresh_head_quietly():
                torch.manual_seed(START_SEED)
                _CACHE[key] = CrossEncoder(str(folder), num_labels=1, max_length=max_length, device=device)
        return _CACHE[key]


def read_selection(folder: Path) -> dict[str, Any]:
    """The selection calibration beside a reranker's weights ({} when it has none)."""
    import json

    calibrated = folder / SELECTION_FILE
    return json.loads(calibrated.read_text(encoding="utf-8")) if calibrated.is_file() else {}


def write_selection(folder: Path, calibration: dict[str, Any]) -> None:
    """Keep the calibration (`training.selection_weight`) beside the weights `Reranker.load` reads."""
    import json

    (folder / SELECTION_FILE).write_text(json.dumps(calibration, indent=2), encoding="utf-8")


@dataclass
class Reranker:
    """Scores for (query, text) pairs from one reranker folder; higher is more relevant."""

    path: Path
    device: str = "cpu"
    batch_size: int = 32
    policy_weight: float = 1.0  # selection's weight of the policy's order (SELECTION_FILE)
    chain_anchors: int = 0  # selection judges by two-document chains from this many first links (0: by the question alone)
    backend: str = "auto"  # torch | numpy | auto (load_cross_encoder)
    kind: str = "cross"  # bi | cross (module doc)
    # Selection's choice per kind of candidate (`agent.selection.CALIBRATED_POLICIES`):
    # {policy: (policy_weight, chain_anchors)}; a kind not in it uses the two fields above.
    by_policy: dict[str, tuple[float, int]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path | None = None, device: str = "cpu", backend: str = "auto", kind: str | None = None) -> Reranker:
        """`kind` None: the folder's own (`folder_kind`); `cross` over a bi-encoder folder is that
        encoder with a fresh seeded head (the cross-encoder's untrained start)."""
        folder = Path(path) if path else start_model_dir()
        found = folder_kind(folder)
        kind = kind or found
        if kind not in ("bi", "cross"):
            raise ValueError(f"reranker kind {kind!r}: use bi or cross")
        if kind == "bi" and found == "cross":
            raise ValueError(f"reranker folder {folder} is a cross-encoder (it has a classification head), not a bi-encoder")
        calibrated = read_selection(folder)
        by_policy = {policy: (float(choice["policy_weight"]), int(choice.get("chain_anchors", 0)))
                     for policy, choice in (calibrated.get("by_policy") or {}).items()}
        reranker = cls(folder, device, policy_weight=calibrated.get("policy_weight", 1.0), backend=backend, kind=kind,
                       chain_anchors=int(calibrated.get("chain_anchors", 0)), by_policy=by_policy)
        reranker.model  # noqa: B018 - load now, so a bad folder fails where it is named
        return reranker

    def choice_for(self, policy: str) -> tuple[float, int]:
        """(policy_weight, chain_anchors) selection uses for `policy`'s kind of candidate."""
        return self.by_policy.get(policy, (self.policy_weight, self.chain_anchors))

    @property
    def model(self) -> Any:
        if self.kind == "bi":  # the index's own embedder class: one encoding path, one process cache
            from search.embeddings import Embedder

            embedder = Embedder(str(self.path), batch_size=self.batch_size, device=self.device, backend=self.backend)
            embedder.dims  # noqa: B018 - loads the weights
            return embedder
        return load_cross_encoder(self.path, self.device, backend=self.backend)

    @property
    def name(self) -> str:
        return self.path.name

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        """Scores of `texts` for `query`: cosine similarity for a bi-encoder, the head's logit for a cross-encoder."""
        return self._scorer(texts)([query])[0]

    def score_many(self, queries: Sequence[str], texts: Sequence[str]) -> list[list[float]]:
        """Scores of every text for each query."""
        return self._scorer(texts)(queries)

    def _scorer(self, texts: Sequence[str]) -> Callable[[Sequence[str]], list[list[float]]]:
        """Scores of `texts` against any queries asked later: a bi-encoder encodes the texts once
        (selection asks the question, then each chain's extended question, of the same texts); a
        cross-encoder reads every (query, text) pair in one batched pass."""
        if not texts:
            return lambda queries: [[] for _ in queries]
        if self.kind == "bi":
            text_vectors = self.model.encode(list(texts))  # unit length (Embedder)

            def by_cosine(queries: Sequence[str]) -> list[list[float]]:
                if not queries:
                    return []
                return [[float(s) for s in row] for row in self.model.encode(list(queries)) @ text_vectors.T]

            return by_cosine

        def by_pairs(queries: Sequence[str]) -> list[list[float]]:
            pairs = [(query, text) for query in queries for text in texts]
            if not pairs:
                return []
            model = self.model
            with encoder_autocast(getattr(getattr(model, "device", None), "type", "numpy"), len(pairs)):
                flat = model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False, convert_to_numpy=True)
            return [[float(s) for s in flat[i * len(texts):(i + 1) * len(texts)]] for i in range(len(queries))]

        return by_pairs

    def order(self, query: str, candidates: Sequence[tuple[str, Sequence[str]]]) -> list[tuple[str, float]]:
        """Documents best first: each `(doc_id, texts)` scores as its best text (a document is as
        relevant as the best chunk of it the episode saw)."""
        return self.orders(query, candidates, (0,))[0]

    def chain_order(self, query: str, candidates: Sequence[tuple[str, Sequence[str]]], anchors: int) -> list[tuple[str, float]]:
        """Documents by the best two-document chain through them, best first.

        Why: a later hop of a multi-hop question shares few words with the question (the Indiana
        alcohol law for "the state where Greenfield-Central High is"), so judged against the
        question alone it loses to near-copies of the first hop. As in multi-hop dense retrieval,
        the question is extended with each of the `anchors` best documents (its best chunk) and
        the others are judged against that: a chain (a, d) scores s(q, a) + s(q + a, d), and a
        document takes the best chain it is part of, as its first or second link."""
        return self.orders(query, candidates, (anchors,))[anchors]

    def orders(self, query: str, candidates: Sequence[tuple[str, Sequence[str]]],
               anchor_choices: Sequence[int]) -> dict[int, list[tuple[str, float]]]:
        """`order` (0) and `chain_order` for each number of anchors in `anchor_choices`, every
        pair scored once: calibration compares the ways of judging on the same episodes, and the
        chains from the best `a` first links are a prefix of those from the best `a + 1`."""
        flat = [(doc_id, text) for doc_id, texts in candidates for text in texts]
        if not flat:
            return {anchors: [] for anchors in anchor_choices}
        texts = [text for _, text in flat]
        scorer = self._scorer(texts)
        (direct,) = scorer([query])
        best = _best_per_document(flat, direct)
        by_question = sorted(best.items(), key=lambda item: -item[1])
        firsts = [doc for doc, _ in by_question[: max(anchor_choices, default=0)]]
        best_text: dict[str, str] = {}
        for (doc_id, text), value in zip(flat, direct):
            if doc_id in firsts and value >= best[doc_id]:
                best_text.setdefault(doc_id, text)
        rows = scorer([f"{query} {best_text[first]}" for first in firsts]) if len(best) > 1 else []
        result = {}
        for anchors in anchor_choices:
            if anchors == 0 or len(best) == 1:
                result[anchors] = by_question
                continue
            chain = {doc: float("-inf") for doc in best}
            for first, row in zip(firsts[:anchors], rows):
                for doc, value in _best_per_document(flat, row).items():
                    if doc != first:
                        linked = best[first] + value
                        chain[doc] = max(chain[doc], linked)
                        chain[first] = max(chain[first], linked)
            result[anchors] = sorted(chain.items(), key=lambda item: -item[1])
        return result


def _best_per_document(flat: Sequence[tuple[str, str]], scores: Sequence[float]) -> dict[str, float]:
    best: dict[str, float] = {}
    for (doc_id, _), value in zip(flat, scores):
        best[doc_id] = max(value, best.get(doc_id, float("-inf")))
    return best
