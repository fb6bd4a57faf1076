"""The promotion gate on hand-made benchmark results, and the served state in a real local store."""

from __future__ import annotations

import json

import pytest

from core.layout import served_key
from core.serving_settings import PromotionSettings
from core.adapter_record import AdapterRecord
from core.storage import LocalArtifactStore
from serving.promotion import adapter_of, decide, record_for
from serving.served_state import NothingToRollBack, ServedRecord, load_served, load_state, promote, rollback, served_policy_spec

SFT = "transformers:/ckpt/sft"
CISPO = "transformers:/ckpt/cispo"


def m(answer_found: float, recall: float = 0.5, tokens: float = 1000.0, n: int = 50) -> dict:
    """A summary as `benchmark_report` writes it (plus the noise the gate must ignore)."""
    return {"answer_found": answer_found, "recall": recall, "precision": 0.2, "f1": 0.3, "mean_prompt_tokens": tokens,
            "n": n, "intervals": {"answer_found": [0.0, 1.0]}, "by_group": {}}


def results(test: dict, external: dict | None = None) -> dict:
    baselines = {"bm25": m(0.9, 0.9, 0.0), "hybrid": m(0.95, 0.95, 0.0)}  # better than every agent: never served
    out = {"test": {**baselines, **test}}
    if external is not None:
        out["multihop_sample"] = {**baselines, **external}
    return out


def served(policy: str, test_af: float, external_af: float | None = None) -> ServedRecord:
    metrics = {"test": {"answer_found": test_af}}
    if external_af is not None:
        metrics["multihop_sample"] = {"answer_found": external_af}
    folder = policy.partition(":")[2]
    return ServedRecord(customer="acme", policy=policy, adapter=AdapterRecord(path=folder) if folder else None, metrics=metrics)


@pytest.fixture
def store(tmp_path):
    return LocalArtifactStore(tmp_path / "artifacts")


# ---------------------------------------------------------------- decisions


def test_first_promotion_takes_the_best_eligible_candidate():
    decision = decide(results({"heuristic": m(0.40), SFT: m(0.55)}), served=None)
    assert decision.promoted and decision.status == "first_promotion"
    assert decision.candidate == SFT
    assert "nothing is served yet" in decision.reason
    assert decision.candidate_metrics["test"]["answer_found"] == 0.55
    assert "intervals" not in decision.candidate_metrics["test"]


def test_baselines_and_nx_variants_are_never_candidates():
    decision = decide(results({"heuristic": m(0.40), "heuristic@4": m(0.8)}), served=None)
    assert decision.candidate == "heuristic"
    assert set(decision.ineligible) == {"bm25", "hybrid", "heuristic@4"}
    assert "baseline" in decision.ineligible["bm25"]


def test_promotes_when_the_margin_is_met_and_nothing_regresses():
    report = results({"heuristic": m(0.40), SFT: m(0.50), CISPO: m(0.60)}, {"heuristic": m(0.30), SFT: m(0.35), CISPO: m(0.34)})
    decision = decide(report, served(SFT, 0.50, 0.35), PromotionSettings(margin=0.05, tolerance=0.02))
    assert decision.promoted and decision.status == "promoted"
    assert decision.candidate == CISPO and decision.served == SFT
    assert decision.test_gain == pytest.approx(0.10)
    assert decision.served_metrics_source == "report"
    assert {c.suite for c in decision.comparisons} == {"test", "multihop_sample"}
    assert decision.regressions == []


def test_rejects_when_the_margin_is_not_met():
    decision = decide(results({SFT: m(0.50), CISPO: m(0.505)}), served(SFT, 0.50), PromotionSettings(margin=0.01))
    assert not decision.promoted and decision.status == "margin_not_met"
    assert decision.candidate == CISPO
    assert "margin" in decision.reason and SFT in decision.reason


def test_a_gain_of_exactly_the_margin_promotes():
    decision = decide(results({SFT: m(0.70), CISPO: m(0.71)}), served(SFT, 0.70), PromotionSettings(margin=0.01))
    assert decision.promoted


def test_rejects_a_regression_on_an_external_suite_beyond_tolerance():
    report = results({SFT: m(0.50), CISPO: m(0.70)}, {SFT: m(0.40), CISPO: m(0.35)})
    decision = decide(report, served(SFT, 0.50, 0.40), PromotionSettings(margin=0.01, tolerance=0.02))
    assert not decision.promoted and decision.status == "regression"
    assert decision.regressions == ["multihop_sample/answer_found"]
    assert "multihop_sample" in decision.reason and "tolerance" in decision.reason


