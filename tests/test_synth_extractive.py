"""The offline generator on real corpora: the demo Wikipedia paragraphs (through the real sync,
chunker and hybrid index) and the multi-hop dev paragraphs. Same verifier, distractors by
hybrid search checked by code, deterministic under a seed."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from core.task_settings import TaskGenConfig
from core.text_match import contains_answer
from corpus.chunk_sync import ChunkerSettings, sync_chunks
from corpus.sources.local import LocalConnector
from corpus.sync import sync_sources
from search.embedding_window import load_token_offsets
from synth.checks import enough_tasks_per_split, supporting_quotes_found
from synth.corpus_view import CorpusView, SourceDoc
from synth.generate import generate_tasks, select_seeds, synthesize_extractive, task_fingerprint

ROOT = Path(__file__).resolve().parents[1]
DEMO_WIKI = ROOT / "customers" / "demo" / "wiki"
MULTIHOP_DEV = ROOT.parent / "shared" / "data" / "multihop_dev.jsonl"


class HashEmbedder:
    """Deterministic bag-of-words hashing vectors: a real dense leg without model weights."""

    name = "hash-bow-64"
    dims = 64

    def encode(self, texts):
        out = np.zeros((len(texts), self.dims), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                out[row, int(hashlib.md5(word.encode()).hexdigest()[:8], 16) % self.dims] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1, norms)


@pytest.fixture(scope="module")
def demo_frames() -> tuple[pl.DataFrame, pl.DataFrame]:
    connector = LocalConnector(DEMO_WIKI, ["**/*.md"], [], "local:wiki", 1 << 20)
    documents = sync_sources([connector], None, "web").documents
    chunks = sync_chunks(documents, None, load_token_offsets(), ChunkerSettings(254, 32, 16_384, "all-MiniLM-L6-v2")).chunks
    return chunks, documents


@pytest.fixture(scope="module")
def demo_index(demo_frames, tmp_path_factory):
    from search.chroma_client import persistent_client
    from search.index import HybridIndex

    index = HybridIndex(persistent_client(tmp_path_factory.mktemp("chroma")), "demo", HashEmbedder())
    index.build_or_update(demo_frames[0])
    return index


def test_extractive_tasks_on_the_demo_corpus(demo_frames, demo_index):
    chunks, documents = demo_frames
    config = TaskGenConfig(generator="extractive", max_seeds=40, seed=7, distractors_per_task=10)
    result = generate_tasks(chunks, documents, demo_index, config, llm=None, store=None)
    corpus = CorpusView.from_frames(chunks, documents)

    assert result.seeds == 40 and result.generated >= 40
    assert result.verified / result.generated >= 0.9, result.failed_reasons
    assert {"1", "2", "3"} <= set(result.by_hops)  # real multi-hop chains, not only single documents
    assert all(task.generator == "extractive" and task.domain == "web" for task in result.tasks)
    assert sum(result.by_split.values()) == result.verified and all(result.by_split.values())
    assert result.summary()["distractors"] == result.distractors_count > 5 * result.verified
    assert result.llm_usage == {}

    for task in result.verified_tasks:
        assert task.split is not None and task.hops == task.level + 1 == len(task.supporting_items)
        assert not contains_answer(task.clues_text, task.truth)  # the answer is masked out of the clues
        assert sum(item.contains_truth for item in task.supporting_items) == 1
        if task.level:
            assert task.bridging_item.id == task.supporting_items[-1].id
            assert task.bridging_item.relevant_prev_id == task.supporting_items[-2].id
        for distractor in task.distractors:
            assert distractor.doc_id not in task.supporting_ids and distractor.mined_for
            assert not contains_answer(demo_index.chunk(distractor.chunk_id).text, task.truth)
        assert all(r.reason == "contains_answer_string" for r in task.rejected_distractors)

    assert enough_tasks_per_split(result.tasks, min_per_split=1)[0]
    passed, details = supporting_quotes_found(result.tasks, corpus)
    assert passed, details


def test_extractive_is_deterministic_under_a_seed(demo_frames):
    corpus = CorpusView.from_frames(*demo_frames)
    config = TaskGenConfig(max_seeds=25, seed=3)
    first = synthesize_extractive(corpus, config)
    again = synthesize_extractive(corpus, config)
    assert [t.model_dump() for t in first.tasks] == [t.model_dump() for t in again.tasks]
    eligible = sorted(corpus.docs)
    assert select_seeds(eligible, 3, 25) == select_seeds(list(reversed(eligible)), 3, 25) != select_seeds(eligible, 4, 25)


def test_extractive_yield_on_the_demo_corpus(demo_frames):
    """A good yield over many seeds (the bench prints the whole-corpus figure)."""
    corpus = CorpusView.from_frames(*demo_frames)
    result = synthesize_extractive(corpus, TaskGenConfig(max_seeds=300))
    verified = sum(task.passed_verification for task in result.tasks)
    assert result.seeds == 300 and result.seeds_without_tasks <= 15
    assert verified / len(result.tasks) >= 0.95
    assert verified >= 1.5 * result.seeds  # chains: several verified tasks per seed on average


def multihop_corpus(limit_questions: int) -> CorpusView:
    docs: dict[str, SourceDoc] = {}
    with MULTIHOP_DEV.open() as handle:
        for number, line in enumerate(handle):
            if number >= limit_questions:
                break
            for paragraph in json.loads(line)["paragraphs"]:
                doc_id = hashlib.sha256(f"{paragraph['title']}\x00{paragraph['text']}".encode()).hexdigest()[:16]
                docs[doc_id] = SourceDoc(doc_id, paragraph["title"], paragraph["text"], "text")
    return CorpusView(docs)


@pytest.mark.skipif(not MULTIHOP_DEV.exists(), reason="../shared/data/multihop_dev.jsonl is not present")
def test_extractive_on_multihop_dev_paragraphs():
    corpus = multihop_corpus(100)
    assert len(corpus) > 800
    result = synthesize_extractive(corpus, TaskGenConfig(max_seeds=200, seed=1))
    verified = [task for task in result.tasks if task.passed_verification]
    assert len(verified) / len(result.tasks) >= 0.9
    levels = {task.level for task in verified}
    assert {0, 1, 2} <= levels
    passed, details = supporting_quotes_found(verified, corpus)
    assert passed, details


def test_natural_questions_ask_in_the_documents_words(demo_frames):
    """The natural style: same hops, documents and answers as the cloze style, but one
    wh-question that names its subject, with no masks, no "Clues:" and the answer nowhere in it."""
    corpus = CorpusView.from_frames(*demo_frames)
    cloze = synthesize_extractive(corpus, TaskGenConfig(max_seeds=40, seed=2, max_hops=2))
    natural = synthesize_extractive(corpus, TaskGenConfig(max_seeds=40, seed=2, max_hops=2, question_style="natural"))
    shape = lambda result: [(t.seed_doc_id, t.level, t.truth, t.supporting_ids) for t in result.tasks]  # noqa: E731
    assert shape(natural) == shape(cloze)
    verified = [task for task in natural.tasks if task.passed_verification]
    assert len(verified) == sum(task.passed_verification for task in cloze.tasks) > 20
    assert {0, 1} <= {task.level for task in verified}
    for task in verified:
        query = task.agent_query
        assert query == task.question and query.endswith("?") and not query.startswith("Clues:")
        assert "[X" not in query and "[the subject]" not in query
        assert not contains_answer(query, task.truth)
        assert re.search(r"\b(?:what|how many)\b", query, flags=re.IGNORECASE)
        # the seed document is named; a bridged hop refers to the earlier answer as X, never by name
        title = corpus.title(task.seed_doc_id)
        assert title in query or title.split()[-1] in query
        if task.level:
            assert re.search(r"\bX\b", query)
    passed, details = supporting_quotes_found(verified, corpus)
    assert passed, details
    assert task_fingerprint(TaskGenConfig(question_style="natural"), None) != task_fingerprint(TaskGenConfig(), None)


def test_wh_phrase_takes_the_answers_place():
    from synth.extractive import name_the_subject, wh_in_place
    from synth.facts import Span

    sentence = "In the United States, the song peaked at number 28 in 1981."
    assert wh_in_place(sentence, Span(7, 20, "United States", "name")) == "In what, the song peaked at number 28 in 1981."
    assert wh_in_place(sentence, Span(54, 58, "1981", "year")).endswith("in what year.")
    assert wh_in_place("He made 91 films.", Span(8, 10, "91", "number")) == "He made how many films."
    assert wh_in_place("Memphis is a city.", Span(0, 7, "Memphis", "name")) == "What is a city."
    assert name_the_subject("It peaked at number 28.", "Icehouse (song)") == "Icehouse (song) peaked at number 28."
    assert name_the_subject("His films were comedies.", "Cecil Parker") == "Cecil Parker's films were comedies."
    assert name_the_subject("In 1981 the song peaked.", "Icehouse") == "About Icehouse: In 1981 the song peaked."
    assert name_the_subject("Parker made 91 films.", "Cecil Parker") == "Parker made 91 films."


def test_unknown_question_style_is_an_error_naming_it():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="question_style"):
        TaskGenConfig(question_style="riddle")
