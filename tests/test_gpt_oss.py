"""gpt-oss end to end on a tiny random `GptOssForCausalLM` (CPU, seconds): its profile is read from
config.json, it drives the harness in harmony, LoRA SFT trains attention and the fused experts
and loads back with the same logits, an MXFP4 checkpoint is dequantized on load, the sampler's
log-probs are what the CISPO trainer recomputes, and CISPO runs.

The tiny model is the real architecture (attention sinks, sliding/full layers, top-k router,
fused experts, YaRN) with a harmony tokenizer trained on the harness's texts; see
`agent.small_model.build_tiny_gpt_oss`. The student is that model after 30 LoRA SFT steps on
a scripted teacher that issues two calls in one turn and then answers: greedy, it repeats both
calls in harmony, the harness runs them and it answers, which only works when the template,
the SFT span, the generation stops and the parser agree. Everything is seeded (CPU, one thread).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agent.final_answer import format_final_answer
from agent.harness import HarnessConfig, run_episode
from agent.policies.model_family import load_options
from agent.policies.transformers_policy import TokenizerCounter, TransformersPolicy, clear_model_cache, load_model
from agent.policy_base import PolicyStep, ToolCall
from core.base_models import GPT_OSS_EXPERT_PARAMETERS, profile_for, profile_from_config
from core.training_settings import LoraSettings, SFTSettings
from tests.support.mxfp4 import write_mxfp4_checkpoint
from tests.support.tiny_models import TinyBackend, tiny_vocab_texts
from tests.test_training_cispo_support import MemoryBackend, lighthouse_tasks
from training.sft import run_sft

QUESTION = "Who designed the Alpha Lighthouse?"
HARNESS = HarnessConfig(token_budget=2048, response_reserve_tokens=256, search_budget_tokens=256, max_turns=3)
ATTENTION = ["k_proj", "o_proj", "q_proj", "v_proj"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def gpt_oss_dir(tmp_path_factory) -> Path:
    from agent.small_model import build_tiny_gpt_oss

    texts = [*tiny_vocab_texts(), *(task.question for task in lighthouse_tasks())]
    return build_tiny_gpt_oss(tmp_path_factory.mktemp("gpt-oss") / "model", texts, seed=0)


class ParallelTeacher:
    """Two calls in one turn (Context-1's parallel calls), then the answer (the gold document d1)."""

    name = "parallel-teacher"

    def __init__(self, counter):
        self.counter = counter

    def token_counter(self):
        return self.counter

    def new_episode(self, question, seed=0):
        return self

    def act(self, messages, tools):
        if not any(m["role"] == "tool" for m in messages):
            return PolicyStep(content="", tool_calls=[
                ToolCall("s", "search_corpus", {"query": "Alpha Lighthouse"}), ToolCall("g", "grep_corpus", {"pattern": "Quell"})])
        return PolicyStep(content=format_final_answer([("d1", "designed by Mara Quell")]))


def teacher_trajectories(model_dir: Path) -> list:
    from transformers import AutoTokenizer

    counter = TokenizerCounter(AutoTokenizer.from_pretrained(str(model_dir)))
    return [run_episode(MemoryBackend(), ParallelTeacher(counter), task.question, HARNESS, task_id=task.task_id)
            for task in lighthouse_tasks()]


def adapter_logits(model_dir: Path, adapter: Path | None, ids: list[int]) -> torch.Tensor:
    """Logits of base + adapter kept unmerged (peft's own forward), fp32."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter))
    with torch.no_grad():
        return model.eval()(input_ids=torch.tensor([ids])).logits[0]


# ---- the profile ---------------------------------------------------------------------------------


def test_profile_is_chosen_from_the_models_config(gpt_oss_dir, tmp_path):
    profile = profile_for(gpt_oss_dir)
    assert (profile.family, profile.chat_format, profile.tool_call_parser) == ("gpt_oss", "harmony", "openai")
    assert set(GPT_OSS_EXPERT_PARAMETERS) <= set(profile.lora_targets) and profile.lora_dropout == 0.0
    assert profile.context_window == 65536 and profile.stop_tokens == ("<|return|>", "<|call|>")
    assert profile.dequantize_mxfp4 is False and load_options(profile) == {}
    assert profile_from_config({"model_type": "gpt_oss", "quantization_config": {"quant_method": "mxfp4"}}).dequantize_mxfp4
    assert profile_from_config({"model_type": "qwen3"}).tool_call_parser == "hermes"
    assert profile_from_config({"model_type": "llama", "vocab_size": 49152}).tool_call_parser == "hermes"
    assert profile_from_config({"model_type": "llama", "vocab_size": 128256}).tool_call_parser == "llama3_json"
    assert "gate_proj" in profile_from_config({"model_type": "qwen3"}).lora_targets
    assert profile_for("smollm2").chat_format == "chatml"
    assert profile_for(tmp_path / "absent") is None  # a validating machine without the weights


def test_a_customer_file_naming_a_gpt_oss_folder_needs_no_other_setting(gpt_oss_dir, tmp_path):
    from core.config import CustomerConfigError, load_customer
    from training.lora_shape import lora_shape
    from training.per_customer import base_profile, rl_config

    (tmp_path / "docs").mkdir()
    path = tmp_path / "acme.yaml"
    path.write_text(f"name: acme\ndomain: web\nsources:\n  - {{type: local, path: ./docs}}\n"
                    f"training:\n  base_model: {gpt_oss_dir}\n")
    settings = load_customer(path).training
    assert base_profile(settings).family == "gpt_oss"
    targets, dropout = lora_shape(settings.lora, base_profile(settings))
    assert set(targets) == {*ATTENTION, *GPT_OSS_EXPERT_PARAMETERS} and dropout == 0.0
    assert set(rl_config(settings, has_init_adapter=False).lora_target_modules) == set(targets)
    # a dropout the experts' LoRA cannot have is refused when the file is read, naming the key
    path.write_text(path.read_text() + "  lora: {dropout: 0.05}\n")
    with pytest.raises(CustomerConfigError) as error:
        load_customer(path)
    errors = str(error.value).splitlines()[1:]
    assert len(errors) == 1 and errors[0].startswith("  - training:") and "no dropout" in errors[0]


# ---- the policy --------------------------------------------------------------------------------


def test_tiny_gpt_oss_drives_the_harness_in_harmony(gpt_oss_dir):
    clear_model_cache()
    policy = TransformersPolicy(str(gpt_oss_dir), max_new_tokens=12, dtype="float32")
    trajectory = run_episode(TinyBackend(), policy, QUESTION, HARNESS, task_id="t")
    lm = policy.loaded()
    vocab = lm.tokenizer.get_vocab()
    assert lm.chat_format == "harmony" and type(lm.model).__name__ == "GptOssForCausalLM"
    assert {vocab["<|return|>"], vocab["<|call|>"]} <= set(lm.eos_token_ids) and vocab["<|end|>"] not in lm.eos_token_ids
    assert trajectory.turns and trajectory.stop_reason
    prompt = policy.render_prompt(trajectory.turns[0].view_messages, trajectory.tools)
    assert prompt.startswith("<|start|>system<|message|>") and prompt.endswith("<|start|>assistant")
    assert "namespace functions {" in prompt
    for turn in trajectory.turns:
        ids = turn.completion_token_ids
        assert ids and len(turn.completion_logprobs) == len(ids)
        stops = [i for i, t in enumerate(ids) if t in lm.eos_token_ids]
        assert stops in ([], [len(ids) - 1]), "generation stops at the first <|call|>/<|return|>"


# ---- SFT: attention and experts ------------------------------------------------------------------


@pytest.fixture(scope="module")
def sft_adapter(gpt_oss_dir, tmp_path_factory):
    """The student: LoRA (targets and dropout left to the family) after 30 steps on both tasks."""
    trajectories = teacher_trajectories(gpt_oss_dir)
    sft = SFTSettings(learning_rate=1e-2, max_steps=30, batch_size=2, grad_accum=1, lr_scheduler="constant",
                      max_length=4096, torch_threads=1, seed=0)
    out = tmp_path_factory.mktemp("sft") / "adapter"
    return run_sft(trajectories, str(gpt_oss_dir), out, lora=LoraSettings(rank=8, alpha=16), sft=sft), trajectories


def test_sft_trains_lora_on_attention_and_the_fused_experts(sft_adapter):
    from safetensors.torch import load_file

    result, _ = sft_adapter
    adapter = Path(result.adapter_path)
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert sorted(config["target_modules"]) == ATTENTION and config["lora_dropout"] == 0.0
    assert sorted(config["target_parameters"]) == sorted(GPT_OSS_EXPERT_PARAMETERS)
    assert result.steps == 30 and result.metrics["final_loss"] < result.metrics["first_loss"]
    weights = load_file(str(adapter / "adapter_model.safetensors"))
    experts_b = [v for k, v in weights.items() if ".mlp.experts." in k and "lora_B" in k]
    attention_b = [v for k, v in weights.items() if "self_attn" in k and "lora_B" in k]
    assert len(experts_b) == 2 * 2 and attention_b  # both expert projections of both layers
    assert all(float(v.abs().max()) > 0 for v in experts_b + attention_b), "B starts at zero: training moved it"
    sidecar = json.loads((adapter / "searchsmith_adapter.json").read_text())
    assert sidecar["base_profile"]["family"] == "gpt_oss" and sidecar["lora_targets"]["dropout"] == 0.0


def test_the_adapter_loads_back_with_the_same_logits(sft_adapter, gpt_oss_dir):
    result, trajectories = sft_adapter
    from training.sft import load_tokenizer
    from training.sft_samples import build_samples

    ids = build_samples(trajectories, load_tokenizer(gpt_oss_dir), 4096).samples[0].input_ids
    unmerged = adapter_logits(gpt_oss_dir, Path(result.adapter_path), ids)
    base = adapter_logits(gpt_oss_dir, None, ids)
    clear_model_cache()
    merged_model = load_model(str(gpt_oss_dir), result.adapter_path, dtype="float32").model  # the policy merges LoRA in
    with torch.no_grad():
        merged = merged_model(input_ids=torch.tensor([ids])).logits[0]
    assert (unmerged - base).abs().max() > 1e-3, "the adapter changes the model"
    torch.testing.assert_close(merged, unmerged, atol=1e-4, rtol=1e-4)


def test_the_student_calls_two_tools_in_one_turn_then_answers(sft_adapter, gpt_oss_dir):
    result, _ = sft_adapter
    clear_model_cache()
    policy = TransformersPolicy(str(gpt_oss_dir), adapter_path=result.adapter_path, max_new_tokens=64, dtype="float32")
    task = lighthouse_tasks()[1]
    trajectory = run_episode(MemoryBackend(), policy, task.question, HARNESS, task_id=task.task_id)
    first = trajectory.turns[0]
    assert [(c.name, c.arguments) for c in first.tool_calls] == [
        ("search_corpus", {"query": "Alpha Lighthouse"}), ("grep_corpus", {"pattern": "Quell"})]
    assert first.raw_text.count("<|call|>") == 1 and first.raw_text.endswith("<|call|>")
    assert all(record.error is None for record in first.tool_calls) and "d1" in first.tool_calls[0].result_doc_ids
    assert trajectory.stop_reason == "answer" and [d.doc_id for d in trajectory.final_ranking] == ["d1"]
    assert trajectory.turns[-1].raw_text.endswith("<|return|>")


def continuing_with(lm):
    """A /v1/completions handler that continues the token-id prompt with the local model (greedy), as
    vLLM would: the text without the stop token, the sampled ids as `token_id:N` log-prob tokens."""
    from tests.support.openai_scripted import Reply

    def continue_prompt(request, number):
        ids = lm.batcher().generate(request["prompt"], request["max_tokens"]).completion_ids
        shown = ids[:-1] if ids and ids[-1] in lm.eos_token_ids else ids
        return Reply(body={"id": "cmpl", "object": "text_completion", "created": 0, "model": request["model"], "choices": [{
            "index": 0, "text": lm.tokenizer.decode(shown, skip_special_tokens=False), "finish_reason": "stop",
            "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.5] * len(ids), "text_offset": None, "top_logprobs": None}}],
            "usage": {"prompt_tokens": len(request["prompt"]), "completion_tokens": len(ids), "total_tokens": len(request["prompt"]) + len(ids)}})

    return continue_prompt


def test_behind_a_completions_server_the_student_gets_the_prompts_it_was_trained_on(sft_adapter, gpt_oss_dir):
    """RL rollouts on vLLM send each prompt as token ids rendered by our harmony template (vLLM
    would render a chat request with openai-harmony's renderer instead). A server that continues
    those ids with the student itself, as vLLM does (the stop token's text left out, special
    tokens kept, ids and log-probs returned), must give the episode the in-process student gives."""
    from agent.policies.openai_policy import OpenAIPolicy
    from tests.support.openai_scripted import ScriptedOpenAI

    result, _ = sft_adapter
    clear_model_cache()
    local = TransformersPolicy(str(gpt_oss_dir), adapter_path=result.adapter_path, max_new_tokens=64, dtype="float32")
    lm = local.loaded()

    task = lighthouse_tasks()[1]
    expected = run_episode(MemoryBackend(), local, task.question, HARNESS, task_id=task.task_id)
    with ScriptedOpenAI(continuing_with(lm)) as server:
        remote = OpenAIPolicy(server.base_url, "student", max_tokens=64, logprobs=True, tokenizer_path=str(gpt_oss_dir), prompt_as_tokens=True)
        served = run_episode(MemoryBackend(), remote, task.question, HARNESS, task_id=task.task_id)
        prompts = [request["prompt"] for request in server.requests]
    assert prompts == [lm.tokenizer(local.render_prompt(turn.view_messages, expected.tools), add_special_tokens=False)["input_ids"]
                       for turn in expected.turns]
    assert [[(c.name, c.arguments) for c in turn.tool_calls] for turn in served.turns] == \
        [[(c.name, c.arguments) for c in turn.tool_calls] for turn in expected.turns]
    assert [t.completion_token_ids for t in served.turns] == [t.completion_token_ids for t in expected.turns]
    assert served.stop_reason == "answer" and [d.doc_id for d in served.final_ranking] == ["d1"]


def test_a_forced_final_answer_is_begun_in_the_final_channel_locally_and_when_served(gpt_oss_dir):
    """The forced final reply of a harmony model starts in the final channel with the view's
    opening; a served model given the prompt as tokens continues exactly the same prompt."""
    from agent.policies.openai_policy import OpenAIPolicy
    from tests.support.openai_scripted import ScriptedOpenAI

    clear_model_cache()
    local = TransformersPolicy(str(gpt_oss_dir), max_new_tokens=16, dtype="float32")
    lm = local.loaded()
    messages = [{"role": "system", "content": "You are a search agent."}, {"role": "user", "content": QUESTION},
                {"role": "user", "content": "You have used all 3 turns. Answer now with up to 5 references: [3] [1] [7]"}]
    step = local.new_episode(QUESTION).answer(messages, "[")
    assert step.prefill == "<|channel|>final<|message|>["
    assert step.content is not None and step.content.startswith("[") and not step.tool_calls
    prompt = lm.tokenizer(local.render_prompt(messages, None) + step.prefill, add_special_tokens=False)["input_ids"]
    assert step.prompt_tokens == len(prompt)

    with ScriptedOpenAI(continuing_with(lm)) as server:
        remote = OpenAIPolicy(server.base_url, "student", max_tokens=16, tokenizer_path=str(gpt_oss_dir), prompt_as_tokens=True)
        served = remote.new_episode(QUESTION).answer(messages, "[")
        sent = [request["prompt"] for request in server.requests]
    assert sent == [prompt] and served.prefill == step.prefill and served.content == step.content


# ---- MXFP4 ---------------------------------------------------------------------------------------


def test_an_mxfp4_checkpoint_is_dequantized_on_load_and_trains(gpt_oss_dir, tmp_path):
    expected = write_mxfp4_checkpoint(gpt_oss_dir, tmp_path / "mxfp4")
    profile = profile_for(tmp_path / "mxfp4")
    assert profile.dequantize_mxfp4 and load_options(profile)["quantization_config"].dequantize is True
    clear_model_cache()
    model = load_model(str(tmp_path / "mxfp4"), dtype="float32").model
    parameters = dict(model.named_parameters())
    assert set(expected) == {n for n in parameters if n.endswith(GPT_OSS_EXPERT_PARAMETERS)}
    for name, weight in expected.items():
        assert parameters[name].dtype == torch.float32
        torch.testing.assert_close(parameters[name].detach(), weight, atol=0, rtol=0)
    sft = SFTSettings(learning_rate=1e-2, max_steps=2, batch_size=1, grad_accum=1, max_length=4096, torch_threads=1)
    result = run_sft(teacher_trajectories(tmp_path / "mxfp4"), str(tmp_path / "mxfp4"), tmp_path / "adapter", sft=sft)
    config = json.loads((Path(result.adapter_path) / "adapter_config.json").read_text())
    assert result.steps == 2 and sorted(config["target_parameters"]) == sorted(GPT_OSS_EXPERT_PARAMETERS)


# ---- CISPO ---------------------------------------------------------------------------------------


def test_sampled_logprobs_are_what_the_cispo_trainer_recomputes(sft_adapter, gpt_oss_dir):
    """pi_old (recorded while sampling harmony turns) equals pi (the trainer's forward over the
    re-rendered prompt + sampled ids) on the sampler's own weights; one CISPO step then moves the
    experts' LoRA weights."""
    from core.training_settings import CispoConfig
    from training.cispo_trainer import load_trainable_model
    from training.cispo_update import cispo_optimizer_step, sequence_logprobs
    from training.rl_batch import collate, sequences_from_groups
    from training.rl_rollouts import collect_rollouts
    from training.rollout_engine import TransformersRolloutEngine

    result, _ = sft_adapter
    config = CispoConfig(device="cpu", seed=0)
    model, tokenizer = load_trainable_model(gpt_oss_dir, result.adapter_path, config)
    engine = TransformersRolloutEngine(model, tokenizer, temperature=1.0, max_new_tokens=24, seed=0)
    harness = HarnessConfig.for_training(max_turns=2)
    batch = collect_rollouts(engine.policy(), MemoryBackend(), lighthouse_tasks()[:1], group_size=2, harness_config=harness,
                             seed=0, workers=1)
    group = batch.groups[0]
    group.advantages = [1.0, -1.0]  # whatever the rewards were: both directions get a gradient
    sequences, counts = sequences_from_groups(tokenizer, [group])
    assert counts.completion_tokens > 0
    model.eval()
    with torch.no_grad():
        new, old, _, _ = sequence_logprobs(model, collate(sequences, tokenizer.pad_token_id))
    torch.testing.assert_close(new, old, atol=2e-4, rtol=0)
    experts = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad and ".mlp.experts." in n}
    assert experts
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    update = cispo_optimizer_step(model, optimizer, sequences, pad_id=tokenizer.pad_token_id, eps_low=1.0, eps_high=4.0)
    assert abs(update["ratio_mean"] - 1.0) < 1e-3
    moved = [n for n, p in model.named_parameters() if n in experts and not torch.equal(p.detach(), experts[n])]
    assert moved, "the CISPO step updates the experts' LoRA"


def test_cispo_runs_two_steps_from_the_student(sft_adapter, gpt_oss_dir, tmp_path):
    """Two CISPO steps from the student near-greedily (T = 0.03: the student's distribution is
    still flat, so T = 1 samples noise) keep its answers; a step trained on groups whose rewards
    differ starts at pi/pi_old = 1.

    Where near-greedy sampling stops agreeing with itself depends on the CPU's arithmetic
    (measured on an AVX512-BF16 machine: at T = 0.03 all 8 rollouts of both tasks answered with
    the gold document, reward 2.0, so every group was dropped; at T = 0.1 rewards were mixed;
    on the machines before it T = 0.03 was already mixed), so the trained step is looked for over
    a few temperatures, from the lowest up, rather than at one.
    """
    from core.training_settings import CispoConfig
    from training.cispo_trainer import train_cispo

    result, _ = sft_adapter

    def cispo(name: str, temperature: float, steps: int):
        config = CispoConfig(group_size=4, tasks_per_step=2, steps=steps, substeps=1, learning_rate=1e-2, max_new_tokens=64,
                             temperature=temperature, harness={"max_turns": 3}, rollout_workers=1, checkpoint_every=1, seed=0)
        return train_cispo(config, lighthouse_tasks(), MemoryBackend(), gpt_oss_dir, result.adapter_path, tmp_path / name)

    run = cispo("greedy", 0.03, steps=2)
    assert [row["step"] for row in run.history] == [0, 1] and run.steps == 2
    assert [p.name for p in run.checkpoints] == ["step-000001", "step-000002"]
    adapter_config = json.loads((run.adapter_path / "adapter_config.json").read_text())
    assert sorted(adapter_config["target_parameters"]) == sorted(GPT_OSS_EXPERT_PARAMETERS)
    assert max(row["reward_mean"] for row in run.history) > 1.0, "the student answers with the gold document"
    trained = [row for row in run.history if not row["skipped"]]
    for temperature in (0.05, 0.1, 0.2, 0.4):
        if trained:
            break
        trained = [row for row in cispo(f"t{temperature}", temperature, steps=1).history if not row["skipped"]]
    assert trained, "at some temperature up to 0.4 a group's rewards differed"
    for row in trained:
        ratio = row["first_substep_ratio"]
        assert abs(ratio["min"] - 1.0) < 1e-3 and abs(ratio["max"] - 1.0) < 1e-3 and ratio["n_tokens"] > 0
