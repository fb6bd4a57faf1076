"""Tasks as a Hugging Face `datasets.Dataset` (save_to_disk, Parquet, Hub) and as JSONL.

The features are declared, not inferred: a batch where every task has zero distractors would
otherwise infer `null` list types and refuse to concatenate with the next batch. JSONL is the
artifact-store format (one task per line, exactly `SynthTask.model_dump_json`), and what
`searchsmith bench --tasks FILE.jsonl` reads. `datasets` is imported only when a dataset is
built, not at import time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from synth.schema import SynthTask


def task_features():
    from datasets import Features, Sequence, Value

    strings = Sequence(Value("string"))
    return Features({
        "id": Value("string"),
        "level": Value("int32"),
        "clues": strings,
        "question": Value("string"),
        "truth": Value("string"),
        "truth_type": Value("string"),
        "supporting_items": [{
            "id": Value("string"), "reasoning": Value("string"), "clue_quotes": strings, "item_quotes": strings,
            "contains_truth": Value("bool"), "truth_quotes": strings,
        }],
        "bridging_item": {"id": Value("string"), "relevant_prev_id": Value("string"), "reasoning": Value("string")},
        "parent_id": Value("string"),
        "seed_doc_id": Value("string"),
        "distractors": [{
            "chunk_id": Value("string"), "doc_id": Value("string"), "mined_for": strings, "query": Value("string"),
            "score": Value("float64"), "check": Value("string"),
        }],
        "rejected_distractors": [{"chunk_id": Value("string"), "doc_id": Value("string"), "reason": Value("string")}],
        "passed_verification": Value("bool"),
        "failure_reason": Value("string"),
        "verification": Value("string"),
        "generator": Value("string"),
        "domain": Value("string"),
        "split": Value("string"),
    })


def task_record(task: SynthTask) -> dict[str, Any]:
    """A flat-enough dict for Arrow: `verification` (a free-keyed map) becomes JSON text."""
    import json

    record = task.model_dump()
    record["verification"] = json.dumps(task.verification, sort_keys=True)
    if record["bridging_item"] is None:
        record["bridging_item"] = {"id": "", "relevant_prev_id": "", "reasoning": ""}
    return record


def task_from_record(record: dict[str, Any]) -> SynthTask:
    import json

    record = dict(record)
    if isinstance(record.get("verification"), str):
        record["verification"] = json.loads(record["verification"] or "{}")
    bridging = record.get("bridging_item")
    if not bridging or not bridging.get("id"):
        record["bridging_item"] = None
    return SynthTask.model_validate(record)


def to_dataset(tasks: Iterable[SynthTask]):
    """A `datasets.Dataset` with one row per task and declared features."""
    from datasets import Dataset

    records, features = [task_record(task) for task in tasks], task_features()
    if not records:  # from_list([]) loses the declared columns and then refuses its own features
        return Dataset.from_dict({column: [] for column in features}, features=features)
    return Dataset.from_list(records, features=features)


def save_dataset(tasks: Iterable[SynthTask], path: str | Path) -> Path:
    """`Dataset.save_to_disk` (reload with `datasets.load_from_disk`)."""
    dataset = to_dataset(tasks)
    # An empty dataset saved with the default sharding writes no data file, and then does not load.
    dataset.save_to_disk(str(path), num_shards=1 if dataset.num_rows == 0 else None)
    return Path(path)


def write_parquet(tasks: Iterable[SynthTask], path: str | Path) -> Path:
    to_dataset(tasks).to_parquet(str(path))
    return Path(path)


def push_to_hub(tasks: Iterable[SynthTask], repo_id: str, *, token_env: str = "HF_TOKEN", private: bool = True) -> None:
    """Publish when configured; the token comes from the environment variable `token_env`."""
    import os

    to_dataset(tasks).push_to_hub(repo_id, token=os.environ.get(token_env), private=private)


def distractor_table(tasks: Iterable[SynthTask]):
    """One row per distractor candidate of every task, kept or rejected (with the reason): the
    `distractor_sets` artifact, joinable to tasks by `task_id` and to the index by `chunk_id`."""
    import polars as pl

    rows = []
    for task in tasks:
        for d in task.distractors:
            rows.append({"task_id": task.id, "chunk_id": d.chunk_id, "doc_id": d.doc_id, "mined_for": d.mined_for,
                         "query": d.query, "score": d.score, "check": d.check, "kept": True, "reason": None})
        for r in task.rejected_distractors:
            rows.append({"task_id": task.id, "chunk_id": r.chunk_id, "doc_id": r.doc_id, "mined_for": [], "query": "",
                         "score": 0.0, "check": "", "kept": False, "reason": r.reason})
    schema = {"task_id": pl.Utf8, "chunk_id": pl.Utf8, "doc_id": pl.Utf8, "mined_for": pl.List(pl.Utf8), "query": pl.Utf8,
              "score": pl.Float64, "check": pl.Utf8, "kept": pl.Boolean, "reason": pl.Utf8}
    return pl.DataFrame(rows, schema=schema)


def tasks_to_jsonl(tasks: Iterable[SynthTask]) -> str:
    return "".join(task.model_dump_json() + "\n" for task in tasks)


def tasks_from_jsonl(text: str) -> list[SynthTask]:
    return [SynthTask.model_validate_json(line) for line in text.splitlines() if line.strip()]
