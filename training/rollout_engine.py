"""Rollout engines: where CISPO's group rollouts are sampled, behind one small interface.

Why an interface: generation is the bottleneck of RL on agentic trajectories (measured on the
H200: transformers `generate` at 194 tokens/s for gpt-oss-20b at batch 8, against thousands for
vLLM), yet tests and tiny models must run in-process on a CPU. The trainer asks an engine for
a `Policy` (what the harness drives) and tells it after each update that the LoRA weights
changed (`sync`); everything else about sampling is the engine's business.

- `TransformersRolloutEngine`: the policy generates with the very model being trained (peft
  LoRA on top of the base), so `sync` costs nothing. Sampling at `temperature` with top-k/top-p
  off, and the recorded log-probs are `log_softmax(logits / T)`: exactly the distribution
  sampled from, which is what the CISPO ratio needs as pi_old.
- `VLLMRolloutEngine`: a vLLM OpenAI-compatible server holds the base model; after each
  optimizer step only the LoRA adapter travels (no full-weight merge): the trainer writes the
  adapter folder, and the engine registers it under a new versioned name with vLLM's dynamic
  LoRA endpoints (`POST /v1/load_lora_adapter {lora_name, lora_path}`), then unloads the
  previous version (`POST /v1/unload_lora_adapter {lora_name}`) once no rollout uses it.
  Versioned names (`cispo-step000012`) mean a request can never hit a half-replaced adapter and
  no server-side cache can serve stale weights. Rollouts request `logprobs` and
  `return_tokens_as_token_ids`, so each turn records the sampled token ids and their
  log-probabilities under the server's sampler.

Running the vLLM path (not exercised by CI, which has no vLLM; the HTTP protocol is tested
against a loopback fake): start the server with runtime LoRA updates allowed and the trainer's
LoRA rank, on a filesystem the trainer writes to (the server reads the adapter folder):

    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve BASE_MODEL --enable-lora \\
        --max-lora-rank 16 --max-loras 2 --enable-auto-tool-choice --tool-call-parser PARSER \\
        --logprobs-mode processed_logprobs --generation-config vllm

(PARSER from the base model's profile, `agent.policies.model_family.profile_for(BASE).tool_call_parser`:
`hermes` for SmolLM2 and Qwen3, `openai` for gpt-oss). With `tokenizer_path` the rollouts send
each prompt as token ids rendered by the trainer's own template to the text completions endpoint
(`OpenAIPolicy(prompt_as_tokens=True)`) and parse the completion here, so the sampler continues
from exactly the tokens the trainer recomputes log-probs on, for every family: a chat request
would let vLLM render, and it renders gpt-oss with openai-harmony's renderer, not the folder's
template.

`--logprobs-mode processed_logprobs` makes the reported log-probs those of the distribution
actually sampled (after temperature; vLLM's default reports the raw model's, which differ from
pi_old whenever T != 1), and `--generation-config vllm` stops the model folder's
generation_config.json from adding top-k/top-p defaults the trainer does not apply. Then pass
`VLLMRolloutEngine("http://HOST:PORT/v1", served_model="BASE_MODEL",
tokenizer_path=BASE_MODEL_DIR)` to `train_cispo`. The tokenizer and chat template must be the
ones the trainer renders prompts with (the trainer re-renders each turn's view to recompute
log-probs; a different template would train on prompts the sampler never saw). Checked against
vLLM 0.32 (CPU build) serving SmolLM2-135M in `bench/cispo_bench.py --vllm`: the log-probs vLLM
reported for its samples matched the trainer's recomputation with the synced adapter to 1.5e-5
(0.07 without the adapter), and a sync (save + load) took about 0.34 s for a 9 MiB adapter.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from agent.policy_base import Policy
from llm.vllm_admin import VLLMAdmin


@dataclass(frozen=True)
class SyncReport:
    """What one adapter sync cost (seconds), for the step log."""

    seconds: float = 0.0
    save_s: float = 0.0
    load_s: float = 0.0
    unload_s: float = 0.0
    adapter_name: str | None = None
    adapter_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RolloutEngine(Protocol):
    """What the CISPO trainer needs from a sampler."""

    name: str

    def policy(self) -> Policy:
        """A policy sampling from the current weights (after the last `sync`)."""

    def sync(self, model: Any, step: int, work_dir: Path) -> SyncReport:
        """Make the engine sample from `model`'s current LoRA weights."""

    def close(self) -> None: ...


