"""LoRA SFT on a tiny random model: TRL trains on our labels as is, the adapter changes and
reloads (peft layout + sidecar), loss falls on a repeated batch, runs are seeded."""

from __future__ import annotations

import json

import pytest

from agent.adapter_sidecar import SIDECAR, read_sidecar
from agent.final_answer import format_final_answer
from agent.harness import HarnessConfig, run_episode
from agent.policies.transformers_policy import TokenizerCounter
from agent.policy_base import PolicyStep, ToolCall
from core.training_settings import LoraSettings, SFTSettings
from tests.support.tiny_models import TinyBackend, tiny_model_dir
from training.sft import run_sft, train_sft
from training.sft_plots import plot_loss_curve
from training.sft_samples import IGNORE_INDEX, SampleSet, build_samples

LORA = LoraSettings(rank=8, alpha=16, dropout=0.0)
SFT = SFTSettings(learning_rate=1e-2, max_steps=12, batch_size=2, grad_accum=1, lr_scheduler="constant",
                  max_length=4096, torch_threads=1, seed=0)


class TwoTurns:
    name = "two-turns"

    def __init__(self, counter):
        self.counter = counter

    def token_counter(self):
        return self.counter

    def new_episode(self, question, seed=0):
        return self

    def act(self, messages, tools):
        if not any(m["role"] == "tool" for m in messages):
            return PolicyStep(content=None, tool_calls=[ToolCall("s", "search_corpus", {"query": "Alpha Lighthouse"})])
        return PolicyStep(content=format_final_answer([("lighthouse", "designed by Mara Quell")]))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def samples(model_dir) -> tuple[SampleSet, list]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    config = HarnessConfig(token_budget=2048, response_reserve_tokens=256, search_budget_tokens=256)
    trajectory = run_episode(TinyBackend(), TwoTurns(TokenizerCounter(tokenizer)), "Who designed the Alpha Lighthouse?", config, task_id="t")
    built = build_samples([trajectory], tokenizer, SFT.max_length)
    assert [s.turn_indices for s in built.samples] == [(0, 1)], "the two turns train as one sequence"
    return built, [trajectory]


