"""The learning curve of the recipe on real questions it never trained on.

    .venv/bin/python bench/learning.py --size cpu|gpu|smoke [--question-style cloze|natural] [--init-adapter SEARCHER]
        [--sft-steps N] [--teacher-tasks N] [--final-answer-weight W] [--answer-steps N [--answer-target gold|teacher] [--answer-order ranked|reading]
        [--answer-learning-rate LR]] [--skip-rl | --skip-rl-dev-row] [--skip-synth] [--out DIR] [--work DIR]
    .venv/bin/python bench/learning.py --size cpu --question-style natural --student ADAPTER [--synth-of RUN [--skip-dev]] [--dev-rows hybrid,sft]
        [--reranker DIR]

What it does, as a customer would (every step is the `searchsmith` CLI in its own home):
1. builds a customer whose corpus is the paragraphs of `shared/data/multihop_dev.jsonl` (one
   Markdown file per distinct paragraph; the file's questions are never written anywhere the
   pipeline reads);
2. `sync`, then `tasks` (the offline extractive generator: verified synthetic tasks with a
   train/dev/test split), then `finetune --stage sft` (the heuristic teacher's trajectories,
   filtered, replayed in the student's compact view, LoRA SFT of SmolLM2-135M-Instruct) and
   `finetune --stage rl` (CISPO from the SFT adapter);
3. evaluates on the first `eval_questions` dev questions (k=5, the pooled-paragraph index of
   `searchsmith bench`), every row on the same questions and harness: hybrid top-5, the heuristic
   teacher, the untrained base, SFT and SFT+CISPO (model rows under the SFT checkpoint's profile),
   then the students on the customer's held-out synthetic test split (mean reward, as RL sees it).

It prints one table (answer found and recall with 95% bootstrap intervals, each row's answer found
minus hybrid's with a paired interval over the same questions, the share of episodes
with a parseable final answer, the share of valid tool calls, mean prompt tokens, wall time) and
writes `learning.json` and the per-row reports under `--out`. Stages that already ran in `--work`
are reused by the pipeline itself (same inputs, same adapter), so a rerun resumes.

`--student ADAPTER` skips the corpus, tasks and training and evaluates that adapter folder as the
SFT row, beside the same hybrid, teacher and base rows: a shipped searcher re-measured under the
current harness and code. With `--synth-of RUN` (the `--work` folder of an earlier training run) it
also measures the adapter's mean reward on that run's held-out synthetic test split: how candidate
checkpoints are compared without looking at the dev questions (`--skip-dev` measures only that).

`--reranker DIR` (a customer's trained reranker) adds `hybrid+rerank` and, from each student row's own
episodes, `sft+rerank` (and `sft+cispo+rerank`): selection over what the student's searches surfaced.
They are fused rows, printed beside the student's own and never in its place.

The SFT adapter of `--size cpu --question-style natural` is the searcher this project ships
(`training/searchers/smollm2-searcher`, which customer files continue with
`training.init_adapter`); after a better run, export its adapter folder (printed in the table's
SFT row, under `--work`) with `python -m training.searchers export FOLDER training/searchers/NAME`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEV_FILE_CANDIDATES = (REPO.parent / "shared" / "data" / "multihop_dev.jsonl", Path("/work/shared/data/multihop_dev.jsonl"))


@dataclass(frozen=True)
class Size:
    """One run's scale. The CPU size is meant to fit 2 hours on 2 cores, evaluation included, and
    does not: its training does (about 30 minutes in bf16), but one student's row on the 150 dev
    questions takes 24-53 minutes on an AVX512-BF16 CPU (by how long the student searches; about
    twice that in fp32), and the run has three model rows and two synthetic ones, about 3 hours
    in all (measured 2026-12-04; `--dev-rows`, `--skip-rl-dev-row` and cached rows split it).
    On a CPU without native bf16 (an AVX2-only EPYC, 2026-12-06) the packaged searcher took 47 s a
    dev question in fp32 (374 s for the first 8), so one student row alone is about 2 hours there."""

    seeds: int  # extractive task seeds (documents the generator starts from)
    teacher_tasks: int  # train tasks the teacher runs (SFT data)
    sft_steps: int
    grad_accum: int
    rl_steps: int
    rl_tasks_per_step: int
    group_size: int
    eval_questions: int
    synth_test: int  # held-out synthetic test tasks for the mean-reward comparison
    max_new_tokens: int  # per model turn, the same for every model row
    learning_rate: float = 5e-4
    lora_rank: int = 32


SIZES = {
    "smoke": Size(seeds=60, teacher_tasks=24, sft_steps=30, grad_accum=1, rl_steps=1, rl_tasks_per_step=2, group_size=2,
                  eval_questions=12, synth_test=8, max_new_tokens=160, learning_rate=1e-3),
    # A reduced CPU run (60 questions) for a session that cannot spend the full CPU size's 2 hours.
    "cpu-short": Size(seeds=200, teacher_tasks=60, sft_steps=30, grad_accum=1, rl_steps=2, rl_tasks_per_step=2, group_size=2,
                      eval_questions=60, synth_test=20, max_new_tokens=160, learning_rate=1e-3),
    # 60 SFT sequences (~1.8K tokens each at ~60-100 tokens/s) and 150 dev questions per model row.
    "cpu": Size(seeds=400, teacher_tasks=120, sft_steps=30, grad_accum=2, rl_steps=2, rl_tasks_per_step=2, group_size=4,
                eval_questions=150, synth_test=30, max_new_tokens=160, learning_rate=1e-3),
    "gpu": Size(seeds=2000, teacher_tasks=800, sft_steps=400, grad_accum=4, rl_steps=40, rl_tasks_per_step=8, group_size=8,
                eval_questions=453, synth_test=200, max_new_tokens=256, learning_rate=3e-4),
}

# The student's harness profile (the compact view) and the turn cap used for every model row.
PROFILE = {"view": "compact", "token_budget": 4096, "search_budget_tokens": 512, "response_reserve_tokens": 256,
           "max_turns": 4, "max_output_docs": 5}
K = 5
# The answer-choice phase's learning rate (`--answer-steps`): half the CPU size's episode rate,
# since it continues an adapter that already searches and trains only on the answers' tokens.
ANSWER_LEARNING_RATE = 5e-4
# Concurrent episodes per row: the model's greedy turns are generated in batches across them
# (`agent.policies.generation_batcher`), about 1.7x the throughput of one episode at a time.
EPISODE_WORKERS = 16


def dev_file() -> Path:
    for candidate in DEV_FILE_CANDIDATES:
        if candidate.is_file():
            return candidate
    raise SystemExit(f"multihop_dev.jsonl not found (looked in {', '.join(map(str, DEV_FILE_CANDIDATES))})")


def write_corpus(records_path: Path, folder: Path) -> int:
    """One Markdown file per distinct paragraph (title as heading); no question text anywhere."""
    from evaluation.external import pooled_documents, read_records

    documents = pooled_documents(read_records(records_path))
    folder.mkdir(parents=True, exist_ok=True)
    for row in documents.iter_rows(named=True):
        body = row["text"][len(row["title"]) + 1:] if row["title"] and row["text"].startswith(row["title"] + "\n") else row["text"]
        path = folder / f"{row['doc_id']}.md"
        if not path.exists():
            path.write_text(f"# {row['title']}\n\n{body}\n", encoding="utf-8")
    return documents.height


def customer_file(work: Path, size: Size, name: str, question_style: str = "cloze", init_adapter: str | None = None,
                  final_answer_weight: float = 1.0, answer_steps: int = 0, answer_target: str = "gold",
                  answer_learning_rate: float = 0.0, answer_order: str = "ranked", max_hops: int = 2) -> Path:
    """The learning customer. With `init_adapter` (a packaged searcher's name) SFT continues that
    adapter, in its own shape, with the data drawn in the next order (the seed its last run used,
    plus one): the searchers this project ships were trained by this script on the same tasks, and
    a run of 30 steps sees about a quarter of the samples, so a continuation in the same order
    would see exactly the samples the searcher has already seen. Tasks chain to `max_hops`
    documents, 2 by default: the compact profile's 4 turns leave the student no room for more."""
    settings = {
        "name": name, "domain": "web", "schedule": "0 3 * * *",
        "sources": [{"type": "local", "path": "./corpus", "include": ["**/*.md"], "exclude": []}],
        "tasks": {"generator": "extractive", "question_style": question_style, "max_seeds": size.seeds, "max_hops": max_hops,
                  "distractors_per_task": 0},
        "benchmark": {"k": K},
        "training": {
            "base_model": "smollm2",
            "harness": PROFILE,
            "teacher": {"policy": "heuristic", "k_rollouts": 1, "max_tasks": size.teacher_tasks, "workers": 1},
            "lora": {"rank": size.lora_rank, "alpha": 2 * size.lora_rank},
            "sft": {"max_length": 4096, "max_steps": size.sft_steps, "batch_size": 1, "grad_accum": size.grad_accum,
                    "learning_rate": size.learning_rate, "final_answer_weight": final_answer_weight,
                    **({"answer_steps": answer_steps, "answer_learning_rate": answer_learning_rate or ANSWER_LEARNING_RATE,
                        "answer_target": answer_target, "answer_order": answer_order} if answer_steps else {})},
            "rl": {"steps": size.rl_steps, "group_size": size.group_size, "tasks_per_step": size.rl_tasks_per_step,
                   "substeps": 1, "max_new_tokens": size.max_new_tokens, "rollout_workers": 1, "checkpoint_every": 1,
                   "learning_rate": 2e-5, "temperature": 1.0},
        },
    }
    if init_adapter is not None:
        training = settings["training"]
        del training["lora"]
        training["init_adapter"] = init_adapter
        training["sft"]["seed"] = continuation_seed(init_adapter)
    path = work / f"{name}.yaml"
    path.write_text(json.dumps(settings, indent=2), encoding="utf-8")  # JSON is YAML
    return path


def continuation_seed(searcher: str) -> int:
    """The data-order seed for a run that continues `searcher`: one past the seed of the run that
    made it (its sidecar's `config.sft.seed`; 0 when it does not say)."""
    from agent.adapter_sidecar import read_sidecar
    from training.searchers import searcher_dir

    sft = (read_sidecar(searcher_dir(searcher)).get("config") or {}).get("sft") or {}
    return int(sft.get("seed") or 0) + 1


def run_customer(run: Path) -> str:
    """The learning customer an earlier run's `--work` folder holds: its one customer file (named
    after the customer, as `customer_file` writes it) beside the home with its tasks and index."""
    customers = sorted((run / "customers").glob("*.yaml"))
    if len(customers) != 1 or not (run / "home").is_dir():
        raise ValueError(f"{run}: not the --work folder of a training run (expected one customer file in customers/ "
                         f"and a home/; found {len(customers)} customer files)")
    return customers[0].stem


def cli(args: list[str], env: dict[str, str], log: Path) -> dict[str, Any]:
    """One `searchsmith ... --json` step; its stderr goes to the log, its JSON object is returned."""
    started = time.perf_counter()
    with log.open("a", encoding="utf-8") as errors:
        errors.write(f"\n$ searchsmith {' '.join(args)}\n")
        errors.flush()
        done = subprocess.run([str(REPO / ".venv" / "bin" / "searchsmith"), *args, "--json"], env=env, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=errors, text=True)
    if done.returncode != 0:
        raise SystemExit(f"searchsmith {' '.join(args)} failed (exit {done.returncode}); see {log}")
    payload = json.loads(done.stdout)
    print(f"  searchsmith {' '.join(args)}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return payload


def episode_shares(trajectories_file: str) -> dict[str, float]:
    """Parseable final answers and valid tool calls, read from the saved trajectories."""
    from agent.trajectory import read_jsonl

    trajectories = read_jsonl(trajectories_file)
    calls = [call for t in trajectories for call in t.tool_call_records()]
    parsed = sum(1 for t in trajectories if t.final_ranking)
    return {
        "parseable_final": parsed / len(trajectories) if trajectories else 0.0,
        "valid_tool_calls": sum(1 for c in calls if not c.error) / len(calls) if calls else None,
        "tool_calls": len(calls) / len(trajectories) if trajectories else 0.0,
    }


def cached(path: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """A finished row from an earlier run with the same key (spec, questions, harness, options).

    Evaluating one model row costs tens of minutes on CPU; a rerun after an interruption (or
    one that only adds a row) keeps what already finished. Checkpoint specs name content-hashed
    adapters, so a retrained model never matches an old row.
    """
    if not path.exists():
        return None
    saved = json.loads(path.read_text(encoding="utf-8"))
    return saved["row"] if saved.get("key") == json.loads(json.dumps(key, default=str)) else None


def remember(path: Path, key: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": key, "row": row}, indent=2, default=str), encoding="utf-8")
    return row


def model_options(size: Size) -> dict[str, Any]:
    """What every model row runs with (and what its cached row is keyed by): the size's reply cap,
    and turns that stop once they loop (agent.policies.runaway), named so rows measured before the
    guard existed are not reused."""
    return {"max_new_tokens": size.max_new_tokens, "stop_runaway": True}


def harness_key(spec: str, overrides: dict[str, Any] | None) -> dict[str, Any]:
    """The harness a row runs under, as resolved from the checkpoint's profile, plus the harness
    behaviours outside profiles: a change in either must not reuse a row measured before it."""
    from agent.policies import harness_for

    config = harness_for(spec, **(overrides or {}))
    return {**config.profile(), "prefill_final_answer": config.prefill_final_answer}


def run_row(name: str, spec: str, tasks, backend, out: Path, overrides: dict[str, Any] | None, size: Size,
            reranker_dir: Path | None = None) -> dict[str, Any]:
    """One row measured on the dev questions (`reranker_dir`: for a `+rerank` spec)."""
    from evaluation.bench import run_benchmark
    from search.reranker import Reranker

    options = model_options(size) if spec.startswith("transformers:") else None
    key = {"spec": spec, "tasks": [t.task_id for t in tasks], "overrides": overrides, "harness": harness_key(spec, overrides),
           "options": options, "k": K}
    if reranker_dir is not None:
        key["reranker"] = str(reranker_dir.resolve())
    if (row := cached(out / name / "row.json", key)) is not None:
        print(f"  {name}: reused (answer found {row['answer_found']:.3f})", file=sys.stderr)
        return row
    started = time.perf_counter()
    report = run_benchmark(tasks, backend, [spec], K, out / name, progress=False, workers=EPISODE_WORKERS,
                           harness_overrides=overrides, model_options=options,
                           reranker=Reranker.load(reranker_dir) if reranker_dir is not None else None)
    name_key = next(iter(report["policies"]))  # the candidate's report name
    summary = report["policies"][name_key]
    row = {
        "row": name, "policy": spec, "n": summary["n"],
        "answer_found": summary["answer_found"], "answer_found_ci": summary["intervals"]["answer_found"],
        "recall": summary["recall"], "recall_ci": summary["intervals"]["recall"],
        "mean_prompt_tokens": summary.get("mean_prompt_tokens"), "wall_s": round(time.perf_counter() - started, 1),
        **episode_shares(report["files"]["trajectories"][name_key]),
    }
    print(f"  {name}: answer found {row['answer_found']:.3f}, parseable {row['parseable_final']:.2f}, {row['wall_s']:.0f} s", file=sys.stderr)
    return remember(out / name / "row.json", key, row)


def selected_row(name: str, model_row: dict[str, Any], tasks, backend, out: Path, reranker_dir: Path) -> dict[str, Any]:
    """`model_row`'s own episodes with their final rankings rebuilt by selection (`agent.selection`,
    the reranker's calibrated choice for agents): what `SPEC+rerank` gives, read from the episodes
    already paid for instead of a second run of the model. Reported beside the student's row,
    never in place of it (issue 12: a fused variant has its own row)."""
    from agent.selection import select
    from agent.trajectory import read_jsonl
    from evaluation.bootstrap import bootstrap_mean
    from evaluation.metrics import score_trajectory
    from search.reranker import Reranker, read_selection

    row_dir = out / model_row["row"]
    (episodes,) = sorted((row_dir / "trajectories").glob("*.jsonl"))
    key = {"episodes": str(episodes), "row": model_row, "reranker": str(reranker_dir.resolve()), "selection": read_selection(reranker_dir)}
    if (row := cached(out / name / "row.json", key)) is not None:
        return row
    started = time.perf_counter()
    reranker, by_id = Reranker.load(reranker_dir), {task.task_id: task for task in tasks}
    scores = []
    for trajectory in read_jsonl(episodes):
        task = by_id[trajectory.task_id]
        if trajectory.seen_doc_ids():
            trajectory.final_ranking = select(trajectory, task.question, backend, reranker, K, policy=f"{model_row['policy']}+rerank")
        score = score_trajectory(trajectory, task.gold, K)  # the benchmark's own scorer
        scores.append({"task_id": task.task_id, "answer_found": score.answer_found, "recall": score.recall})
    (out / name / "scores").mkdir(parents=True, exist_ok=True)
    (out / name / "scores" / "selected.jsonl").write_text("".join(json.dumps(score) + "\n" for score in scores), encoding="utf-8")
    found, recall = (bootstrap_mean([score[metric] for score in scores]) for metric in ("answer_found", "recall"))
    row = {**{k: model_row[k] for k in ("n", "parseable_final", "valid_tool_calls", "tool_calls", "mean_prompt_tokens")},
           "row": name, "policy": f"{model_row['policy']}+rerank", "answer_found": found.mean, "answer_found_ci": found.as_list(),
           "recall": recall.mean, "recall_ci": recall.as_list(), "wall_s": round(time.perf_counter() - started, 1)}
    print(f"  {name}: answer found {row['answer_found']:.3f} (selection over the {model_row['row']} row's episodes)", file=sys.stderr)
    return remember(out / name / "row.json", key, row)


def task_scores(row_dir: Path, metric: str = "answer_found") -> dict[str, float]:
    """One row's per-question `metric`, from the scores file its benchmark report wrote."""
    files = sorted((row_dir / "scores").glob("*.jsonl"))
    if len(files) != 1:
        raise FileNotFoundError(f"{row_dir / 'scores'}: expected one scores file, found {len(files)}")
    records = [json.loads(line) for line in files[0].read_text(encoding="utf-8").splitlines() if line.strip()]
    return {record["task_id"]: float(record[metric]) for record in records}


def add_paired_differences(rows: list[dict[str, Any]], out: Path, baseline: str = "hybrid") -> None:
    """Each row's answer found minus the baseline row's on the same questions, with a paired
    bootstrap interval (`vs_hybrid`, `vs_hybrid_ci`): whether a student beats hybrid is read from
    this interval, not from two overlapping ones."""
    from evaluation.bootstrap import paired_difference

    if not any(row["row"] == baseline for row in rows):
        return
    theirs = task_scores(out / baseline)
    for row in rows:
        if row["row"] != baseline:
            difference = paired_difference(task_scores(out / row["row"]), theirs)
            row[f"vs_{baseline}"], row[f"vs_{baseline}_ci"] = difference.mean, difference.as_list()


def synth_rewards(name: str, spec: str, tasks, backend, out: Path, size: Size) -> dict[str, Any]:
    """Mean reward (the RL reward at the benchmark's k, beta 2) of a student on held-out synthetic tasks."""
    from agent.trajectory import read_jsonl
    from evaluation.bench import run_benchmark
    from evaluation.reward import reward

    key = {"spec": spec, "tasks": [t.task_id for t in tasks], "harness": harness_key(spec, None), "options": model_options(size), "k": K}
    if (row := cached(out / f"synth-{name}" / "row.json", key)) is not None:
        return row
    started = time.perf_counter()
    report = run_benchmark(tasks, backend, [spec], K, out / f"synth-{name}", progress=False, workers=EPISODE_WORKERS,
                           model_options=model_options(size))
    name_key = next(iter(report["policies"]))
    gold = {task.task_id: task.gold for task in tasks}
    values = [reward(t, gold[t.task_id], beta=2.0, k=K).reward for t in read_jsonl(report["files"]["trajectories"][name_key])]
    from evaluation.bootstrap import bootstrap_mean

    interval = bootstrap_mean(values)
    row = {"row": name, "mean_reward": interval.mean, "ci": [interval.low, interval.high], "n": len(values),
           "answer_found": report["policies"][name_key]["answer_found"], "wall_s": round(time.perf_counter() - started, 1)}
    print(f"  synthetic {name}: mean reward {row['mean_reward']:.3f}, {row['wall_s']:.0f} s", file=sys.stderr)
    return remember(out / f"synth-{name}" / "row.json", key, row)


DEV_ROWS = ("hybrid", "heuristic", "base", "sft", "sft+cispo")


def table(rows: list[dict[str, Any]]) -> str:
    def ci(value, bounds):
        return f"{value:.3f} [{bounds[0]:.3f}, {bounds[1]:.3f}]" if value is not None else "-"

    def difference(r):
        value = r.get("vs_hybrid")
        return f"{value:+.3f} [{r['vs_hybrid_ci'][0]:+.3f}, {r['vs_hybrid_ci'][1]:+.3f}]" if value is not None else "-"

    lines = ["| row | answer found [95% CI] | minus hybrid [paired 95% CI] | recall [95% CI] | parseable final | valid tool calls | tool calls/ep | prompt tokens/ep | wall s |",
             "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        valid = f"{r['valid_tool_calls']:.2f}" if r.get("valid_tool_calls") is not None else "-"
        tokens = f"{r['mean_prompt_tokens']:,.0f}" if r.get("mean_prompt_tokens") is not None else "-"
        lines.append(f"| {r['row']} | {ci(r['answer_found'], r['answer_found_ci'])} | {difference(r)} | {ci(r['recall'], r['recall_ci'])} | "
                     f"{r['parseable_final']:.2f} | {valid} | {r['tool_calls']:.1f} | {tokens} | {r['wall_s']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu")
    parser.add_argument("--work", type=Path, default=None, help="the run's home (default .searchsmith/learning-SIZE)")
    parser.add_argument("--out", type=Path, default=None, help="reports (default WORK/report)")
    parser.add_argument("--skip-synth", action="store_true", help="skip the synthetic test split comparison")
    parser.add_argument("--skip-rl", action="store_true",
                        help="train and evaluate the SFT student only (no CISPO stage, no SFT+CISPO rows): a run "
                             "that cannot spend the CISPO row's hour; a later run without it reuses every finished row")
    parser.add_argument("--skip-rl-dev-row", action="store_true",
                        help="train CISPO and compare it with SFT on the held-out synthetic split (its goal), but do "
                             "not evaluate the SFT+CISPO row on the dev questions (another SFT row's time: 48 minutes "
                             "on 2 cores)")
    parser.add_argument("--question-style", choices=("cloze", "natural"), default="cloze",
                        help="wording of the offline synthetic questions (synth.extractive); the run's home is "
                             "suffixed with it unless cloze")
    parser.add_argument("--init-adapter", default=None, metavar="SEARCHER",
                        help="continue a packaged searcher (training/searchers/NAME) instead of a fresh LoRA: the "
                             "size's SFT steps are added to what it was trained with; the run's home is suffixed with it")
    parser.add_argument("--student", type=Path, default=None, metavar="ADAPTER",
                        help="evaluate this adapter folder (a shipped searcher) as the SFT row instead of training "
                             "one: no corpus, tasks, training or CISPO, and synthetic rows only with --synth-of; the run's home "
                             "is suffixed with it")
    parser.add_argument("--synth-of", type=Path, default=None, metavar="RUN",
                        help="with --student: also measure its mean reward on the held-out synthetic test split of "
                             "the training run whose --work folder is RUN (it holds that customer's tasks and index)")
    parser.add_argument("--skip-dev", action="store_true",
                        help="with --synth-of: measure only the synthetic split, not the dev-question rows")
    parser.add_argument("--reranker", type=Path, default=None, metavar="DIR",
                        help="a trained reranker folder (a customer's reranker_checkpoint): adds the rows hybrid+rerank and, "
                             "from the student rows' own episodes, sft+rerank and sft+cispo+rerank (fused rows, beside the student's own)")
    parser.add_argument("--dev-rows", type=lambda text: [name.strip() for name in text.split(",") if name.strip()],
                        default=None, metavar="ROWS",
                        help=f"evaluate only these dev-question rows (comma-separated, of {', '.join(DEV_ROWS)}), e.g. "
                             "'hybrid,sft' for one adapter's row without the base model's; each row is cached, so a "
                             "later run without it adds the rest")
    parser.add_argument("--sft-steps", type=int, default=None, metavar="N",
                        help="SFT optimizer steps instead of the size's (a longer run where time allows; 0 with --answer-steps: "
                             "only the answer-choice phase)")
    parser.add_argument("--teacher-tasks", type=int, default=None, metavar="N",
                        help="train tasks the teacher runs instead of the size's (more distinct episodes for the "
                             "same SFT steps: the teacher took 55 s for all 578 tasks on 2 cores, SFT steps are the time)")
    parser.add_argument("--answer-steps", type=int, default=0, metavar="N",
                        help="after the SFT steps, N answer-choice steps (sft.answer_steps: the final answers alone, their "
                             "context frozen, relabelled gold-first from the verified tasks; 8 answers a step); the run's "
                             "home is suffixed with it")
    parser.add_argument("--answer-target", choices=("gold", "teacher"), default="gold",
                        help="with --answer-steps: the answers taught (sft.answer_target): gold relabels the teacher's "
                             "from the verified task, teacher keeps them as written; the run's home is suffixed with teacher")
    parser.add_argument("--answer-order", choices=("ranked", "reading"), default="ranked",
                        help="with --answer-steps: the order answers are taught in (sft.answer_order): ranked as written, "
                             "reading lists their first 5 references as shown (scored as a set at k=5); the run's home "
                             "is suffixed with reading")
    parser.add_argument("--answer-learning-rate", type=float, default=None, metavar="LR",
                        help=f"with --answer-steps: the phase's learning rate (default {ANSWER_LEARNING_RATE:g}); the run's "
                             "home is suffixed with it")
    parser.add_argument("--final-answer-weight", type=float, default=1.0, metavar="W",
                        help="SFT loss weight of the final answer's tokens against the tool calls' (sft.final_answer_weight; "
                             "the answer is about 15 of 2,500 tokens of an episode); the run's home is suffixed with it")
    args = parser.parse_args()
    size = SIZES[args.size]
    if args.final_answer_weight <= 0:
        parser.error(f"--final-answer-weight {args.final_answer_weight}: must be positive")
    if args.final_answer_weight != 1.0 and args.student:
        parser.error("--final-answer-weight shapes SFT; --student trains nothing")
    if args.answer_steps < 0 or (args.answer_steps and args.student):
        parser.error(f"--answer-steps {args.answer_steps}: " + ("must be at least 0" if args.answer_steps < 0 else "--student trains nothing"))
    if (args.answer_target != "gold" or args.answer_order != "ranked" or args.answer_learning_rate is not None) and not args.answer_steps:
        parser.error("--answer-target, --answer-order and --answer-learning-rate shape the answer-choice phase: they need --answer-steps")
    if args.answer_learning_rate is not None and args.answer_learning_rate <= 0:
        parser.error(f"--answer-learning-rate {args.answer_learning_rate}: must be positive")
    if args.sft_steps is not None:
        if args.sft_steps < (0 if args.answer_steps else 1):
            parser.error(f"--sft-steps {args.sft_steps}: must be at least 1 (0 only with --answer-steps: the "
                         "answer-choice phase alone)")
        size = replace(size, sft_steps=args.sft_steps)
    if args.teacher_tasks is not None:
        if args.teacher_tasks < 1:
            parser.error(f"--teacher-tasks {args.teacher_tasks}: must be at least 1")
        if args.student:
            parser.error("--teacher-tasks sets the SFT data; --student trains nothing")
        size = replace(size, teacher_tasks=args.teacher_tasks)
    if args.skip_rl_dev_row and (args.skip_rl or args.skip_synth or args.student):
        parser.error("--skip-rl-dev-row compares CISPO with SFT on the synthetic split: it needs CISPO and that split "
                     "(no --skip-rl, --skip-synth or --student)")
    label = args.size if args.question_style == "cloze" else f"{args.size}-{args.question_style}"
    if args.init_adapter:
        label += f"-from-{args.init_adapter}"
    if args.final_answer_weight != 1.0:
        label += f"-answer-weight-{args.final_answer_weight:g}"
    if args.answer_steps:
        label += f"-answer-steps-{args.answer_steps}"
        if args.answer_target != "gold":
            label += f"-{args.answer_target}"
        if args.answer_order != "ranked":
            label += f"-{args.answer_order}"
        if args.answer_learning_rate is not None:
            label += f"-lr-{args.answer_learning_rate:g}"
    if args.student:
        if args.init_adapter:
            parser.error("--student evaluates an adapter as it is; --init-adapter trains one")
        args.student = args.student.resolve()
        if not args.student.is_dir():
            parser.error(f"--student {args.student}: no such adapter folder")
        label += f"-student-{args.student.name}"
        args.skip_rl, args.skip_synth = True, args.synth_of is None
    if args.synth_of is not None:
        if not args.student:
            parser.error("--synth-of measures a --student adapter on an earlier run's synthetic split; a training run "
                         "measures its own")
        args.synth_of = args.synth_of.resolve()
        try:
            synth_customer = run_customer(args.synth_of)
        except ValueError as error:
            parser.error(f"--synth-of {error}")
    if args.reranker is not None:
        from search.reranker import folder_kind

        try:
            folder_kind(args.reranker)  # before an hour of model rows, not after
        except FileNotFoundError as error:
            parser.error(f"--reranker {error}")
    if args.dev_rows is not None:
        unknown = sorted(set(args.dev_rows) - set(DEV_ROWS))
        if unknown or not args.dev_rows:
            parser.error(f"--dev-rows {','.join(args.dev_rows)}: {'unknown row(s) ' + ', '.join(unknown) if unknown else 'no row'}; "
                         f"the rows are {', '.join(DEV_ROWS)}")
        if args.skip_dev:
            parser.error("--dev-rows chooses dev-question rows; --skip-dev runs none")
    if args.skip_dev and args.synth_of is None:
        parser.error("--skip-dev leaves only the synthetic split, which needs --synth-of RUN")
    work = (args.work or REPO / ".searchsmith" / f"learning-{label}").resolve()
    out = (args.out or work / "report").resolve()
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    # This process opens the customer's index too: the same home as the CLI steps (with --synth-of,
    # the home of the run whose tasks and index it reads; reports stay under this run's --out).
    customer_home = args.synth_of or work
    env = {**os.environ, "SEARCHSMITH_HOME": str(customer_home / "home"), "DAGSTER_HOME": str(customer_home / "home" / "dagster"),
           "SEARCHSMITH_CUSTOMERS_DIR": str(customer_home / "customers")}
    os.environ.update({k: env[k] for k in ("SEARCHSMITH_HOME", "DAGSTER_HOME", "SEARCHSMITH_CUSTOMERS_DIR")})
    (customer_home / "home" / "dagster").mkdir(parents=True, exist_ok=True)
    (customer_home / "customers").mkdir(exist_ok=True)
    sys.path.insert(0, str(REPO))
    log = work / "pipeline.log"
    name = synth_customer if args.synth_of else f"learning-{label}"
    timings: dict[str, float] = {}
    started = time.perf_counter()

    records = dev_file()
    n_docs, synced, tasks, rl = None, None, {}, None
    if args.student:
        from agent.adapter_sidecar import read_sidecar

        sidecar = read_sidecar(args.student)
        sft = {"adapter_path": str(args.student), "steps": (sidecar.get("metrics") or {}).get("steps"),
               "metrics": sidecar.get("metrics")}
    else:
        print(f"[{args.size}] corpus, tasks and training in {work}", file=sys.stderr)
        n_docs = write_corpus(records, work / "customers" / "corpus")
        customer = customer_file(work / "customers", size, name, args.question_style, args.init_adapter,
                                 args.final_answer_weight, args.answer_steps, args.answer_target,
                                 args.answer_learning_rate or 0.0, args.answer_order)
        stage = time.perf_counter()
        cli(["customers", "add", str(customer)], env, log)
        synced = cli(["sync", name], env, log)
        timings["sync_s"] = time.perf_counter() - stage
        stage = time.perf_counter()
        tasks = cli(["tasks", name], env, log)
        timings["tasks_s"] = time.perf_counter() - stage
        stage = time.perf_counter()
        sft = cli(["finetune", name, "--stage", "sft"], env, log)
        timings["sft_s"] = time.perf_counter() - stage
        if not args.skip_rl:
            stage = time.perf_counter()
            rl = cli(["finetune", name, "--stage", "rl"], env, log)
            timings["rl_s"] = time.perf_counter() - stage

    from agent.policies import harness_for

    sft_spec = f"transformers:{sft['adapter_path']}"
    rl_spec = f"transformers:{rl['adapter_path']}" if rl else None
    rows: list[dict[str, Any]] = []
    if not args.skip_dev:
        print(f"[{args.size}] evaluation on {size.eval_questions} dev questions (k={K})", file=sys.stderr)
        from evaluation.external import load_external_benchmark

        bench = load_external_benchmark(records, limit=size.eval_questions)
        # The base model runs under the profile the SFT row runs under (as `harness_for` reads it).
        profile = {k: v for k, v in harness_for(sft_spec).profile().items() if k != "prompt_version"}
        turn_cap = {"max_turns": PROFILE["max_turns"]}
        stage = time.perf_counter()
        planned = [("hybrid", "hybrid", None), ("heuristic", "heuristic", turn_cap),
                   ("base", "transformers:smollm2", profile), ("sft", sft_spec, turn_cap)]
        if rl_spec and not args.skip_rl_dev_row:
            planned.append(("sft+cispo", rl_spec, turn_cap))
        rows = [run_row(row, spec, bench.tasks, bench.index, out, overrides, size)
                for row, spec, overrides in planned if args.dev_rows is None or row in args.dev_rows]
        if args.reranker is not None:  # selection's rows, each beside the row it selects from
            rows += [run_row("hybrid+rerank", "hybrid+rerank", bench.tasks, bench.index, out, None, size, args.reranker)]
            rows += [selected_row(f"{row['row']}+rerank", row, bench.tasks, bench.index, out, args.reranker)
                     for row in list(rows) if row["row"] in ("sft", "sft+cispo")]
        add_paired_differences(rows, out)
        timings["eval_s"] = time.perf_counter() - stage

    synth: list[dict[str, Any]] = []
    if not args.skip_synth:
        from core.layout import final_tasks_key
        from evaluation.synth_tasks import read_synth_tasks, tasks_from_synth
        from orchestration.runner import open_index

        index, chunks = open_index(name)
        tasks_path = customer_home / "home" / "artifacts" / final_tasks_key(name)
        held_out = tasks_from_synth(read_synth_tasks(tasks_path, split="test", limit=size.synth_test), chunks)
        stage = time.perf_counter()
        synth = [synth_rewards("sft", sft_spec, held_out, index, out, size)]
        if rl_spec:
            synth.append(synth_rewards("sft+cispo", rl_spec, held_out, index, out, size))
        timings["synth_eval_s"] = time.perf_counter() - stage
    timings["total_s"] = time.perf_counter() - started

    result = {"size": args.size, "question_style": args.question_style, "init_adapter": args.init_adapter,
              "student": str(args.student) if args.student else None, "synth_of": str(args.synth_of) if args.synth_of else None,
              "settings": asdict(size), "profile": PROFILE, "k": K, "dev_file": str(records),
              "corpus_documents": n_docs, "sync": synced, "tasks": {k: tasks.get(k) for k in ("generated", "verified", "by_split", "failed")} if tasks else None,
              "sft": {"adapter": sft["adapter_path"], "steps": sft["steps"], "metrics": sft["metrics"]},
              "rl": {"adapter": rl["adapter_path"], "steps": rl["steps"], "metrics": rl["metrics"]} if rl else None,
              "rows": rows, "synthetic_test": synth, "timings_s": {k: round(v, 1) for k, v in timings.items()}}
    # A synthetic-only measurement does not overwrite the dev table an earlier run of this student wrote.
    (out / ("learning-synth.json" if args.skip_dev else "learning.json")).write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    start = f", SFT continuing {args.init_adapter}" if args.init_adapter else ""
    if args.student:
        start = f", SFT row: {args.student} as shipped (not trained by this run)"
    if rows:
        print(f"\n## Learning benchmark, size {args.size}, {args.question_style} synthetic questions{start}: first {size.eval_questions} questions of {records.name}, k={K}\n")
        print(table(rows))
    if synth:
        split = f" of {args.synth_of.name}" if args.synth_of else ""
        print(f"\nHeld-out synthetic test split{split} (mean reward at k=5, beta 2):")
        for s in synth:
            print(f"- {s['row']}: {s['mean_reward']:.3f} [{s['ci'][0]:.3f}, {s['ci'][1]:.3f}] over {s['n']} tasks (answer found {s['answer_found']:.3f})")
    print("\nTimings (s): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()))
    cispo = f"CISPO {rl['steps']} steps" if rl else "CISPO not run (--skip-rl)"
    if rl and args.skip_rl_dev_row:
        cispo += " (compared on the synthetic split only: --skip-rl-dev-row)"
    print(f"tasks: {result['tasks']}; SFT {sft['steps']} steps; {cispo}; written to {out}")


if __name__ == "__main__":
    main()