class TransformersRolloutEngine:
    """In-process sampling with the live training model (CPU, tests, tiny models)."""

    def __init__(self, model: Any, tokenizer: Any, *, temperature: float = 1.0, max_new_tokens: int = 512,
                 seed: int = 0, name: str = "cispo:transformers"):
        if temperature <= 0:
            raise ValueError("RL rollouts sample: temperature must be > 0")
        from agent.policies.transformers_policy import TransformersPolicy

        self.name = name
        self._policy = TransformersPolicy.from_loaded(
            model, tokenizer, name=name, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed
        )

    def policy(self) -> Policy:
        return self._policy

    def sync(self, model: Any, step: int, work_dir: Path) -> SyncReport:
        return SyncReport()  # the policy holds the training model itself

    def close(self) -> None:
        pass


class VLLMRolloutEngine:
    """Sampling on a vLLM server with the LoRA adapter hot-swapped after each update."""

    def __init__(
        self,
        base_url: str,
        served_model: str,
        *,
        tokenizer_path: str | None = None,
        lora_prefix: str = "cispo",
        temperature: float = 1.0,
        max_tokens: int = 512,
        seed: int = 0,
        api_key_env: str | None = None,
        timeout: float = 300.0,
        keep_versions: int = 1,
    ):
        if temperature <= 0:
            raise ValueError("RL rollouts sample: temperature must be > 0")
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.served_model = served_model
        self.tokenizer_path = tokenizer_path
        self.lora_prefix = lora_prefix
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.seed = seed
        self.api_key_env = api_key_env
        self.timeout = timeout
        self.keep_versions = max(0, keep_versions)
        self.name = f"cispo:vllm:{self.base_url}#{served_model}"
        self.current: str | None = None  # the LoRA name rollouts use; None = the base model
        self.loaded: list[str] = []
        self.syncs: list[SyncReport] = []
        self.admin = VLLMAdmin(self.base_url, api_key_env=api_key_env, timeout=timeout)

    # ---- the engine interface -----------------------------------------------------------------
    def policy(self) -> Policy:
        from agent.policies.openai_policy import OpenAIPolicy

        return OpenAIPolicy(
            self.base_url, self.current or self.served_model, api_key_env=self.api_key_env, timeout=self.timeout,
            temperature=self.temperature, max_tokens=self.max_tokens, seed=self.seed, logprobs=True, token_ids=True,
            tokenizer_path=self.tokenizer_path, name=f"{self.name}@{self.current or 'base'}",
            prompt_as_tokens=self.tokenizer_path is not None,  # the trainer's template, token for token
        )

    def sync(self, model: Any, step: int, work_dir: Path) -> SyncReport:
        """Save the adapter (weights only), load it under a new name, unload old versions."""
        start = time.perf_counter()
        name = f"{self.lora_prefix}-step{step:06d}"
        folder = Path(work_dir) / "vllm_sync" / name
        model.save_pretrained(str(folder))
        save_s = time.perf_counter() - start
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        load_s = self.admin.load_adapter(name, folder)
        self.current = name
        self.loaded.append(name)
        unload_s = 0.0
        while len(self.loaded) > self.keep_versions + 1:
            old = self.loaded.pop(0)
            unload_s += self.admin.unload_adapter(old)
            _remove_tree(Path(work_dir) / "vllm_sync" / old)
        report = SyncReport(time.perf_counter() - start, save_s, load_s, unload_s, name, size)
        self.syncs.append(report)
        return report

    def close(self) -> None:
        for name in self.loaded:
            try:
                self.admin.unload_adapter(name)
            except Exception:  # the server may already be gone; nothing to release then
                pass
        self.loaded.clear()
        self.admin.close()


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