@pytest.fixture(scope="module")
def trained(samples, model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("adapter") / "sft"
    return run_sft(samples[1], str(model_dir), out, lora=LORA, sft=SFT, lineage={"filter": {"whole": 1}})


def test_first_logged_loss_is_the_base_models_loss_on_assistant_tokens_only(trained, samples, model_dir):
    """LoRA's B starts at zero, so step 1's loss is the base model's: TRL used our labels untouched."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for sample in samples[0].samples:
            logits = model(input_ids=torch.tensor([sample.input_ids])).logits[0, :-1]
            labels = torch.tensor(sample.labels[1:])
            keep = labels != IGNORE_INDEX
            total += torch.nn.functional.cross_entropy(logits[keep], labels[keep], reduction="sum").item()
            count += int(keep.sum())
    assert trained.loss_curve[0][1] == pytest.approx(total / count, rel=1e-3)


def test_loss_falls_on_a_repeated_batch(trained):
    losses = [loss for _, loss in trained.loss_curve]
    assert trained.steps == SFT.max_steps and len(losses) == SFT.max_steps
    assert losses[-1] < losses[0] - 0.5
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3


def test_adapter_parameters_changed(trained):
    from safetensors.torch import load_file

    weights = load_file(f"{trained.adapter_path}/adapter_model.safetensors")
    lora_b = [w for name, w in weights.items() if "lora_B" in name]
    assert lora_b and all(w.abs().sum() > 0 for w in lora_b), "lora_B starts at zero; training must move it"
    assert {name.split(".")[-3] for name in weights if "lora_A" in name} == set(LORA.target_modules)


def test_adapter_is_in_peft_layout_with_a_sidecar(trained):
    config = json.loads(open(f"{trained.adapter_path}/adapter_config.json").read())
    assert config["peft_type"] == "LORA" and config["r"] == 8 and config["lora_alpha"] == 16
    assert sorted(config["target_modules"]) == sorted(LORA.target_modules)
    sidecar = read_sidecar(trained.adapter_path)
    assert sidecar["base_model"] == trained.base_model == config["base_model_name_or_path"]
    assert sidecar["lineage"]["trajectories"] == 1 and len(sidecar["lineage"]["task_fingerprint"]) == 16
    assert sidecar["lineage"]["filter"] == {"whole": 1} and sidecar["data"]["samples"] == 1
    assert sidecar["config"]["sft"]["max_steps"] == SFT.max_steps and sidecar["config"]["lora"]["rank"] == 8
    assert sidecar["metrics"]["steps"] == trained.steps and sidecar["metrics"]["tokens_per_s"] > 0
    assert [tuple(p) for p in sidecar["loss_curve"]] == trained.loss_curve
    assert trained.sidecar_path.endswith(SIDECAR)
    profile = sidecar["harness_profile"]  # recorded from the trajectories: the checkpoint's own harness
    assert (profile["token_budget"], profile["search_budget_tokens"], profile["view"]) == (2048, 256, "full")


def test_adapter_reloads_and_generates(trained, model_dir):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = tokenizer("<|im_start|>user\nWho designed it?<|im_end|>\n<|im_start|>assistant\n", return_tensors="pt").input_ids
    with torch.no_grad():
        before = base(input_ids=ids).logits
    tuned = PeftModel.from_pretrained(base, trained.adapter_path).eval()
    with torch.no_grad():
        after = tuned(input_ids=ids).logits
        out = tuned.generate(input_ids=ids, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert not torch.allclose(before, after)
    assert out.shape[1] > ids.shape[1]


def test_transformers_policy_runs_an_episode_with_the_adapter(trained, model_dir):
    from agent.policies.transformers_policy import TransformersPolicy

    policy = TransformersPolicy(str(model_dir), adapter_path=trained.adapter_path, max_new_tokens=16)
    config = HarnessConfig(token_budget=2048, response_reserve_tokens=256, max_turns=2)
    trajectory = run_episode(TinyBackend(), policy, "Who designed the Alpha Lighthouse?", config)
    assert trajectory.turns and trajectory.error is None


def test_same_seed_same_adapter(samples, model_dir, tmp_path):
    from safetensors.torch import load_file

    short = SFT.model_copy(update={"max_steps": 2, "batch_size": 1})
    a = train_sft(samples[0], model_dir, tmp_path / "a", lora=LORA.model_copy(update={"dropout": 0.1}), sft=short)
    b = train_sft(samples[0], model_dir, tmp_path / "b", lora=LORA.model_copy(update={"dropout": 0.1}), sft=short)
    wa, wb = (load_file(f"{r.adapter_path}/adapter_model.safetensors") for r in (a, b))
    assert all((wa[name] == wb[name]).all() for name in wa)


def test_no_samples_is_an_error(model_dir, tmp_path):
    with pytest.raises(ValueError, match="no training samples"):
        train_sft(SampleSet([], max_length=8), model_dir, tmp_path / "x")


def test_loss_curve_plot(trained, tmp_path):
    assert plot_loss_curve(trained.loss_curve, tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"


def test_an_exported_searcher_is_portable_and_sft_continues_it(trained, samples, model_dir, tmp_path):
    """A shipped searcher (`training.searchers`): bf16 weights, no trainer paths, and a continued
    run starts from its weights (its first loss is the trained adapter's, far below a fresh LoRA's)
    with its shape, recording which adapter it continued."""
    from safetensors.torch import load_file

    from training.searchers import adapter_digest, export_searcher

    searcher = export_searcher(trained.adapter_path, tmp_path / "searcher", base_model="tiny")
    weights = load_file(str(searcher / "adapter_model.safetensors"))
    assert {str(w.dtype) for w in weights.values()} == {"torch.bfloat16"}
    assert json.loads((searcher / "adapter_config.json").read_text())["base_model_name_or_path"] == "tiny"
    exported = read_sidecar(searcher)
    assert "base_model_path" not in exported and exported["base_model"] == "tiny"
    assert exported["export"]["source_digest"] == adapter_digest(trained.adapter_path)
    assert exported["harness_profile"] == read_sidecar(trained.adapter_path)["harness_profile"]

    short = SFT.model_copy(update={"max_steps": 2, "batch_size": 1})
    fresh_first = trained.loss_curve[0][1]
    continued = train_sft(samples[0], model_dir, tmp_path / "continued", sft=short, init_adapter=searcher)
    assert continued.loss_curve[0][1] < fresh_first - 0.5, (continued.loss_curve, fresh_first)
    sidecar = read_sidecar(continued.adapter_path)
    assert (sidecar["config"]["lora"]["rank"], sidecar["config"]["lora"]["alpha"]) == (LORA.rank, LORA.alpha)
    assert sidecar["lineage"]["init_adapter_digest"] == adapter_digest(searcher)
    moved = load_file(f"{continued.adapter_path}/adapter_model.safetensors")
    assert any(not (moved[name].float() == weights[name].float()).all() for name in weights), "SFT must train the adapter"
    reshipped = read_sidecar(export_searcher(continued.adapter_path, tmp_path / "searcher-2", base_model="tiny"))
    assert reshipped["lineage"]["init_adapter"] == "searcher", "the searcher it continued, by name, not by this machine's path"
    assert reshipped["lineage"]["init_adapter_digest"] == adapter_digest(searcher)


def _train_in(samples_set, model_dir, out, precision):
    settings = SFTSettings(learning_rate=1e-2, max_steps=6, batch_size=1, grad_accum=1, lr_scheduler="constant",
                           max_length=4096, torch_threads=1, seed=0, precision=precision)
    return train_sft(samples_set, model_dir, out, lora=LORA, sft=settings, device="cpu")


def test_bf16_sft_on_cpu_keeps_fp32_lora_weights_and_learns_like_fp32(samples, model_dir, tmp_path):
    import torch
    from safetensors.torch import load_file

    fp32 = _train_in(samples[0], model_dir, tmp_path / "fp32", "fp32")
    bf16 = _train_in(samples[0], model_dir, tmp_path / "bf16", "bf16")
    assert (fp32.metrics["precision"], bf16.metrics["precision"]) == ("fp32", "bf16")
    weights = load_file(f"{bf16.adapter_path}/adapter_model.safetensors")
    assert weights and {w.dtype for w in weights.values()} == {torch.float32}, "LoRA weights and optimizer stay fp32"
    first_fp32, first_bf16 = fp32.loss_curve[0][1], bf16.loss_curve[0][1]
    assert first_bf16 == pytest.approx(first_fp32, rel=0.02), "the same base model's loss..."
    assert first_bf16 != first_fp32, "...computed in bf16 (an fp32 run repeats the fp32 loss exactly)"
    losses = [loss for _, loss in bf16.loss_curve]
    assert losses[-1] < losses[0] - 0.5, "bf16 autocast still trains the adapter"


def test_a_final_answer_weight_scales_the_answers_share_of_the_loss(samples, model_dir, tmp_path):
    """Step 1's loss (LoRA's B is zero) is the base model's weighted loss: the weights reach the
    loss aligned with the labels, and the answer's tokens count `final_answer_weight` times."""
    import torch
    from transformers import AutoModelForCausalLM

    weight = 4.0
    sft = SFT.model_copy(update={"max_steps": 2, "final_answer_weight": weight})
    result = train_sft(samples[0], str(model_dir), tmp_path / "weighted", lora=LORA, sft=sft)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    plain = weighted = 0.0
    count = 0
    with torch.no_grad():
        for sample in samples[0].samples:
            logits = model(input_ids=torch.tensor([sample.input_ids])).logits[0, :-1]
            labels = torch.tensor(sample.labels[1:])
            keep = labels != IGNORE_INDEX
            losses = torch.nn.functional.cross_entropy(logits[keep], labels[keep], reduction="none")
            weights = torch.tensor(sample.loss_weights(weight)[1:])[keep]
            plain += losses.sum().item()
            weighted += (losses * weights).sum().item()
            count += int(keep.sum())
    merged = samples[0].samples[0]
    labelled = [i for i, label in enumerate(merged.labels) if label != IGNORE_INDEX]
    marked = [i for i, flag in enumerate(merged.final_mask) if flag]
    assert marked and marked == labelled[-len(marked):] and len(marked) < len(labelled), \
        "in the merged episode only the answer, its last labelled tokens, is marked"
    assert result.loss_curve[0][1] == pytest.approx(weighted / count, rel=1e-3)
    assert abs(weighted - plain) / count > 0.01, "the weights changed the loss"
    assert result.metrics["final_answer_weight"] == weight and result.metrics["final_answer_loss_tokens"] > 0
    assert json.loads((tmp_path / "weighted" / SIDECAR).read_text())["config"]["sft"]["final_answer_weight"] == weight
