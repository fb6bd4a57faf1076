"""Issue 18's claim end to end: a reranker trained on verified synthetic tasks from the dev file's
paragraphs (never its questions), then selection with it on the dev file's real questions.

    .venv/bin/python bench/reranker_dev.py [--seeds 1200] [--max-hops 4] [--max-train-tasks N]
        [--policies hybrid,hybrid+rerank,heuristic,heuristic+rerank] [--work DIR] [--out DIR] [--against-start]

What it does, as a customer would (every training step is the `searchsmith` CLI in its own home):
1. builds `bench/learning.py`'s customer (one Markdown file per distinct dev paragraph, natural
   questions), except that its tasks chain to `--max-hops` documents: the product's default depth
   (4, `core.task_settings.DEFAULT_MAX_HOPS`) unless told otherwise. The learning benchmark stops
   at 2 for the student's budget; a reranker has no such budget, and MuSiQue's chains go to 4;
2. `sync`, `tasks`, `finetune --stage reranker` (the product's defaults: a bi-encoder from the
   packaged MiniLM, chain pairs, the dev-split check and the selection calibration per kind of
   candidate). `--max-train-tasks` caps the train tasks, first in file order, to compare depths at
   one training budget;
3. `bench/bench_dev.py --reranker` with that reranker on every dev question at k=5;
4. with `--against-start`, the untrained start (the packaged MiniLM) calibrated by the same rule on
   the same synthetic dev tasks (`training.per_customer.calibrated_start`), its `+rerank` candidates
   on the same questions, and each trained row against the start's, paired (`bench/paired.py`):
   the recipe's claim is that training on the customer's own tasks, not the start, is what helps.

A rerun reuses every stage whose inputs are unchanged (the pipeline's own reuse), so it resumes.
It prints the reranker's training figures, its dev-split check and calibration, then the dev table.
On 2 cores: sync about 2 minutes, the reranker 40-80 minutes (3.7-4.9 pairs/s in bf16 on
AVX512-BF16 CPUs: AMD EPYC, Xeon with AMX), the four candidates about 13 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from core.task_settings import DEFAULT_MAX_HOPS  # noqa: E402

NAME = "rr"
DEFAULT_SEEDS = 1200
DEFAULT_POLICIES = "hybrid,hybrid+rerank,heuristic,heuristic+rerank"


def build_customer(work: Path, seeds: int, max_hops: int, max_train_tasks: int | None) -> tuple[Path, dict[str, str]]:
    """The customer file and the environment of its own home under `work`."""
    from bench import learning

    customers = work / "customers"
    customers.mkdir(parents=True, exist_ok=True)
    (work / "home" / "dagster").mkdir(parents=True, exist_ok=True)
    learning.write_corpus(learning.dev_file(), customers / "corpus")
    size = replace(learning.SIZES["cpu"], seeds=seeds)
    path = learning.customer_file(customers, size, NAME, "natural", max_hops=max_hops)
    settings = json.loads(path.read_text(encoding="utf-8"))
    settings["training"]["reranker"] = {"max_tasks": max_train_tasks} if max_train_tasks else {}
    path.write_text(json.dumps(settings, indent=2), encoding="utf-8")
    env = {**os.environ, "SEARCHSMITH_HOME": str(work / "home"), "DAGSTER_HOME": str(work / "home" / "dagster"),
           "SEARCHSMITH_CUSTOMERS_DIR": str(customers)}
    return path, env


def train_reranker(work: Path, path: Path, env: dict[str, str]) -> dict:
    """The product's stages, in order; each prints its own one-line summary to the log."""
    from bench import learning

    log = work / "pipeline.log"
    for step in (["customers", "add", str(path)], ["sync", NAME], ["tasks", NAME]):
        learning.cli(step, env, log)
    return learning.cli(["finetune", NAME, "--stage", "reranker"], env, log)


