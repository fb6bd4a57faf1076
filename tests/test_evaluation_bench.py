"""`searchsmith bench` logic end to end on a small slice of the dev file: pooled corpus, index
cache, baselines and the heuristic agent, scores, report.json / report.md / plots, trajectories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.policy_spec import PolicySpec
from evaluation.bench import run_bench_command
from evaluation.candidates import split_candidates
from evaluation.external import paragraph_doc_id, read_records, tasks_from_records

REPO = Path(__file__).resolve().parents[1]
DEV_FILE = REPO.parent / "shared" / "data" / "multihop_dev.jsonl"
SAMPLE_FILE = REPO / "customers" / "demo" / "benchmarks" / "multihop_sample.jsonl"
SLICE = 15
POLICIES = ["bm25", "dense", "hybrid", "heuristic"]
REPORT_KEYS = {"answer_found", "recall", "precision", "f1", "trajectory_recall", "prune_accuracy", "mean_prompt_tokens", "n"}


@pytest.fixture(scope="module")
def slice_file(tmp_path_factory) -> Path:
    source = DEV_FILE if DEV_FILE.exists() else SAMPLE_FILE
    lines = [line for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    # Both datasets in the slice (when the file has both): the first MuSiQue and HotpotQA records.
    musique = [l for l in lines if '"MuSiQue' in l][:5]
    hotpot = [l for l in lines if '"MuSiQue' not in l][: SLICE - len(musique)]
    path = tmp_path_factory.mktemp("bench") / "slice.jsonl"
    path.write_text("\n".join(hotpot + musique) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def bench_run(slice_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    cache = tmp_path_factory.mktemp("cache")
    report = run_bench_command(slice_file, POLICIES, k=5, out_dir=out, limit=None, progress=False, cache_root=cache, workers=4)
    return report, out, cache


@pytest.mark.slow
def test_report_has_the_contract_keys_and_sane_values(bench_run):
    report, out, _ = bench_run
    assert list(report["policies"]) == POLICIES
    for name, summary in report["policies"].items():
        assert REPORT_KEYS <= set(summary), name
        assert summary["n"] == SLICE
        for key in ("answer_found", "recall", "precision", "f1", "trajectory_recall"):
            assert 0.0 <= summary[key] <= 1.0
            low, high = summary["intervals"][key]
            assert low <= summary[key] <= high
        assert summary["trajectory_recall"] >= summary["recall"] - 1e-9
        assert summary["errors"] == 0
    # On a ~150-paragraph pool a working retriever finds most gold; a broken id mapping finds none.
    assert report["policies"]["hybrid"]["recall"] > 0.5
    assert report["policies"]["bm25"]["mean_prompt_tokens"] == 0
    assert report["policies"]["heuristic"]["mean_prompt_tokens"] > 0
    assert report["policies"]["heuristic"]["turns"] > 1
    config = report["config"]
    assert config["k"] == 5 and config["n_tasks"] == SLICE and config["embedding_model"]
    assert config["candidates"]["heuristic"]["kind"] == "agent"
    assert config["candidates"]["heuristic"]["harness"]["max_output_docs"] == 5
    assert config["candidates"]["heuristic"]["workers"] == 4  # as the caller said


@pytest.mark.slow
def test_files_written(bench_run):
    report, out, _ = bench_run
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk == json.loads(json.dumps(report))
    assert "| heuristic |" in (out / "report.md").read_text()
    for plot in report["files"]["plots"]:
        assert Path(plot).stat().st_size > 1000
    for name in POLICIES:
        rows = Path(report["files"]["trajectories"][name]).read_text().splitlines()
        assert len(rows) == SLICE
        assert all(json.loads(row)["final_ranking"] is not None for row in rows)
        assert len(Path(report["files"]["scores"][name]).read_text().splitlines()) == SLICE


@pytest.mark.slow
def test_every_candidate_returns_at_most_k_documents(bench_run):
    report, _, _ = bench_run
    for name in POLICIES:
        assert report["policies"][name]["returned_docs"] <= 5


@pytest.mark.slow
def test_index_cache_is_reused_and_limit_applies(bench_run, slice_file, tmp_path):
    _, _, cache = bench_run
    report = run_bench_command(slice_file, ["bm25"], k=3, out_dir=tmp_path, limit=4, progress=False, cache_root=cache)
    assert report["config"]["index_reused"] is True
    assert report["policies"]["bm25"]["n"] == 4
    assert report["policies"]["bm25"]["returned_docs"] <= 3


def test_gold_is_paragraph_level(slice_file):
    records = read_records(slice_file)
    tasks = tasks_from_records(records)
    for record, task in zip(records, tasks):
        expected = {paragraph_doc_id(p["title"], p["text"]) for p in record.paragraphs if p["is_supporting"]}
        assert task.gold.doc_ids == expected
        assert task.gold.answer_doc_ids <= task.gold.doc_ids


def test_an_in_process_model_runs_as_many_episodes_at_once_as_a_generation_batch_holds(monkeypatch):
    from evaluation.bench import episode_workers
    from evaluation.runner import default_workers

    monkeypatch.setenv("SEARCHSMITH_GENERATION_BATCH", "16")
    assert episode_workers(PolicySpec.parse("transformers:/models/demo/sft/adapter")) == 16
    assert episode_workers(PolicySpec.parse("transformers:smollm2@2+rerank")) == 16
    monkeypatch.setenv("SEARCHSMITH_GENERATION_BATCH", "1")  # batching off: the index-bound default
    assert episode_workers(PolicySpec.parse("transformers:smollm2")) == default_workers()
    for name in ("heuristic", "hybrid", "heuristic@4", "openai:http://127.0.0.1:9/v1#m"):
        assert episode_workers(PolicySpec.parse(name)) == default_workers()


def test_candidate_specs():
    assert PolicySpec.parse("heuristic@4").n == 4 and PolicySpec.parse("heuristic@4").policy == "heuristic"
    spec = PolicySpec.parse("openai:http://user@host:8000/v1#qwen@2")
    assert (spec.policy, spec.n) == ("openai:http://user@host:8000/v1#qwen", 2)
    assert PolicySpec.parse("transformers:/ckpt/a@b").n == 1
    with pytest.raises(ValueError):
        PolicySpec.parse("hybrid@4")
    with pytest.raises(ValueError):
        split_candidates("bm25,bm25")
    assert [s.name for s in split_candidates("bm25, heuristic@2")] == ["bm25", "heuristic@2"]


def test_specs_name_their_adapter_whichever_way_they_are_written(tmp_path):
    """`+` means two things in a spec (BASE+ADAPTER, and the +rerank suffix): parsed in one place."""
    both = PolicySpec.parse("transformers:/models/base+/ckpt/sft@2+rerank")
    assert (both.policy, both.n, both.rerank) == ("transformers:/models/base+/ckpt/sft", 2, True)
    assert (both.adapter().folder, both.adapter().base_model) == ("/ckpt/sft", "/models/base")
    assert both.without_selection().name == "transformers:/models/base+/ckpt/sft@2"
    elsewhere = PolicySpec.parse("transformers:/on/another/worker").adapter()
    assert elsewhere.folder == "/on/another/worker" and not elsewhere.readable and elsewhere.base_model is None
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert PolicySpec.parse(f"transformers:{model}").adapter() is None  # a full model folder: no adapter
    assert PolicySpec.parse("transformers:smollm2").adapter() is None
    assert PolicySpec.parse("heuristic+rerank").adapter() is None and PolicySpec.parse("openai:http://h/v1#m").adapter() is None


def test_benchmark_candidates_add_all_checkpoints_or_only_the_latest():
    from core.benchmark_settings import BenchmarkSettings
    from evaluation.per_customer import benchmark_candidates

    from agent.policy_spec import PolicySpec

    def names(specs):
        return [spec.name for spec in specs]

    checkpoints = [PolicySpec.for_adapter("/m/sft"), PolicySpec.for_adapter("/m/cispo")]
    both = benchmark_candidates(BenchmarkSettings(policies=["hybrid", "heuristic"]), checkpoints)
    assert names(both) == ["hybrid", "heuristic", "transformers:/m/sft", "transformers:/m/cispo"]
    assert both[-1].adapter().folder == "/m/cispo" and both[0].is_baseline
    latest = BenchmarkSettings(policies=["hybrid", "transformers:/m/cispo"], checkpoints="latest")
    assert names(benchmark_candidates(latest, checkpoints)) == ["hybrid", "transformers:/m/cispo"]
    assert names(benchmark_candidates(latest, [])) == ["hybrid", "transformers:/m/cispo"]


def test_two_runs_over_one_file_build_its_index_once(tmp_path):
    """Two benchmarks started together over the same file (two shells, a bench beside the demo)
    must not both embed its corpus into the same cached Chroma folder: one builds, the other
    waits on the cache's lock and loads what the first built."""
    from concurrent.futures import ThreadPoolExecutor

    from evaluation.external import load_external_benchmark

    lines = [line for line in SAMPLE_FILE.read_text(encoding="utf-8").splitlines() if line.strip()][:3]
    path = tmp_path / "three.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    cache = tmp_path / "cache"
    with ThreadPoolExecutor(2) as pool:
        loaded = list(pool.map(lambda _: load_external_benchmark(path, cache_root=cache), range(2)))
    assert sorted(benchmark.built for benchmark in loaded) == [False, True]
    assert loaded[0].n_chunks == loaded[1].n_chunks > 0
    assert [h.chunk_id for h in loaded[0].index.search("football", k=3)] == [h.chunk_id for h in loaded[1].index.search("football", k=3)]


