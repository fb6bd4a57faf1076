"""Teacher trajectories: K harness rollouts per train task, concurrent, saved one by one, resumable.

Why the harness and not a bespoke loop: SFT must teach exactly the protocol the student will
run under (tools, budget lines, pruning), so the teacher (an OpenAI-compatible endpoint with
tool calling, or offline the `heuristic` policy) drives the same `Harness` as RL, evaluation
and serving, and every turn's view is recorded in the trajectory.

Resumption: each rollout is keyed by (task id, rollout seed) under a fingerprint of the teacher
and the harness settings, and written to the artifact store as soon as it completes; a rerun
loads what is there and runs only the rest (a crash loses at most the episodes in flight; a
new teacher or new settings get a new fingerprint, so stale rollouts are never reused).

Failures: an episode whose policy failed (endpoint down, model missing: `Trajectory.error`) is
retried up to `max_attempts` times, then recorded under `errors/` and reported in the result;
it is never saved as a done rollout, so it is neither scored (a zero recall it did not earn)
nor skipped by the next run, which retries it. An exception out of the harness (a bug) is
raised. If no rollout at all succeeded, `TeacherFailed` is raised.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.environment import open_harness
from agent.harness import Harness, HarnessConfig
from agent.policy_base import Policy
from agent.trajectory import Trajectory
from core.progress import Progress
from core.storage import ArtifactNotFound, ArtifactStore, LocalArtifactStore
from search.backend import SearchBackend

STORE_FORMAT = "1"
log = logging.getLogger(__name__)


class TeacherFailed(RuntimeError):
    """Every rollout failed (the teacher is unreachable or broken): nothing to distil."""


@dataclass(frozen=True)
class RolloutFailure:
    task_id: str
    seed: int
    attempts: int
    error: str


@dataclass
class TeacherRollouts:
    """The collected trajectories (task order, then seed) and what it took to get them."""

    trajectories: list[Trajectory]
    failures: list[RolloutFailure] = field(default_factory=list)
    reused: int = 0  # loaded from the store (done by an earlier run)
    collected: int = 0  # run by this call
    fingerprint: str = ""

    def metadata(self) -> dict[str, Any]:
        return {
            "trajectories": len(self.trajectories),
            "reused": self.reused,
            "collected": self.collected,
            "failed": len(self.failures),
            "failures": [f"{f.task_id}#{f.seed}: {f.error}" for f in self.failures[:20]],
            "fingerprint": self.fingerprint,
        }


def task_fields(task: Any) -> tuple[str, str]:
    """(task id, question) of a `synth.schema.SynthTask` or an `evaluation.external.Task`."""
    task_id = getattr(task, "task_id", None) or getattr(task, "id", None)
    if not task_id:
        raise ValueError(f"task without an id: {task!r:.120}")
    return str(task_id), str(task.question)


def teacher_fingerprint(policy_name: str, config: HarnessConfig, policy_settings: str = "") -> str:
    """What makes two rollouts of one (task, seed) comparable: teacher (its name and, for a
    scripted teacher, its settings such as the answer size), harness settings, prompts."""
    body = json.dumps(
        {"format": STORE_FORMAT, "policy": policy_name, "config": config.model_dump(), "prompt": config.prompt_version,
         **({"policy_settings": policy_settings} if policy_settings else {})},
        sort_keys=True,
    )
    return hashlib.sha256(body.encode()).hexdigest()[:16]


class RolloutStore:
    """Done rollouts and recorded failures under `{prefix}/{fingerprint}/` in an artifact store."""

    def __init__(self, store: ArtifactStore | str | Path, prefix: str, fingerprint: str):
        self.store = store if isinstance(store, ArtifactStore) else LocalArtifactStore(store)
        self.base = f"{prefix.strip('/')}/{fingerprint}" if prefix.strip("/") else fingerprint

    def _done_key(self, task_id: str, seed: int) -> str:
        return f"{self.base}/done/{task_id}/{seed}.json"

    def _error_key(self, task_id: str, seed: int) -> str:
        return f"{self.base}/errors/{task_id}/{seed}.json"

    def load(self, task_id: str, seed: int) -> Trajectory | None:
        try:
            raw = self.store.read_bytes(self._done_key(task_id, seed))
        except ArtifactNotFound:
            return None
        try:
            return Trajectory.model_validate_json(raw)
        except ValueError:
            return None  # a corrupt entry is a miss, rerun and overwritten

    def save(self, trajectory: Trajectory) -> None:
        assert trajectory.task_id is not None
        self.store.write_bytes(self._done_key(trajectory.task_id, trajectory.seed), trajectory.model_dump_json().encode())
        error_key = self._error_key(trajectory.task_id, trajectory.seed)
        if self.store.exists(error_key):
            self.store.delete(error_key)

    def record_failure(self, failure: RolloutFailure) -> None:
        payload = {"task_id": failure.task_id, "seed": failure.seed, "attempts": failure.attempts, "error": failure.error}
        self.store.write_bytes(self._error_key(failure.task_id, failure.seed), json.dumps(payload).encode())


def collect_teacher_trajectories(
    tasks: Sequence[Any],
    backend: SearchBackend,
    policy: Policy,
    config: HarnessConfig | None = None,
    *,
    k_rollouts: int = 1,
    workers: int = 4,
    store: ArtifactStore | str | Path | None = None,
    prefix: str = "teacher_rollouts",
    seed: int = 0,
    max_attempts: int = 2,
    progress: bool = False,
) -> TeacherRollouts:
    """Run `k_rollouts` episodes (seeds `seed..seed+k-1`) per task; see the module docstring.

    `config` defaults to `HarnessConfig.for_training()` (soft hint on, as in Context-1's
    training rollouts). `store=None` keeps nothing between runs (tests, one-off calls).
    """
    if k_rollouts < 1 or workers < 1 or max_attempts < 1:
        raise ValueError("k_rollouts, workers and max_attempts must be >= 1")
    config = config or HarnessConfig.for_training()
    settings = repr(policy) if dataclasses.is_dataclass(policy) else ""  # the heuristic's max_docs, hops, weights
    fingerprint = teacher_fingerprint(policy.name, config, settings)
    rollouts = RolloutStore(store, prefix, fingerprint) if store is not None else None
    plan = [(task_id, question, seed + r) for task_id, question in map(task_fields, tasks) for r in range(k_rollouts)]
    results: dict[tuple[str, int], Trajectory] = {}
    pending = []
    for task_id, question, rollout_seed in plan:
        cached = rollouts.load(task_id, rollout_seed) if rollouts is not None else None
        if cached is not None:
            results[(task_id, rollout_seed)] = cached
        else:
            pending.append((task_id, question, rollout_seed))
    reused = len(results)
    failures: list[RolloutFailure] = []

    def one(task_id: str, question: str, rollout_seed: int, harness: Harness) -> Trajectory | RolloutFailure:
        error = ""
        for attempt in range(1, max_attempts + 1):
            trajectory = harness.run(
                question, seed=rollout_seed, task_id=task_id,
                metadata={"teacher": policy.name, "teacher_fingerprint": fingerprint, "attempt": attempt},
            )
            if trajectory.error is None:
                if rollouts is not None:
                    rollouts.save(trajectory)
                return trajectory
            error = trajectory.error
        failure = RolloutFailure(task_id, rollout_seed, max_attempts, error)
        if rollouts is not None:
            rollouts.record_failure(failure)
        return failure

    bar = _progress_bar(len(pending), policy.name) if progress and pending else None
    with open_harness(policy, backend, config=config) as harness, ThreadPoolExecutor(workers, thread_name_prefix="teacher") as pool:
        futures = {pool.submit(one, *item, harness): item for item in pending}
        progress = Progress(log, "teacher rollouts", len(futures))
        try:
            for future in as_completed(futures):
                outcome = future.result()  # a harness exception (a bug) is raised here
                if isinstance(outcome, RolloutFailure):
                    failures.append(outcome)
                else:
                    results[(outcome.task_id or "", outcome.seed)] = outcome
                progress.advance(note=f"{len(failures)} failed" if failures else "")
                if bar is not None:
                    bar.update(1)
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        finally:
            if bar is not None:
                bar.close()
    if plan and not results:
        first = failures[0].error if failures else "no rollouts"
        raise TeacherFailed(f"{policy.name}: every rollout failed ({len(failures)}); first error: {first}")
    ordered = [results[(task_id, s)] for task_id, _, s in plan if (task_id, s) in results]
    failures.sort(key=lambda f: (f.task_id, f.seed))
    return TeacherRollouts(ordered, failures, reused=reused, collected=len(results) - reused, fingerprint=fingerprint)


def _progress_bar(total: int, name: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=f"teacher {name}", unit="rollout", file=sys.stderr, dynamic_ncols=True)
