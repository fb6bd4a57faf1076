"""Two benchmark rows compared on the same questions: the paired difference, what it won and lost.

    .venv/bin/python bench/paired.py RUN_A:CANDIDATE RUN_B:CANDIDATE [--metric answer_found]

Each side is the `--out` folder of a `searchsmith bench` or `bench/bench_dev.py` run and one of its
candidates (`RUN:heuristic+rerank`; a folder alone takes its only candidate). Both sides must have
scored exactly the same questions. Prints, for A - B: the paired mean difference with its bootstrap
95% interval, the questions A won and lost (a metric that moved, for answer found a question found
by one side only), and the same per dataset (the task's group) and per half of the file (task ids
split by sha1 parity, as `bench/selection_sweep.py` splits them).

Why: two rows side by side with their own intervals overlap even when one is better on almost
every question they differ on; whether a change helped is a question about the difference
(`evaluation.bootstrap.paired_difference`), and the halves show whether a gain is one part of the
file or all of it. Every "paired" figure in docs/results.md is this script's output. Asserts nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


@dataclass(frozen=True)
class Row:
    run: Path
    candidate: str
    scores: dict[str, dict]  # task id -> its score line


def load_row(spec: str) -> Row:
    """`RUN[:CANDIDATE]` read from the run's report and score file, with errors naming what is missing."""
    run_text, _, candidate = spec.partition(":") if not Path(spec).is_dir() else (spec, "", "")
    run = Path(run_text)
    report_path = run / "report.json"
    if not report_path.is_file():
        raise SystemExit(f"{spec}: {report_path} not found; give the --out folder of a `searchsmith bench` or bench_dev.py run")
    files = json.loads(report_path.read_text(encoding="utf-8"))["files"]["scores"]
    if not candidate:
        if len(files) != 1:
            raise SystemExit(f"{spec}: the run has {len(files)} candidates ({', '.join(files)}); name one as {run}:CANDIDATE")
        candidate = next(iter(files))
    if candidate not in files:
        raise SystemExit(f"{spec}: no candidate {candidate!r} in {run} (it has {', '.join(files)})")
    path = Path(files[candidate])
    if not path.is_absolute() or not path.is_file():  # a run folder moved since: its scores/ beside report.json
        path = run / "scores" / Path(files[candidate]).name
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return Row(run, candidate, {line["task_id"]: line for line in lines})


def half_of(task_id: str) -> str:
    return "half A" if int(hashlib.sha1(task_id.encode()).hexdigest(), 16) % 2 == 0 else "half B"


def compare(ours: Row, theirs: Row, metric: str) -> list[dict]:
    """One line per slice (all, each group, each half): n, both means, the paired difference, won, lost."""
    from evaluation.bootstrap import paired_difference

    missing = sorted(set(ours.scores) ^ set(theirs.scores))
    if missing:
        raise SystemExit(f"{ours.run}:{ours.candidate} and {theirs.run}:{theirs.candidate} scored different questions: "
                         f"{len(missing)} on one side only, e.g. {missing[:3]}")
    for row in (ours, theirs):
        absent = [task for task, line in row.scores.items() if line.get(metric) is None]
        if len(absent) == len(row.scores):
            raise SystemExit(f"{row.run}:{row.candidate}: no {metric!r} in its scores")
    groups: dict[str, list[str]] = {}
    halves: dict[str, list[str]] = {}
    for task in sorted(ours.scores):
        groups.setdefault(str(ours.scores[task].get("group") or "no group"), []).append(task)
        halves.setdefault(half_of(task), []).append(task)
    slices = {"all": sorted(ours.scores), **dict(sorted(groups.items())), **dict(sorted(halves.items()))}
    result = []
    for name, tasks in slices.items():
        a = {task: float(ours.scores[task].get(metric) or 0.0) for task in tasks}
        b = {task: float(theirs.scores[task].get(metric) or 0.0) for task in tasks}
        interval = paired_difference(a, b)
        result.append({"slice": name, "n": len(tasks), "ours": sum(a.values()) / len(tasks), "theirs": sum(b.values()) / len(tasks),
                       "difference": interval.mean, "low": interval.low, "high": interval.high,
                       "won": sum(1 for task in tasks if a[task] > b[task]), "lost": sum(1 for task in tasks if a[task] < b[task])})
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ours", help="RUN_DIR[:CANDIDATE], the row whose gain is asked about (A)")
    parser.add_argument("theirs", help="RUN_DIR[:CANDIDATE], the row it is compared with (B)")
    parser.add_argument("--metric", default="answer_found", help="a per-question score (answer_found, recall, trajectory_recall, ...)")
    args = parser.parse_args(argv)
    ours, theirs = load_row(args.ours), load_row(args.theirs)
    print(f"A = {ours.run}:{ours.candidate}, B = {theirs.run}:{theirs.candidate}, {args.metric}")
    print("| questions | n | A | B | A - B [95% CI] | A won | A lost |")
    print("|---|---:|---:|---:|---|---:|---:|")
    for line in compare(ours, theirs, args.metric):
        print(f"| {line['slice']} | {line['n']} | {line['ours']:.3f} | {line['theirs']:.3f} | "
              f"{line['difference']:+.3f} [{line['low']:+.3f}, {line['high']:+.3f}] | {line['won']} | {line['lost']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
