"""The shipped searcher adapters and the checks on continuing one (`training.searchers`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.adapter_sidecar import read_sidecar
from core.config import CustomerConfigError, load_customer, parse_customer
from core.training_settings import TrainingSettings
from training.per_customer import starting_adapter, student_harness
from training.searchers import PACKAGED_DIR, adapter_digest, check_continuable, packaged_searchers, searcher_dir


def test_the_packaged_searcher_is_found_by_name_and_records_how_it_was_made():
    assert "smollm2-searcher" in packaged_searchers()
    folder = searcher_dir("smollm2-searcher")
    assert folder == PACKAGED_DIR / "smollm2-searcher"
    sidecar = read_sidecar(folder)
    assert sidecar["base_model"] == "smollm2" and sidecar["kind"] == "sft"
    assert sidecar["harness_profile"]["view"] == "compact"
    assert sidecar["data"]["trajectories"] > 0 and sidecar["metrics"]["steps"] > 0
    assert "base_model_path" not in sidecar
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "smollm2" and config["r"] == sidecar["config"]["lora"]["rank"]
    assert len(adapter_digest(folder)) == 16


def test_the_demo_continues_the_packaged_searcher_under_its_own_profile():
    demo = load_customer(Path(__file__).resolve().parents[1] / "customers" / "demo.yaml")
    folder = starting_adapter(demo)
    assert folder == searcher_dir("smollm2-searcher")
    check_continuable(folder, demo.training.base_model, student_harness(demo.training).profile())


def test_an_adapter_path_resolves_against_the_customer_file_and_a_missing_one_names_what_is_absent(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "adapter_config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"'mine'.*missing adapter_model.safetensors.*smollm2-searcher"):
        searcher_dir("mine", lambda name: tmp_path / name)
    (tmp_path / "mine" / "adapter_model.safetensors").write_bytes(b"x")
    config = parse_customer({"name": "acme", "sources": [{"type": "local", "path": "."}],
                             "training": {"init_adapter": "mine"}}, tmp_path / "acme.yaml")
    assert starting_adapter(config) == tmp_path / "mine"


def test_continuing_under_another_profile_or_base_model_is_refused():
    folder = searcher_dir("smollm2-searcher")
    profile = dict(read_sidecar(folder)["harness_profile"])
    with pytest.raises(ValueError, match=r"token_budget 8192 \(the adapter's 4096\)"):
        check_continuable(folder, "smollm2", {**profile, "token_budget": 8192})
    with pytest.raises(ValueError, match=r"trained on base model 'smollm2'.*'gpt-oss-20b'"):
        check_continuable(folder, "gpt-oss-20b", profile)


def test_a_lora_shape_beside_a_starting_adapter_is_an_error():
    with pytest.raises(ValueError, match="training.lora and training.init_adapter"):
        TrainingSettings(init_adapter="smollm2-searcher", lora={"rank": 8})
    with pytest.raises(CustomerConfigError, match="init_adaptr"):
        parse_customer({"name": "acme", "sources": [{"type": "local", "path": "."}], "training": {"init_adaptr": "x"}},
                       Path("acme.yaml"))


def test_a_learning_run_that_continues_a_searcher_draws_the_next_data_order(tmp_path):
    """`bench/learning.py --init-adapter` continues a searcher on the tasks it was trained on; a run
    sees about a quarter of the samples, so it must not replay the order that made the searcher."""
    from bench.learning import continuation_seed

    shipped = read_sidecar(searcher_dir("smollm2-searcher"))["config"]["sft"]["seed"]
    assert continuation_seed("smollm2-searcher") == shipped + 1
    folder = tmp_path / "unrecorded"
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    (folder / "adapter_model.safetensors").write_bytes(b"")
    assert continuation_seed(str(folder)) == 1
    (folder / "searchsmith_adapter.json").write_text(json.dumps({"config": {"sft": {"seed": 4}}}))
    assert continuation_seed(str(folder)) == 5


def test_a_student_is_measured_on_the_synthetic_split_of_the_run_it_names(tmp_path):
    """`bench/learning.py --student A --synth-of RUN` reads RUN's customer: a folder that is not a
    training run's is refused by name rather than measured against nothing."""
    from bench.learning import SIZES, customer_file, run_customer

    with pytest.raises(ValueError, match=str(tmp_path)):
        run_customer(tmp_path)
    (tmp_path / "customers").mkdir()
    (tmp_path / "home").mkdir()
    customer_file(tmp_path / "customers", SIZES["smoke"], "learning-smoke-natural", "natural")
    assert run_customer(tmp_path) == "learning-smoke-natural"
    customer_file(tmp_path / "customers", SIZES["smoke"], "learning-smoke", "cloze")
    with pytest.raises(ValueError, match="found 2 customer files"):
        run_customer(tmp_path)


