"""The runner and the report on tiny fakes: order, failures, aggregation, files."""

from __future__ import annotations

import json

import pytest

from agent.trajectory import RankedDocument, ToolCallRecord, Trajectory, Turn, read_jsonl
from evaluation.aggregate import summarize_scores
from evaluation.metrics import Gold
from evaluation.report import write_report
from evaluation.runner import CandidateFailed, run_candidate, save_results
from evaluation.tasks import Task


class FakeCandidate:
    """Returns document `D<i>` for question `q<i>` (gold is D<i> for even i); `fail` raises or errors."""

    name = "fake@2"

    def __init__(self, mode: str = "ok"):
        self.mode = mode

    def describe(self):
        return {"kind": "fake"}

    def run(self, question, task_id=None, seed=0):
        if self.mode == "raise" and question == "q3":
            raise RuntimeError("index bug")
        doc = "D" + question[1:]
        call = ToolCallRecord(id="c", name="search_corpus", result_chunk_ids=[doc + "c"], result_doc_ids=[doc])
        return Trajectory(
            question=question, policy=self.name, task_id=task_id, turns=[Turn(index=0, prompt_tokens=50, tool_calls=[call])],
            final_ranking=[] if self.mode == "error" or (self.mode == "prose" and int(question[1:]) % 2) else [RankedDocument(doc_id=doc)],
            total_prompt_tokens=50,
            error="endpoint down" if self.mode == "error" else None, chunk_docs={doc + "c": doc},
        )


def tasks(n: int = 8) -> list[Task]:
    return [
        Task(f"t{i}", f"q{i}", Gold(doc_ids=frozenset({f"D{i}" if i % 2 == 0 else "X"}), answer_doc_ids=frozenset({f"D{i}"})), "even" if i % 2 == 0 else "odd")
        for i in range(n)
    ]


def test_results_in_task_order_and_scored(tmp_path):
    results = run_candidate(FakeCandidate(), tasks(), k=5, workers=4, progress=False)
    assert [r.task.task_id for r in results] == [f"t{i}" for i in range(8)]
    assert [r.score.recall for r in results] == [1.0, 0.0] * 4
    saved = save_results(results, tmp_path, "fake@2")
    assert saved["trajectories"].endswith("fake@2.jsonl")
    assert [t.task_id for t in read_jsonl(saved["trajectories"])] == [f"t{i}" for i in range(8)]


def test_candidate_exceptions_are_raised_not_scored():
    with pytest.raises(RuntimeError, match="index bug"):
        run_candidate(FakeCandidate("raise"), tasks(), k=5, workers=2, progress=False)
    with pytest.raises(CandidateFailed, match="endpoint down"):
        run_candidate(FakeCandidate("error"), tasks(), k=5, workers=2, progress=False)


def test_final_answers_counts_the_episodes_that_returned_documents():
    """A model that answers in prose half the time returns nothing for those episodes: 0.5."""
    results = run_candidate(FakeCandidate("prose"), tasks(), k=5, workers=2, progress=False)
    summary = summarize_scores([r.score for r in results], resamples=50)
    assert summary["final_answers"] == 0.5 and summary["errors"] == 0


def test_summary_and_report_files(tmp_path):
    results = run_candidate(FakeCandidate(), tasks(), k=5, workers=2, progress=False)
    summary = summarize_scores([r.score for r in results], [r.task.group for r in results], resamples=200, seed=3)
    assert summary["recall"] == 0.5 and summary["n"] == 8 and summary["mean_prompt_tokens"] == 50
    assert summary["prune_accuracy"] is None and summary["intervals"]["prune_accuracy"] == [None, None]
    assert summary["by_group"]["even"]["recall"] == 1.0 and summary["by_group"]["odd"]["recall"] == 0.0
    assert summary["final_answers"] == 1.0
    assert summary == summarize_scores([r.score for r in results], [r.task.group for r in results], resamples=200, seed=3)
    report = write_report({"policies": {"fake@2": summary}, "config": {"k": 5, "tasks_file": "x.jsonl"}}, tmp_path)
    assert json.loads((tmp_path / "report.json").read_text())["policies"]["fake@2"]["recall"] == 0.5
    markdown = (tmp_path / "report.md").read_text()
    assert "| fake@2 | 1.000" in markdown and "| 0.500 [" in markdown and "even" in markdown
    assert all((tmp_path / name).exists() for name in ("metrics.png", "recall_vs_tokens.png"))
    assert report["files"]["report_json"].endswith("report.json")


def _synth_file(tmp_path):
    from synth.schema import SupportingItem, SynthTask

    rows = []
    for i, split in enumerate(["test", "test", "train"]):
        rows.append(SynthTask(
            id=f"s{i}", question=f"what about topic{i}", truth=f"answer{i}", split=split, passed_verification=True, level=1,
            supporting_items=[
                SupportingItem(id=f"doc{i}", item_quotes=[f"topic{i} is   here"], contains_truth=True),
                SupportingItem(id=f"other{i}", item_quotes=["not in any chunk"]),
            ],
        ).model_dump_json())
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return path


