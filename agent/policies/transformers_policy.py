"""The `transformers` policy: in-process generation with a local model and its chat template.

Why in-process: CPU runs, tests, tiny models and RL rollouts on one machine need no server. The
prompt is the model's own chat template rendered with the tool schemas
(`apply_chat_template(messages, tools=tools, add_generation_prompt=True)`), so SFT, RL and
serving all see the same text. Tool calls are parsed from the generated text by
`tool_parsing.parse_reply` in the model family's format (Hermes `<tool_call>` blocks, SmolLM2's
list form, bare JSON lists; or harmony for gpt-oss, whose tokenizer gets our harmony template
and whose MXFP4 weights are dequantized on load: `model_family`); a malformed reply becomes
`PolicyStep.error`, never an exception.

For RL each step records the sampled completion token ids and their log-probabilities under the
sampling distribution: `log_softmax(logits / T)` at T > 0 (top-k and top-p are switched off so
that this is exactly the distribution sampled from), `log_softmax(logits)` for greedy decoding.

Models load lazily on the first turn and are cached per process (keyed by folder, adapter,
device and dtype), so many episodes and threads share one copy. Greedy turns of concurrent
episodes are generated together in batches (`generation_batcher`); sampled turns and training
steps hold the model's lock alone.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.adapter_sidecar import read_sidecar
from agent.policies.generation_batcher import DEFAULT_MAX_BATCH, GenerationBatcher, first_end
from agent.policies.model_family import chat_format_of, end_of_turn_ids, load_options, prepare_tokenizer, reply_opening
from agent.policies.prefix_cache import DEFAULT_MAX_TOKENS, PrefixCache
from agent.policies.runaway import RunawayStop
from agent.policies.tool_parsing import distinct_calls, parse_reply
from agent.policy_base import Message, PolicyStep
from core.base_models import profile_for
from core.cpu_precision import cpu_inference_dtype
from core.heap_memory import releasing_freed_memory
from core.model_loading import MODEL_LOAD_LOCK

SMOLLM2_ALIASES = ("smollm2", "smollm2-135m-instruct")


@dataclass
class LoadedModel:
    """A model, its tokenizer and what generation needs to know about them."""

    model: Any
    tokenizer: Any
    eos_token_ids: list[int]
    pad_token_id: int | None
    max_positions: int | None
    lock: threading.Lock
    chat_format: str = "chatml"  # how replies are parsed: "chatml" (Hermes tool calls) or "harmony"
    _batcher: GenerationBatcher | None = None

    def batcher(self) -> GenerationBatcher:
        """The queue that batches this model's greedy turns (created on first use)."""
        with _CACHE_LOCK:
            if self._batcher is None:
                self._batcher = GenerationBatcher(self.model, pad_token_id=self.pad_token_id,
                                                  eos_token_ids=self.eos_token_ids, lock=self.lock, tokenizer=self.tokenizer,
                                                  max_batch=generation_batch_size(),
                                                  prefix_cache=PrefixCache(self.model, prefix_cache_tokens()) if prefix_cache_tokens() else None)
            return self._batcher


_CACHE: dict[tuple[str, str | None, str, str], LoadedModel] = {}
_TOKENIZERS: dict[str, Any] = {}
_CACHE_LOCK = threading.Lock()


def resolve_model_dir(model_path_or_dir: str | Path) -> Path:
    """A local model folder; `smollm2` names the cached SmolLM2-135M-Instruct copy (built on demand)."""
    text = str(model_path_or_dir)
    if text.lower() in SMOLLM2_ALIASES:
        from agent.small_model import ensure_smollm2

        return ensure_smollm2()
    path = Path(text).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"no model folder at {text} (expected config.json; models are never downloaded at run time)"
        )
    return path.resolve()