@pytest.mark.slow
def test_nx_ceiling_reads_every_rollouts_answer_from_a_bench_run(bench_run, slice_file, tmp_path, capsys):
    """An Nx candidate's saved trajectories keep each rollout's own ranking, and
    `bench/nx_ceiling.py` scores them: the best rollout per question is never below the first,
    and the union of the rollouts' top k never recalls less than the first rollout alone."""
    import importlib.util

    _, _, cache = bench_run
    run_bench_command(slice_file, ["heuristic@2"], k=5, out_dir=tmp_path, limit=6, progress=False, cache_root=cache)
    spec = importlib.util.spec_from_file_location("nx_ceiling", REPO / "bench" / "nx_ceiling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    capsys.readouterr()
    assert module.main(["--run", str(tmp_path)]) == 0
    rows = {line.split("|")[1].strip(): line.split("|")[2:4] for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line}
    first_found, first_recall = (cell.split()[0] for cell in rows["first rollout (the 1x policy)"])
    oracle = rows["best rollout per question (oracle)"][0].split()[0]
    union_recall = rows["union of the rollouts' top 5"][1].strip()
    assert float(oracle) >= float(first_found)
    assert float(union_recall) >= float(first_recall) > 0
    with pytest.raises(SystemExit, match="no Nx candidate"):
        module.main(["--run", str(tmp_path), "--policy", "heuristic"])
    with pytest.raises(SystemExit, match="report.json: not found"):
        module.main(["--run", str(tmp_path / "absent")])


def test_arguments_that_would_lose_the_run_are_refused_before_it(slice_file, tmp_path):
    """Checked before any indexing or episode: a run whose report cannot be written is lost work."""
    report_file = tmp_path / "report"
    report_file.write_text("a file, not a folder")
    with pytest.raises(ValueError, match="is a file: the report needs a folder"):
        run_bench_command(slice_file, ["heuristic"], k=5, out_dir=report_file, progress=False, cache_root=tmp_path / "cache")
    with pytest.raises(ValueError, match="workers 0: must be at least 1"):
        run_bench_command(slice_file, ["heuristic"], k=5, out_dir=tmp_path / "out", progress=False, workers=0, cache_root=tmp_path / "cache")
    with pytest.raises(ValueError, match="limit must be >= 1"):
        run_bench_command(slice_file, ["heuristic"], k=5, out_dir=tmp_path / "out", limit=0, progress=False, cache_root=tmp_path / "cache")
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()
