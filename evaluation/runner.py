"""Run candidates over bench tasks: concurrent across questions, a progress bar on stderr,
every trajectory saved, every trajectory scored by the one scorer.

Why threads: an episode waits on the index (Chroma's Rust core, numpy and torch release the
GIL) or on a remote model endpoint, so questions overlap well in one process; the harness and
the index are thread-safe by contract. Results are written in task order whatever order they
finish in, so two runs of the same candidate diff cleanly.

Failures: an exception out of a candidate (a harness or index bug) is raised, never scored as
zero; an episode that recorded a policy error is scored as what it returned and counted in
`errors`; a candidate whose every episode failed raises `CandidateFailed`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from agent.trajectory import Trajectory, write_jsonl
from core.progress import Progress
from evaluation.candidates import Runnable
from evaluation.metrics import Granularity, TaskScore, score_trajectory
from evaluation.tasks import Task

log = logging.getLogger(__name__)


class CandidateFailed(RuntimeError):
    """Every episode of a candidate failed (endpoint down, model missing): nothing to score."""


@dataclass(frozen=True)
class TaskResult:
    task: Task
    trajectory: Trajectory
    score: TaskScore


def default_workers() -> int:
    return max(2, min(8, (os.cpu_count() or 2) * 2))


def safe_name(name: str) -> str:
    """A candidate name as a file name (`openai:http://h/v1#m@4` -> `openai_http_h_v1_m@4`)."""
    return re.sub(r"[^A-Za-z0-9@._-]+", "_", name).strip("_") or "candidate"


def run_candidate(
    candidate: Runnable,
    tasks: Sequence[Task],
    k: int,
    workers: int | None = None,
    progress: bool = True,
    seed: int = 0,
    granularity: Granularity = "document",
) -> list[TaskResult]:
    """Every task through `candidate`, scored at output size `k`, in task order."""

    def one(task: Task) -> TaskResult:
        trajectory = candidate.run(task.question, task_id=task.task_id, seed=seed)
        return TaskResult(task, trajectory, score_trajectory(trajectory, task.gold, k=k, granularity=granularity))

    bar = _progress_bar(len(tasks), candidate.name, progress)
    results: list[TaskResult | None] = [None] * len(tasks)
    pool = ThreadPoolExecutor(workers or default_workers(), thread_name_prefix=f"bench-{safe_name(candidate.name)}")
    try:
        futures = {pool.submit(one, task): position for position, task in enumerate(tasks)}
        counted = Progress(log, f"{candidate.name}: questions", len(tasks))
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            counted.advance()
            if bar is not None:
                bar.update(1)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)  # fail now, not after the remaining questions
        raise
    finally:
        pool.shutdown(wait=True)
        if bar is not None:
            bar.close()
    done = [result for result in results if result is not None]
    if done and all(result.score.error for result in done):
        raise CandidateFailed(f"{candidate.name}: every episode failed; first error: {done[0].trajectory.error}")
    return done


def _progress_bar(total: int, name: str, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=name, unit="q", file=sys.stderr, dynamic_ncols=True, leave=True)


def save_results(results: Sequence[TaskResult], out_dir: str | Path, name: str) -> dict[str, str]:
    """`trajectories/<name>.jsonl` (whole records) and `scores/<name>.jsonl` (one row per task)."""
    out_dir = Path(out_dir)
    trajectories = write_jsonl([r.trajectory for r in results], out_dir / "trajectories" / f"{safe_name(name)}.jsonl")
    scores = out_dir / "scores" / f"{safe_name(name)}.jsonl"
    scores.parent.mkdir(parents=True, exist_ok=True)
    with scores.open("w", encoding="utf-8") as handle:
        for r in results:
            row = {"task_id": r.task.task_id, "group": r.task.group, "trajectory_id": r.trajectory.id, **r.score.to_dict()}
            handle.write(json.dumps(row) + "\n")
    return {"trajectories": str(trajectories), "scores": str(scores)}
