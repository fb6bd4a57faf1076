"""gpt-oss-20b on one GPU with dummy weights: rollout generation through vLLM, LoRA training with the
experts targeted, and adapter sync time (issue 16). Prints one JSON object (figures, never asserts).

No download is needed: the model is gpt-oss-20b's architecture built from its config (24 layers,
32 experts, 4 per token, hidden 2880, 64 query / 8 key-value heads, vocab 201,088, YaRN to 131K)
with random weights: vLLM loads it with `load_format="dummy"`, transformers builds it with
`from_config`. Figures measure speed and memory only; dummy weights say nothing about quality.

Parts (each runs in its own child process, so one part's GPU memory never limits another's):
- `vllm`: generation tokens/s for batches of harness-sized rollouts (prompts of
  `--prompt-tokens`, rendered by our harmony template and padded to length; `--gen-tokens` new
  tokens each, eos ignored) at batch 8/32/64, with a random LoRA adapter loaded (attention +
  experts in peft's layout; when vLLM refuses the expert weights, attention only, and the
  refusal is reported);
- `train`: LoRA training tokens/s with attention and the fused experts targeted
  (`model_family.lora_targets`), gradient checkpointing, bf16, at 8K and 32K-token sequences,
  with peak memory; the attention kernel is the first of flash-attn3 (hub kernel), flex
  attention, eager that loads (gpt-oss's attention sinks rule out SDPA);
- `sync`: adapter sync into the running vLLM engine: save a new adapter, `add_lora`, and the
  first request on it.

Anchors measured earlier on the same GPU kind (plain transformers, random weights, issue 16):
generation 194 tok/s at batch 8 (eager), LoRA training 3.6k tok/s at 4 x 2,048 (attention-only),
59 GiB peak. Goals: generation >= 10x that anchor through vLLM, training >= the anchor with the
experts targeted, sync <= 1 s. The output says, for each, whether it was met.

    python bench/gpu_gpt_oss.py                      # all parts, JSON on stdout
    python bench/gpu_gpt_oss.py --parts train --seq-lens 8192
    python bench/gpu_gpt_oss.py --preset tiny --parts train --allow-cpu   # the code path on a CPU

Without CUDA (and without --allow-cpu) it prints {"skipped": ...} and exits 0. vLLM runs from
the interpreter given by --vllm-python (default: this one, else SEARCHSMITH_VLLM_PYTHON).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GPT_OSS_20B = dict(vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=24,
                   num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32,
                   num_experts_per_tok=4, sliding_window=128, max_position_embeddings=131072,
                   rope_parameters={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                    "truncate": False, "original_max_position_embeddings": 4096,
                                    "rope_theta": 150000.0},
                   tie_word_embeddings=False, eos_token_id=200002, pad_token_id=199999)
TINY = dict(GPT_OSS_20B, vocab_size=2048, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
            eos_token_id=2, pad_token_id=1)
ANCHORS = {"generation_tok_s_batch8": 194.0, "train_tok_s": 3600.0, "peak_gib": 59.0}
GOALS = {"generation_tok_s_batch8": 10 * ANCHORS["generation_tok_s_batch8"], "train_tok_s": ANCHORS["train_tok_s"],
         "sync_s": 1.0}
ATTENTION_KERNELS = ("kernels-community/vllm-flash-attn3", "flex_attention", "eager")


def log(message: str) -> None:
    print(f"[gpu_gpt_oss] {message}", file=sys.stderr, flush=True)


def write_model_folder(folder: Path, preset: dict[str, Any]) -> Path:
    """config.json (+ generation_config.json) of the preset; no weights (vLLM's dummy loader, or
    transformers' from_config, make them)."""
    from transformers import GenerationConfig, GptOssConfig

    folder.mkdir(parents=True, exist_ok=True)
    config = GptOssConfig(**preset)
    config.architectures = ["GptOssForCausalLM"]
    config.save_pretrained(str(folder))
    GenerationConfig(eos_token_id=[200002, 199999, 200012], pad_token_id=199999).save_pretrained(str(folder))
    return folder


def harness_prompt_ids(n_tokens: int, vocab_size: int) -> list[int]:
    """A first-turn harness prompt rendered by our harmony template (tokenized by the tiny harmony
    tokenizer, ids shifted into the model's vocabulary), repeated to `n_tokens`."""
    from agent.prompts import SYSTEM_PROMPT, tool_schemas
    from agent.small_model import train_harmony_tokenizer

    tokenizer = train_harmony_tokenizer([SYSTEM_PROMPT, json.dumps(tool_schemas())], vocab_size=1024)
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "Who designed the lighthouse?"}]
    text = tokenizer.apply_chat_template(messages, tools=tool_schemas(), add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = (ids * (n_tokens // len(ids) + 1))[:n_tokens]
    return [(i * 97) % (vocab_size - 1000) for i in ids]


def random_adapter(folder: Path, model_dir: Path, preset: dict[str, Any], targets: list[str], rank: int, seed: int) -> Path:
    """A peft LoRA adapter with random A and B for the preset, built on the meta device (no base weights)."""
    import torch
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from safetensors.torch import save_file
    from transformers import GptOssConfig, GptOssForCausalLM

    from agent.policies.model_family import lora_targets

    with torch.device("meta"):
        model = GptOssForCausalLM(GptOssConfig(**preset))
    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, **lora_targets(targets, model),
                        task_type="CAUSAL_LM", base_model_name_or_path=str(model_dir))
    state = get_peft_model_state_dict(get_peft_model(model, config))
    generator = torch.Generator().manual_seed(seed)
    tensors = {k: (torch.randn(tuple(v.shape), generator=generator) * 0.01).to(torch.bfloat16) for k, v in state.items()}
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config.save_pretrained(str(folder))
    return folder


# ---- parts (child processes) ----------------------------------------------------------------------


def part_train(args: argparse.Namespace, preset: dict[str, Any]) -> dict[str, Any]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import GptOssConfig, GptOssForCausalLM

    from agent.policies.model_family import lora_targets
    from core.base_models import GPT_OSS_LORA_TARGETS

    device = "cuda" if torch.cuda.is_available() else "cpu"
    results: dict[str, Any] = {"device": device, "runs": []}
    torch.manual_seed(0)
    started = time.perf_counter()
    with torch.device(device):
        model = GptOssForCausalLM(GptOssConfig(**preset)).to(torch.bfloat16)
    results["build_s"] = round(time.perf_counter() - started, 1)
    probe = torch.randint(0, preset["vocab_size"], (1, 16), device=device)
    for kernel in ATTENTION_KERNELS:  # the first that loads and runs a forward with sinks
        try:
            model.set_attn_implementation(kernel)
            with torch.no_grad():
                model(input_ids=probe)
            results["attention"] = kernel
            break
        except Exception as error:  # noqa: BLE001 - the next kernel is tried; the reason is reported
            results.setdefault("attention_refused", {})[kernel] = f"{type(error).__name__}: {str(error)[:200]}"
    else:
        return {**results, "error": "no attention implementation runs"}
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    targets = lora_targets(list(GPT_OSS_LORA_TARGETS), model)
    model = get_peft_model(model, LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0, **targets,
                                             task_type="CAUSAL_LM"))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    results.update(lora_targets=targets, trainable_params=trainable)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    model.train()
    for seq_len in args.seq_lens:
        run: dict[str, Any] = {"seq_len": seq_len, "batch": 1}
        try:
            ids = torch.randint(0, preset["vocab_size"], (1, seq_len), device=device)
            if device == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            times = []
            for step in range(args.train_steps + 1):  # the first step warms up (kernels, allocator)
                started = time.perf_counter()
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if device == "cuda":
                    torch.cuda.synchronize()
                if step:
                    times.append(time.perf_counter() - started)
            run["tok_s"] = round(seq_len * len(times) / sum(times), 1)
            run["step_s"] = round(sum(times) / len(times), 3)
            if device == "cuda":
                run["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        except Exception as error:  # noqa: BLE001 - e.g. out of memory at 32K: a figure, not a crash
            run["error"] = f"{type(error).__name__}: {str(error)[:300]}"
        results["runs"].append(run)
        log(f"train {run}")
    return results


def part_vllm(args: argparse.Namespace, preset: dict[str, Any]) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    from core.base_models import GPT_OSS_LORA_TARGETS

    work = Path(tempfile.mkdtemp(prefix="gpu-gpt-oss-"))
    model_dir = write_model_folder(work / "model", preset)
    out: dict[str, Any] = {"prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens}
    llm = LLM(model=str(model_dir), load_format="dummy", skip_tokenizer_init=True, enable_lora=True,
              max_lora_rank=args.rank, max_loras=2, max_model_len=args.prompt_tokens + args.gen_tokens + 16,
              max_num_seqs=max(args.batches), gpu_memory_utilization=0.85, seed=0)
    adapter, lora = None, None
    for name, targets in (("attention+experts", list(GPT_OSS_LORA_TARGETS)), ("attention", ["q_proj", "k_proj", "v_proj", "o_proj"])):
        folder = random_adapter(work / f"lora-{len(targets)}", model_dir, preset, targets, args.rank, seed=1)
        try:
            request = LoRARequest(f"bench-{len(targets)}", len(targets), str(folder))
            llm.llm_engine.add_lora(request)
            adapter, lora = name, request
            break
        except Exception as error:  # noqa: BLE001 - vLLM may not serve LoRA on the fused experts
            out.setdefault("lora_refused", {})[name] = f"{type(error).__name__}: {str(error)[:300]}"
    out["lora"] = adapter
    prompt = harness_prompt_ids(args.prompt_tokens, preset["vocab_size"])
    params = SamplingParams(max_tokens=args.gen_tokens, ignore_eos=True, temperature=1.0, seed=0)
    out["batches"] = []
    for batch in args.batches:
        prompts = [TokensPrompt(prompt_token_ids=prompt) for _ in range(batch)]
        llm.generate(prompts[:1], params, lora_request=lora, use_tqdm=False)  # warm
        started = time.perf_counter()
        results = llm.generate(prompts, params, lora_request=lora, use_tqdm=False)
        seconds = time.perf_counter() - started
        generated = sum(len(r.outputs[0].token_ids) for r in results)
        row = {"batch": batch, "generated_tokens": generated, "seconds": round(seconds, 2),
               "tok_s": round(generated / seconds, 1)}
        out["batches"].append(row)
        log(f"vllm {row}")
    if lora is not None:  # the sync part: a new adapter version joins the running engine
        syncs = []
        for version in range(3):
            started = time.perf_counter()
            folder = random_adapter(work / f"sync-{version}", model_dir, preset, list(GPT_OSS_LORA_TARGETS) if adapter ==
                                    "attention+experts" else ["q_proj", "k_proj", "v_proj", "o_proj"], args.rank, seed=10 + version)
            saved = time.perf_counter()
            request = LoRARequest(f"sync-{version}", 100 + version, str(folder))
            llm.llm_engine.add_lora(request)
            loaded = time.perf_counter()
            llm.generate([TokensPrompt(prompt_token_ids=prompt[:256])], SamplingParams(max_tokens=1), lora_request=request,
                         use_tqdm=False)
            first = time.perf_counter()
            llm.llm_engine.remove_lora(request.lora_int_id)
            syncs.append({"write_s": round(saved - started, 3), "add_lora_s": round(loaded - saved, 3),
                          "first_request_s": round(first - loaded, 3), "sync_s": round(loaded - started, 3)})
        out["sync"] = syncs
    return out


# ---- driver -----------------------------------------------------------------------------------------


def run_part(name: str, args: argparse.Namespace) -> dict[str, Any]:
    python = args.vllm_python if name == "vllm" else sys.executable
    command = [python, str(Path(__file__).resolve()), "--child", name, "--preset", args.preset,
               "--prompt-tokens", str(args.prompt_tokens), "--gen-tokens", str(args.gen_tokens),
               "--rank", str(args.rank), "--train-steps", str(args.train_steps),
               "--batches", ",".join(map(str, args.batches)), "--seq-lens", ",".join(map(str, args.seq_lens))]
    if args.allow_cpu:
        command.append("--allow-cpu")
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.part_timeout, cwd=str(REPO))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.part_timeout} s"}
    sys.stderr.write(done.stderr[-4000:])
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-600:]}"}
    return {**json.loads(lines[-1]), "wall_s": round(time.perf_counter() - started, 1)}


