"""Task records: content-hash ids, the stratified split, Hugging Face export, prompt packs,
the blocking checks and seed records."""

from __future__ import annotations

from collections import Counter

import datasets
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.storage import LocalArtifactStore
from synth.checks import enough_tasks_per_split, supporting_quotes_found
from synth.corpus_view import CorpusView, SourceDoc
from synth.export import distractor_table, save_dataset, task_from_record, tasks_from_jsonl, tasks_to_jsonl, to_dataset, write_parquet
from synth.packs import DOMAINS, load_pack, pack_fingerprint
from synth.records import SeedRecords
from synth.schema import BridgingItem, Distractor, RejectedDistractor, SupportingItem, SynthTask
from synth.split import apply_splits, assign_splits


def make_task(i: int, level: int = 0, passed: bool = True) -> SynthTask:
    items = [SupportingItem(id=f"d{i}", clue_quotes=["c"], item_quotes=[f"fact {i}"], contains_truth=True, truth_quotes=[f"fact {i}"])]
    return SynthTask(level=level, clues=[f"clue {i}"], question=f"q{i}?", truth=f"t{i}", truth_type="name",
                     supporting_items=items, passed_verification=passed, generator="extractive").with_id()


def test_ids_are_content_hashes():
    assert make_task(1).id == make_task(1).id != make_task(2).id
    assert make_task(1, level=1).id != make_task(1).id


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=4))
def test_split_is_deterministic_stratified_and_complete(sizes):
    tasks = [make_task(1000 * level + i, level=level) for level, n in enumerate(sizes) for i in range(n)]
    first = assign_splits(tasks)
    assert first == assign_splits(list(reversed(tasks)))  # order of arrival does not matter
    assert set(first) == {t.id for t in tasks}
    for level, n in enumerate(sizes):
        counts = Counter(first[t.id] for t in tasks if t.level == level)
        if n >= 3:
            assert counts["dev"] >= 1 and counts["test"] >= 1
        if n >= 10:
            assert counts["train"] >= 0.7 * n


def test_only_verified_tasks_get_a_split():
    tasks = apply_splits([make_task(i) for i in range(5)] + [make_task(99, passed=False)])
    assert tasks[-1].split is None and all(t.split for t in tasks[:-1])
    with pytest.raises(ValueError):
        assign_splits(tasks, fractions=(1.0, -1.0, 0.5))


def rich_task() -> SynthTask:
    task = make_task(7, level=1)
    return task.model_copy(update={
        "bridging_item": BridgingItem(id="d7", relevant_prev_id="d6", reasoning="names it"),
        "parent_id": "abc", "split": "dev", "verification": {"d7": "ok"},
        "distractors": [Distractor(chunk_id="c1", doc_id="d9", mined_for=["d7"], query="clue 7", score=0.03)],
        "rejected_distractors": [RejectedDistractor(chunk_id="c2", doc_id="d8", reason="contains_answer_string")],
    })


def test_export_as_a_hugging_face_dataset_round_trips(tmp_path):
    tasks = [rich_task(), make_task(1), make_task(2, passed=False)]
    dataset = to_dataset(tasks)
    assert dataset.num_rows == 3 and dataset.features["level"].dtype == "int32"
    save_dataset(tasks, tmp_path / "ds")
    loaded = datasets.load_from_disk(str(tmp_path / "ds"))
    assert [task_from_record(row) for row in loaded] == tasks
    write_parquet(tasks, tmp_path / "tasks.parquet")
    assert datasets.Dataset.from_parquet(str(tmp_path / "tasks.parquet")).num_rows == 3
    assert to_dataset([make_task(3)]).features == dataset.features  # no distractors anywhere: same schema
    assert tasks_from_jsonl(tasks_to_jsonl(tasks)) == tasks
    table = distractor_table(tasks)
    assert table.height == 2 and table.filter(table["kept"])["mined_for"].to_list() == [["d7"]]
    assert table.filter(~table["kept"])["reason"].to_list() == ["contains_answer_string"]
    assert distractor_table([make_task(1)]).height == 0


def test_no_verified_tasks_is_an_empty_dataset_with_the_same_columns(tmp_path):
    """A corpus that yields no task (empty, or nothing verifiable) still exports: `verified_tasks`
    materializes with zero rows and its blocking check says why, instead of `datasets` failing
    with a schema mismatch."""
    empty = to_dataset([])
    assert empty.num_rows == 0 and empty.features == to_dataset([make_task(1)]).features
    save_dataset([], tmp_path / "ds")
    assert datasets.load_from_disk(str(tmp_path / "ds")).num_rows == 0


@pytest.mark.parametrize("domain", DOMAINS)
def test_every_domain_has_a_pack_that_renders(domain):
    pack = load_pack(domain)
    assert pack.answer_types and pack.examples and pack.guidance
    explore = pack.render("explore", n_docs=3)
    assert pack.answer_types[0] in explore and "$" not in explore.replace("$$", "")
    assert "Answer: 42" in pack.render("verify", clues="- c", question="q", truth="42", doc_id="d", document="text")
    assert "[X2]" in pack.extractive_question("date", "[X2]", 5)
    assert len(pack_fingerprint(domain)) == 16
    with pytest.raises(KeyError):
        pack.render("verify")  # a missing value is an error, not an empty hole in the prompt


def test_unknown_domain_is_an_error():
    with pytest.raises(KeyError, match="known: web"):
        load_pack("medical")


def test_blocking_checks():
    corpus = CorpusView({f"d{i}": SourceDoc(f"d{i}", "", f"Intro. fact {i} here.") for i in range(12)})
    tasks = apply_splits([make_task(i) for i in range(12)])
    assert enough_tasks_per_split(tasks, 1)[0]
    ok, meta = enough_tasks_per_split(tasks, 5)
    assert not ok and "dev" in meta["short"]
    assert supporting_quotes_found(tasks, corpus)[0]
    edited = CorpusView({**corpus.docs, "d3": SourceDoc("d3", "", "The page was rewritten.")})
    ok, meta = supporting_quotes_found(tasks, edited)
    assert not ok and meta["failing_tasks"] == 1


def test_seed_records_are_reused_until_a_document_changes(tmp_path):
    store = LocalArtifactStore(tmp_path)
    corpus = CorpusView({"d1": SourceDoc("d1", "", "fact 1", content_hash="h1")})
    records = SeedRecords(store, "acme/synth", "fp")
    assert records.load("d1", corpus) is None
    records.save("d1", [make_task(1)], corpus)
    assert records.load("d1", corpus) == [make_task(1)]
    changed = CorpusView({"d1": SourceDoc("d1", "", "fact 1 edited", content_hash="h2")})
    assert records.load("d1", changed) is None
    assert SeedRecords(store, "acme/synth", "other-config").load("d1", corpus) is None