def test_the_reranker_benchmark_builds_the_learning_customer_at_the_products_chain_depth(tmp_path, monkeypatch):
    """`bench/reranker_dev.py` trains the reranker on the learning customer's corpus and natural
    questions, but with tasks chained to the product's default depth (the student's customer stops
    at 2) and, when asked, a cap on its train tasks: a file the product itself accepts."""
    import bench.learning as learning
    from bench.reranker_dev import build_customer
    from core.config import load_customer
    from core.task_settings import DEFAULT_MAX_HOPS

    records = tmp_path / "dev.jsonl"
    records.write_text(json.dumps({"id": "q1", "question": "Who?", "answer": "A", "dataset": "hotpotqa",
                                   "paragraphs": [{"title": "Alpha", "text": "Alpha is a town.", "is_supporting": True}]}) + "\n")
    monkeypatch.setattr(learning, "dev_file", lambda: records)
    path, env = build_customer(tmp_path / "work", 50, DEFAULT_MAX_HOPS, 300)
    customer = load_customer(path)
    assert customer.tasks.max_hops == DEFAULT_MAX_HOPS > 2
    assert customer.tasks.question_style == "natural"
    assert customer.training.reranker.max_tasks == 300 and customer.training.reranker.chain_pairs
    assert env["SEARCHSMITH_HOME"] == str(tmp_path / "work" / "home")
    assert [p.read_text() for p in (path.parent / "corpus").glob("*.md")] and "Who?" not in "".join(
        p.read_text() for p in (path.parent / "corpus").glob("*.md"))
    assert load_customer(learning.customer_file(tmp_path, learning.SIZES["smoke"], "student", "natural")).tasks.max_hops == 2


def test_a_learning_run_names_a_dev_row_it_does_not_know():
    """`bench/learning.py --dev-rows` picks rows by name (one adapter's row without the base
    model's half hour); a misspelt row is refused with the rows there are, before any work."""
    import subprocess
    import sys

    bench = Path(__file__).resolve().parents[1] / "bench" / "learning.py"
    result = subprocess.run([sys.executable, str(bench), "--dev-rows", "hybrid,bse"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "unknown row(s) bse" in result.stderr and "hybrid, heuristic, base, sft, sft+cispo" in result.stderr
    result = subprocess.run([sys.executable, str(bench), "--dev-rows", "sft", "--skip-dev"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--skip-dev runs none" in result.stderr
    result = subprocess.run([sys.executable, str(bench), "--answer-target", "teacher"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "they need --answer-steps" in result.stderr
    result = subprocess.run([sys.executable, str(bench), "--answer-order", "reading"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "they need --answer-steps" in result.stderr
    result = subprocess.run([sys.executable, str(bench), "--reranker", "/no/such/reranker"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--reranker reranker folder not found or not a model: /no/such/reranker" in result.stderr


def test_a_learning_table_reads_each_row_against_hybrid_on_the_same_questions(tmp_path):
    """Each row's answer found minus hybrid's, paired by question, from the scores files the
    rows' reports wrote; a row scored on other questions is an error, not a silent mismatch."""
    import json

    import pytest

    from bench.learning import add_paired_differences, table

    def write(row: str, found: list[float]) -> dict:
        (tmp_path / row / "scores").mkdir(parents=True)
        lines = [json.dumps({"task_id": f"q{i}", "answer_found": value}) for i, value in enumerate(found)]
        (tmp_path / row / "scores" / f"{row}.jsonl").write_text("\n".join(lines) + "\n")
        return {"row": row, "answer_found": sum(found) / len(found), "answer_found_ci": [0.0, 1.0], "recall": 0.5,
                "recall_ci": [0.0, 1.0], "parseable_final": 1.0, "valid_tool_calls": None, "tool_calls": 1.0, "wall_s": 1.0}

    rows = [write("hybrid", [1, 0, 1, 0]), write("sft", [1, 1, 1, 0])]
    add_paired_differences(rows, tmp_path)
    assert "vs_hybrid" not in rows[0] and rows[1]["vs_hybrid"] == pytest.approx(0.25)
    printed = table(rows).splitlines()
    assert "minus hybrid" in printed[0] and "| +0.250 [" in printed[3] and printed[2].split("|")[3].strip() == "-"
    rows.append(write("base", [0, 0, 0]))
    with pytest.raises(ValueError, match="one side only"):
        add_paired_differences(rows, tmp_path)
