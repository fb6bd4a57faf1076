"""Peak memory and time of one CISPO forward and backward, by micro-batch size and recomputation.

    .venv/bin/python bench/cispo_memory.py [--model smollm2] [--plans 4096:off,4096:on,8192:on]
        [--rows 1] [--lora-rank 32] [--threads N]

Why: `CispoConfig.memory_plan()` picks how many tokens a CISPO forward holds and whether the
backward recomputes activations; on CPU that choice decides whether a step fits the machine at
all (a 16K-token forward without recomputation was killed at 22.7 GB on a 24 GB machine). Each
plan runs in its own process (peak RSS is per process): the base model in fp32 with a LoRA on
every linear layer, `rows` sequences of `tokens / rows` random tokens whose last tenth is the
completion, `training.cispo_update.sequence_logprobs` (the trainer's own forward) and a backward.
Prints one row per plan: the model's resident size, the peak, and the seconds of the step.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def measure(model: str, tokens: int, recompute: bool, rows: int, lora_rank: int, threads: int | None) -> dict:
    """One forward and backward in this process; returns its figures."""
    sys.path.insert(0, str(REPO))
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from agent.policies.transformers_policy import resolve_model_dir
    from training.cispo_update import sequence_logprobs

    if threads:
        torch.set_num_threads(threads)
    base = AutoModelForCausalLM.from_pretrained(str(resolve_model_dir(model)), dtype=torch.float32)
    if recompute:
        base.activation_checkpointing_enable()
        base.enable_input_require_grads()
    policy = get_peft_model(base, LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, target_modules="all-linear",
                                             lora_dropout=0.0))
    policy.train()
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    length = tokens // rows
    generator = torch.Generator().manual_seed(0)
    attention = torch.ones(rows, length, dtype=torch.long)
    attention[1:, : length // 3] = 0  # later rows left-padded, as collated micro-batches are
    targets = torch.zeros(rows, length, dtype=torch.long)
    targets[:, -max(1, length // 10):] = 1
    batch = {"input_ids": torch.randint(0, base.config.vocab_size, (rows, length), generator=generator),
             "attention_mask": attention, "target_mask": targets, "old_logprobs": torch.zeros(rows, length),
             "advantages": torch.ones(rows)}
    started = time.perf_counter()
    logp, _, _, advantages = sequence_logprobs(policy, batch)
    (-(logp * advantages).mean()).backward()
    return {"tokens": tokens, "rows": rows, "recompute": recompute, "model_gb": loaded / 1e9,
            "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,
            "step_s": time.perf_counter() - started}


def parse_plans(text: str) -> list[tuple[int, bool]]:
    plans = []
    for item in text.split(","):
        tokens, _, mode = item.partition(":")
        if not tokens.isdigit() or mode not in ("on", "off"):
            raise SystemExit(f"--plans {item!r}: expected TOKENS:on or TOKENS:off, e.g. 4096:on")
        plans.append((int(tokens), mode == "on"))
    return plans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--plans", default="4096:off,4096:on,8192:on", help="TOKENS:on|off (recompute activations), comma-separated")
    parser.add_argument("--rows", type=int, default=1, help="sequences per micro-batch")
    parser.add_argument("--lora-rank", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: measure one plan in this process
    args = parser.parse_args()
    if args.one:
        tokens, recompute = parse_plans(args.one)[0]
        print(json.dumps(measure(args.model, tokens, recompute, args.rows, args.lora_rank, args.threads)))
        return
    print("| tokens | rows | recompute | model GB | peak GB | step s |\n|---:|---:|---|---:|---:|---:|")
    for tokens, recompute in parse_plans(args.plans):
        command = [sys.executable, __file__, "--one", f"{tokens}:{'on' if recompute else 'off'}", "--model", args.model,
                   "--rows", str(args.rows), "--lora-rank", str(args.lora_rank)]
        if args.threads:
            command += ["--threads", str(args.threads)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"| {tokens} | {args.rows} | {recompute} | - | - | failed (exit {done.returncode}: "
                  f"{(done.stderr.strip().splitlines() or ['killed'])[-1][:120]}) |", flush=True)
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"| {tokens} | {r['rows']} | {'on' if r['recompute'] else 'off'} | {r['model_gb']:.2f} | {r['peak_gb']:.2f} | {r['step_s']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