def _chunks():
    import polars as pl

    rows = [
        {"chunk_id": f"doc{i}-a", "doc_id": f"doc{i}", "text": f"topic{i} is here with answer{i}"} for i in range(3)
    ] + [{"chunk_id": f"doc{i}-b", "doc_id": f"doc{i}", "text": "filler"} for i in range(3)] + [
        {"chunk_id": f"other{i}-a", "doc_id": f"other{i}", "text": f"more on topic{i}"} for i in range(3)
    ]
    return pl.DataFrame(rows)


class FakeBackend:
    """Every leg returns doc<i>'s matching chunk first for a query naming topic<i>."""

    def _hits(self, query, k=50, exclude=()):
        from search.backend import Hit

        i = query.rsplit("topic", 1)[-1]
        ids = [(f"doc{i}-a", f"doc{i}"), (f"other{i}-a", f"other{i}"), ("doc9-a", "doc9")]
        return [Hit(chunk_id=c, doc_id=d, title=d, text="", score=1.0, rank=r) for r, (c, d) in enumerate(ids[:k], start=1)]

    search = search_bm25 = search_dense = _hits

    def document_title(self, doc_id):
        return doc_id


def test_synth_tasks_become_bench_tasks_with_facts(tmp_path):
    from evaluation.synth_tasks import file_kind, read_synth_tasks, tasks_from_synth

    path = _synth_file(tmp_path)
    assert file_kind(path) == "synth"
    tasks = tasks_from_synth(read_synth_tasks(path, split="test"), _chunks())
    assert [t.task_id for t in tasks] == ["s0", "s1"]
    gold = tasks[0].gold
    assert gold.doc_ids == {"doc0", "other0"} and gold.answer_doc_ids == {"doc0"}
    # The quote is located in one chunk of doc0; other0's quote is nowhere, so all its chunks count.
    assert gold.facts == (frozenset({"doc0-a"}), frozenset({"other0-a"}))
    assert tasks[0].group == "2-hop"


def test_a_task_file_that_cannot_be_read_names_the_file_and_line(tmp_path):
    from evaluation.synth_tasks import file_kind, read_synth_tasks

    with pytest.raises(ValueError, match="absent.jsonl: task file not found"):
        file_kind(tmp_path / "absent.jsonl")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('\n{"question": "cut off\n')
    with pytest.raises(ValueError, match=r"broken.jsonl:2: not a JSON record"):
        file_kind(broken)
    broken.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=r"broken.jsonl:1: a record is a JSON object, not list"):
        file_kind(broken)
    path = _synth_file(tmp_path)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], '{"id": "s9", "supporting_items": 3}', *lines[1:]]) + "\n")
    with pytest.raises(ValueError, match=r"\.jsonl:2: not a synthetic task \(supporting_items: Input should be a valid array"):
        read_synth_tasks(path, split=None)


def test_bench_command_on_synth_tasks_needs_and_uses_a_backend(tmp_path):
    from evaluation.bench import run_bench_command

    path = _synth_file(tmp_path)
    with pytest.raises(ValueError, match="backend"):
        run_bench_command(path, "bm25", 2, tmp_path / "out", progress=False)
    report = run_bench_command(path, "bm25,hybrid", 2, tmp_path / "out", progress=False, backend=FakeBackend(), chunks=_chunks(), granularity="fact")
    assert report["policies"]["hybrid"]["recall"] == 1.0 and report["policies"]["bm25"]["n"] == 2
    assert report["config"]["granularity"] == "fact" and report["config"]["split"] == "test"


def test_nx_merge_is_one_trajectory_with_every_rollout():
    from types import SimpleNamespace

    from evaluation.candidates import merge_nx
    from evaluation.metrics import score_trajectory

    def rollout(doc, pruned_doc):
        calls = [ToolCallRecord(id="s", name="search_corpus", result_chunk_ids=[doc + "c", pruned_doc + "c"], result_doc_ids=[doc, pruned_doc])]
        return Trajectory(
            question="q", policy="p", turns=[Turn(index=0, prompt_tokens=100, tool_calls=calls), Turn(index=1, prompt_tokens=200, pruned_ids=[pruned_doc + "c"])],
            final_ranking=[RankedDocument(doc_id=doc)], chunk_docs={doc + "c": doc, pruned_doc + "c": pruned_doc},
            peak_tokens=200, total_prompt_tokens=300, stop_reason="answer",
        )

    rollouts = [rollout("A", "G"), rollout("B", "H")]
    result = SimpleNamespace(trajectories=rollouts, ranking=[RankedDocument(doc_id="B"), RankedDocument(doc_id="A")], scores={"A": 0.1, "B": 0.2})
    merged = merge_nx("p@2", "q", "t", 0, result, wall_s=2.0)
    assert merged.output_doc_ids() == ["B", "A"]
    assert (len(merged.turns), merged.total_prompt_tokens, merged.peak_tokens) == (4, 600, 200)
    assert merged.metadata["rollout_ids"] == [r.id for r in rollouts] and merged.error is None
    assert merged.metadata["rollout_rankings"] == [["A"], ["B"]]
    score = score_trajectory(merged, Gold(doc_ids=frozenset({"A", "G", "H"}), answer_doc_ids=frozenset({"H"})), k=5)
    assert score.trajectory_recall == 1.0 and score.recall == pytest.approx(1 / 3) and score.prune_accuracy == 0.0
