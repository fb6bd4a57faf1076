"""CISPO's importance ratio r = pi/pi_old is 1 on the first substep (issue 12, item 4).

On the first substep of a step the trainer's weights are exactly the sampler's, so any r != 1
means the trainer's pi and the sampler's pi_old are different functions. The case that broke
it: an adapter continued from SFT inherited `lora_dropout` 0.05, the trainer computed pi in
`model.train()` (dropout on) while sampling ran in eval mode (dropout off). These tests run the
real trainer on the tiny answer model (`test_training_cispo_support`) from a fresh adapter and
from an "SFT" adapter saved with lora_dropout 0.05 and non-zero LoRA weights (with lora_B = 0,
as a fresh adapter has, dropout on the LoRA input would change nothing).
"""

from __future__ import annotations

import json

import pytest
import torch

from core.training_settings import CispoConfig
from tests.test_training_cispo_support import MemoryBackend, answer_model_dir, lighthouse_tasks, model_dir, one_thread  # noqa: F401 (fixtures)
from training.cispo_trainer import load_trainable_model, train_cispo

RATIO_TOLERANCE = 1e-5  # float32 on CPU: cached generation vs one full forward


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    yield


@pytest.fixture(scope="module")
def sft_adapter(model_dir, tmp_path_factory):
    """An adapter as SFT leaves it: lora_dropout 0.05 in its config, trained (non-zero) LoRA weights."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("sft-adapter") / "adapter"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules="all-linear",
                                             bias="none", task_type="CAUSAL_LM"))
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    model.save_pretrained(str(folder))
    assert json.loads((folder / "adapter_config.json").read_text())["lora_dropout"] == 0.05
    return folder


def _config(**overrides) -> CispoConfig:
    base = dict(group_size=8, tasks_per_step=2, steps=1, substeps=2, learning_rate=3e-3, lora_r=8, lora_alpha=16,
                max_new_tokens=1, harness={"max_turns": 2, "token_budget": 16384}, rollout_workers=1, checkpoint_every=1,
                seed=0)
    return CispoConfig(**{**base, **overrides})


def _assert_first_substep_ratio_is_one(row: dict) -> None:
    assert row["optimizer_steps"] == 2 and row["groups_kept"] > 0, {k: row.get(k) for k in ("reward_mean", "stop_reasons", "groups_kept")} # there was an update to measure
    first = row["first_substep_ratio"]
    assert first["n_tokens"] > 0
    print("first substep ratio", first)
    for key in ("mean", "min", "max"):
        assert first[key] == pytest.approx(1.0, abs=RATIO_TOLERANCE), (key, first)
    # the step's own figures include the first substep's
    assert row["ratio_min"] <= first["min"] and row["ratio_max"] >= first["max"]


@pytest.mark.parametrize("from_sft", [False, True], ids=["fresh-adapter", "sft-adapter-with-dropout-0.05"])
def test_the_first_substep_ratio_is_one_on_the_samplers_own_weights(model_dir, sft_adapter, tmp_path, from_sft):
    init = sft_adapter if from_sft else None
    result = train_cispo(_config(), lighthouse_tasks(), MemoryBackend(), model_dir, init, tmp_path / "run")
    _assert_first_substep_ratio_is_one(result.history[0])
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["first_substep_ratio"] == result.history[0]["first_substep_ratio"]  # logged, not only returned
    sidecar = json.loads((result.adapter_path / "searchsmith_adapter.json").read_text())
    assert sidecar["first_step"]["first_substep_ratio"] == result.history[0]["first_substep_ratio"]
    # the CISPO adapter continues SFT's weights but says (and has) no dropout
    assert json.loads((result.adapter_path / "adapter_config.json").read_text())["lora_dropout"] == 0.0


def test_the_trainable_model_has_no_dropout_in_train_mode(model_dir, sft_adapter, tmp_path):
    """The cause, checked directly: loaded from the SFT adapter, the model gives the same
    log-probs in train mode (as the trainer computes pi) as in eval mode (as the sampler does)."""
    from transformers import AutoConfig

    model, tokenizer = load_trainable_model(model_dir, sft_adapter, _config())
    assert model.peft_config["default"].lora_dropout == 0.0
    dropouts = [m for m in model.modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0]
    assert dropouts == []
    ids = tokenizer("Who designed the Alpha Lighthouse on Corven Point?", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        model.eval()
        reference = torch.log_softmax(model(input_ids=ids).logits, -1)
        model.train()
        for _ in range(3):
            assert torch.equal(torch.log_softmax(model(input_ids=ids).logits, -1), reference)
    # the base model's dropout probabilities are zeroed too (functional attention dropout has no module)
    dropout_config = AutoConfig.from_pretrained(str(model_dir))
    dropout_config.attention_dropout = 0.3
    dropout_config.save_pretrained(str(tmp_path / "with-dropout"))
    from training.cispo_trainer import zero_dropout_config

    assert zero_dropout_config(AutoConfig.from_pretrained(str(tmp_path / "with-dropout"))).attention_dropout == 0.0


def test_a_cispo_adapter_with_dropout_is_refused():
    with pytest.raises(ValueError, match="lora_dropout=0.05: CISPO trains without dropout"):
        CispoConfig(lora_dropout=0.05)
    assert CispoConfig().lora_dropout == 0.0