RL = "transformers:/ckpt/rl"


def test_a_regressing_top_candidate_is_passed_over_for_the_next_that_passes():
    # The learning benchmark's case: CISPO tops the synthetic test split and loses the real questions,
    # a sibling SFT continuation gains on both; the served searcher must not be stuck behind the first.
    report = results({SFT: m(0.50), CISPO: m(0.70), RL: m(0.60)}, {SFT: m(0.40), CISPO: m(0.30), RL: m(0.45)})
    decision = decide(report, served(SFT, 0.50, 0.40), PromotionSettings(margin=0.01, tolerance=0.02))
    assert decision.promoted and decision.status == "promoted"
    assert decision.candidate == RL and decision.test_gain == pytest.approx(0.10)
    assert decision.candidate_metrics["multihop_sample"]["answer_found"] == 0.45
    assert [(p.name, p.regressions) for p in decision.passed_over] == [(CISPO, ["multihop_sample/answer_found"])]
    assert decision.passed_over[0].test_gain == pytest.approx(0.20)
    assert f"passed over, ranked higher but regressing: {CISPO}" in decision.reason


def test_when_every_candidate_regresses_the_best_one_is_reported_and_the_others_listed():
    report = results({SFT: m(0.50), CISPO: m(0.70), RL: m(0.60)}, {SFT: m(0.40), CISPO: m(0.30), RL: m(0.35)})
    decision = decide(report, served(SFT, 0.50, 0.40), PromotionSettings(margin=0.01, tolerance=0.02))
    assert not decision.promoted and decision.status == "regression"
    assert decision.candidate == CISPO and decision.regressions == ["multihop_sample/answer_found"]
    assert [p.name for p in decision.passed_over] == [RL]
    assert f"also regressing: {RL}" in decision.reason


def test_no_candidate_below_the_margin_is_considered_after_a_regression():
    report = results({SFT: m(0.50), CISPO: m(0.70), RL: m(0.505)}, {SFT: m(0.40), CISPO: m(0.30), RL: m(0.45)})
    decision = decide(report, served(SFT, 0.50, 0.40), PromotionSettings(margin=0.01, tolerance=0.02))
    assert not decision.promoted and decision.status == "regression"
    assert decision.candidate == CISPO and decision.passed_over == []


def test_a_drop_within_tolerance_is_not_a_regression():
    report = results({SFT: m(0.50), CISPO: m(0.70)}, {SFT: m(0.40), CISPO: m(0.39)})
    decision = decide(report, served(SFT, 0.50, 0.40), PromotionSettings(tolerance=0.02))
    assert decision.promoted and decision.regressions == []


def test_ties_break_by_recall_then_fewer_prompt_tokens():
    by_recall = decide(results({SFT: m(0.6, recall=0.7), CISPO: m(0.6, recall=0.8)}), served=None)
    assert by_recall.candidate == CISPO
    by_tokens = decide(results({SFT: m(0.6, 0.8, tokens=900), CISPO: m(0.6, 0.8, tokens=1200)}), served=None)
    assert by_tokens.candidate == SFT
    assert [c.name for c in by_tokens.ranking] == [SFT, CISPO]


def test_the_served_candidate_is_already_served():
    decision = decide(results({SFT: m(0.6), "heuristic": m(0.4)}), served(SFT, 0.6))
    assert not decision.promoted and decision.status == "already_served"
    assert "already served" in decision.reason


def test_an_exact_tie_with_the_served_one_keeps_it():
    decision = decide(results({SFT: m(0.6), CISPO: m(0.6)}), served(CISPO, 0.6))
    assert decision.status == "already_served" and decision.candidate == CISPO


def test_served_numbers_fall_back_to_its_record_when_not_benchmarked_again():
    decision = decide(results({CISPO: m(0.70)}, {CISPO: m(0.30)}), served(SFT, 0.60, external_af=0.40))
    assert decision.served_metrics_source == "record"
    assert decision.served_metrics["multihop_sample"]["answer_found"] == 0.40
    assert decision.status == "regression"  # 0.30 against the recorded 0.40


def test_results_without_a_test_suite_are_an_error():
    with pytest.raises(ValueError, match="'test' suite"):
        decide({"multihop_sample": {SFT: m(0.5)}}, served=None)


def test_no_eligible_candidate_is_a_decision_not_an_error():
    decision = decide({"test": {"bm25": m(0.9)}}, served=None)
    assert not decision.promoted and decision.status == "no_candidate"


