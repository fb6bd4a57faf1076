"""From benchmark results to the served policy: promotion persists and deploys, a rejection
changes nothing, a rollback redeploys the previous record, and the search service's policy
follows the serving manifest."""

from __future__ import annotations

import json

import pytest

from core.layout import benchmark_summary_key
from core.serving_settings import ServingSettings
from core.storage import LocalArtifactStore
from serving.per_customer import current_serving, promote_best, rollback_served, served_policy
from serving.served_state import NothingToRollBack, load_served
from serving.serving_manifest import load_manifest
from tests.test_serving_promotion import m

SETTINGS = ServingSettings()


@pytest.fixture
def store(tmp_path):
    return LocalArtifactStore(tmp_path / "artifacts")


def _adapter(tmp_path, name: str) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/models/base", "r": 8}))
    (folder / "searchsmith_adapter.json").write_text(json.dumps({"base_model": "smollm2"}))
    return str(folder)


def _report(store, test: dict) -> None:
    store.write_text(benchmark_summary_key("acme"), json.dumps({"test": {"hybrid": m(0.9), **test}}))


def test_nothing_served_means_the_heuristic(store):
    assert served_policy(store, "acme").name == "heuristic"
    assert current_serving(store, "acme").to_dict()["served"]["policy"] == "heuristic"


def test_a_promotion_is_persisted_deployed_and_served_in_process_without_a_vllm_server(store, tmp_path):
    adapter = _adapter(tmp_path, "sft")
    _report(store, {"heuristic": m(0.5), f"transformers:{adapter}": m(0.6)})
    outcome = promote_best(store, "acme", SETTINGS)
    assert outcome.promoted and outcome.decision.status == "first_promotion"
    record = load_served(store, "acme")
    assert record.adapter.path == adapter and record.adapter.base_model == "smollm2"
    manifest = load_manifest(store, "acme")
    assert manifest.server_url is None and manifest.adapter_name.startswith("acme-") and manifest.tool_call_parser == "hermes"
    assert served_policy(store, "acme").name == f"transformers:{adapter}"
    payload = outcome.to_dict()
    assert payload["promoted"] and payload["served"]["adapter_path"] == adapter and payload["served"]["metrics"]["test"]["answer_found"] == 0.6


def test_a_rejected_candidate_leaves_the_served_model_and_manifest_untouched(store, tmp_path):
    first, second = _adapter(tmp_path, "a"), _adapter(tmp_path, "b")
    _report(store, {"heuristic": m(0.5), f"transformers:{first}": m(0.6)})
    promote_best(store, "acme", SETTINGS)
    before = (store.read_text("acme/serving/served.json"), store.read_text("acme/serving/manifest.json"))
    _report(store, {"heuristic": m(0.5), f"transformers:{first}": m(0.6), f"transformers:{second}": m(0.605)})
    outcome = promote_best(store, "acme", SETTINGS)
    assert not outcome.promoted and outcome.decision.status == "margin_not_met"
    assert (store.read_text("acme/serving/served.json"), store.read_text("acme/serving/manifest.json")) == before


def test_rollback_redeploys_the_previous_record_then_the_heuristic_then_refuses(store, tmp_path):
    first, second = _adapter(tmp_path, "a"), _adapter(tmp_path, "b")
    _report(store, {"heuristic": m(0.5), f"transformers:{first}": m(0.6)})
    promote_best(store, "acme", SETTINGS)
    _report(store, {"heuristic": m(0.5), f"transformers:{first}": m(0.6), f"transformers:{second}": m(0.7)})
    assert promote_best(store, "acme", SETTINGS).promoted
    assert served_policy(store, "acme").name == f"transformers:{second}"
    back = rollback_served(store, "acme", SETTINGS)
    assert back.served.policy == f"transformers:{first}" and "rolled back" in back.reason
    assert load_manifest(store, "acme").adapter.path == first and served_policy(store, "acme").name == f"transformers:{first}"
    rollback_served(store, "acme", SETTINGS)
    assert served_policy(store, "acme").name == "heuristic" and load_manifest(store, "acme") is None
    with pytest.raises(NothingToRollBack):
        rollback_served(store, "acme", SETTINGS)