def calibrate_start(folder: Path) -> None:
    """In the customer's environment (a child process): the start calibrated as the trained reranker was."""
    from core.layout import final_tasks_key
    from core.registry import CustomerRegistry
    from orchestration.runner import open_index, resources
    from synth.per_customer import load_tasks
    from training.per_customer import calibrated_start

    config = CustomerRegistry().get(NAME)
    store = resources().store.get()
    index, chunks = open_index(NAME)
    calibrated_start(load_tasks(store, final_tasks_key(NAME)), chunks, index,
                     config.training.reranker, folder, k=config.benchmark.k)


def against_start(work: Path, env: dict[str, str], policies: str, trained_out: Path) -> None:
    """The start's `+rerank` rows on the same questions, and each trained row minus the start's, paired."""
    import subprocess

    from bench import bench_dev, paired

    rerank = [policy for policy in policies.split(",") if policy.endswith("+rerank")]
    if not rerank:
        raise SystemExit("--against-start compares +rerank candidates; --policies names none")
    folder = work / "start-reranker"
    done = subprocess.run([sys.executable, __file__, "--calibrate-start", str(folder)], env=env, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"calibrating the untrained start failed (exit {done.returncode})")
    start_out = work / "dev-start"
    if bench_dev.main(["--policies", ",".join(rerank), "--reranker", str(folder), "--out", str(start_out)]) != 0:
        raise SystemExit(f"the untrained start's rows failed; see {start_out}")
    for policy in rerank:
        print(f"\n{policy}: trained reranker (A) against its untrained start (B), calibrated alike", flush=True)
        paired.main([f"{trained_out}:{policy}", f"{start_out}:{policy}"])


def summary(result: dict) -> str:
    train, dev, selection = result["train"], result.get("dev") or {}, result.get("selection") or {}
    lines = [f"reranker {result['path']}",
             f"  trained on {train.get('train_tasks')} tasks: {train['pairs']:,} pairs, {train['steps']} steps, "
             f"{train['train_s'] / 60:.1f} min ({train['pairs_per_s']} pairs/s, {train['metrics'].get('precision')})"]
    if dev:
        lines.append("  synthetic dev split recall@k: " + ", ".join(f"{name} {row['recall_at_k']:.3f}" for name, row in dev.items()))
    for policy, choice in (selection.get("by_policy") or {}).items():
        lines.append(f"  selection for {policy}: weight {choice['policy_weight']:g}, chains from {choice['chain_anchors']} "
                     f"first links (recall@k {max(choice['recall_at_k_by_choice'].values()):.3f} on {choice['tasks']} tasks)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help="extractive task seeds")
    parser.add_argument("--max-hops", type=int, default=DEFAULT_MAX_HOPS, help="documents a task chains at most")
    parser.add_argument("--max-train-tasks", type=int, default=None, help="cap on the reranker's train tasks")
    parser.add_argument("--policies", default=DEFAULT_POLICIES)
    parser.add_argument("--work", type=Path, default=None, help="the customer's home (default .searchsmith/reranker-dev-hHOPS)")
    parser.add_argument("--out", type=Path, default=None, help="the dev report (default WORK/dev)")
    parser.add_argument("--against-start", action="store_true",
                        help="also the untrained start, calibrated alike, on the +rerank candidates; paired against the trained rows")
    parser.add_argument("--calibrate-start", type=Path, default=None, help=argparse.SUPPRESS)  # the child process of --against-start
    args = parser.parse_args(argv)
    if args.calibrate_start:
        calibrate_start(args.calibrate_start)
        return 0
    work = (args.work or REPO / ".searchsmith" / f"reranker-dev-h{args.max_hops}").resolve()
    path, env = build_customer(work, args.seeds, args.max_hops, args.max_train_tasks)
    result = train_reranker(work, path, env)
    print(summary(result), flush=True)

    from bench import bench_dev

    out = args.out or work / "dev"
    status = bench_dev.main(["--policies", args.policies, "--reranker", result["path"], "--out", str(out)])
    if status == 0 and args.against_start:
        against_start(work, env, args.policies, out)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