def load_tokenizer(model_path_or_dir: str | Path) -> Any:
    """The model's tokenizer alone (no weights), cached per process: budgets count with it."""
    path = resolve_model_dir(model_path_or_dir)
    with _CACHE_LOCK:
        if str(path) not in _TOKENIZERS:
            from transformers import AutoTokenizer

            _TOKENIZERS[str(path)] = prepare_tokenizer(AutoTokenizer.from_pretrained(str(path)))
        return _TOKENIZERS[str(path)]


def load_model(
    model_path_or_dir: str | Path, adapter_path: str | Path | None = None, device: str = "cpu", dtype: str | None = None
) -> LoadedModel:
    """Load (once per process) a causal LM, optionally with a peft LoRA adapter on top."""
    path = resolve_model_dir(model_path_or_dir)
    adapter = str(Path(adapter_path).expanduser().resolve()) if adapter_path else None
    dtype_name = dtype or (cpu_inference_dtype() if device == "cpu" else "auto")
    key = (str(path), adapter, device, dtype_name)
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    # One load at a time: transformers builds models on the meta device under process-wide
    # patches, so two threads loading at once (a benchmark's first episodes) can leave one
    # model with meta tensors; the loser of the race also reuses the winner's copy.
    with MODEL_LOAD_LOCK:
        with _CACHE_LOCK:
            if key in _CACHE:
                return _CACHE[key]
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch_dtype = "auto" if dtype_name == "auto" else getattr(torch, dtype_name)
        tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(str(path)))
        profile = profile_for(path)
        options = load_options(profile)
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype, **options)
        if adapter is not None:
            from peft import PeftModel

            # Inference only: fold the LoRA deltas into the weights, so each step runs the base
            # model's matmuls instead of base + two low-rank ones per projection.
            model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
        model.to(device)
        model.eval()
        loaded = from_model(model, tokenizer)
        with _CACHE_LOCK:
            return _CACHE.setdefault(key, loaded)


def generation_batch_size() -> int:
    """How many greedy turns one batch may hold; `SEARCHSMITH_GENERATION_BATCH=1` turns batching off."""
    import os

    configured = os.environ.get("SEARCHSMITH_GENERATION_BATCH", "").strip()
    if not configured:
        return DEFAULT_MAX_BATCH
    try:
        value = int(configured)
    except ValueError:
        raise ValueError(f"SEARCHSMITH_GENERATION_BATCH must be a whole number, got {configured!r}") from None
    if value < 1:
        raise ValueError(f"SEARCHSMITH_GENERATION_BATCH must be at least 1, got {value}")
    return value


def prefix_cache_tokens() -> int:
    """How many prompt tokens the prefix cache keeps; `SEARCHSMITH_PREFIX_CACHE_TOKENS=0` turns it off."""
    import os

    configured = os.environ.get("SEARCHSMITH_PREFIX_CACHE_TOKENS", "").strip()
    if not configured:
        return DEFAULT_MAX_TOKENS
    if not configured.isdigit():
        raise ValueError(f"SEARCHSMITH_PREFIX_CACHE_TOKENS must be a whole number >= 0, got {configured!r}")
    return int(configured)


def from_model(model: Any, tokenizer: Any) -> LoadedModel:
    """Wrap an already-loaded model (e.g. the one an RL trainer is updating) for generation."""
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    config = getattr(model, "config", None)
    chat_format = chat_format_of(tokenizer, config)
    ids = end_of_turn_ids(tokenizer, chat_format, first=gen_eos if isinstance(gen_eos, list) else [gen_eos])
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (ids[0] if ids else None)
    max_positions = getattr(config, "max_position_embeddings", None)
    return LoadedModel(model=model, tokenizer=tokenizer, eos_token_ids=ids, pad_token_id=pad,
                       max_positions=max_positions, lock=threading.Lock(), chat_format=chat_format)


def clear_model_cache() -> None:
    """Drop cached models (e.g. after an adapter folder was rewritten in place)."""
    with _CACHE_LOCK:
        _CACHE.clear()
        _TOKENIZERS.clear()


def window_of(model_dir: Path) -> int | None:
    """A model folder's context window (`max_position_embeddings` in its config.json), or None."""
    config = Path(model_dir) / "config.json"
    return json.loads(config.read_text(encoding="utf-8")).get("max_position_embeddings") if config.is_file() else None


