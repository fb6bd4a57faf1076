"""The per-customer training stages end to end on a tiny model: teacher rollouts through the
filter into the store, an SFT adapter with its manifest, CISPO from it, reruns that reuse the
paid work, and the adapter served back as a `transformers:` policy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.harness import Harness, HarnessConfig
from agent.policies import load_policy
from agent.policy_spec import PolicySpec
from core.layout import kept_trajectories_key
from core.storage import LocalArtifactStore
from core.training_settings import TrainingSettings
from tests.support.tiny_models import TinyBackend, tiny_model_dir
from tests.test_training_sft_teacher import TASKS
from training.per_customer import (
    checkpoint_policies,
    collect_sft_trajectories,
    load_kept_trajectories,
    read_manifest,
    teacher_policy,
    train_cispo_checkpoint,
    train_sft_checkpoint,
    train_tasks,
)


def _customer(training: dict | None = None, teacher=None):
    extra = {"training": training} if training is not None else {}
    return SimpleNamespace(name="acme", teacher=teacher, model_extra=extra)


def test_auto_teacher_is_the_customer_endpoint_when_configured_else_the_heuristic():
    settings = TrainingSettings().teacher
    teacher = teacher_policy(_customer(), settings)
    assert teacher.policy.name == "heuristic" and "offline" in teacher.description and not teacher.selects
    from core.config import TeacherEndpoint
    from llm.client import LLMClient

    endpoint = TeacherEndpoint(base_url="http://127.0.0.1:9/v1", model="teacher-1", timeout_s=5.0, concurrency=3)
    teacher = teacher_policy(_customer(teacher=endpoint), settings, served=PolicySpec.parse("heuristic+rerank"))
    assert "teacher-1" in teacher.policy.name and "127.0.0.1:9" in teacher.description and not teacher.selects
    client = teacher.policy.client()  # the endpoint's limits hold for the teacher as a policy too
    assert (client.timeout_s, client.max_retries, client.concurrency) == (5.0, endpoint.max_retries, 3)
    held = LLMClient(base_url=endpoint.base_url, model=endpoint.model, api_key_env=None)
    assert teacher_policy(_customer(teacher=endpoint), settings, llm=held).policy.client() is held  # the caller's client (a Dagster resource's): its counters see every call
    with pytest.raises(ValueError, match="no `teacher:` endpoint"):
        teacher_policy(_customer(), settings.model_copy(update={"policy": "teacher"}))


def test_the_offline_teacher_is_the_heuristic_with_selection_once_the_gate_served_it():
    settings = TrainingSettings().teacher
    won = teacher_policy(_customer(), settings, served=PolicySpec.parse("heuristic+rerank"))
    assert won.policy.name == "heuristic" and won.selects and "heuristic+rerank" in won.description
    for served in (None, "heuristic", "heuristic@4+rerank", "transformers:/models/acme/sft/abc+rerank", "transformers:/models/acme/sft/abc"):
        teacher = teacher_policy(_customer(), settings, served=PolicySpec.parse(served) if served else None)
        assert teacher.policy.name == "heuristic" and not teacher.selects, served  # a checkpoint never teaches its successor
    explicit = teacher_policy(_customer(), settings.model_copy(update={"policy": "heuristic+rerank"}), max_docs=5)
    assert explicit.selects and explicit.policy.max_docs == 5


def test_the_scripted_teacher_answers_within_the_profiles_answer_size():
    settings = TrainingSettings().teacher
    five = teacher_policy(_customer(), settings, max_docs=5).policy
    ten = teacher_policy(_customer(), settings).policy
    assert (five.max_docs, ten.max_docs) == (5, 10) and repr(five) != repr(ten)


def test_train_tasks_are_the_verified_train_split_or_a_clear_error():
    tasks = train_tasks(TASKS, None, max_tasks=2)
    assert [t.task_id for t in tasks] == [t.id for t in TASKS[:2]]
    held_out = [t.model_copy(update={"split": "test"}) for t in TASKS]
    with pytest.raises(ValueError, match="no verified train tasks"):
        train_tasks(held_out, None, None)


@pytest.fixture(scope="module")
def settings(tmp_path_factory) -> TrainingSettings:
    model = tiny_model_dir(tmp_path_factory)
    return TrainingSettings.model_validate({
        "base_model": str(model),
        "teacher": {"k_rollouts": 2, "workers": 2},
        "lora": {"rank": 4, "alpha": 8, "dropout": 0.0},
        "sft": {"max_steps": 2, "max_length": 4096, "batch_size": 1, "grad_accum": 1, "torch_threads": 1},
        "rl": {"steps": 2, "group_size": 2, "tasks_per_step": 1, "substeps": 1, "max_new_tokens": 8,
               "rollout_workers": 1, "checkpoint_every": 1, "harness": {"max_turns": 2}},
    })


@pytest.fixture(scope="module")
def trained(settings, tmp_path_factory):
    """SFT data, an SFT checkpoint and a CISPO checkpoint for `acme` in one store and home."""
    root = tmp_path_factory.mktemp("training")
    store, home = LocalArtifactStore(root / "artifacts"), root / "home"
    tasks = train_tasks(TASKS, None, None)
    data = collect_sft_trajectories("acme", store, TinyBackend(), tasks, load_policy("heuristic"), settings.teacher, root / "work")
    sft, curve = train_sft_checkpoint("acme", store, load_kept_trajectories(store, "acme"), settings, home)
    cispo, history = train_cispo_checkpoint("acme", store, TinyBackend(), tasks, settings, home)
    return SimpleNamespace(store=store, home=home, tasks=tasks, data=data, sft=sft, curve=curve, cispo=cispo, history=history)


def test_sft_trajectories_are_filtered_and_stored_with_a_dataset(trained):
    meta = trained.data.metadata
    assert meta["trajectories"] == 2 * len(TASKS) and meta["collected"] == 2 * len(TASKS)
    assert meta["filter"]["rollouts"] == 2 * len(TASKS) and sum(meta["filter"]["counts"].values()) == 2 * len(TASKS)
    assert [t.id for t in load_kept_trajectories(trained.store, "acme")] == [t.id for t in trained.data.kept]
    assert trained.store.exists("acme/training/sft_dataset/dataset_info.json")
    assert trained.data.histogram is not None and trained.data.histogram.stat().st_size > 0
    assert trained.store.exists(kept_trajectories_key("acme"))


def test_sft_checkpoint_writes_a_manifest_the_adapter_and_its_copy_in_the_store(trained, settings):
    manifest = read_manifest(trained.store, "acme", "sft")
    assert manifest is not None and manifest.adapter.path == trained.sft.adapter.path
    assert manifest.steps == 2 and manifest.adapter.base_model == settings.base_model and trained.curve
    assert "loss" in json.dumps(manifest.metrics)
    stored = set(trained.store.list(manifest.adapter.store_key))
    assert any(key.endswith("adapter_config.json") for key in stored) and any(key.endswith(".safetensors") for key in stored)


def test_cispo_starts_from_the_sft_adapter_and_records_its_lineage(trained):
    manifest = read_manifest(trained.store, "acme", "cispo")
    assert manifest is not None and manifest.steps == 2 and len(trained.history) == 2
    assert manifest.lineage["init_run_id"] == trained.sft.run_id
    assert "reward_mean" in manifest.metrics


def test_reruns_reuse_the_adapters_instead_of_training_again(trained, settings):
    again, curve = train_sft_checkpoint("acme", trained.store, load_kept_trajectories(trained.store, "acme"), settings, trained.home)
    assert again.reused and again.run_id == trained.sft.run_id and curve == []
    cispo, history = train_cispo_checkpoint("acme", trained.store, TinyBackend(), trained.tasks, settings, trained.home)
    assert cispo.reused and cispo.run_id == trained.cispo.run_id and history == []


def test_changed_settings_train_a_new_adapter(trained, settings, tmp_path):
    changed = settings.model_copy(update={"sft": settings.sft.model_copy(update={"max_steps": 1})})
    manifest, _ = train_sft_checkpoint("acme", trained.store, load_kept_trajectories(trained.store, "acme"), changed, tmp_path)
    assert not manifest.reused and manifest.run_id != trained.sft.run_id and manifest.steps == 1
    # restore the module's manifest for the other tests
    train_sft_checkpoint("acme", trained.store, load_kept_trajectories(trained.store, "acme"), settings, trained.home)


def test_a_worker_without_the_adapter_folder_pulls_it_from_the_store(trained):
    manifest = read_manifest(trained.store, "acme", "cispo")
    moved = manifest.adapter.path + ".moved"
    shutil.move(manifest.adapter.path, moved)
    try:
        specs = checkpoint_policies(trained.store, "acme")
        assert [spec.name for spec in specs] == [f"transformers:{trained.sft.adapter.path}", f"transformers:{manifest.adapter.path}"]
        assert json.loads((Path(manifest.adapter.path) / "adapter_config.json").read_text())["r"] == 4
    finally:
        shutil.rmtree(manifest.adapter.path, ignore_errors=True)
        shutil.move(moved, manifest.adapter.path)


def test_the_checkpoint_runs_as_a_policy_through_the_harness(trained):
    spec = checkpoint_policies(trained.store, "acme")[-1]
    policy = load_policy(spec, max_new_tokens=8)
    assert policy.adapter_path == trained.cispo.adapter.path
    config = HarnessConfig(token_budget=4096, response_reserve_tokens=256, search_budget_tokens=512, max_turns=2)
    with Harness(TinyBackend(), policy, config) as harness:
        trajectory = harness.run("Who designed the Alpha Lighthouse?")
    assert trajectory.error is None and trajectory.turns


def test_concurrent_first_loads_of_an_adapter_share_one_real_model(trained, settings):
    """A benchmark's first episodes load the checkpoint from several threads at once; transformers
    builds on the meta device under process-wide patches, so unserialized loads broke models."""
    from concurrent.futures import ThreadPoolExecutor

    from agent.policies.transformers_policy import clear_model_cache, load_model

    clear_model_cache()
    with ThreadPoolExecutor(4) as pool:
        loaded = list(pool.map(lambda _: load_model(settings.base_model, trained.sft.adapter.path), range(4)))
    assert all(item is loaded[0] for item in loaded)
    assert not any(p.is_meta for p in loaded[0].model.parameters())


def test_a_checkpoint_manifest_of_an_earlier_release_still_reads(tmp_path):
    # Manifests written before the adapter record kept `adapter_path`/`adapter_key`/`base_model` flat.
    store = LocalArtifactStore(tmp_path)
    store.write_text("acme/checkpoints/sft.json", json.dumps({
        "stage": "sft", "customer": "acme", "run_id": "r1", "adapter_path": "/m/acme/sft/r1", "adapter_key": "acme/checkpoints/sft/r1/",
        "base_model": "smollm2", "steps": 3, "metrics": {"loss": 1.0}, "lineage": {}, "reused": False,
        "created_at": "2026-11-01T00:00:00+00:00", "policy": "transformers:/m/acme/sft/r1"}))
    manifest = read_manifest(store, "acme", "sft")
    assert (manifest.adapter.path, manifest.adapter.store_key, manifest.adapter.base_model) == (
        "/m/acme/sft/r1", "acme/checkpoints/sft/r1/", "smollm2")
    assert manifest.policy == "transformers:/m/acme/sft/r1" and manifest.steps == 3
