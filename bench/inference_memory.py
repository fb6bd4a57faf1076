"""Resident memory and wall time of an in-process model's benchmark, per decode cache and heap trimming.

    .venv/bin/python bench/inference_memory.py --adapter .searchsmith/models/demo/cispo/*/adapter [--limit 16] [--repeat 1] [--variants dynamic,shipped]

Runs the same benchmark as `searchsmith bench --policies transformers:ADAPTER --k 5` on the
first `--limit` dev questions, once per variant and repeat, each in a fresh child process (its
own heap). Variants:
- `shipped`: decode into a cache preallocated per batch (agent.policies.preallocated_cache), and
  trim freed heap pages every 2 s while the process holds more than 40% of the machine's memory
  (core.heap_memory.releasing_freed_memory, around each batch);
- `dynamic`: transformers' DynamicCache, which grows every layer by `torch.cat` at each decode
  step (how it ran before the preallocated cache), trimming as shipped;
- `dynamic-keep`: DynamicCache and no trimming (how it ran before either);
- `keep`: preallocated, no trimming; `always`: preallocated, trimming every 2 s whatever is held.
A thread samples the process's resident memory every second. Prints, per variant, the medians of
peak and final resident memory, wall time and answer found (the same questions and greedy turns,
so answer found must not move), and each variant's ratios to the first. Asserts nothing.
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
VARIANTS = ("dynamic", "shipped", "dynamic-keep", "keep", "always")


def use_dynamic_cache() -> None:
    """Make the generation code decode into transformers' DynamicCache, as before."""
    from transformers import DynamicCache

    import agent.policies.preallocated_cache as preallocated

    stack_into_buffers = preallocated.stacked_cache

    def dynamic_stacked(rows, width, capacity):
        cache = DynamicCache()
        for index, layer in enumerate(stack_into_buffers(rows, width, width).layers):
            cache.update(layer.keys, layer.values, index)
        return cache

    preallocated.decode_cache = lambda model, capacity: {}
    preallocated.stacked_cache = dynamic_stacked


def run_variant(variant: str, adapter: str, limit: int, tasks: Path) -> dict:
    """One benchmark in this process; what it measured."""
    import agent.policies.generation_batcher as batcher
    from core import heap_memory
    from evaluation.bench import run_bench_command

    if variant.startswith("dynamic"):
        use_dynamic_cache()
    if variant.endswith("keep"):
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
    parser.add_argument("--variants", default="dynamic,shipped",
                        help=f"comma-separated, ratios against the first (of {', '.join(VARIANTS)})")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # the child's mode
    args = parser.parse_args(argv)
    variants = [name.strip() for name in args.variants.split(",") if name.strip()]
    if unknown := sorted(set(variants) - set(VARIANTS)):
        raise SystemExit(f"--variants: unknown {', '.join(unknown)} (known: {', '.join(VARIANTS)})")
    if not Path(args.adapter).is_dir():
        raise SystemExit(f"--adapter {args.adapter}: not a folder (make demo writes .searchsmith/models/demo/cispo/*/adapter)")
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.adapter, args.limit, args.tasks)))
        return 0
    rows: dict[str, list[dict]] = {variant: [] for variant in variants}
    for _ in range(args.repeat):
        for variant in variants:
            child = subprocess.run([sys.executable, __file__, "--adapter", args.adapter, "--limit", str(args.limit),
                                    "--tasks", str(args.tasks), "--variant", variant],
                                   capture_output=True, text=True, check=False)
            if child.returncode != 0:
                raise SystemExit(f"{variant} run failed:\n{child.stderr[-3000:]}")
            rows[variant].append(json.loads(child.stdout.strip().splitlines()[-1]))
    medians = {variant: {key: statistics.median(r[key] for r in runs) for key in ("peak_gb", "end_gb", "wall_s", "answer_found")}
               for variant, runs in rows.items()}
    print(f"{args.limit} questions, {args.repeat} run(s) per variant (medians)")
    print(f"{'variant':12s} {'peak GB':>8s} {'end GB':>8s} {'wall s':>8s} {'answer':>7s}")
    for variant, m in medians.items():
        print(f"{variant:12s} {m['peak_gb']:8.2f} {m['end_gb']:8.2f} {m['wall_s']:8.0f} {m['answer_found']:7.3f}")
    base = medians[variants[0]]
    for variant in variants[1:]:
        m = medians[variant]
        print(f"{variant}/{variants[0]}: peak {m['peak_gb'] / base['peak_gb']:.2f}x, wall {m['wall_s'] / base['wall_s']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
