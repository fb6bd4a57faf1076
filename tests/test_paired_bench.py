"""`bench/paired.py`: two benchmark rows compared question by question, from the files a run writes."""

import json

import pytest

from bench.paired import compare, half_of, load_row


def write_run(folder, rows_by_candidate):
    """A run folder as `searchsmith bench` leaves it: report.json naming one score file per candidate."""
    (folder / "scores").mkdir(parents=True)
    files = {}
    for candidate, rows in rows_by_candidate.items():
        path = folder / "scores" / f"{candidate.replace('+', '_')}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        files[candidate] = str(path)
    (folder / "report.json").write_text(json.dumps({"files": {"scores": files}}))
    return folder


def rows(found, group="HotpotQA"):
    return [{"task_id": f"t{i}", "group": group, "answer_found": value} for i, value in enumerate(found)]


def test_counts_won_and_lost_and_slices_by_group_and_half(tmp_path):
    ours = write_run(tmp_path / "a", {"heuristic+rerank": rows([1, 1, 1, 0, 1, 0])})
    theirs = write_run(tmp_path / "b", {"heuristic": rows([1, 0, 0, 0, 1, 1]), "hybrid": rows([0] * 6)})
    lines = {line["slice"]: line for line in compare(load_row(f"{ours}"), load_row(f"{theirs}:heuristic"), "answer_found")}
    assert lines["all"]["won"] == 2 and lines["all"]["lost"] == 1
    assert lines["all"]["difference"] == pytest.approx(1 / 6)
    assert lines["all"]["low"] <= lines["all"]["difference"] <= lines["all"]["high"]
    assert lines["HotpotQA"]["n"] == 6
    halves = [name for name in lines if name.startswith("half")]
    assert sum(lines[name]["n"] for name in halves) == 6
    assert {half_of(f"t{i}") for i in range(6)} == set(halves)


def test_refuses_rows_over_different_questions_and_names_missing_candidates(tmp_path):
    ours = write_run(tmp_path / "a", {"heuristic": rows([1, 0, 1])})
    theirs = write_run(tmp_path / "b", {"heuristic": rows([1, 0])})
    with pytest.raises(SystemExit, match="scored different questions"):
        compare(load_row(str(ours)), load_row(str(theirs)), "answer_found")
    with pytest.raises(SystemExit, match="no candidate 'hybrid'.*it has heuristic"):
        load_row(f"{ours}:hybrid")
    with pytest.raises(SystemExit, match="report.json not found"):
        load_row(str(tmp_path / "nowhere"))
