"""What an Nx merge could gain: each rollout alone, the merge, and the best any merge could do.

    .venv/bin/python bench/bench_dev.py --policies heuristic@4 --out /tmp/nx
    .venv/bin/python bench/nx_ceiling.py --run /tmp/nx [--policy heuristic@4] [--k 5]

Reads the trajectories `searchsmith bench` / `bench_dev.py` saved for an Nx candidate (each
merged trajectory keeps every rollout's own ranking) and scores, on the same questions at the same
k: the first rollout alone (seed 0, the 1x policy), the harness's RRF merge, the *best rollout*
per question (an oracle that knows which rollout found the answer) and the union of the rollouts'
top k (recall only). When the oracle is barely above one rollout, the rollouts agree and no merge
can add much: the limit is their diversity, not the merge. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, required=True, help="a bench output folder (with report.json)")
    parser.add_argument("--policy", default=None, help="the Nx candidate (default: the first one with n > 1)")
    parser.add_argument("--k", type=int, default=None, help="documents scored (default: the run's k)")
    args = parser.parse_args(argv)

    from agent.trajectory import read_jsonl
    from evaluation.bootstrap import bootstrap_mean
    from evaluation.external import read_records, tasks_from_records
    from evaluation.metrics import answer_found_in

    report_path = args.run / "report.json"
    if not report_path.is_file():
        raise SystemExit(f"{report_path}: not found; --run takes the --out folder of a `searchsmith bench` or bench_dev.py run")
    report = json.loads(report_path.read_text())
    config = report["config"]
    nx = [name for name, candidate in config["candidates"].items() if candidate.get("n", 1) > 1]
    policy = args.policy or (nx[0] if nx else None)
    if policy not in nx:
        raise SystemExit(f"{args.run}: no Nx candidate {policy!r} in this run (Nx candidates: {nx or 'none'})")
    k = args.k or config["k"]
    golds = {task.task_id: task.gold for task in tasks_from_records(read_records(config["tasks_file"]))}
    first, merged_found, oracle = [], [], []
    first_recall, merged_recall, union_recall = [], [], []
    for trajectory in read_jsonl(report["files"]["trajectories"][policy]):
        rankings = trajectory.metadata.get("rollout_rankings")
        if rankings is None:
            raise SystemExit(f"{args.run}: trajectories without rollout_rankings (written before they were recorded); rerun the bench")
        gold = golds[trajectory.task_id]
        merged = list(dict.fromkeys(trajectory.output_doc_ids()))[:k]
        tops = [ranking[:k] for ranking in rankings]
        first.append(answer_found_in(set(tops[0]), gold))
        merged_found.append(answer_found_in(set(merged), gold))
        oracle.append(max(answer_found_in(set(top), gold) for top in tops))
        first_recall.append(_recall(tops[0], gold))
        merged_recall.append(_recall(merged, gold))
        union_recall.append(_recall([doc for top in tops for doc in top], gold))
    n = len(first)
    print(f"{config['tasks_file']}: {policy}, {n} questions, k={k}")
    print("| ranking | answer found [95% CI] | recall |")
    print("|---|---|---:|")
    for name, found, recall in (("first rollout (the 1x policy)", first, first_recall),
                                ("RRF merge (the harness)", merged_found, merged_recall),
                                ("best rollout per question (oracle)", oracle, None),
                                (f"union of the rollouts' top {k}", None, union_recall)):
        cell = "-"
        if found is not None:
            interval = bootstrap_mean(found)
            cell = f"{interval.mean:.3f} [{interval.low:.2f}, {interval.high:.2f}]"
        print(f"| {name} | {cell} | {sum(recall) / n:.3f} |" if recall is not None else f"| {name} | {cell} | - |")
    return 0


def _recall(returned: list[str], gold) -> float:
    return len(gold.doc_ids & set(returned)) / len(gold.doc_ids) if gold.doc_ids else 0.0


if __name__ == "__main__":
    raise SystemExit(main())
