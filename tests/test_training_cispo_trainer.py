"""The CISPO trainer end to end on a tiny model: it learns, it resumes, it stops on divergence,
and its vLLM engine speaks the dynamic-LoRA protocol (against a loopback fake of vLLM's API).

The environment (`test_training_cispo_support`): the real harness over an in-memory backend, a
tiny Llama that answers with one document token, THE reward (2.0 for the gold document, 0 for
another). Everything is seeded; rollouts are a function of (seed, step), so the numbers are
deterministic on CPU.
"""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from statistics import fmean

import pytest
import torch

from agent.policies.transformers_policy import TransformersPolicy, clear_model_cache
from core.training_settings import CispoConfig
from tests.test_training_cispo_support import ANSWER_TOKENS, MemoryBackend, answer_model_dir, lighthouse_tasks, model_dir, one_thread  # noqa: F401 (fixtures)
from training.cispo_trainer import train_cispo
from training.cispo_update import CispoDiverged
from training.rl_checkpoints import latest_checkpoint
from training.rl_rollouts import collect_rollouts
from training.rollout_engine import VLLMRolloutEngine

LEARNING_MARGIN = 0.8  # mean reward (0..2) must rise by at least this much: +40 points of answer-found


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    yield


def _config(**overrides) -> CispoConfig:
    base = dict(group_size=8, tasks_per_step=2, steps=6, substeps=2, learning_rate=3e-3, lora_r=8, lora_alpha=16,
                max_new_tokens=1, harness={"max_turns": 2}, rollout_workers=1, checkpoint_every=3, seed=0)
    return CispoConfig(**{**base, **overrides})


def _mean_reward(model_dir, adapter=None) -> float:
    policy = TransformersPolicy(str(model_dir), adapter_path=adapter, temperature=1.0, max_new_tokens=1, seed=99)
    batch = collect_rollouts(policy, MemoryBackend(), lighthouse_tasks(), group_size=16, seed=1234, workers=1)
    return fmean(r.reward.reward for r in batch.rollouts)


def test_cispo_raises_the_mean_reward_of_a_tiny_model(model_dir, tmp_path):
    clear_model_cache()
    before = _mean_reward(model_dir)
    result = train_cispo(_config(), lighthouse_tasks(), MemoryBackend(), model_dir, None, tmp_path / "run")
    after = _mean_reward(model_dir, result.adapter_path)
    print(f"mean reward before {before:.3f} after {after:.3f}; per step "
          f"{[round(r['reward_mean'], 3) for r in result.history]}")
    assert after >= before + LEARNING_MARGIN, (before, after)
    history = result.history
    assert [r["step"] for r in history] == list(range(6)) and result.steps == 6
    assert history[0]["beta"] == 4.0 and history[-1]["beta"] == 2.0  # annealed across the 6 epochs
    assert all(b["beta"] <= a["beta"] for a, b in zip(history, history[1:]))
    assert history[0]["groups_kept"] > 0 and history[0]["optimizer_steps"] == 2
    first = history[0]
    assert first["tokens"]["completion_tokens"] == 8 * first["groups_kept"] and first["tokens"]["naive_prompt_tokens"] > 0
    assert set(first["time"]) == {"rollout_s", "scoring_s", "batch_s", "training_s", "sync_s", "step_s"}
    assert first["entropy_proxy"] > 0 and 0.0 <= first["clip_ratio"] <= 1.0
    sidecar = json.loads((result.adapter_path / "searchsmith_adapter.json").read_text())
    for key in ("reward_mean", "reward_components", "answer_found", "recall", "tokens", "clip_ratio", "entropy"):
        assert key in sidecar["metrics"], key
    assert sidecar["config"]["group_size"] == 8 and sidecar["step"] == 6
    # Left unset, the CPU run forwards 4K tokens at a time with recomputed activations, and says so.
    assert (result.metrics["micro_batch_tokens"], result.metrics["gradient_checkpointing"]) == (4096, True)
    assert [p.name for p in result.checkpoints] == ["step-000003", "step-000006"]
    rewards = [json.loads(line) for line in (tmp_path / "run" / "rewards.jsonl").read_text().splitlines()]
    assert len(rewards) == 6 * 2 * 8 and {"reward", "f_beta", "p_prune", "p_turn", "answer_found"} <= set(rewards[0])
    assert fmean(r["reward"] for r in rewards if r["step"] == 0) == pytest.approx(history[0]["reward_mean"])
    assert (result.adapter_path / "adapter_model.safetensors").is_file()
    from training.cispo_plots import plot_cispo_curves

    assert plot_cispo_curves(history, tmp_path / "curves.png").stat().st_size > 10_000


