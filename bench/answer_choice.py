"""How a compact-view model chooses its answer: by counting references, or by what they say.

    .venv/bin/python bench/answer_choice.py --run DIR [--policy NAME] [--tasks FILE]
    .venv/bin/python bench/answer_choice.py --trajectories FILE

DIR is the `--out` folder of `searchsmith bench` or one row of `bench/learning.py` (for example
`.searchsmith/learning-cpu-natural-student-ADAPTER/report/sft`). A compact-view answer is a list of
episode-wide references (`[3] [1] [7]`), numbered in the order chunks were first shown, so `[1]`
... `[5]` is the top of the first search. A student that writes them in counting order returns
hybrid's top five whatever it read after; one that chooses returns the passages that hold the
answer wherever they were shown. This prints, for the run's episodes: answers given on the model's
own and at the harness's forced final, with answer found for each; the share of answers (the documents
the harness kept from them) that begin with `[1]`, that are exactly `[1]` ... `[n]`, and of
consecutive references that count up by one; answer found for answers that are exactly the first
references and for the rest (does choosing pay?); how often the passage with the answer was shown
past the fifth reference and, when it was, how often the answer named it; trajectory recall against recall (what choosing lost). With
`--trajectories` (the teacher's episodes as SFT replays them in the student's view) only the
counting figures: what the student was shown to do. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FIRST_SEARCH = 5  # references a first search's top shows, the size of the answer


@dataclass(frozen=True)
class Choice:
    """One episode's answer as reference numbers, and where its answer passage was shown."""

    answered: list[int]  # references of the documents the harness kept from the answer, in its order
    answer_references: frozenset[int]  # references of chunks of the passages with the answer
    forced: bool


def choice_figures(choices: list[Choice]) -> dict[str, float]:
    """Shares over episodes (counting pairs over adjacent answer references)."""
    answered = [c for c in choices if c.answered]
    pairs = [(a, b) for c in answered for a, b in zip(c.answered, c.answered[1:], strict=False)]
    late = [c for c in choices if c.answer_references and min(c.answer_references) > FIRST_SEARCH]
    n = len(answered) or 1
    return {
        "answers": len(answered),
        "begin_with_1": sum(c.answered[0] == 1 for c in answered) / n,
        "first_references": sum(is_first_references(c.answered) for c in answered) / n,
        "past_first_search": sum(max(c.answered) > FIRST_SEARCH for c in answered) / n,
        "counting_pairs": sum(b == a + 1 for a, b in pairs) / (len(pairs) or 1),
        "answer_shown_late": len(late),
        "late_answer_chosen": sum(bool(c.answer_references.intersection(c.answered)) for c in late) / (len(late) or 1),
    }


def is_first_references(answered: list[int]) -> bool:
    """The answer is `[1] [2] ... [n]`: the first passages shown, in the order shown."""
    return answered == list(range(1, len(answered) + 1))


def _mean(values: list[float]) -> str:
    return f"{sum(values) / len(values):.3f}" if values else "-"