def verdicts(report: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    batch8 = [b for b in (report.get("vllm") or {}).get("batches", []) if b["batch"] == 8]
    if batch8:
        out["generation_batch8"] = {"tok_s": batch8[0]["tok_s"], "goal": GOALS["generation_tok_s_batch8"],
                                    "met": batch8[0]["tok_s"] >= GOALS["generation_tok_s_batch8"]}
    runs = [r for r in (report.get("train") or {}).get("runs", []) if "tok_s" in r]
    if runs:
        best = max(r["tok_s"] for r in runs)
        out["training"] = {"best_tok_s": best, "goal": GOALS["train_tok_s"], "met": best >= GOALS["train_tok_s"]}
    syncs = (report.get("vllm") or {}).get("sync") or []
    if syncs:
        worst = max(s["sync_s"] for s in syncs)
        out["sync"] = {"worst_s": worst, "goal": GOALS["sync_s"], "met": worst <= GOALS["sync_s"]}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="train,vllm", help="train, vllm (vllm includes the adapter sync)")
    parser.add_argument("--preset", choices=("20b", "tiny"), default="20b")
    parser.add_argument("--batches", default="8,32,64")
    parser.add_argument("--seq-lens", default="8192,32768")
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--gen-tokens", type=int, default=512)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--train-steps", type=int, default=3)
    parser.add_argument("--part-timeout", type=int, default=1200)
    parser.add_argument("--vllm-python", default=os.environ.get("SEARCHSMITH_VLLM_PYTHON") or sys.executable)
    parser.add_argument("--allow-cpu", action="store_true", help="run without CUDA (the tiny preset: checks the code path)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.batches = [int(x) for x in str(args.batches).split(",") if x]
    args.seq_lens = [int(x) for x in str(args.seq_lens).split(",") if x]
    preset = GPT_OSS_20B if args.preset == "20b" else TINY
    if args.child:
        result = {"train": part_train, "vllm": part_vllm}[args.child](args, preset)
        print(json.dumps(result, default=str))
        return 0
    import torch

    if not torch.cuda.is_available() and not args.allow_cpu:
        print(json.dumps({"skipped": "no CUDA device: this benchmark needs a GPU (see the module docstring)"}))
        return 0
    report: dict[str, Any] = {"preset": args.preset, "anchors": ANCHORS, "goals": GOALS,
                              "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
                              "weights": "dummy (random): speed and memory only"}
    for part in [p.strip() for p in args.parts.split(",") if p.strip()]:
        log(f"part {part} ...")
        report[part] = run_part(part, args)
    report["verdicts"] = verdicts(report)
    print(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
