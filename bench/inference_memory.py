"""Resident memory of an in-process model's benchmark, with and without giving freed heap pages back.

    .venv/bin/python bench/inference_memory.py --adapter .searchsmith/models/demo/cispo/*/adapter [--limit 16] [--repeat 1]

Runs the same benchmark as `searchsmith bench --policies transformers:ADAPTER --k 5` on the
first `--limit` dev questions, once per variant and repeat, each in a fresh child process (its
own heap): `ceiling`, as shipped (the generation batcher generates inside `core.heap_memory.
releasing_freed_memory`, which trims freed pages every 2 s while the process holds more than
40% of the machine's memory), `always` (trims every 2 s whatever the process holds) and `keep`
(no trimming, how it ran before). A thread samples the process's resident memory every second.
Prints, per variant, the medians of peak and final resident memory, wall time and answer found
(the same questions and greedy turns, so answer found must not move), and each variant's ratios
to `keep`. Asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DEV_FILE = REPO.parent / "shared" / "data" / "multihop_dev.jsonl"
VARIANTS = ("keep", "ceiling", "always")


def run_variant(variant: str, adapter: str, limit: int, tasks: Path) -> dict:
    """One benchmark in this process; what it measured."""
    import agent.policies.generation_batcher as batcher
    from core import heap_memory
    from evaluation.bench import run_bench_command

    if variant == "keep":
        batcher.releasing_freed_memory = contextlib.nullcontext
    elif variant == "always":
        batcher.releasing_freed_memory = functools.partial(heap_memory.releasing_freed_memory, above_bytes=0)
    def resident_gb() -> float:
        return (heap_memory.resident_bytes() or 0) / 1e9

    peak = [0.0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(1.0):
            peak[0] = max(peak[0], resident_gb())

    threading.Thread(target=sample, daemon=True).start()
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as out:
        report = run_bench_command(tasks, [f"transformers:{adapter}"], k=5, out_dir=out, limit=limit, progress=False)
    wall = time.monotonic() - began
    done.set()
    (row,) = report["policies"].values()
    return {"variant": variant, "peak_gb": max(peak[0], resident_gb()), "end_gb": resident_gb(), "wall_s": wall,
            "answer_found": row["answer_found"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--adapter", required=True, help="a checkpoint's adapter folder (or a model folder)")
    parser.add_argument("--limit", type=int, default=16, help="dev questions (default 16: two batches of 8 episodes)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--tasks", type=Path, default=DEV_FILE)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # the child's mode
    args = parser.parse_args(argv)
    if not Path(args.adapter).is_dir():
        raise SystemExit(f"--adapter {args.adapter}: not a folder (make demo writes .searchsmith/models/demo/cispo/*/adapter)")
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.adapter, args.limit, args.tasks)))
        return 0
    rows: dict[str, list[dict]] = {variant: [] for variant in VARIANTS}
    for _ in range(args.repeat):
        for variant in VARIANTS:
            child = subprocess.run([sys.executable, __file__, "--adapter", args.adapter, "--limit", str(args.limit),
                                    "--tasks", str(args.tasks), "--variant", variant],
                                   capture_output=True, text=True, check=False)
            if child.returncode != 0:
                raise SystemExit(f"{variant} run failed:\n{child.stderr[-3000:]}")
            rows[variant].append(json.loads(child.stdout.strip().splitlines()[-1]))
    medians = {variant: {key: statistics.median(r[key] for r in runs) for key in ("peak_gb", "end_gb", "wall_s", "answer_found")}
               for variant, runs in rows.items()}
    print(f"{args.limit} questions, {args.repeat} run(s) per variant (medians)")
    print(f"{'variant':8s} {'peak GB':>8s} {'end GB':>8s} {'wall s':>8s} {'answer':>7s}")
    for variant, m in medians.items():
        print(f"{variant:8s} {m['peak_gb']:8.2f} {m['end_gb']:8.2f} {m['wall_s']:8.0f} {m['answer_found']:7.3f}")
    keep = medians["keep"]
    for variant in VARIANTS[1:]:
        m = medians[variant]
        print(f"{variant}/keep: peak {m['peak_gb'] / keep['peak_gb']:.2f}x, wall {m['wall_s'] / keep['wall_s']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
