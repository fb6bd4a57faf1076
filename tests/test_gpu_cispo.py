"""A few CISPO steps on a GPU with the transformers engine, printing where the time goes.

Marked `gpu`: skipped without CUDA (CI never has one). The environment is the CPU tests' answer
environment (the real harness, THE reward, a Llama answering with one document token), with a
larger model in bf16 so the GPU does measurable work; the figures are printed, not asserted
(timed asserts do not belong in tests), apart from learning: the mean reward must still rise.
"""

from __future__ import annotations

import json
from statistics import median

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_cispo_steps_on_gpu_with_the_transformers_engine(tmp_path):
    from core.training_settings import CispoConfig
    from tests.test_training_cispo_support import MemoryBackend, build_answer_model, lighthouse_tasks
    from training.cispo_trainer import train_cispo

    tasks = lighthouse_tasks()
    model = build_answer_model(tmp_path / "model", [t.question for t in tasks], hidden_size=512, num_layers=8,
                               num_heads=8)
    config = CispoConfig(group_size=8, tasks_per_step=2, steps=6, substeps=2, learning_rate=1e-3, lora_r=16,
                         lora_alpha=32, max_new_tokens=1, harness={"max_turns": 2}, rollout_workers=8,
                         checkpoint_every=6, device="cuda", dtype="bfloat16")
    torch.cuda.reset_peak_memory_stats()
    result = train_cispo(config, tasks, MemoryBackend(), model, None, tmp_path / "run")
    rows = result.history
    figures = {
        "device": torch.cuda.get_device_name(0),
        "reward_per_step": [round(r["reward_mean"], 3) for r in rows],
        "median_s": {k: round(median(r["time"][k] for r in rows[1:]), 4) for k in rows[0]["time"]},
        "train_tokens_per_s": [round(r["train_tokens_per_s"]) for r in rows if r.get("train_tokens_per_s")],
        "clip_ratio": [r["clip_ratio"] for r in rows],
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
    }
    print("CISPO GPU figures:", json.dumps(figures))
    assert rows[-1]["reward_mean"] > rows[0]["reward_mean"]
    assert (result.adapter_path / "adapter_model.safetensors").is_file()