def test_resuming_after_a_crash_reproduces_the_uninterrupted_run(model_dir, tmp_path):
    config = _config(group_size=4, tasks_per_step=1, steps=4, checkpoint_every=2, learning_rate=1e-3)
    straight = train_cispo(config, lighthouse_tasks(), MemoryBackend(), model_dir, None, tmp_path / "a")

    def crash_at_step_2(step, row):
        if step == 2:
            raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError, match="simulated crash"):
        train_cispo(config, lighthouse_tasks(), MemoryBackend(), model_dir, None, tmp_path / "b", on_step=crash_at_step_2)
    assert latest_checkpoint(tmp_path / "b").name == "step-000002"
    resumed = train_cispo(config, lighthouse_tasks(), MemoryBackend(), model_dir, None, tmp_path / "b")
    assert resumed.resumed_from == 2
    assert [r["step"] for r in resumed.history] == [0, 1, 2, 3]
    logged = [json.loads(line)["step"] for line in (tmp_path / "b" / "rewards.jsonl").read_text().splitlines()]
    assert logged == sorted(logged) and len(logged) == 4 * 4  # the re-run step 2 is logged once
    assert sum(r["optimizer_steps"] for r in straight.history[2:]) > 0  # the resumed steps did train
    assert [r["reward_mean"] for r in resumed.history] == [r["reward_mean"] for r in straight.history]
    from safetensors.torch import load_file

    a = load_file(str(straight.adapter_path / "adapter_model.safetensors"))
    b = load_file(str(resumed.adapter_path / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    state = torch.load(latest_checkpoint(tmp_path / "b") / "trainer_state.pt", weights_only=False)
    assert state["optimizer"]["state"] and state["optimizer_steps"] == straight.history[-1]["optimizer_steps_total"]
    with pytest.raises(ValueError, match="learning_rate"):
        train_cispo(config.model_copy(update={"learning_rate": 5e-3, "steps": 5}), lighthouse_tasks(),
                    MemoryBackend(), model_dir, None, tmp_path / "b")


@pytest.mark.parametrize("overrides, message", [
    ({"learning_rate": 1e30}, r"non-finite|exploded"),
    ({"abort_grad_norm": 1e-12}, r"gradient norm"),
])
def test_nan_or_exploding_training_stops_the_run_with_a_clear_error(model_dir, tmp_path, overrides, message):
    config = _config(steps=3, checkpoint_every=1, **overrides)
    with pytest.raises(CispoDiverged, match=message) as caught:
        train_cispo(config, lighthouse_tasks(), MemoryBackend(), model_dir, None, tmp_path / "run")
    assert "step 0" in str(caught.value) and "checkpoint" in str(caught.value)
    assert latest_checkpoint(tmp_path / "run") is None  # nothing saved after (or at) the bad update


class FakeVLLM(BaseHTTPRequestHandler):
    """vLLM's OpenAI server, as far as the engine uses it: text completions of token-id prompts
    with logprobs and token ids, and the dynamic LoRA endpoints. Alternates between the gold document and another,
    so every group of an even size has mixed rewards (and is kept)."""

    answer_ids: dict[str, int] = {}
    calls: list[tuple[str, dict]] = []
    adapters: set[str] = set()
    served = 0
    lock = threading.Lock()

    def log_message(self, *args):  # quiet
        pass

    def _reply(self, status: int, body: dict | str) -> None:
        data = (json.dumps(body) if isinstance(body, dict) else body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if isinstance(body, dict) else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeVLLM.calls.append((self.path, body))
        if self.path == "/v1/load_lora_adapter":
            FakeVLLM.adapters.add(body["lora_name"])
            return self._reply(200, "Success")
        if self.path == "/v1/unload_lora_adapter":
            FakeVLLM.adapters.discard(body["lora_name"])
            return self._reply(200, "Success")
        if self.path != "/v1/completions" or not all(isinstance(t, int) for t in body.get("prompt", [None])):
            return self._reply(404, {"error": "not found (the engine sends prompts as token ids to /v1/completions)"})
        if body["model"] != "base" and body["model"] not in FakeVLLM.adapters:
            return self._reply(404, {"error": f"model {body['model']} not loaded"})
        with FakeVLLM.lock:
            FakeVLLM.served += 1
            token = ANSWER_TOKENS[FakeVLLM.served % 2]
        logprobs = {"tokens": [f"token_id:{FakeVLLM.answer_ids[token]}"], "token_logprobs": [math.log(0.25)],
                    "text_offset": [0], "top_logprobs": None}
        return self._reply(200, {
            "id": "cmpl-1", "object": "text_completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "text": token, "logprobs": logprobs, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": 1, "total_tokens": len(body["prompt"]) + 1},
        })


def test_vllm_engine_reloads_only_the_lora_adapter_after_each_update(model_dir, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    FakeVLLM.answer_ids = dict(zip(ANSWER_TOKENS, tokenizer.convert_tokens_to_ids(ANSWER_TOKENS)))
    FakeVLLM.calls, FakeVLLM.adapters = [], set()
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeVLLM)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        engine = VLLMRolloutEngine(f"http://127.0.0.1:{server.server_port}/v1", "base", tokenizer_path=str(model_dir),
                                   timeout=30)
        result = train_cispo(_config(group_size=4, tasks_per_step=1, steps=3, checkpoint_every=3, rollout_workers=4),
                             lighthouse_tasks(), MemoryBackend(), model_dir, None, tmp_path / "run", engine=engine)
        engine.close()
    finally:
        server.shutdown()
        thread.join()
    lora_calls = [(path.rsplit("/", 1)[1], body["lora_name"]) for path, body in FakeVLLM.calls if "lora" in path]
    assert lora_calls[:4] == [("load_lora_adapter", "cispo-step000001"), ("load_lora_adapter", "cispo-step000002"),
                              ("load_lora_adapter", "cispo-step000003"), ("unload_lora_adapter", "cispo-step000001")]
    turns = [body for path, body in FakeVLLM.calls if path == "/v1/completions"]
    assert {body["model"] for body in turns} == {"base", "cispo-step000001", "cispo-step000002"}
    assert all(body["logprobs"] == 1 and body["return_tokens_as_token_ids"] is True and body["skip_special_tokens"] is False
               for body in turns)
    # The sampler continued from the trainer's own rendering, token for token.
    first = turns[0]["prompt"]
    assert tokenizer.decode(first).endswith("<|im_start|>assistant\n") and "Who designed the Alpha Lighthouse?" in tokenizer.decode(first)
    assert all(r["optimizer_steps"] == 2 and r["sync"]["adapter_name"] for r in result.history)
    assert all(r["time"]["sync_s"] > 0 and r["sync"]["adapter_bytes"] > 0 for r in result.history)
    assert FakeVLLM.adapters == set()  # close() unloaded what the run loaded
