"""Progress of long loops as throttled INFO records (what the CLI's status line shows)."""

from __future__ import annotations

import logging

import pytest

from core.progress import Progress, library_bars_follow_hub_setting


def test_progress_reports_at_most_every_interval_and_always_at_the_end(caplog):
    log = logging.getLogger("corpus.test_progress")
    with caplog.at_level(logging.INFO, logger="corpus.test_progress"):
        progress = Progress(log, "chunks embedded", 5_000, every_s=3600)
        for _ in range(50):
            progress.advance(100)
    assert [r.getMessage() for r in caplog.records] == ["chunks embedded 5,000/5,000"]


def test_progress_without_a_total_counts_and_notes(caplog):
    log = logging.getLogger("corpus.test_progress")
    with caplog.at_level(logging.INFO, logger="corpus.test_progress"):
        progress = Progress(log, "documents scanned in local:./docs", every_s=0)
        progress.advance()
        progress.advance(2, note="1 failed")
    assert [r.getMessage() for r in caplog.records] == [
        "documents scanned in local:./docs 1", "documents scanned in local:./docs 3 (1 failed)"]


def test_embedding_reports_chunks_embedded(caplog, tmp_path):
    """The index build reports through the `search.index` logger (the console's status line)."""
    import hashlib
    import re

    import numpy as np
    import polars as pl

    from search.chroma_client import persistent_client
    from search.index import HybridIndex

    class HashEmbedder:
        name, dims = "hash-bow-16", 16

        def encode(self, texts):
            out = np.zeros((len(texts), self.dims), dtype=np.float32)
            for row, text in enumerate(texts):
                for word in re.findall(r"\w+", text.lower()):
                    out[row, int(hashlib.md5(word.encode()).hexdigest()[:8], 16) % self.dims] += 1.0
            return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)

    chunks = pl.DataFrame({
        "chunk_id": [f"c{i}" for i in range(12)], "doc_id": [f"d{i // 3}" for i in range(12)],
        "text": [f"passage {i} about topic {i % 4}" for i in range(12)], "title": [f"Doc {i // 3}" for i in range(12)],
        "index": [i % 3 for i in range(12)], "n_tokens": [6] * 12,
    })
    with caplog.at_level(logging.INFO, logger="search.index"):
        HybridIndex(persistent_client(tmp_path / "chroma"), "progress", HashEmbedder()).build_or_update(chunks, chunker="test")
    assert any(r.getMessage() == "chunks embedded 12/12" for r in caplog.records)


@pytest.mark.parametrize("module", ["transformers.modeling_gguf_pytorch_utils", "sentence_transformers.base.model_card"])
def test_library_bars_are_off_only_while_hub_bars_are(module):
    """The first SmolLM2 conversion and each reranker training must not write a bar's carriage returns
    into a CLI log that asked for no bars; the bar is restored after, and drawn where bars are on."""
    import importlib

    import huggingface_hub.utils as hub

    library = importlib.import_module(module)
    drawn, were_off = library.tqdm, hub.are_progress_bars_disabled()
    hub.disable_progress_bars()
    try:
        with library_bars_follow_hub_setting(module, "no.such.module"):
            assert library.tqdm(range(3)).disable
    finally:
        if not were_off:
            hub.enable_progress_bars()
    assert library.tqdm is drawn
    if not hub.are_progress_bars_disabled():  # HF_HUB_DISABLE_PROGRESS_BARS=1 in the environment keeps them off
        with library_bars_follow_hub_setting(module):
            assert library.tqdm is drawn

