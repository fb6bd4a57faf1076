"""The RL reward is scored at the benchmark's k, not at the harness's `max_output_docs` (issue 12,
item 6): a rollout is rewarded for what the benchmark and the promotion gate will report."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.harness import HarnessConfig
from core.benchmark_settings import BenchmarkSettings
from core.training_settings import DEFAULT_REWARD_K, CispoConfig, TrainingSettings
from tests.test_training_cispo_support import MemoryBackend, ScriptedPolicy, answer_model_dir, lighthouse_tasks, model_dir  # noqa: F401 (fixtures)
from training.per_customer import rl_config
from training.rl_rollouts import collect_rollouts, rollout_metrics

ROOT = Path(__file__).resolve().parents[1]
# Seven documents; the gold one (d1) is ranked sixth: inside the harness's 10, outside top-5.
DOCS = {f"d{i}": (f"Document {i}", [f"Text of document {i} about the Alpha Lighthouse."]) for i in range(1, 8)}
SIXTH = "".join(f"<Document id={d}><Justification>j</Justification></Document>" for d in ("d2", "d3", "d4", "d5", "d6", "d1"))
SECOND = "".join(f"<Document id={d}><Justification>j</Justification></Document>" for d in ("d2", "d1"))


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def test_cispo_scores_the_reward_at_the_benchmarks_default_k():
    assert DEFAULT_REWARD_K == BenchmarkSettings().k == 5
    assert CispoConfig().reward_k == 5 and HarnessConfig.for_training().max_output_docs == 10
    with pytest.raises(ValueError):
        CispoConfig(reward_k=0)


def test_a_gold_document_ranked_past_k_earns_no_answer_bonus(tokenizer):
    """Half the rollouts rank the gold document 2nd, half 6th: at k=5 only the 2nd counts, so the
    group has a signal; at the harness's 10 both would score the same and the group be dropped."""
    policy = ScriptedPolicy(tokenizer, lambda seed: [("answer", SECOND if seed % 2 else SIXTH)])
    task = lighthouse_tasks()[:1]
    harness = HarnessConfig.for_training(max_turns=2, token_budget=16384)
    at_5 = collect_rollouts(policy, MemoryBackend(DOCS), task, group_size=8, harness_config=harness, workers=1)
    assert all(len(r.trajectory.output_doc_ids()) in (2, 6) for r in at_5.rollouts)
    for rollout in at_5.rollouts:
        sixth = rollout.trajectory.output_doc_ids()[-1] == "d1" and len(rollout.trajectory.output_doc_ids()) == 6
        assert rollout.score.answer_found == (0.0 if sixth else 1.0)
    assert {r.score.answer_found for r in at_5.rollouts} == {0.0, 1.0}  # both orders were sampled
    assert not at_5.groups[0].dropped and rollout_metrics(at_5)["reward_k"] == 5
    at_10 = collect_rollouts(policy, MemoryBackend(DOCS), task, group_size=8, harness_config=harness, workers=1, k=10)
    assert all(r.score.answer_found == 1.0 for r in at_10.rollouts) and rollout_metrics(at_10)["reward_k"] == 10


def test_rl_config_takes_the_reward_k_from_the_customer_files_benchmark_k():
    settings = TrainingSettings()
    assert rl_config(settings, True).reward_k == 5
    assert rl_config(settings, True, benchmark_k=3).reward_k == 3
    explicit = TrainingSettings.model_validate({"rl": {"reward_k": 7}})
    assert rl_config(explicit, True, benchmark_k=3).reward_k == 7  # an explicit training.rl.reward_k wins

    from core.config import load_customer

    demo = load_customer(ROOT / "customers" / "demo.yaml")
    config = rl_config(demo.training, True, benchmark_k=demo.benchmark.k)
    assert demo.benchmark.k == 5 and config.reward_k == 5


def test_cispo_memory_plan_fills_unset_fields_per_device():
    """CPU: 4K-token forwards with recomputed activations (a 16K forward was killed at 22.7 GB on a
    24 GB machine); an accelerator: 16K tokens, recomputed; anything the customer sets is kept."""
    assert CispoConfig().memory_plan() == (4096, True)
    assert CispoConfig(device="cuda").memory_plan() == (16_384, True)
    assert CispoConfig(micro_batch_tokens=2048, gradient_checkpointing=False).memory_plan() == (2048, False)
