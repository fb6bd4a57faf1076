"""A BERT sentence encoder in numpy: the torch-free backend of `search.embeddings.Embedder`.

Why: the search service embeds one short query per request, and an install that only serves
(`searchsmith[serve]`) should not carry torch (about 1 GB) for that. A sentence-transformers
folder of a BERT model with mean pooling and normalization (the packaged all-MiniLM-L6-v2, and
most small retrieval embedders) is six matrix products per layer; numpy computes them from the
folder's `model.safetensors` and `tokenizer.json` with the same numbers as torch, to float32
rounding (tests compare the two backends on the same texts).

Supported: `BertModel` weights, absolute positions, `gelu` activation, mean pooling (with or
without a `Normalize` module). Anything else is an error that names the folder and what it has;
such models need the torch backend.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
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


def check_supported(folder: Path) -> dict:
    """The model's config, after checking the folder is a BERT encoder with mean pooling."""
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
    if not pooling.get("pooling_mode_mean_tokens") or any(
        pooling.get(mode) for mode in ("pooling_mode_cls_token", "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens")
    ):
        problems.append("pooling other than mean tokens")
    for name in ("model.safetensors", "tokenizer.json"):
        if not (folder / name).is_file():
            problems.append(f"no {name}")
    if problems:
        raise ValueError(f"{folder}: the numpy encoder cannot run this model ({'; '.join(problems)}); install torch and sentence-transformers")
    return config


@dataclass
class NumpyBertEncoder:
    """Mean-pooled, L2-normalized BERT embeddings of a sentence-transformers folder."""

    folder: Path
    max_seq_length: int

    def __post_init__(self) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        self.folder = Path(self.folder)
        config = check_supported(self.folder)
        self.heads = int(config["num_attention_heads"])
        self.layers = int(config["num_hidden_layers"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        weights = load_file(str(self.folder / "model.safetensors"))
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in weights else ""
        self.w = {name[len(prefix):]: value.astype(np.float32) for name, value in weights.items() if name.startswith(prefix)}
        self.dims = int(self.w["embeddings.word_embeddings.weight"].shape[1])
        self.tokenizer = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(self.max_seq_length)
        self.tokenizer.no_padding()

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        rows = [self._batch(list(texts[start : start + batch_size])) for start in range(0, len(texts), batch_size)]
        return np.concatenate(rows) if rows else np.zeros((0, self.dims), dtype=np.float32)

    def _batch(self, texts: list[str]) -> np.ndarray:
        encodings = self.tokenizer.encode_batch(texts)
        length = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(texts), length), dtype=np.int64)
        mask = np.zeros((len(texts), length), dtype=np.float32)
        for row, encoding in enumerate(encodings):
            ids[row, : len(encoding.ids)] = encoding.ids
            mask[row, : len(encoding.ids)] = 1.0
        hidden = self._forward(ids, mask)
        pooled = (hidden * mask[:, :, None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, 1e-12)).astype(np.float32)

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        return x @ self.w[f"{name}.weight"].T + self.w[f"{name}.bias"]

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        w, batch, length = self.w, ids.shape[0], ids.shape[1]
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:length][None]
        x = x + w["embeddings.token_type_embeddings.weight"][0]
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
