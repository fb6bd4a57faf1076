"""LoRA SFT throughput on CPU (or GPU): tokens/s and peak memory of short runs, and the demo's SFT.

Two modes:

- `synthetic` (default): random token sequences of `--seq-len` with the last 20% labelled,
  trained for `--steps` optimizer steps through the real `train_sft` (TRL + peft), for each
  model (`tiny`: a random model built on the fly; `smollm2`: the cached SmolLM2-135M-Instruct,
  skipped when absent) and each `--threads` value. Each configuration runs in a fresh
  subprocess so its peak memory is its own.
- `pipeline`: what `make demo` does before SFT, on a benchmark file's pooled corpus: heuristic
  teacher rollouts, the Context-1 filter, per-turn samples in SmolLM2's chat format (lengths,
  overlong count), then SFT with the given `--max-length/--max-samples/--steps`, each stage timed.

The machine may be shared: timings are noisy, compare runs made side by side. Never asserts.

    .venv/bin/python bench/sft_bench.py [--models tiny,smollm2] [--seq-len 1024] [--steps 4] [--threads 1,2] \
        [--precision fp32,bf16] [--runs 3] [--json]
    .venv/bin/python bench/sft_bench.py --mode pipeline --tasks tests/data/multihop_sample.jsonl --limit 12 \
        --max-length 2048 --max-samples 12 --steps 6 [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def model_folder(name: str, scratch: Path) -> Path | None:
    if name == "tiny":
        from agent.small_model import build_tiny_model

        return build_tiny_model(scratch / "tiny", ["search agent tool call"], seed=0)
    if name == "smollm2":
        from agent.small_model import SMOLLM2_DIRNAME, default_models_dir, is_complete

        folder = default_models_dir() / SMOLLM2_DIRNAME
        return folder if is_complete(folder) else None
    return Path(name)


def synthetic_samples(vocab_size: int, seq_len: int, n: int, seed: int = 0):
    from training.sft_samples import IGNORE_INDEX, SampleSet, SFTSample

    rng = random.Random(seed)
    samples = []
    for i in range(n):
        ids = [rng.randrange(16, vocab_size) for _ in range(seq_len)]
        cut = int(seq_len * 0.8)
        samples.append(SFTSample(f"synthetic-{i}", None, 0, ids, [IGNORE_INDEX] * cut + ids[cut:]))
    return SampleSet(samples, [], seq_len, n)


def run_single(model: str, threads: int, args: argparse.Namespace) -> dict:
    """One configuration in this process (the parent starts one subprocess per configuration)."""
    from transformers import AutoConfig

    from core.training_settings import LoraSettings, SFTSettings
    from training.sft import train_sft

    with tempfile.TemporaryDirectory(prefix="sft-bench-") as scratch:
        folder = model_folder(model, Path(scratch))
        if folder is None:
            return {"model": model, "skipped": "not cached (run ensure_smollm2 first)"}
        vocab = AutoConfig.from_pretrained(str(folder)).vocab_size
        per_step = args.batch * args.grad_accum
        samples = synthetic_samples(vocab, args.seq_len, per_step * args.steps)
        sft = SFTSettings(max_steps=args.steps, batch_size=args.batch, grad_accum=args.grad_accum, max_length=args.seq_len,
                          learning_rate=1e-4, torch_threads=threads, precision=args.precision,
                          gradient_checkpointing=args.checkpointing)
        result = train_sft(samples, folder, Path(scratch) / "adapter", lora=LoraSettings(rank=args.rank), sft=sft)
    m = result.metrics
    return {"model": model, "threads": threads, "seq_len": args.seq_len, "steps": m["steps"], "tokens": m["tokens"],
            "wall_s": m["wall_s"], "tokens_per_s": m["tokens_per_s"], "s_per_step": round(m["wall_s"] / max(1, m["steps"]), 2),
            "peak_rss_mb": m["peak_rss_mb"], "peak_gpu_mb": m.get("peak_gpu_mb"), "device": m["device"],
            "precision": m["precision"], "checkpointing": m["gradient_checkpointing"], "first_loss": m["first_loss"], "final_loss": m["final_loss"]}


def synthetic(args: argparse.Namespace) -> list[dict]:
    """Every (model, threads, precision) configuration `--runs` times, each in a fresh subprocess.

    A row holds the medians of its runs and, for every precision after the first, its
    tokens/s and peak memory as ratios to the first precision's row of the same model and threads.
    """
    rows = []
    for model in args.models.split(","):
        for threads in [int(t) for t in args.threads.split(",")]:
            baseline = None
            for precision in args.precision.split(","):
                runs = [_run_subprocess(model, threads, precision, args) for _ in range(args.runs)]
                good = [run for run in runs if "tokens_per_s" in run]
                if not good:
                    rows.append(runs[-1])
                    print(json.dumps(runs[-1]), file=sys.stderr)
                    continue
                row = {**good[-1], "runs": len(good),
                       **{key: statistics.median(run[key] for run in good) for key in ("tokens_per_s", "wall_s", "peak_rss_mb")},
                       "tokens_per_s_runs": [run["tokens_per_s"] for run in good]}
                if baseline is None:
                    baseline = row
                else:
                    row["speed_vs_" + baseline["precision"]] = round(row["tokens_per_s"] / baseline["tokens_per_s"], 2)
                    row["memory_vs_" + baseline["precision"]] = round(row["peak_rss_mb"] / baseline["peak_rss_mb"], 2)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
    return rows


def _run_subprocess(model: str, threads: int, precision: str, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--single", model, "--single-threads", str(threads),
               "--seq-len", str(args.seq_len), "--steps", str(args.steps), "--batch", str(args.batch),
               "--grad-accum", str(args.grad_accum), "--rank", str(args.rank), "--precision", precision]
    command += ["--checkpointing"] if args.checkpointing else []
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"model": model, "threads": threads, "precision": precision,
                                                "error": done.stderr[-800:]}


def pipeline(args: argparse.Namespace) -> dict:
    """Teacher -> filter -> samples -> SFT on a benchmark file's pooled corpus, each stage timed."""
    from agent.harness import HarnessConfig
    from agent.policies import load_policy
    from core.training_settings import LoraSettings, SFTSettings
    from evaluation.external import load_external_benchmark
    from training.kept_trajectories import filter_trajectories
    from training.sft import data_lineage, load_tokenizer, train_sft
    from training.sft_samples import build_samples
    from training.teacher_trajectories import collect_teacher_trajectories

    report: dict = {"settings": vars(args).copy()}
    with tempfile.TemporaryDirectory(prefix="sft-pipeline-") as scratch:
        start = time.perf_counter()
        bench = load_external_benchmark(args.tasks, limit=args.limit, cache_root=args.cache_root or Path(scratch) / "cache")
        report["index_s"] = round(time.perf_counter() - start, 1)
        overrides = {"token_budget": args.token_budget} if args.token_budget else {}
        if args.search_budget:
            overrides["search_budget_tokens"] = args.search_budget
        config = HarnessConfig.for_training(**overrides)
        start = time.perf_counter()
        rollouts = collect_teacher_trajectories(bench.tasks, bench.index, load_policy("heuristic"), config,
                                                k_rollouts=args.k_rollouts, workers=2)
        report["teacher_s"] = round(time.perf_counter() - start, 1)
        selected = filter_trajectories(rollouts.trajectories, {t.task_id: t.gold for t in bench.tasks})
        report["filter"] = selected.metadata()
        start = time.perf_counter()
        folder = model_folder(args.model, Path(scratch))
        samples = build_samples(selected.kept, load_tokenizer(folder), args.max_length)
        lengths = sorted(len(s.input_ids) for s in build_samples(selected.kept, load_tokenizer(folder), 10**9).samples)
        report["samples_s"] = round(time.perf_counter() - start, 1)
        report["all_turn_lengths"] = {"n": len(lengths), "p50": lengths[len(lengths) // 2] if lengths else 0,
                                      "p90": lengths[int(len(lengths) * 0.9)] if lengths else 0, "max": max(lengths, default=0)}
        chosen = samples.select(args.max_samples, 0)
        report["samples"] = {k: v for k, v in chosen.metadata().items() if k != "overlong_samples"}
        sft = SFTSettings(max_steps=args.steps, batch_size=args.batch, grad_accum=args.grad_accum,
                          max_length=args.max_length, learning_rate=2e-4, torch_threads=args.pipeline_threads)
        start = time.perf_counter()
        result = train_sft(chosen, folder, Path(scratch) / "adapter", lora=LoraSettings(rank=args.rank), sft=sft,
                           lineage=data_lineage(selected.kept))
        report["sft_s"] = round(time.perf_counter() - start, 1)
        report["sft"] = {k: result.metrics[k] for k in ("steps", "tokens", "wall_s", "tokens_per_s", "peak_rss_mb", "first_loss", "final_loss")}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("synthetic", "pipeline"), default="synthetic")
    parser.add_argument("--models", default="tiny,smollm2")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--precision", default="auto", help="one or more of auto,fp32,bf16,fp16, comma-separated")
    parser.add_argument("--runs", type=int, default=1, help="runs per configuration (median reported)")
    parser.add_argument("--checkpointing", action="store_true", default=None, help="gradient checkpointing (default: on GPU only)")
    parser.add_argument("--json", action="store_true")
    # pipeline mode
    parser.add_argument("--tasks", default=str(ROOT / "tests" / "data" / "multihop_sample.jsonl"))
    parser.add_argument("--limit", type=int, default=12)
    parser.add_argument("--k-rollouts", type=int, default=1)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--max-samples", type=int, default=12)
    parser.add_argument("--token-budget", type=int, default=None)
    parser.add_argument("--search-budget", type=int, default=None)
    parser.add_argument("--pipeline-threads", type=int, default=None)
    parser.add_argument("--cache-root", default=None)
    # internal: one configuration per subprocess
    parser.add_argument("--single", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--single-threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.single:
        print(json.dumps(run_single(args.single, args.single_threads, args)))
        return
    result = pipeline(args) if args.mode == "pipeline" else {"runs": synthetic(args)}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key}: {json.dumps(value)}")


if __name__ == "__main__":
    main()
