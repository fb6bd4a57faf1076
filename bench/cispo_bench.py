"""CISPO benchmark: where a step's time goes, and our trainer's tokens/s against TRL's GRPOTrainer.

Prints figures (medians over steps, the first step excluded as warm-up); asserts nothing.
Timings on a shared machine are noisy: compare medians within one run, not across runs.

1. Step split (`train_cispo`, the tests' answer environment: the real harness, THE reward, a
   tiny Llama answering with one document token): rollout / scoring / batch building /
   training / adapter sync seconds per step.
2. Multi-turn sequences (a scripted policy that searches twice, prunes, answers, recording the
   tokens a canonical model would sample): recomputed prompt tokens per step with one sequence
   per turn vs. merging turns that share a prefix.
3. Training tokens/s on the same model and the same batches: TRL 1.16
   `GRPOTrainer(loss_type="cispo")` (single-turn prompts, G completions each, LoRA; its
   generation time is measured and subtracted) against our `cispo_optimizer_step` run on the
   very batches TRL generated (prompt + completion tokens, one optimizer step per batch).
   TRL also computes per-token entropies in its loss; we do not (our entropy is a proxy).

4. With `--vllm`: adapter sync time against a real vLLM server (the CPU build in `.venv-vllm`
   serving SmolLM2-135M with runtime LoRA updates), and the gap between the log-probs vLLM
   reports for its samples and the trainer's recomputation (with and without the adapter), which
   shows the server samples from the synced adapter on the prompt the trainer re-renders.

Usage: .venv/bin/python bench/cispo_bench.py [--steps 6] [--model DIR] [--threads 1] [--vllm]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _median(values: list[float]) -> float:
    values = values[1:] if len(values) > 2 else values
    return median(values) if values else float("nan")


def step_split(work: Path, steps: int) -> dict:
    from core.training_settings import CispoConfig
    from tests.test_training_cispo_support import MemoryBackend, build_answer_model, lighthouse_tasks
    from training.cispo_trainer import train_cispo

    tasks = lighthouse_tasks()
    model = build_answer_model(work / "answer_model", [t.question for t in tasks])
    config = CispoConfig(group_size=8, tasks_per_step=2, steps=steps, substeps=2, learning_rate=1e-3, lora_r=8,
                         lora_alpha=16, max_new_tokens=1, harness={"max_turns": 2}, rollout_workers=1,
                         checkpoint_every=steps)
    result = train_cispo(config, tasks, MemoryBackend(), model, None, work / "run_split", log=lambda row: None)
    rows = result.history
    trained = [r for r in rows if not r["skipped"]] or rows  # once learned, groups agree and are dropped
    out = {key: _median([r["time"][key] for r in trained]) for key in rows[0]["time"]}
    out["steps_trained"] = sum(1 for r in rows if not r["skipped"])
    out["reward_first_last"] = [rows[0]["reward_mean"], rows[-1]["reward_mean"]]
    return out


def multi_turn_tokens(work: Path, steps: int) -> dict:
    from transformers import AutoTokenizer

    from core.training_settings import CispoConfig
    from tests.test_training_cispo_batch import ANSWER, PRUNING_PLAN, WRONG
    from tests.test_training_cispo_support import MemoryBackend, ScriptedPolicy, lighthouse_tasks
    from training.cispo_trainer import train_cispo
    from training.rollout_engine import SyncReport

    model = work / "answer_model"
    tokenizer = AutoTokenizer.from_pretrained(str(model))

    def plan(seed: int) -> list:
        return PRUNING_PLAN[:-1] + [("answer", ANSWER if seed % 2 else WRONG)]

    class ScriptedEngine:
        name = "scripted"

        def policy(self):
            return ScriptedPolicy(tokenizer, plan)

        def sync(self, model, step, work_dir):
            return SyncReport()

        def close(self):
            pass

    config = CispoConfig(group_size=8, tasks_per_step=2, steps=steps, substeps=2, learning_rate=1e-4, lora_r=8,
                         lora_alpha=16, harness={"max_turns": 6}, rollout_workers=1, checkpoint_every=steps)
    rows = []
    for merge in (False, True):
        result = train_cispo(config.model_copy(update={"merge_turns": merge}), lighthouse_tasks(), MemoryBackend(),
                             model, None, work / f"run_turns_{merge}", engine=ScriptedEngine(), log=lambda row: None)
        rows.append(result.history)
    plain, merged = rows
    return {
        "turns_per_step": _median([r["tokens"]["turns"] for r in merged]),
        "completion_tokens_per_step": _median([r["tokens"]["completion_tokens"] for r in merged]),
        "prompt_tokens_one_sequence_per_turn": _median([r["tokens"]["recomputed_prompt_tokens"] for r in plain]),
        "prompt_tokens_merged": _median([r["tokens"]["recomputed_prompt_tokens"] for r in merged]),
        "sequences_per_step": [_median([r["tokens"]["sequences"] for r in plain]), _median([r["tokens"]["sequences"] for r in merged])],
        "training_s_per_turn_vs_merged": [_median([r["time"]["training_s"] for r in plain]),
                                          _median([r["time"]["training_s"] for r in merged])],
    }


def versus_trl(work: Path, steps: int, model_dir: Path | None, completion_len: int) -> dict:
    import datasets
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from agent.small_model import build_tiny_model
    from training.cispo_update import cispo_optimizer_step
    from training.rl_batch import TurnSequence

    if model_dir is None:
        texts = ["Where is the lighthouse? Who designed it? The river flows north into the sea."] * 4
        model_dir = build_tiny_model(work / "bench_model", texts, seed=0, hidden_size=128, num_layers=4, num_heads=4)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    prompts = [f"Question {i}: who designed the lighthouse on the northern point, and when was it built?" for i in range(64)]
    lora = dict(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM")
    captured: list[dict] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.begin = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            captured[-1]["step_s"] = time.perf_counter() - self.begin

    args = GRPOConfig(output_dir=str(work / "trl"), per_device_train_batch_size=16, num_generations=8,
                      max_completion_length=completion_len, max_steps=steps, learning_rate=1e-4, loss_type="cispo",
                      epsilon_high=5.0, beta=0.0, logging_steps=1, report_to="none", save_strategy="no", use_cpu=True,
                      temperature=1.0, seed=0, gradient_accumulation_steps=1, dataloader_num_workers=0, bf16=False)
    generator = torch.Generator().manual_seed(0)

    def reward(completions, **kwargs):
        return torch.rand(len(completions), generator=generator).tolist()

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, processing_class=tokenizer,
                          train_dataset=datasets.Dataset.from_dict({"prompt": prompts}),
                          peft_config=LoraConfig(**lora), callbacks=[Clock()])
    original = trainer._generate_and_score_completions

    def timed(batch):
        start = time.perf_counter()
        out = original(batch)
        captured.append({"gen_s": time.perf_counter() - start, "batch": {k: v.detach().clone() for k, v in out.items()
                                                                          if isinstance(v, torch.Tensor)}})
        return out

    trainer._generate_and_score_completions = timed
    trainer.train()
    trl_rates, batches = [], []
    for entry in captured:
        b = entry["batch"]
        tokens = int(b["prompt_mask"].sum() + b["completion_mask"].sum())
        trl_rates.append(tokens / max(1e-9, entry["step_s"] - entry["gen_s"]))
        batches.append((b, tokens))

    ours_model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32), LoraConfig(**lora))
    optimizer = torch.optim.AdamW([p for p in ours_model.parameters() if p.requires_grad], lr=1e-4)
    ours_model.train()
    our_rates = []
    for b, tokens in batches:
        sequences = []
        for i in range(b["prompt_ids"].shape[0]):
            prompt = b["prompt_ids"][i][b["prompt_mask"][i] > 0].tolist()
            completion = b["completion_ids"][i][b["completion_mask"][i] > 0].tolist()
            seq = TurnSequence(advantage=float(b["advantages"][i]))
            seq.append(prompt)
            seq.append(completion, [-1.0] * len(completion))
            sequences.append(seq)
        start = time.perf_counter()
        cispo_optimizer_step(ours_model, optimizer, sequences, pad_id=tokenizer.pad_token_id, eps_low=1.0, eps_high=4.0)
        our_rates.append(tokens / (time.perf_counter() - start))
    return {
        "model": str(model_dir), "batch": "2 prompts x 8 completions", "completion_len_max": completion_len,
        "tokens_per_batch": _median([t for _, t in batches]),
        "trl_generation_s": _median([e["gen_s"] for e in captured]),
        "trl_train_tokens_per_s": _median(trl_rates), "ours_train_tokens_per_s": _median(our_rates),
        "ratio_ours_over_trl": _median(our_rates) / _median(trl_rates),
    }


def vllm_sync(work: Path, syncs: int, lora_r: int = 8) -> dict:
    """Adapter sync time against a real vLLM server (the CPU build in `.venv-vllm`, SmolLM2-135M),
    and whether the server samples from OUR adapter: the log-probs vLLM reports for its sampled
    tokens against the trainer's recomputation on the same re-rendered prompt."""
    import os
    import subprocess

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent.harness import Harness, HarnessConfig
    from agent.small_model import ensure_smollm2
    from tests.support.openai_server import _ready, _stop, free_port, vllm_python
    from tests.test_training_cispo_support import MemoryBackend, lighthouse_tasks
    from training.cispo_update import sequence_logprobs
    from training.rl_batch import collate, sequences_from_trajectory
    from training.rollout_engine import VLLMRolloutEngine

    python = vllm_python()
    if python is None:
        return {"skipped": "no vLLM venv (.venv-vllm)"}
    model_dir = ensure_smollm2()
    port = free_port()
    command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
               "--max-model-len", "4096", "--max-num-seqs", "4", "--enforce-eager", "-O0", "--enable-lora",
               "--max-lora-rank", str(lora_r), "--max-loras", "2", "--enable-auto-tool-choice",
               "--tool-call-parser", "hermes", "--disable-uvicorn-access-log",
               "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm"]
    env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}
    log_path = work / "vllm.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    base_url = f"http://127.0.0.1:{port}/v1"
    started = time.perf_counter()
    try:
        while not _ready(base_url):
            if process.poll() is not None or time.perf_counter() - started > 900:
                return {"skipped": "vLLM did not start", "log_tail": log_path.read_text(errors="replace")[-1500:]}
            time.sleep(2)
        startup_s = time.perf_counter() - started
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        torch.manual_seed(0)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32),
                               LoraConfig(r=lora_r, lora_alpha=2 * lora_r, target_modules="all-linear",
                                          init_lora_weights=False))  # random B: the adapter changes the outputs
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.mul_(0.05)
        engine = VLLMRolloutEngine(base_url, "smollm2", tokenizer_path=str(model_dir), max_tokens=24, timeout=600)
        reports = [engine.sync(model, step, work) for step in range(1, syncs + 1)]
        task = lighthouse_tasks()[0]
        # A profile that fits the server's 4,096-token --max-model-len (the window check refuses more).
        profile = HarnessConfig.for_training(max_turns=1, token_budget=2048, search_budget_tokens=512, response_reserve_tokens=256)
        with Harness(MemoryBackend(), engine.policy(), profile) as harness:
            trajectory = harness.run(task.question, seed=3)
        sequences, _ = sequences_from_trajectory(tokenizer, trajectory, 0.0, merge=False)
        model.eval()
        with torch.no_grad():
            ours = torch.cat([sequence_logprobs(model, collate([s], tokenizer.pad_token_id))[0][0] for s in sequences])
            with model.disable_adapter():
                base = torch.cat([sequence_logprobs(model, collate([s], tokenizer.pad_token_id))[0][0] for s in sequences])
        sampled = torch.tensor([x for s in sequences for x, m in zip(s.old_logprobs, s.target_mask) if m])
        engine.close()
        return {
            "startup_s": startup_s,
            "sync_s": [round(r.seconds, 3) for r in reports],
            "sync_median_s": _median([r.seconds for r in reports]),
            "save_median_s": _median([r.save_s for r in reports]),
            "load_median_s": _median([r.load_s for r in reports]),
            "unload_median_s": _median([r.unload_s for r in reports[1:]] or [0.0]),
            "adapter_mb": reports[-1].adapter_bytes / 2**20,
            "sampled_tokens": int(sampled.numel()),
            "mean_abs_logprob_gap_vs_trainer_with_adapter": float((sampled - ours).abs().mean()),
            "mean_abs_logprob_gap_vs_base_model": float((sampled - base).abs().mean()),
        }
    finally:
        _stop(process)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--model", type=Path, default=None, help="model folder for the TRL comparison (default: a tiny Llama)")
    parser.add_argument("--completion-len", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--only", choices=["split", "turns", "trl", "vllm"], default=None)
    parser.add_argument("--vllm", action="store_true", help="also measure adapter sync against a real vLLM (CPU) server")
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    report: dict = {"torch_threads": torch.get_num_threads()}
    with tempfile.TemporaryDirectory(prefix="cispo_bench_") as tmp:
        work = Path(tmp)
        if args.only in (None, "split", "turns"):
            report["step_split_s"] = step_split(work, args.steps)
        if args.only in (None, "turns"):
            report["multi_turn_tokens"] = multi_turn_tokens(work, args.steps)
        if args.only in (None, "trl"):
            report["versus_trl"] = versus_trl(work, args.steps, args.model, args.completion_len)
        if args.vllm or args.only == "vllm":
            report["vllm_adapter_sync"] = vllm_sync(work, syncs=max(3, args.steps))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