def shown_references(trajectory) -> dict[str, int]:
    """Chunk id -> reference number, replayed through the compact view's own numbering (first shown, in call order)."""
    from agent.compact_view import References

    references = References()
    for turn in trajectory.turns:
        for call in turn.tool_calls:
            for chunk_id in call.result_chunk_ids:
                references.assign(chunk_id)
    return references.by_chunk


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", type=Path, help="a bench output folder (with report.json)")
    source.add_argument("--trajectories", type=Path,
                        help="a trajectories file without scores, e.g. a run's training/sft_trajectories.jsonl (the "
                             "teacher in the student's view): the counting figures only")
    parser.add_argument("--policy", default=None, help="the candidate (default: the run's first)")
    parser.add_argument("--tasks", type=Path, default=None,
                        help="the questions' file (default: the one the run names; a learning-bench row ran the dev file)")
    args = parser.parse_args(argv)

    from agent.trajectory import read_jsonl

    if args.trajectories:
        choices = [_choice(t, frozenset(), args.trajectories) for t in read_jsonl(args.trajectories)]
        print(f"{args.trajectories}: {len(choices)} episodes")
        _print_counting(choice_figures(choices))
        return 0

    from evaluation.bootstrap import bootstrap_mean
    from evaluation.external import read_records, tasks_from_records

    report_path = args.run / "report.json"
    if not report_path.is_file():
        raise SystemExit(f"{report_path}: not found; --run takes the --out folder of a `searchsmith bench` run or a learning-bench row")
    report = json.loads(report_path.read_text())
    policy = args.policy or next(iter(report["policies"]))
    if policy not in report["files"]["trajectories"]:
        raise SystemExit(f"{args.run}: no candidate {policy!r} (candidates: {sorted(report['files']['trajectories'])})")
    tasks_file = args.tasks or report["config"].get("tasks_file") or REPO.parent / "shared" / "data" / "multihop_dev.jsonl"
    golds = {task.task_id: task.gold for task in tasks_from_records(read_records(tasks_file))}
    scores = {row["trajectory_id"]: row for row in map(json.loads, Path(report["files"]["scores"][policy]).read_text().splitlines())}
    choices, found = [], {"own": [], "forced": []}
    by_counting: dict[bool, list[float]] = {True: [], False: []}  # answer is exactly [1] ... [n], or not
    for trajectory in read_jsonl(report["files"]["trajectories"][policy]):
        gold = golds.get(trajectory.task_id)
        if gold is None:
            raise SystemExit(f"{args.run}: question {trajectory.task_id} is not in {tasks_file}; pass the run's file with --tasks")
        answer_docs = gold.answer_doc_ids or gold.doc_ids  # no single answer passage: any gold one
        choice = _choice(trajectory, answer_docs, args.run)
        choices.append(choice)
        found["forced" if choice.forced else "own"].append(scores[trajectory.id]["answer_found"])
        if choice.answered:
            by_counting[is_first_references(choice.answered)].append(scores[trajectory.id]["answer_found"])
    rows = list(scores.values())
    figures = choice_figures(choices)
    print(f"{args.run}: {policy}, {len(choices)} episodes")
    for kind, values in found.items():
        if values:
            interval = bootstrap_mean(values)
            print(f"- answered {'at the forced final' if kind == 'forced' else 'on its own'}: {len(values)}, answer found "
                  f"{interval.mean:.3f} [{interval.low:.2f}, {interval.high:.2f}]")
    _print_counting(figures)
    counted, chosen = by_counting[True], by_counting[False]
    print(f"- answer found when the answer is exactly [1] ... [n]: {_mean(counted)} of {len(counted)}; "
          f"when it is not: {_mean(chosen)} of {len(chosen)}")
    print(f"- the answer's passage first shown past reference [{FIRST_SEARCH}]: {figures['answer_shown_late']} episodes; "
          f"the answer named it in {figures['late_answer_chosen']:.2f} of them")
    print(f"- trajectory recall {sum(r['trajectory_recall'] for r in rows) / len(rows):.3f}, recall "
          f"{sum(r['recall'] for r in rows) / len(rows):.3f}: choosing lost the difference")
    return 0


def _choice(trajectory, answer_docs: frozenset[str], source: Path) -> Choice:
    if trajectory.config.get("view") != "compact":
        raise SystemExit(f"{source}: trajectory {trajectory.id} ran in the {trajectory.config.get('view')!r} view; "
                         "references exist only in the compact view")
    numbers = shown_references(trajectory)
    shown = frozenset(number for chunk_id, number in numbers.items() if trajectory.chunk_docs.get(chunk_id) in answer_docs)
    kept = [numbers[doc.chunk_id] for doc in trajectory.final_ranking if doc.chunk_id in numbers]
    return Choice(kept, shown, forced=any(turn.forced_final for turn in trajectory.turns))


def _print_counting(figures: dict[str, float]) -> None:
    print(f"- answers that begin with [1]: {figures['begin_with_1']:.2f} of {figures['answers']}; exactly [1] ... [n] (the first "
          f"passages shown): {figures['first_references']:.2f}; naming a reference past [{FIRST_SEARCH}]: "
          f"{figures['past_first_search']:.2f}; consecutive references counting up by one: {figures['counting_pairs']:.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