def template_tool_overhead(tokenizer: Any, tools: list[dict[str, Any]]) -> int | None:
    """Tokens the chat template adds when it declares `tools` (what the harness's usage line
    must count on top of the messages): a two-message prompt rendered with and without them.
    None for a template without tool support (the harness then counts the tools' JSON)."""
    if not tools:
        return 0
    probe = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    try:
        with_tools = tokenizer.apply_chat_template(probe, tools=tools, add_generation_prompt=True, tokenize=False)
        without = tokenizer.apply_chat_template(probe, add_generation_prompt=True, tokenize=False)
    except Exception:  # noqa: BLE001 - a template without tool support
        return None
    count = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    return max(0, count(with_tools) - count(without))


def template_messages(messages: list[Message]) -> list[Message]:
    """Messages as chat templates expect them: string content, tool-call arguments as objects.

    The harness speaks the OpenAI protocol, where arguments are JSON strings; most templates
    (ours, Llama's, Qwen's) render a mapping with `tojson`, so valid JSON strings are decoded.
    """
    out: list[Message] = []
    for message in messages:
        m = dict(message)
        if m.get("content") is None:
            m["content"] = ""
        if m.get("tool_calls"):
            calls = []
            for call in m["tool_calls"]:
                call = dict(call)
                fn = dict(call.get("function") or {})
                if isinstance(fn.get("arguments"), str):
                    try:
                        decoded = json.loads(fn["arguments"])
                        if isinstance(decoded, dict):
                            fn["arguments"] = decoded
                    except json.JSONDecodeError:
                        pass
                call["function"] = fn
                calls.append(call)
            m["tool_calls"] = calls
        out.append(m)
    return out


def turn_seed(*parts: int) -> int:
    """A per-turn seed mixed from (policy seed, episode seed, turn): stable across runs."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF


class TokenizerCounter:
    """Counts tokens with a Hugging Face tokenizer, special tokens excluded."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))


