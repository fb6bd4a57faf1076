"""Benchmark and training numbers as numeric Dagster metadata under stable keys (issue 17), so the
UI plots them across materializations: pure key rules first, then benchmark_report materialized
twice for a small customer and read back through Dagster's GraphQL API, as the UI reads it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from assets.metadata import benchmark_numbers, candidate_label, suite_numbers, training_numbers

ROOT = Path(__file__).resolve().parents[1]
WIKI = ROOT / "customers" / "demo" / "wiki"
CLI = [sys.executable, "-m", "orchestration.cli"]


def _summary(answer_found: float, **extra) -> dict:
    return {"answer_found": answer_found, "recall": 0.5, "precision": 0.25, "f1": 0.3, "trajectory_recall": 0.75,
            "prune_accuracy": None, "mean_prompt_tokens": 1200.0, "n": 6, "intervals": {"recall": [0.1, 0.9]}, **extra}


def test_checkpoints_are_named_by_stage_so_a_retrain_keeps_its_keys():
    first = {"transformers:/home/a/adapters/sft-1111": "sft"}
    second = {"transformers:/home/a/adapters/sft-2222": "sft"}
    assert candidate_label("transformers:/home/a/adapters/sft-1111", first) == candidate_label("transformers:/home/a/adapters/sft-2222", second) == "sft"
    assert candidate_label("hybrid", first) == "hybrid" and candidate_label("heuristic@4", {}) == "heuristic@4"
    assert candidate_label("openai:http://127.0.0.1:8000/v1#m", {}) == "openai_http_127.0.0.1_8000_v1_m"


def test_benchmark_numbers_are_suite_candidate_metric_floats():
    reports = {"test": {"policies": {"hybrid": _summary(0.5), "transformers:/x/cispo-9": _summary(0.75)}},
               "multihop_sample": {"policies": {"hybrid": _summary(float("nan"))}}}
    numbers = benchmark_numbers(reports, {"transformers:/x/cispo-9": "cispo"})
    assert numbers["test/cispo/answer_found"] == 0.75 and numbers["test/hybrid/mean_prompt_tokens"] == 1200.0
    assert {key.split("/")[2] for key in numbers} == {"answer_found", "recall", "precision", "f1", "trajectory_recall", "mean_prompt_tokens"}
    assert "multihop_sample/hybrid/answer_found" not in numbers and "multihop_sample/hybrid/recall" in numbers  # NaN is no number
    assert all(type(value) is float for value in numbers.values())
    assert not any("prune_accuracy" in key or key.endswith("/n") for key in numbers)


def test_served_numbers_and_training_numbers_use_fixed_keys():
    assert suite_numbers("served", {"test": {"answer_found": 0.5, "recall": 1, "n": 4}}) == {"served/test/answer_found": 0.5, "served/test/recall": 1.0}
    assert suite_numbers("served", {}) == {}
    sft = training_numbers("sft", {"train_loss": 2.0, "first_loss": 3.0, "final_loss": 1.5, "steps": 5})
    assert sft == {"loss": 1.5, "first_loss": 3.0}
    assert training_numbers("sft", {"train_loss": 2.0, "first_loss": None, "final_loss": None}) == {"loss": 2.0}
    cispo = training_numbers("cispo", {"loss": -0.02, "reward_mean": 0.4, "first_reward_mean": 0.3, "answer_found": 0.5,
                                       "reward_components": {"f_beta": 0.6, "p_turn": 0.0}, "tokens": {"forward_tokens": 10}})
    assert cispo["loss"] == -0.02 and cispo["reward"] == 0.4 and cispo["first_reward"] == 0.3
    assert cispo["reward/f_beta"] == 0.6 and cispo["answer_found"] == 0.5 and "tokens" not in cispo


# -- benchmark_report twice, read through GraphQL --------------------------------------------------

MATERIALIZE_TWICE_AND_QUERY = """
import json, sys
import dagster as dg
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster_graphql.test.utils import execute_dagster_graphql
from orchestration.definitions import defs

instance = dg.DagsterInstance.get()
job = defs.resolve_implicit_global_asset_job_def()
for _ in range(2):
    assert job.execute_in_process(asset_selection=[dg.AssetKey("benchmark_report")], partition_key="small", instance=instance).success
origin = InProcessCodeLocationOrigin(LoadableTargetOrigin(executable_path=sys.executable, module_name="orchestration.definitions",
                                                          working_directory=".", attribute="defs"), location_name="searchsmith")
QUERY = '''query($key: AssetKeyInput!, $partition: String!) { assetOrError(assetKey: $key) { __typename
  ... on Asset { assetMaterializations(partitions: [$partition]) { runId partition
    metadataEntries { __typename label ... on FloatMetadataEntry { floatValue } } } } } }'''
with WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget(origin)) as workspace:
    result = execute_dagster_graphql(workspace.create_request_context(), QUERY, {"key": {"path": ["benchmark_report"]}, "partition": "small"})
assert not result.errors, result.errors
print("GRAPHQL " + json.dumps(result.data))
"""


@pytest.mark.slow
def test_benchmark_numbers_reach_the_ui_across_two_materializations(tmp_path):
    folder = tmp_path / "customers"
    (folder / "wiki").mkdir(parents=True)
    for path in sorted(WIKI.glob("*.md"))[:40]:
        shutil.copy(path, folder / "wiki" / path.name)
    (folder / "small.yaml").write_text(
        "name: small\nsources:\n  - {type: local, path: ./wiki}\n"
        "tasks: {generator: extractive, max_seeds: 30, distractors_per_task: 2}\n"
        "benchmark: {k: 5, policies: [bm25, hybrid], test_limit: 4}\n"
    )
    env = {**os.environ, "SEARCHSMITH_HOME": str(tmp_path / "home"), "DAGSTER_HOME": str(tmp_path / "home" / "dagster"),
           "SEARCHSMITH_CUSTOMERS_DIR": str(folder)}
    env.pop("SEARCHSMITH_ARTIFACTS", None)
    for command in (["sync", "small"], ["tasks", "small"]):
        done = subprocess.run([*CLI, *command, "--json"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-4000:]
    done = subprocess.run([sys.executable, "-c", MATERIALIZE_TWICE_AND_QUERY], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    data = json.loads(done.stdout.split("GRAPHQL ", 1)[1])
    materializations = data["assetOrError"]["assetMaterializations"]
    assert len(materializations) == 2 and len({m["runId"] for m in materializations}) == 2
    series: dict[str, list[float]] = {}
    for materialization in materializations:
        for entry in materialization["metadataEntries"]:
            if entry["__typename"] == "FloatMetadataEntry":
                series.setdefault(entry["label"], []).append(entry["floatValue"])
    for candidate in ("bm25", "hybrid"):
        for metric in ("answer_found", "recall", "precision", "trajectory_recall", "mean_prompt_tokens"):
            values = series[f"test/{candidate}/{metric}"]  # a point per materialization: what the UI plots
            assert len(values) == 2 and all(0.0 <= v for v in values)
    assert 0.0 <= series["test/hybrid/answer_found"][0] <= 1.0
    labels = {entry["label"] for entry in materializations[0]["metadataEntries"]}
    assert "test_report" in labels  # the Markdown report with its plots stays
