"""CISPO on CPU in fp32 against bf16: step time, training tokens/s, peak memory, and the noise of
the first substep's importance ratio, on a real customer's tasks.

    .venv/bin/python bench/cispo_precision.py CUSTOMER [--adapter DIR] [--dtypes float32,bfloat16]
        [--tasks 2] [--group 4] [--max-new-tokens 160] [--micro-batch-tokens 4096] [--runs 1]

Why: on CPU the CISPO sampler is the model being trained (`TransformersRolloutEngine`), so its
precision sets both the rollouts' speed and the training step's, and the importance ratio
pi/pi_old compares the trainer's full forward with the sampler's cached generation in the same
precision: on the first substep the weights are identical, so whatever r differs from 1 there
is arithmetic noise. In fp32 it is below 1e-5 (`tests/test_training_cispo_ratio.py`); in bf16
it is larger, and this script measures how much on the model that will train.

Each dtype runs in its own process (peak memory is per process), on the same train tasks of
CUSTOMER (its verified tasks and index, in SEARCHSMITH_HOME: for the learning benchmark's
customer, its run's `home`), one CISPO step of
`--tasks` tasks x `--group` rollouts from `--adapter` (default the packaged searcher) under the
adapter's harness profile, with the learning benchmark's reply cap. A step whose groups all
agree trains nothing; the script says so rather than report a training rate it did not measure.
Prints one row per dtype (medians over `--runs`) and the ratio to the first dtype.

Measured 2026-12-02 on the learning benchmark's customer (AVX512-BF16 EPYC, 2 cores shared with
an evaluation, one run): fp32 691 s a step, bf16 681 s; bf16 trained 1.38x faster at 0.76x the
memory but sampled no faster, and its first-substep ratios spread 0.72-1.55. Hence fp32 stays
CISPO's CPU default (core/cpu_precision.py).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def one_step(customer: str, adapter: str, dtype: str, tasks: int, group: int, max_new_tokens: int,
             micro_batch_tokens: int) -> dict:
    """One CISPO step in this process; its timings, token counts, ratio stats and peak RSS."""
    from agent.adapter_sidecar import read_sidecar
    from agent.policies import harness_for
    from core.layout import final_tasks_key
    from core.training_settings import CispoConfig
    from evaluation.synth_tasks import read_synth_tasks, tasks_from_synth
    from orchestration.runner import open_index
    from training.cispo_trainer import train_cispo

    index, chunks = open_index(customer)
    tasks_file = Path(os.environ["SEARCHSMITH_HOME"]) / "artifacts" / final_tasks_key(customer)
    train = tasks_from_synth(read_synth_tasks(tasks_file, split="train", limit=tasks), chunks)
    sidecar = read_sidecar(adapter)
    profile = {k: v for k, v in harness_for(f"transformers:{adapter}").profile().items() if k != "prompt_version"}
    config = CispoConfig(group_size=group, tasks_per_step=tasks, steps=1, substeps=1, max_new_tokens=max_new_tokens,
                         rollout_workers=1, checkpoint_every=1, learning_rate=2e-5, temperature=1.0, harness=profile,
                         micro_batch_tokens=micro_batch_tokens, curriculum=False, dtype=dtype, seed=0)
    with tempfile.TemporaryDirectory() as work:
        result = train_cispo(config, train, index, sidecar["base_model"], adapter, Path(work) / "run",
                             resume=False, log=lambda row: None)
    row = result.history[-1]
    return {"dtype": dtype, "time": row["time"], "tokens": row["tokens"], "groups_kept": row.get("groups_kept"),
            "train_tokens_per_s": row.get("train_tokens_per_s"), "first_substep_ratio": row.get("first_substep_ratio"),
            "reward_mean": row.get("reward_mean"),
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("customer")
    parser.add_argument("--adapter", default=str(REPO / "training" / "searchers" / "smollm2-searcher"))
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--micro-batch-tokens", type=int, default=4096,
                        help="padded tokens per forward (the learning benchmark's; a 16K-token forward kept 22 GB for the backward)")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(one_step(args.customer, args.adapter, args.child, args.tasks, args.group, args.max_new_tokens,
                                  args.micro_batch_tokens)))
        return
    results: dict[str, list[dict]] = {}
    for _ in range(args.runs):
        for dtype in args.dtypes.split(","):
            done = subprocess.run([sys.executable, __file__, args.customer, "--adapter", args.adapter, "--child", dtype,
                                   "--tasks", str(args.tasks), "--group", str(args.group),
                                   "--max-new-tokens", str(args.max_new_tokens),
                                   "--micro-batch-tokens", str(args.micro_batch_tokens)],
                                  stdout=subprocess.PIPE, text=True, check=True)
            results.setdefault(dtype, []).append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(done.stdout.strip().splitlines()[-1], file=sys.stderr)
    print(f"\nCISPO, one step of {args.tasks} tasks x {args.group} rollouts on {args.customer}, from {Path(args.adapter).name}, "
          f"median of {args.runs}\n")
    print("| dtype | rollout s | training s | step s | train tokens/s | peak RSS GB | first-substep r mean [min, max] | groups kept |")
    print("|---|---:|---:|---:|---:|---:|---|---:|")
    first_step = None
    for dtype, rows in results.items():
        step = median(r["time"]["step_s"] for r in rows)
        rollout = median(r["time"]["rollout_s"] for r in rows)
        training = median(r["time"]["training_s"] for r in rows)
        rates = [r["train_tokens_per_s"] for r in rows if r["train_tokens_per_s"]]
        rate = median(rates) if rates else None
        ratios = [r["first_substep_ratio"] for r in rows if r["first_substep_ratio"]]
        ratio = (f"{median(x['mean'] for x in ratios):.4f} [{min(x['min'] for x in ratios):.3f}, "
                 f"{max(x['max'] for x in ratios):.3f}]") if ratios else "no update (every group agreed)"
        speed = f" ({first_step / step:.2f}x)" if first_step is not None else ""
        first_step = step if first_step is None else first_step
        rate_text = f"{rate:.1f}" if rate else "-"
        print(f"| {dtype} | {rollout:.0f} | {training:.0f} | {step:.0f}{speed} | {rate_text} | "
              f"{median(r['peak_rss_gb'] for r in rows):.2f} | {ratio} | {median(r['groups_kept'] or 0 for r in rows)} |")


if __name__ == "__main__":
    main()