class TransformersPolicy:
    """Generation with a local causal LM; see the module docstring for the why."""

    def __init__(
        self,
        model_path_or_dir: str | Path,
        adapter_path: str | Path | None = None,
        max_new_tokens: int = 512,
        temperature: float = 0.0,
        seed: int = 0,
        device: str = "cpu",
        *,
        dtype: str | None = None,
        name: str | None = None,
        stop_runaway: bool = True,
    ):
        self.model_path = str(model_path_or_dir)
        self.adapter_path = str(adapter_path) if adapter_path else None
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.seed = seed
        self.device = device
        self.dtype = dtype
        self.stop_runaway = stop_runaway  # end a turn once it loops (agent.policies.runaway)
        self.name = name or f"transformers:{self.model_path}" + (f"+{self.adapter_path}" if self.adapter_path else "")
        self._loaded: LoadedModel | None = None

    @classmethod
    def from_loaded(cls, model: Any, tokenizer: Any, *, name: str = "transformers:in-memory", **kwargs: Any) -> TransformersPolicy:
        """A policy over a model already in memory (an RL trainer's live model): nothing is loaded."""
        policy = cls(model_path_or_dir=name, name=name, **kwargs)
        policy._loaded = from_model(model, tokenizer)
        return policy

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_loaded"] = None  # a process that receives the policy loads (and caches) its own copy
        return state

    def loaded(self) -> LoadedModel:
        if self._loaded is None:
            self._loaded = load_model(self.model_path, self.adapter_path, self.device, self.dtype)
        return self._loaded

    def token_counter(self) -> TokenizerCounter:
        if self._loaded is not None:
            return TokenizerCounter(self._loaded.tokenizer)
        return TokenizerCounter(load_tokenizer(self.model_path))

    def new_episode(self, question: str, seed: int = 0) -> TransformersEpisode:
        return TransformersEpisode(self, seed)

    def _tokenizer(self) -> Any:
        return self._loaded.tokenizer if self._loaded is not None else load_tokenizer(self.model_path)

    def context_window(self) -> int | None:
        """The model's window (`max_position_embeddings`), read without loading weights."""
        if self._loaded is not None:
            return self._loaded.max_positions
        return window_of(resolve_model_dir(self.model_path))

    def tool_overhead_tokens(self, tools: list[dict[str, Any]]) -> int | None:
        return template_tool_overhead(self._tokenizer(), tools)

    def render_prompt(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        """The exact prompt text the model continues from (the chat template's rendering)."""
        return self.loaded().tokenizer.apply_chat_template(
            template_messages(messages), tools=tools or None, add_generation_prompt=True, tokenize=False
        )

    def generate(self, messages: list[Message], tools: list[dict[str, Any]] | None, seed: int, id_prefix: str = "call",
                 *, opening: str | None = None) -> PolicyStep:
        """One model turn: render, generate, record ids and logprobs, parse tool calls. With
        `opening` the reply is begun with it (`AnsweringEpisode`): it is appended to the prompt, in
        the final channel for harmony, and parsed as the start of the reply."""
        lm = self.loaded()
        prefill = reply_opening(lm.chat_format, opening) if opening else None
        prompt = self.render_prompt(messages, tools) + (prefill or "")
        input_ids = lm.tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        n_prompt = int(input_ids.shape[1])
        max_new = self.max_new_tokens
        if lm.max_positions is not None:
            max_new = min(max_new, lm.max_positions - n_prompt)
            if max_new <= 0:
                return PolicyStep(content=None, prompt_tokens=n_prompt, window_full=True, error=(
                    f"prompt of {n_prompt} tokens leaves no room in the model's {lm.max_positions}-token window"))
        if self.temperature > 0:
            completion, logits = self._sample(lm, input_ids, max_new, seed)
        else:
            turn = lm.batcher().generate(input_ids[0].tolist(), max_new, stop_runaway=self.stop_runaway)
            completion, logits = turn.completion_ids, turn.logits
        logprobs = completion_logprobs(logits, completion, self.temperature)
        raw_text = lm.tokenizer.decode(completion, skip_special_tokens=False)
        text = strip_end_markers((prefill or "") + raw_text, lm.tokenizer, lm.eos_token_ids)
        parsed = parse_reply(text, lm.chat_format, id_prefix=id_prefix)
        if self.stop_runaway:
            parsed.tool_calls = distinct_calls(parsed.tool_calls)
        error = parsed.error
        if not parsed.tool_calls and parsed.content is None and error is None:
            error = "empty completion"
        return PolicyStep(
            content=parsed.content,
            tool_calls=parsed.tool_calls,
            prompt_tokens=n_prompt,
            completion_tokens=len(completion),
            completion_token_ids=completion,
            completion_logprobs=logprobs,
            raw_text=raw_text,
            error=error,
            prefill=prefill,
        )

    def _sample(self, lm: LoadedModel, input_ids: Any, max_new: int, seed: int) -> tuple[list[int], Any]:
        """One sampled turn, alone on the model: its seed makes the rollout reproducible."""
        import torch
        from transformers import GenerationConfig

        from agent.policies.preallocated_cache import decode_cache

        config = GenerationConfig(
            max_new_tokens=max_new,
            do_sample=True,
            temperature=self.temperature,
            top_k=0,
            top_p=1.0,
            # Explicit neutral values: fields left None are filled from the model's own
            # generation_config, and any such processor would make the recorded logprobs lie.
            min_p=0.0,
            typical_p=1.0,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            min_new_tokens=0,
            eos_token_id=lm.eos_token_ids or None,
            pad_token_id=lm.pad_token_id,
            return_dict_in_generate=True,
            output_logits=True,
        )
        model = lm.model
        device = next(model.parameters()).device
        stop = [RunawayStop(lm.tokenizer, int(input_ids.shape[1]))] if self.stop_runaway else None
        rng_devices = [device] if device.type == "cuda" else []
        with lm.lock, torch.random.fork_rng(devices=rng_devices), torch.inference_mode(), releasing_freed_memory():
            torch.manual_seed(seed)
            was_training = model.training
            model.eval()
            try:
                out = model.generate(
                    input_ids=input_ids.to(device),
                    attention_mask=torch.ones_like(input_ids).to(device),
                    generation_config=config,
                    stopping_criteria=stop,
                    **decode_cache(model, int(input_ids.shape[1]) + max_new),
                )
            finally:
                model.train(was_training)
        completion = out.sequences[0, input_ids.shape[1]:].tolist()
        completion = completion[: first_end(completion, set(lm.eos_token_ids))]
        logits = torch.stack([step[0] for step in out.logits[: len(completion)]]) if completion else None
        return completion, logits


def completion_logprobs(logits: Any, token_ids: list[int], temperature: float) -> list[float]:
    """Log-probability of each generated token under the distribution it was drawn from
    (`logits`: one row per token)."""
    import torch

    if not token_ids:
        return []
    logits = logits.float()
    if temperature > 0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    index = torch.tensor(token_ids, device=logp.device).unsqueeze(1)
    return logp.gather(1, index).squeeze(1).tolist()


def strip_end_markers(text: str, tokenizer: Any, eos_ids: list[int]) -> str:
    """Text before the first end-of-turn marker (the template's end tokens are not content)."""
    markers = {tokenizer.convert_ids_to_tokens(i) for i in eos_ids} | {"<|im_end|>", "<|endoftext|>"}
    cut = len(text)
    for marker in markers:
        if isinstance(marker, str) and marker:
            pos = text.find(marker)
            if pos != -1:
                cut = min(cut, pos)
    return text[:cut]


class TransformersEpisode:
    """Holds only the turn counter: the harness owns the context and passes it every turn."""

    def __init__(self, policy: TransformersPolicy, seed: int):
        self.policy = policy
        self.seed = seed
        self.turn = 0

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> PolicyStep:
        return self._turn(messages, tools)

    def answer(self, messages: list[Message], opening: str) -> PolicyStep:
        """The forced final turn, the reply begun with `opening` (no tools offered)."""
        return self._turn(messages, None, opening)

    def _turn(self, messages: list[Message], tools: list[dict[str, Any]] | None, opening: str | None = None) -> PolicyStep:
        step = self.policy.generate(messages, tools, seed=turn_seed(self.policy.seed, self.seed, self.turn),
                                    id_prefix=f"call_{self.turn}", opening=opening)
        self.turn += 1
        return step


def adapter_base_model(adapter_dir: str | Path) -> str:
    """The base model a peft adapter folder was trained on: our sidecar first (it records the
    spec as given, e.g. `smollm2`, which resolves on any machine), else peft's own record."""
    folder = Path(adapter_dir).expanduser()
    base = read_sidecar(folder).get("base_model")
    if base:
        return str(base)
    config = folder / "adapter_config.json"
    base = json.loads(config.read_text(encoding="utf-8")).get("base_model_name_or_path") if config.is_file() else None
    if not base:
        raise ValueError(f"{folder}: not a peft adapter folder with a known base model (no sidecar, no base_model_name_or_path)")
    return str(base)


def policy_from_spec(rest: str, **options: Any) -> TransformersPolicy:
    """`transformers:PATH` (CLI spec). `PATH` is a model folder, `smollm2`, a LoRA adapter folder
    (its base model read from the adapter's sidecar), or `BASE+ADAPTER`; options go to the constructor."""
    base, plus, adapter = rest.partition("+")
    if plus:
        return TransformersPolicy(base, adapter_path=adapter, name=options.pop("name", f"transformers:{rest}"), **options)
    folder = Path(rest).expanduser()
    if (folder / "adapter_config.json").is_file() and not (folder / "config.json").is_file():
        return TransformersPolicy(adapter_base_model(folder), adapter_path=folder, name=options.pop("name", f"transformers:{rest}"), **options)
    return TransformersPolicy(rest, **options)
