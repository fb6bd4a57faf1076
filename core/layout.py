"""Where everything a customer owns is kept: every artifact-store key and local folder, in one place.

Why one module: a key is an interface between stages (the benchmark reads what training wrote,
the search service reads what the promotion gate wrote, a worker pulls what another pushed).
When each stage spelled its own, the same key was a literal in one module and a function in
another, and moving a stage meant hunting for strings. Keys are relative to the artifact store
(a local folder or an S3 prefix, `core.storage`); prefixes end with `/` when they name a folder
the store keeps whole (`push_folder`/`pull_folder`).

    {customer}/corpus/     raw_documents.parquet, quarantine.parquet, chunks.parquet, source_status.json
    {customer}/index/      bm25/ (the sparse leg; dense vectors live in Chroma)
    {customer}/synth/      synthetic_tasks.jsonl, verified_tasks.jsonl, verified_dataset/, tasks.jsonl,
                           distractors.parquet, seeds/, llm_cache/
    {customer}/training/   teacher_rollouts/, sft_trajectories.jsonl, sft_dataset/
    {customer}/checkpoints/{sft|cispo|reranker}.json and {sft|cispo|reranker}/{run_id}/ (model files)
    {customer}/benchmark/  reports, trajectories, summary.json
    {customer}/serving/    served.json (the promotion record), manifest.json (what vLLM loads)
"""

from __future__ import annotations

from pathlib import Path

# Training stages that write a checkpoint manifest.
CHECKPOINT_STAGES = ("sft", "cispo")

# ---- corpus -----------------------------------------------------------------------------------


def documents_key(customer: str) -> str:
    return f"{customer}/corpus/raw_documents.parquet"


def quarantine_key(customer: str) -> str:
    return f"{customer}/corpus/quarantine.parquet"


def chunks_key(customer: str) -> str:
    return f"{customer}/corpus/chunks.parquet"


def source_status_key(customer: str) -> str:
    """Each source's status in the last sync (JSON list of `SourceStatus.as_dict()`)."""
    return f"{customer}/corpus/source_status.json"


# ---- index ------------------------------------------------------------------------------------


def bm25_prefix(customer: str) -> str:
    return f"{customer}/index/bm25/"


# ---- synthetic tasks --------------------------------------------------------------------------


def synth_prefix(customer: str) -> str:
    """Per-seed records (`seeds/`) live under here, so an interrupted generation resumes."""
    return f"{customer}/synth"


def synthetic_key(customer: str) -> str:
    return f"{synth_prefix(customer)}/synthetic_tasks.jsonl"


def verified_key(customer: str) -> str:
    return f"{synth_prefix(customer)}/verified_tasks.jsonl"


def verified_dataset_prefix(customer: str) -> str:
    return f"{synth_prefix(customer)}/verified_dataset/"


def final_tasks_key(customer: str) -> str:
    """The verified tasks with their distractor sets: what training and the benchmark read."""
    return f"{synth_prefix(customer)}/tasks.jsonl"


def distractors_key(customer: str) -> str:
    return f"{synth_prefix(customer)}/distractors.parquet"


def llm_cache_prefix(customer: str) -> str:
    return f"{synth_prefix(customer)}/llm_cache"


# ---- training ---------------------------------------------------------------------------------


def training_prefix(customer: str) -> str:
    return f"{customer}/training"


def teacher_rollouts_prefix(customer: str) -> str:
    return f"{training_prefix(customer)}/teacher_rollouts"


def kept_trajectories_key(customer: str) -> str:
    return f"{training_prefix(customer)}/sft_trajectories.jsonl"


def sft_dataset_prefix(customer: str) -> str:
    return f"{training_prefix(customer)}/sft_dataset/"


def checkpoint_manifest_key(customer: str, stage: str) -> str:
    if stage not in CHECKPOINT_STAGES:
        raise ValueError(f"unknown training stage {stage!r}; use one of {CHECKPOINT_STAGES}")
    return f"{customer}/checkpoints/{stage}.json"


def reranker_manifest_key(customer: str) -> str:
    """The customer's trained reranker (`training.reranker`): its run, files and dev-split figures."""
    return f"{customer}/checkpoints/reranker.json"


def adapter_prefix(customer: str, stage: str, run_id: str) -> str:
    return f"{customer}/checkpoints/{stage}/{run_id}/"


def models_dir(home: Path, customer: str, stage: str, run_id: str) -> Path:
    """The local folder an adapter is trained in and served from (`transformers` and vLLM load
    folders, not URIs); a worker without it pulls `adapter_prefix` from the store."""
    return home / "models" / customer / stage / run_id


# ---- benchmark --------------------------------------------------------------------------------


def benchmark_prefix(customer: str) -> str:
    return f"{customer}/benchmark/"


def benchmark_summary_key(customer: str) -> str:
    """Each suite's per-candidate figures: what the promotion gate compares."""
    return f"{benchmark_prefix(customer)}summary.json"


# ---- serving ----------------------------------------------------------------------------------


def served_key(customer: str) -> str:
    return f"{customer}/serving/served.json"


def serving_manifest_key(customer: str) -> str:
    return f"{customer}/serving/manifest.json"