def test_settings_reject_unknown_fields():
    with pytest.raises(ValueError):
        PromotionSettings(margins=0.1)


# ---------------------------------------------------------------- records


def test_adapter_of_reads_the_base_from_the_adapter_sidecar(tmp_path):
    adapter = tmp_path / "sft"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/models/x"}))
    (adapter / "searchsmith_adapter.json").write_text(json.dumps({"base_model": "smollm2"}))
    assert adapter_of(f"transformers:{adapter}") == (str(adapter), "smollm2")
    assert adapter_of("transformers:smollm2+/a/b") == ("/a/b", "smollm2")
    assert adapter_of("transformers:/elsewhere/cispo") == ("/elsewhere/cispo", None)
    assert adapter_of("transformers:smollm2") == (None, "smollm2")
    assert adapter_of("heuristic") == (None, None)


def test_record_for_a_rejection_is_an_error():
    decision = decide(results({SFT: m(0.6)}), served(SFT, 0.6))
    with pytest.raises(ValueError, match="already_served"):
        record_for("acme", decision)


# ---------------------------------------------------------------- served state


def test_nothing_served_means_the_heuristic_policy(store):
    assert load_served(store, "acme") is None
    assert served_policy_spec(store, "acme") == "heuristic"


def test_promote_then_rollback_restores_the_previous_record(store):
    first = record_for("acme", decide(results({SFT: m(0.5)}), served=None), base_model="smollm2")
    promote(store, "acme", first)
    second_decision = decide(results({SFT: m(0.5), CISPO: m(0.6)}), load_served(store, "acme"))
    promote(store, "acme", record_for("acme", second_decision, base_model="smollm2"))
    assert served_policy_spec(store, "acme") == CISPO

    restored = rollback(store, "acme")
    assert restored == first
    assert load_served(store, "acme") == first
    state = load_state(store, "acme")
    assert [e.action for e in state.log] == ["promote", "promote", "rollback"]
    assert state.history == []


def test_rolling_back_the_first_promotion_returns_to_nothing_served(store):
    promote(store, "acme", served("heuristic", 0.4))
    assert rollback(store, "acme") is None
    assert served_policy_spec(store, "acme") == "heuristic"


def test_rollback_with_nothing_served_is_a_clear_error(store):
    with pytest.raises(NothingToRollBack, match="nothing to roll back for customer 'acme'"):
        rollback(store, "acme")


def test_a_rejected_candidate_leaves_the_state_untouched(store):
    promote(store, "acme", served(SFT, 0.50))
    before = store.read_bytes(served_key("acme"))
    decision = decide(results({SFT: m(0.50), CISPO: m(0.505)}), load_served(store, "acme"))
    assert not decision.promoted
    with pytest.raises(ValueError):
        record_for("acme", decision)
    assert store.read_bytes(served_key("acme")) == before


def test_customers_are_isolated(store):
    promote(store, "acme", served(SFT, 0.5))
    assert served_policy_spec(store, "globex") == "heuristic"
    with pytest.raises(ValueError, match="customer"):
        promote(store, "globex", served(SFT, 0.5))


def test_the_gate_table_labels_a_smoke_sized_checkpoint(tmp_path):
    """A few steps of CPU training must not read as a result next to the baselines."""
    import json

    from serving.promotion import PromotionDecision, RankedCandidate, decision_table

    def adapter(name: str, sidecar: dict) -> str:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "smollm2"}))
        (folder / "searchsmith_adapter.json").write_text(json.dumps({"base_model": "smollm2", "harness_profile": {"view": "compact"}, **sidecar}))
        return f"transformers:{folder}"

    small = adapter("small", {"kind": "sft", "metrics": {"steps": 6, "tokens": 15_000}})
    large = adapter("large", {"kind": "sft", "metrics": {"steps": 900, "tokens": 2_000_000}})
    decision = PromotionDecision(promoted=False, status="margin_not_met", reason="r", ranking=[
        RankedCandidate(name="heuristic", answer_found=0.75, final_answers=1.0), RankedCandidate(name=small, answer_found=0.1),
        RankedCandidate(name=large, answer_found=0.5)])
    rows = {line.split(" | ")[0].strip("| "): line for line in decision_table(decision).splitlines()[2:]}
    assert "smoke-sized run: SFT, 6 steps, 15,000 tokens" in rows[small]
    assert "smoke-sized" not in rows[large] and "SFT, 900 steps" in rows[large]
    assert rows["heuristic"].endswith("| - |") and "| 1.00 |" in rows["heuristic"]
