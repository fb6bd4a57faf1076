"""Which precision a CPU computes fastest, for inference and for LoRA training.

Why one home: evaluation, serving, SFT and CISPO all load the same small models on CPU, and
each must agree on what "bf16 is faster here" means. bf16 is fast only where the CPU multiplies
it natively (AVX512-BF16 or AMX); elsewhere PyTorch emulates it and fp32 wins. Measured on an
AVX512-BF16 EPYC with 2 threads: a 1024x576x1536 matmul runs at 610 GFLOP/s in bf16 against
159 in fp32; SmolLM2-135M LoRA SFT runs 1.36x faster at 0.72x the peak memory
(`bench/sft_bench.py --precision fp32,bf16 --runs 3`); inference prefills about 1.9x and
decodes about 1.6x faster (`bench/cpu_dtype.py`). Without those instructions bf16 is converted
in software around every matmul, so there fp32 stays the default. Measured on such a CPU (an AVX2-only
EPYC, 2 cores, 2026-12-06): the packaged searcher on the first 8 dev questions took 374 s in fp32 and
926 s in bf16 (`searchsmith bench --policies transformers:training/searchers/smollm2-searcher --limit 8`
with `SEARCHSMITH_CPU_DTYPE` set to each; same answers found, 6 of 8). The default follows the CPU's
flags, not a fixed choice.

CISPO on CPU stays fp32 (`CispoConfig.dtype`; `rl.dtype: bfloat16` asks for bf16): its sampler
and its learner are the same model, and measured on the learning customer (one step of 2 tasks x
4 rollouts from the packaged searcher, 2 cores shared with an evaluation, 2026-12-02,
`bench/cispo_precision.py`) bf16 trained 1.38x faster (99.8 against 72.4 tokens/s) at 0.76x the
peak memory, but its sampled rollouts were no faster (407 against 354 s), so a step took the same
time (681 against 691 s); and on identical weights the importance ratio of its tokens ranged
0.72-1.55 (fp32: 1 within 4e-5), noise that CISPO's cap at 5 does not touch.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX); elsewhere bf16 is emulated and slow."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_inference_dtype() -> str:
    """bf16 where the CPU has it natively, fp32 elsewhere; `SEARCHSMITH_CPU_DTYPE` overrides."""
    configured = os.environ.get("SEARCHSMITH_CPU_DTYPE")
    if configured:
        return configured
    return "bfloat16" if cpu_has_native_bf16() else "float32"


def cpu_training_precision() -> str:
    """The `auto` training precision on CPU: bf16 (weights and autocast; LoRA weights and the
    optimizer stay fp32) where the CPU has it natively, fp32 elsewhere."""
    return "bf16" if cpu_has_native_bf16() else "fp32"


def encoder_autocast(device_type: str, texts: int) -> Any:
    """bf16 autocast for a batch of `texts` through an encoder (the index's embedder, the
    reranker) on a CPU that computes bf16 natively; a null context on a GPU, for a single text, or
    where `cpu_inference_dtype` says fp32.

    Why autocast, not bf16 weights: matmuls run in bf16 while layer norms, softmax and pooling stay
    fp32, so the vectors move by about 1e-3 (cosine to the fp32 vector >= 0.9999) where bf16
    weights move them by 2e-3 (cosine 0.998). Measured on an AMX Xeon with 2 threads (2026-12-06):
    all-MiniLM-L6-v2 embeds 2.65x the chunks/s (171.7 against 64.8, `bench/index_bench.py`; 152
    against 58 dev-file paragraphs/s, `bench/embedder_backends.py`), and the dev file's index
    ranks as before (hybrid 0.656 against 0.653 answer found, the heuristic 0.815 against 0.812,
    453 questions, `bench/bench_dev.py`). One short query is no faster in bf16 (9.7 against 7.5
    ms in a first measurement), hence fp32 for a single text."""
    if device_type != "cpu" or texts < 2 or cpu_inference_dtype() != "bfloat16":
        return contextlib.nullcontext()
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16)
