import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from corpus.chunking import chunk_document
from search.embedding_window import embedding_model_info, load_token_offsets

TOKENIZER = load_token_offsets()


def test_default_window_is_the_embedding_models():
    info = embedding_model_info()
    assert info.max_seq_length == 256 and info.max_chunk_tokens == 254


def test_chunks_fit_the_window_and_ids_are_stable():
    text = "\n\n".join(f"Paragraph {i} talks about topic {i} " * 12 for i in range(30))
    chunks = chunk_document("doc1", text, "text", TOKENIZER, 64, 8)
    assert len(chunks) > 5
    assert all(c.n_tokens <= 64 for c in chunks)
    assert all(TOKENIZER.count(c.text) <= 64 for c in chunks)
    again = chunk_document("doc1", text, "text", TOKENIZER, 64, 8)
    assert [c.chunk_id for c in again] == [c.chunk_id for c in chunks]
    other_doc = chunk_document("doc2", text, "text", TOKENIZER, 64, 8)
    assert not {c.chunk_id for c in other_doc} & {c.chunk_id for c in chunks}


def test_markdown_headings_start_chunks():
    text = "# Intro\n\n" + "Intro words here. " * 30 + "\n\n## Install\n\nRun the installer now.\n"
    chunks = chunk_document("d", text, "markdown", TOKENIZER, 200, 16)
    assert any(c.text.startswith("## Install") for c in chunks)


def test_byte_cap_splits_oversized_chunks():
    text = "ü" * 3000  # one word piece per char is not guaranteed, bytes are
    chunks = chunk_document("d", text, "text", TOKENIZER, 4000, 0, max_bytes=1024)
    assert chunks and all(len(c.text.encode()) <= 1024 for c in chunks)


def test_overlap_must_be_smaller_than_size():
    with pytest.raises(ValueError, match="overlap"):
        chunk_document("d", "some text", "text", TOKENIZER, 16, 16)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=300), min_size=1, max_size=8))
@example(["0" * 34, "0" * 34])  # found by hypothesis: a paragraph repeated whole
def test_every_token_is_covered(paragraphs):
    """No text is lost: every word piece of the document lies inside some chunk, or inside a
    repeat of a chunk's text (identical text in one document is one chunk id, kept once)."""
    text = "\n\n".join(paragraphs)
    chunks = chunk_document("d", text, "text", TOKENIZER, 32, 4)
    covered = []
    for chunk in chunks:
        at = text.find(chunk.text)
        while at != -1:
            covered.append((at, at + len(chunk.text)))
            at = text.find(chunk.text, at + 1)
    for start, end in TOKENIZER.offsets(text):
        piece = text[start:end]
        assert any(s <= start and end <= e for s, e in covered), f"token {piece!r} at {start} not in any chunk"


def test_a_paragraph_repeated_in_one_document_is_one_chunk_and_still_covered():
    """Two identical paragraphs are one chunk id, kept once (the coverage test counts the repeat)."""
    text = "\n\n".join(["0" * 34, "0" * 34])
    chunks = chunk_document("d", text, "text", TOKENIZER, 32, 4)
    assert [c.text for c in chunks] == ["0" * 34]
