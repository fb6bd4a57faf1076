"""BERT in numpy: the torch-free backends of `search.embeddings.Embedder` and `search.reranker.Reranker`.

Why: the search service embeds one short query per request and, when a customer is served with
selection, scores a few dozen (question, chunk) pairs; an install that only serves
(`searchsmith[serve]`) should not carry torch (about 1 GB) for that. A BERT encoder (the packaged
all-MiniLM-L6-v2, most small retrieval embedders, and the MiniLM cross-encoders this project
trains) is six matrix products per layer; numpy computes them from the folder's
`model.safetensors` and `tokenizer.json` with the same numbers as torch, to float32 rounding
(tests compare the two backends on the same inputs).

Supported: BERT weights, absolute positions, `gelu`; for embeddings mean pooling (with or without
a `Normalize` module); for cross-encoders a one-logit `BertForSequenceClassification` head with a
sigmoid or identity activation. Anything else is an error that names the folder and what it has;
such models need the torch backend.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

import numpy as np

_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _erf(x: np.ndarray) -> np.ndarray:
    """erf to 1.5e-7 (Abramowitz and Stegun 7.1.26): numpy has none, and scipy is not a dependency."""
    sign = np.sign(x)
    x = np.abs(x)
    t = 1.0 / (1.0 + _ERF_P * x)
    a1, a2, a3, a4, a5 = _ERF_A
    poly = ((((a5 * t + a4) * t + a3) * t + a2) * t + a1) * t
    return sign * (1.0 - poly * np.exp(-x * x))


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def mean_pooling(pooling: dict) -> bool:
    """Whether a `1_Pooling/config.json` is plain mean pooling, in sentence-transformers' older
    form (`pooling_mode_mean_tokens: true`) or the one its trainer saves today (`pooling_mode: mean`)."""
    others = ("pooling_mode_cls_token", "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
              "pooling_mode_lasttoken")
    if "pooling_mode" in pooling:
        return pooling["pooling_mode"] == "mean" or pooling["pooling_mode"] == ["mean"]
    return bool(pooling.get("pooling_mode_mean_tokens")) and not any(pooling.get(mode) for mode in others)


def check_supported(folder: Path, pooling_required: bool = True) -> dict:
    """The model's config, after checking the folder is a BERT encoder (with mean pooling when
    `pooling_required`: an embedder; a cross-encoder reads the [CLS] token through its head)."""
    config = json.loads((folder / "config.json").read_text())
    pooling_file = folder / "1_Pooling" / "config.json"
    pooling = json.loads(pooling_file.read_text()) if pooling_file.is_file() else {}
    problems = []
    if config.get("model_type") != "bert":
        problems.append(f"model_type {config.get('model_type')!r} (only 'bert')")
    if config.get("hidden_act", "gelu") != "gelu":
        problems.append(f"hidden_act {config.get('hidden_act')!r} (only 'gelu')")
    if config.get("position_embedding_type", "absolute") != "absolute":
        problems.append(f"position_embedding_type {config.get('position_embedding_type')!r}")
    if pooling_required and not mean_pooling(pooling):
        problems.append(f"pooling other than mean tokens ({pooling_file})")
    for name in ("model.safetensors", "tokenizer.json"):
        if not (folder / name).is_file():
            problems.append(f"no {name}")
    if problems:
        raise ValueError(f"{folder}: the numpy encoder cannot run this model ({'; '.join(problems)}); install torch and sentence-transformers")
    return config


class _NumpyBert:
    """BERT weights, tokenizer and forward pass of one folder (what both backends share)."""

    def __init__(self, folder: Path, max_length: int, pooling_required: bool):
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        self.folder = Path(folder)
        self.config = check_supported(self.folder, pooling_required)
        self.heads = int(self.config["num_attention_heads"])
        self.layers = int(self.config["num_hidden_layers"])
        self.eps = float(self.config.get("layer_norm_eps", 1e-12))
        weights = load_file(str(self.folder / "model.safetensors"))
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in weights else ""
        self.w = {name[len(prefix):]: value.astype(np.float32) for name, value in weights.items() if name.startswith(prefix)}
        self.head = {name: value.astype(np.float32) for name, value in weights.items() if name.startswith("classifier.")}
        self.dims = int(self.w["embeddings.word_embeddings.weight"].shape[1])
        self.tokenizer = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length, strategy="longest_first")
        self.tokenizer.no_padding()

    def _hidden(self, inputs: list) -> tuple[np.ndarray, np.ndarray]:
        """Last hidden states and attention mask of a batch (texts, or (question, text) pairs)."""
        encodings = self.tokenizer.encode_batch(inputs)
        length = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(inputs), length), dtype=np.int64)
        types = np.zeros((len(inputs), length), dtype=np.int64)
        mask = np.zeros((len(inputs), length), dtype=np.float32)
        for row, encoding in enumerate(encodings):
            ids[row, : len(encoding.ids)] = encoding.ids
            types[row, : len(encoding.ids)] = encoding.type_ids
            mask[row, : len(encoding.ids)] = 1.0
        return self._forward(ids, types, mask), mask

    def _linear(self, x: np.ndarray, name: str, weights: dict[str, np.ndarray] | None = None) -> np.ndarray:
        weights = self.w if weights is None else weights
        return x @ weights[f"{name}.weight"].T + weights[f"{name}.bias"]

    def _forward(self, ids: np.ndarray, types: np.ndarray, mask: np.ndarray) -> np.ndarray:
        w, batch, length = self.w, ids.shape[0], ids.shape[1]
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:length][None]
        x = x + w["embeddings.token_type_embeddings.weight"][types]
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], self.eps)
        head_dim = self.dims // self.heads
        blocked = (1.0 - mask)[:, None, None, :] * np.float32(-1e9)  # padding takes no attention

        def split(t: np.ndarray) -> np.ndarray:
            return t.reshape(batch, length, self.heads, head_dim).transpose(0, 2, 1, 3)

        for layer in range(self.layers):
            p = f"encoder.layer.{layer}"
            q, k, v = (split(self._linear(x, f"{p}.attention.self.{part}")) for part in ("query", "key", "value"))
            scores = q @ k.transpose(0, 1, 3, 2) / np.float32(math.sqrt(head_dim)) + blocked
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            context = (scores / scores.sum(-1, keepdims=True)) @ v
            context = context.transpose(0, 2, 1, 3).reshape(batch, length, self.dims)
            attended = self._linear(context, f"{p}.attention.output.dense") + x
            x = _layer_norm(attended, w[f"{p}.attention.output.LayerNorm.weight"], w[f"{p}.attention.output.LayerNorm.bias"], self.eps)
            inner = _gelu(self._linear(x, f"{p}.intermediate.dense"))
            out = self._linear(inner, f"{p}.output.dense") + x
            x = _layer_norm(out, w[f"{p}.output.LayerNorm.weight"], w[f"{p}.output.LayerNorm.bias"], self.eps)
        return x


class NumpyBertEncoder(_NumpyBert):
    """Mean-pooled, L2-normalized BERT embeddings of a sentence-transformers folder."""

    def __init__(self, folder: Path, max_seq_length: int):
        super().__init__(folder, max_seq_length, pooling_required=True)

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        rows = [self._embed(list(texts[start : start + batch_size])) for start in range(0, len(texts), batch_size)]
        return np.concatenate(rows) if rows else np.zeros((0, self.dims), dtype=np.float32)

    def _embed(self, texts: list[str]) -> np.ndarray:
        hidden, mask = self._hidden(texts)
        pooled = (hidden * mask[:, :, None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, 1e-12)).astype(np.float32)


_ACTIVATIONS = {"torch.nn.modules.activation.Sigmoid": "sigmoid", "torch.nn.modules.linear.Identity": "identity"}


class NumpyCrossEncoder(_NumpyBert):
    """One relevance score per (question, text) pair, as sentence-transformers' `CrossEncoder.predict`."""

    def __init__(self, folder: Path, max_length: int):
        super().__init__(folder, max_length, pooling_required=False)
        settings_file = self.folder / "config_sentence_transformers.json"
        settings = json.loads(settings_file.read_text()) if settings_file.is_file() else {}
        named = settings.get("activation_fn", "torch.nn.modules.activation.Sigmoid")
        problems = []
        if "classifier.weight" not in self.head or self.head["classifier.weight"].shape[0] != 1:
            problems.append("no one-logit classification head (an untrained start draws its head with torch)")
        if "pooler.dense.weight" not in self.w:
            problems.append("no pooler")
        if named not in _ACTIVATIONS:
            problems.append(f"activation {named!r}")
        if problems:
            raise ValueError(f"{self.folder}: the numpy cross-encoder cannot run this model ({'; '.join(problems)}); "
                             "install torch and sentence-transformers")
        self.activation = _ACTIVATIONS[named]

    def predict(self, pairs: Sequence[tuple[str, str]], batch_size: int = 32, **_: object) -> np.ndarray:
        rows = [self._score(list(pairs[start : start + batch_size])) for start in range(0, len(pairs), batch_size)]
        return np.concatenate(rows) if rows else np.zeros((0,), dtype=np.float32)

    def _score(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        hidden, _ = self._hidden(pairs)
        pooled = np.tanh(self._linear(hidden[:, 0], "pooler.dense"))
        logits = self._linear(pooled, "classifier", self.head)[:, 0]
        return (1.0 / (1.0 + np.exp(-logits)) if self.activation == "sigmoid" else logits).astype(np.float32)