def test_missing_benchmark_results_are_a_clear_error(store):
    with pytest.raises(FileNotFoundError, match="benchmark_report"):
        promote_best(store, "acme", SETTINGS)




def test_a_machine_that_did_not_train_the_promoted_checkpoint_pulls_it_from_the_store(store, tmp_path):
    # Training published the adapter under a store key (its checkpoint manifest's record); the gate
    # promotes it, and a search-service host without the trainer's disk brings it down on first use.
    from core.adapter_record import AdapterRecord
    from core.layout import adapter_prefix
    from core.storage import push_folder
    from serving.per_customer import served_checkpoint
    from training.per_customer import CheckpointManifest, write_manifest

    folder = tmp_path / "models" / "acme" / "sft" / "run1"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/models/base", "r": 8}))
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    (folder / "searchsmith_adapter.json").write_text(json.dumps({"base_model": "smollm2", "harness_profile": {"view": "compact"}}))
    published = AdapterRecord(path=str(folder), store_key=adapter_prefix("acme", "sft", "run1"), base_model="smollm2")
    push_folder(store, folder, published.store_key)
    write_manifest(store, CheckpointManifest("sft", "acme", "run1", published, steps=2, metrics={}))
    _report(store, {"heuristic": m(0.5), f"transformers:{folder}": m(0.6)})
    assert promote_best(store, "acme", SETTINGS).promoted
    served = load_served(store, "acme")
    assert served.adapter == published and load_manifest(store, "acme").adapter == published

    for name in ("adapter_config.json", "adapter_model.safetensors", "searchsmith_adapter.json"):
        (folder / name).unlink()
    folder.rmdir()
    assert served_checkpoint(store, "acme").name == f"transformers:{folder}"
    assert (folder / "adapter_model.safetensors").read_bytes() == b"weights"
    assert json.loads((folder / "searchsmith_adapter.json").read_text())["harness_profile"] == {"view": "compact"}


def test_records_written_before_the_adapter_record_still_load(store):
    # served.json and the serving manifest of earlier releases kept flat adapter fields.
    store.write_text("acme/serving/served.json", json.dumps({"customer": "acme", "current": {
        "customer": "acme", "policy": "transformers:/m/acme/sft/1", "adapter_path": "/m/acme/sft/1", "base_model": "smollm2",
        "metrics": {}, "promoted_at": "2026-11-01T00:00:00+00:00", "reason": "first"}, "history": [{
        "customer": "acme", "policy": "heuristic", "adapter_path": None, "base_model": None, "metrics": {}}], "log": []}))
    store.write_text("acme/serving/manifest.json", json.dumps({
        "customer": "acme", "policy": "transformers:/m/acme/sft/1", "base_model": "smollm2", "adapter_name": "acme-1",
        "adapter_path": "/m/acme/sft/1", "server_url": None, "tool_call_parser": "hermes", "metrics": {}}))
    served = load_served(store, "acme")
    assert served.adapter.path == "/m/acme/sft/1" and served.adapter.base_model == "smollm2" and served.adapter.store_key is None
    assert load_manifest(store, "acme").adapter == served.adapter
    assert current_serving(store, "acme").to_dict()["served"]["adapter_path"] == "/m/acme/sft/1"


@pytest.mark.parametrize("text", ["{\"customer\": \"acme\", \"current\": {\"custo", "{\"customer\": \"acme\", \"curent\": null}"])
def test_a_torn_or_misspelled_served_record_is_an_error_naming_it(store, text):
    # A crash mid-write on a store without atomic renames, or a hand edit: the message names the
    # record's URI; the record is left as it was for the operator to mend.
    store.write_text("acme/serving/served.json", text)
    with pytest.raises(ValueError, match=r"acme/serving/served\.json is not a valid record"):
        served_policy(store, "acme")
    assert store.read_text("acme/serving/served.json") == text
