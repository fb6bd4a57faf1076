"""bf16 against fp32 for SmolLM2-135M inference on this CPU: prefill and decode, median of runs.

    .venv/bin/python bench/cpu_dtype.py [--runs 3] [--threads 2] [--prompt-tokens 1800] [--new-tokens 64]
        [--context-tokens 6000] [--batch 4]

Prints seconds per phase for each dtype and the fp32/bf16 ratio (>1: bf16 is faster). Three
phases: prefill of a fresh prompt; decode after a short prompt; and decode after a long context
for `--batch` sequences at once, which is what an agent episode does (its prompt holds every tool
result so far, 3-10K tokens, and the generation batcher decodes concurrent episodes together).
The last phase is the one to weigh when choosing the transformers policy's CPU default
(`cpu_inference_dtype`, which today follows the CPU's native bf16 support).
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from core.cpu_precision import cpu_has_native_bf16
    from agent.small_model import ensure_smollm2

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=1800)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--context-tokens", type=int, default=6000)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder = ensure_smollm2()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    text_ids = tokenizer("The river flows north past the old mill. " * 1600, return_tensors="pt")["input_ids"]
    ids = text_ids[:, : args.prompt_tokens]
    context = text_ids[:, : args.context_tokens].repeat(args.batch, 1)
    print(f"SmolLM2-135M, {args.threads} threads, native bf16: {cpu_has_native_bf16()}, prompt {ids.shape[1]} tokens")
    figures: dict[str, dict[str, float]] = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype).eval()
        prefill, decode, long_decode = [], [], []
        with torch.inference_mode():
            model(ids[:, :64])  # warm up
            for _ in range(args.runs):
                start = time.perf_counter()
                model(ids)
                prefill.append(time.perf_counter() - start)
                start = time.perf_counter()
                model.generate(ids[:, :256], max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False)
                decode.append(time.perf_counter() - start)
                cache = model(context, use_cache=True, logits_to_keep=1).past_key_values  # prefill not timed
                next_ids = context[:, -1:]
                start = time.perf_counter()
                for _ in range(args.new_tokens):
                    next_ids = model(next_ids, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)
                long_decode.append(time.perf_counter() - start)
        figures[name] = {"prefill_s": statistics.median(prefill), "decode_s": statistics.median(decode),
                         "long_decode_s": statistics.median(long_decode)}
        print(f"{name}: prefill {figures[name]['prefill_s']:.2f} s, {args.new_tokens} new tokens {figures[name]['decode_s']:.2f} s, "
              f"{args.new_tokens} new tokens x {args.batch} after {args.context_tokens} {figures[name]['long_decode_s']:.2f} s")
    for phase in ("prefill_s", "decode_s", "long_decode_s"):
        print(f"fp32/bf16 {phase[:-2]}: {figures['fp32'][phase] / figures['bf16'][phase]:.2f}x")


if __name__ == "__main__":
    main()
