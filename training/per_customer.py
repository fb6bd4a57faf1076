"""The per-customer training stages behind `sft_trajectories`, `sft_checkpoint` and `cispo_checkpoint`.

Why a module apart from the assets: every decision here (which teacher, which tasks, where an
adapter lives, when a rerun may reuse paid work) is plain logic that tests and the CLI call
without Dagster; the assets only load inputs, call these and attach metadata.

Settings come from the customer file's `training:` section (`TrainingSettings`): the base model,
the teacher, the LoRA shape, SFT hyperparameters and CISPO settings, each validated strictly so
a typo fails at load time.

Where things live:
- the artifact store (local folder or S3) holds the durable record: teacher rollouts (resumable,
  per rollout), the kept trajectories as JSONL and a Hugging Face dataset folder, each adapter's
  files, and one manifest per stage, `{customer}/checkpoints/{sft|cispo}.json`, which the
  benchmark and the promotion gate read;
- adapters are trained in, and served from, a local folder under `$SEARCHSMITH_HOME/models/`
  (`transformers` and vLLM load folders, not URIs); a worker that lacks the folder pulls it
  from the store (`local_adapter`).

Reruns: an SFT run is identified by what determines its result (base model, LoRA, SFT
settings, the kept trajectories); a rerun with the same identity reuses the adapter instead of
training again. A CISPO run's folder is keyed the same way (base, settings, the SFT adapter it
starts from, the tasks), so a crashed run resumes from its last checkpoint (`train_cispo`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.harness import HarnessConfig
from agent.policy_base import Policy
from agent.policy_spec import PolicySpec
from agent.trajectory import Trajectory
from core.adapter_record import AdapterRecord, lift_flat_fields
from core.base_models import profile_for
from core.layout import (
    CHECKPOINT_STAGES,
    adapter_prefix,
    checkpoint_manifest_key,
    kept_trajectories_key,
    models_dir,
    reranker_manifest_key,
    sft_dataset_prefix,
    teacher_rollouts_prefix,
)
from core.storage import ArtifactStore, pull_folder, push_folder
from core.training_settings import CispoConfig, RerankerSettings, TeacherSettings, TrainingSettings
from llm.client import LLMClient
from search.backend import SearchBackend

if TYPE_CHECKING:  # the trainers are imported where they run (below), not when this module is
    from training.cispo_trainer import CispoResult
    from training.sft import SFTResult

LOG = logging.getLogger(__name__)


def base_profile(settings: TrainingSettings) -> Any:
    """The base model's `BaseModelProfile` (None when its folder is not on this machine)."""
    return profile_for(settings.base_model)


def student_harness(settings: TrainingSettings) -> HarnessConfig:
    """The student's profile (teacher rollouts run it in the full view when it is compact)."""
    return HarnessConfig.for_training(**settings.harness)


def student_policy(settings: TrainingSettings) -> Policy:
    """The base model as a policy: the student's tokenizer, window and chat template."""
    from agent.policies import load_policy

    return load_policy(f"transformers:{settings.base_model}")


# ---- run identity and manifests ---------------------------------------------------------------


def run_identity(*parts: Any) -> str:
    """A short content hash of what determines a training run's result."""
    body = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


# ---- manifests ----------------------------------------------------------------------------------


@dataclass
class CheckpointManifest:
    """What a training stage produced: read by the benchmark (as a `transformers:` candidate),
    the promotion gate (which carries its `adapter` record into the served record) and
    `searchsmith finetune --json`."""

    stage: str
    customer: str
    run_id: str
    adapter: AdapterRecord
    steps: int
    metrics: dict[str, Any]
    lineage: dict[str, Any] = field(default_factory=dict)
    reused: bool = False
    created_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat())

    @property
    def policy(self) -> str:
        return PolicySpec.for_adapter(self.adapter.path).name

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage, "customer": self.customer, "run_id": self.run_id, "adapter": self.adapter.model_dump(),
            "steps": self.steps, "metrics": self.metrics, "lineage": self.lineage, "reused": self.reused,
            "created_at": self.created_at, "policy": self.policy,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckpointManifest:
        data = lift_flat_fields(data)
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**{**fields, "adapter": AdapterRecord.model_validate(fields["adapter"])})


def read_manifest(store: ArtifactStore, customer: str, stage: str) -> CheckpointManifest | None:
    key = checkpoint_manifest_key(customer, stage)
    if not store.exists(key):
        return None
    return store.read_record(key, CheckpointManifest.from_dict)


def write_manifest(store: ArtifactStore, manifest: CheckpointManifest) -> None:
    store.write_text(checkpoint_manifest_key(manifest.customer, manifest.stage), json.dumps(manifest.to_dict(), indent=2, default=str))


def local_adapter(store: ArtifactStore, manifest: CheckpointManifest) -> Path:
    """The manifest's adapter as a local folder, pulled from the artifact store when this machine
    lacks it (another worker trained it)."""
    try:
        return manifest.adapter.local_folder(store)
    except FileNotFoundError as error:
        raise FileNotFoundError(f"adapter of {manifest.customer}/{manifest.stage}: {error}") from None


def checkpoint_adapters(store: ArtifactStore, customer: str) -> list[AdapterRecord]:
    """The adapter records of every stage that has produced a checkpoint, SFT first."""
    manifests = (read_manifest(store, customer, stage) for stage in CHECKPOINT_STAGES)
    return [manifest.adapter for manifest in manifests if manifest is not None]


def checkpoint_policies(store: ArtifactStore, customer: str) -> list[PolicySpec]:
    """The specs (`transformers:ADAPTER`) of every stage that has produced a checkpoint, SFT first,
    each adapter on this machine (pulled from the store when another worker trained it)."""
    specs = []
    for stage in CHECKPOINT_STAGES:
        manifest = read_manifest(store, customer, stage)
        if manifest is not None:
            specs.append(PolicySpec.for_adapter(local_adapter(store, manifest)))
    return specs


# ---- tasks --------------------------------------------------------------------------------------


def train_tasks(tasks: list, chunks: Any, max_tasks: int | None) -> list:
    """The verified train split as bench tasks (question = the agent's query, gold for scoring),
    first `max_tasks` in file order (stable across reruns, so rollouts are reused)."""
    from evaluation.synth_tasks import tasks_from_synth

    train = [task for task in tasks if task.split == "train" and task.passed_verification]
    if max_tasks is not None:
        train = train[:max_tasks]
    if not train:
        raise ValueError("no verified train tasks: materialize verified_tasks first (or generate more tasks)")
    return tasks_from_synth(train, chunks)


# ---- sft_trajectories ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Teacher:
    """The policy that writes the SFT trajectories. `selects`: its final rankings are rebuilt by
    selection with the customer's reranker (`POLICY+rerank`, as the search service runs it)."""

    policy: Policy
    description: str
    selects: bool = False


def teacher_policy(config: Any, settings: TeacherSettings, max_docs: int | None = None, llm: LLMClient | None = None,
                   served: PolicySpec | None = None) -> Teacher:
    """`policy: teacher` uses the customer's `teacher:` endpoint (tool calling); `auto` uses it when
    configured, else the best scripted policy the promotion gate has measured: `served` (the
    customer's served spec) when it is the heuristic with selection (`heuristic+rerank` won on the
    test split), the plain heuristic otherwise. A trained checkpoint never teaches its own
    successor. Any other value is a `load_policy` spec, `+rerank` allowed.
    `max_docs` (the profile's answer size) bounds the heuristic's answers: a model reads the limit
    in its prompt, the script is told it, so no answer runs past it.
    `llm`: the endpoint's client when the caller holds one (the Dagster resource's), so its
    limits and counters apply; otherwise one is built from the `teacher:` section."""
    from agent.policies import load_policy

    spec = settings.policy
    scripted = {"max_docs": max_docs} if max_docs is not None else {}
    endpoint = getattr(config, "teacher", None)
    if spec == "teacher" and endpoint is None:
        raise ValueError(f"customer {config.name!r}: training.teacher.policy is 'teacher' but the file has no `teacher:` endpoint")
    if spec in ("auto", "teacher") and endpoint is not None:
        from agent.policies.openai_policy import OpenAIPolicy

        if llm is None:
            llm = LLMClient(base_url=endpoint.base_url, model=endpoint.model, api_key_env=endpoint.api_key_env,
                            timeout_s=endpoint.timeout_s, max_retries=endpoint.max_retries, concurrency=endpoint.concurrency)
        return Teacher(OpenAIPolicy.over(llm), f"{endpoint.model} at {endpoint.base_url}")
    if spec == "auto":
        winner = served
        if winner is not None and winner.rerank and winner.n == 1 and winner.policy.startswith("heuristic"):
            return Teacher(load_policy(winner.policy, **scripted), f"{winner.name} (served: the promotion gate's pick on the test split)",
                           selects=True)
        return Teacher(load_policy("heuristic", **scripted), "heuristic (offline: no teacher endpoint)")
    requested = PolicySpec.parse(spec)
    inner = requested.without_selection().name
    return Teacher(load_policy(inner, **(scripted if inner.startswith("heuristic") else {})), spec, selects=requested.rerank)


def with_selection(trajectory: Trajectory, backend: SearchBackend, reranker: Any, k: int) -> Trajectory:
    """The trajectory with its final ranking rebuilt by selection (`agent.selection`) and its final
    answer rewritten to match, so SFT teaches the answer the served `+rerank` policy gives."""
    from agent.final_answer import format_final_answer
    from agent.selection import select

    if not trajectory.seen_doc_ids():
        return trajectory
    selected = trajectory.model_copy(deep=True)
    selected.final_ranking = select(trajectory, trajectory.question, backend, reranker, k)
    answer = format_final_answer([(d.chunk_id or d.doc_id, d.justification or "") for d in selected.final_ranking])
    final = next((turn for turn in reversed(selected.turns) if not turn.tool_calls), None)
    if final is not None:
        final.completion = answer
    selected.final_text = answer
    selected.metadata = {**selected.metadata, "selection": "reranker"}
    return selected


@dataclass
class SFTData:
    kept: list[Trajectory]
    metadata: dict[str, Any]
    histogram: Path | None = None


def collect_sft_trajectories(
    customer: str, store: ArtifactStore, backend: SearchBackend, bench_tasks: list, policy: Policy,
    settings: TeacherSettings, work_dir: Path, progress: bool = False, harness: Any = None, student: Policy | None = None,
    reranker: Any = None,
) -> SFTData:
    """Teacher rollouts (resumable, per rollout in the store) -> Context-1 filter -> kept JSONL and
    a `datasets` folder in the store; the recall histogram is written under `work_dir`.

    `harness` is the student's profile. Under the compact view the teacher still decides in the
    full view (it reads whole chunks) and the kept trajectories are replayed in the student's
    view (`student_view`) with the `student` policy's tokenizer, so SFT teaches what the student
    will read and write. `reranker`: the teacher selects (`Teacher.selects`): each rollout's final
    ranking is rebuilt by selection before the filter scores it."""
    from training.kept_trajectories import filter_trajectories, kept_dataset
    from training.sft_plots import plot_recall_histograms
    from training.teacher_trajectories import collect_teacher_trajectories

    teacher_harness = harness
    if harness is not None and harness.view == "compact":
        if student is None:
            raise ValueError("a compact student profile needs the student policy to render the teacher's trajectories")
        teacher_harness = harness.model_copy(update={"view": "full"})
    rollouts = collect_teacher_trajectories(
        bench_tasks, backend, policy, teacher_harness, k_rollouts=settings.k_rollouts, workers=settings.workers, store=store,
        prefix=teacher_rollouts_prefix(customer), seed=settings.seed, max_attempts=settings.max_attempts,
        progress=progress,
    )
    trajectories = rollouts.trajectories
    if reranker is not None:
        answer_size = harness.max_output_docs if harness is not None else HarnessConfig().max_output_docs
        trajectories = [with_selection(t, backend, reranker, answer_size) for t in trajectories]
    golds = {task.task_id: task.gold for task in bench_tasks}
    result = filter_trajectories(trajectories, golds, k=settings.k, seed=settings.filter_seed)
    if not result.kept:
        raise ValueError(f"the SFT filter kept none of {len(rollouts.trajectories)} teacher trajectories ({result.counts}); "
                         "a better teacher or more tasks are needed")
    kept = result.kept
    if teacher_harness is not harness:
        from training.student_view import render_in_student_view

        kept = render_in_student_view(result.kept, backend, student, harness)
    store.write_text(kept_trajectories_key(customer), "".join(t.model_dump_json() + "\n" for t in kept))
    dataset_dir = work_dir / "sft_dataset"
    kept_dataset(result).save_to_disk(str(dataset_dir))
    for stale in list(store.list(sft_dataset_prefix(customer))):
        store.delete(stale)
    push_folder(store, dataset_dir, sft_dataset_prefix(customer))
    histogram = plot_recall_histograms(result.recall_before, result.recall_after, work_dir / "recall_histogram.png")
    metadata = {"teacher": policy.name + ("+rerank" if reranker is not None else ""), "tasks": len(bench_tasks), **rollouts.metadata(), "filter": result.metadata(),
                "student_view": harness.view if harness is not None else "full"}
    return SFTData(kept, metadata, histogram)


def load_kept_trajectories(store: ArtifactStore, customer: str) -> list[Trajectory]:
    key = kept_trajectories_key(customer)
    if not store.exists(key):
        raise FileNotFoundError(f"no SFT trajectories for {customer!r}: materialize sft_trajectories first")
    return [Trajectory.model_validate_json(line) for line in store.read_text(key).splitlines() if line.strip()]


# ---- sft_checkpoint -----------------------------------------------------------------------------


def starting_adapter(config: Any) -> Path | None:
    """The customer's `training.init_adapter` as a folder (a packaged searcher's name, or a path
    relative to the customer file), or None for a fresh LoRA."""
    from training.searchers import searcher_dir

    name = config.training.init_adapter
    return searcher_dir(name, config.resolve) if name else None


def train_sft_checkpoint(
    customer: str, store: ArtifactStore, trajectories: list[Trajectory], settings: TrainingSettings, home: Path,
    init_adapter: Path | None = None, golds: dict[str, Any] | None = None,
) -> tuple[CheckpointManifest, list[tuple[int, float]]]:
    """LoRA SFT on the kept trajectories, continuing `init_adapter` (the resolved
    `training.init_adapter`) when given; reuses the adapter of an identical earlier run. `golds`
    (task id -> gold) are the verified tasks' answers the answer-choice phase relabels with."""
    from training.searchers import adapter_digest, check_continuable
    from training.sft import run_sft

    profile = student_harness(settings).profile()
    start = None
    if init_adapter is not None:
        check_continuable(init_adapter, settings.base_model, profile)
        start = adapter_digest(init_adapter)
    run_id = run_identity("sft", settings.base_model, start or settings.lora.model_dump(), settings.sft.identity(),
                          sorted(t.id for t in trajectories))
    reusable = _reusable_run(store, customer, "sft", run_id)
    if reusable is not None:
        return reusable, []
    out = models_dir(home, customer, "sft", run_id)
    continued = {"init_adapter": str(init_adapter), "init_adapter_digest": start} if start else {}
    result = run_sft(trajectories, settings.base_model, out, lora=settings.lora, sft=settings.sft,
                     lineage={"customer": customer, "run_id": run_id, **continued}, harness_profile=profile, init_adapter=init_adapter,
                     golds=golds)
    lineage = {"trajectories": len(trajectories), **continued}
    manifest = _publish(store, CheckpointManifest("sft", customer, run_id, _trained_adapter(result, customer, "sft", run_id),
                                                  result.steps, result.metrics, lineage=lineage))
    return manifest, result.loss_curve


def _trained_adapter(result: SFTResult | CispoResult, customer: str, stage: str, run_id: str) -> AdapterRecord:
    """The record of the adapter a trainer (SFT or CISPO) just wrote: its folder, the store key
    it is published under, its base model."""
    return AdapterRecord(path=str(Path(result.adapter_path).resolve()), store_key=adapter_prefix(customer, stage, run_id),
                         base_model=str(result.base_model))


def _reusable_run(store: ArtifactStore, customer: str, stage: str, run_id: str) -> CheckpointManifest | None:
    """The stage's manifest when it records this very run and its adapter is still reachable."""
    previous = read_manifest(store, customer, stage)
    if previous is None or previous.run_id != run_id:
        return None
    try:
        local_adapter(store, previous)
    except FileNotFoundError:
        LOG.warning("the manifest's %s adapter is gone; training again", stage)
        return None
    previous.reused = True
    return previous


def _publish(store: ArtifactStore, manifest: CheckpointManifest) -> CheckpointManifest:
    """Copy the trained adapter into the store, then point the stage's manifest at it."""
    push_folder(store, Path(manifest.adapter.path), manifest.adapter.store_key)
    write_manifest(store, manifest)
    return manifest


# ---- cispo_checkpoint ---------------------------------------------------------------------------


def rl_config(settings: TrainingSettings, has_init_adapter: bool, benchmark_k: int | None = None) -> CispoConfig:
    """The trainer's config: the customer's RL settings, the LoRA shape of `training.lora` for a
    fresh adapter, and CUDA when present unless the file pins a device.

    `benchmark_k`: the customer file's `benchmark.k`; the reward is scored at it (`reward_k`), so
    RL optimizes the figure the benchmark reports. An explicit `training.rl.reward_k` wins;
    without either, `CispoConfig`'s default (5, the benchmark's default k)."""
    import torch

    rl = settings.rl
    values = rl.model_dump(exclude={"max_tasks", "from_sft"})
    values["harness"] = {**settings.harness, **rl.harness}
    if not has_init_adapter:
        from training.lora_shape import lora_shape

        targets, _dropout = lora_shape(settings.lora, profile_for(settings.base_model))  # CISPO has no dropout
        values.update(lora_r=settings.lora.rank, lora_alpha=settings.lora.alpha, lora_target_modules=targets)
    if "device" not in rl.model_fields_set and torch.cuda.is_available():
        values["device"] = "cuda"
    if benchmark_k is not None and "reward_k" not in rl.model_fields_set:
        values["reward_k"] = benchmark_k
    return CispoConfig.model_validate(values)


def train_cispo_checkpoint(
    customer: str, store: ArtifactStore, backend: SearchBackend, bench_tasks: list, settings: TrainingSettings, home: Path,
    log: Any = None, benchmark_k: int | None = None, init_adapter: Path | None = None,
) -> tuple[CheckpointManifest, list[dict[str, Any]]]:
    """CISPO from the SFT adapter (when there is one and `from_sft`), else from `init_adapter`
    (the resolved `training.init_adapter`) when given, resuming a crashed run."""
    from training.cispo_trainer import train_cispo
    from training.searchers import adapter_digest

    init = read_manifest(store, customer, "sft") if settings.rl.from_sft else None
    init_path = local_adapter(store, init) if init is not None else init_adapter
    config = rl_config(settings, init_path is not None, benchmark_k)
    start = init.run_id if init else (adapter_digest(init_adapter) if init_adapter is not None else None)
    run_id = run_identity("cispo", settings.base_model, config.model_dump(mode="json"), start,
                          sorted(task.task_id for task in bench_tasks))
    reusable = _reusable_run(store, customer, "cispo", run_id)  # gone: train again, resuming from checkpoints
    if reusable is not None:
        return reusable, []
    out = models_dir(home, customer, "cispo", run_id)
    result = train_cispo(config, bench_tasks, backend, settings.base_model, init_path, out, log=log)
    lineage = {"init_adapter": str(init_path) if init_path else None, "init_run_id": init.run_id if init else None,
               "tasks": len(bench_tasks), "resumed_from": result.resumed_from,
               "checkpoints": [str(p) for p in result.checkpoints]}
    manifest = _publish(store, CheckpointManifest("cispo", customer, run_id, _trained_adapter(result, customer, "cispo", run_id),
                                                  result.steps, _jsonable(result.metrics), lineage=lineage))
    return manifest, result.history


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


# ---- reranker_checkpoint ------------------------------------------------------------------------


@dataclass
class RerankerCheckpoint:
    """The customer's trained reranker and how it compares on the dev split: hybrid's own order,
    the untrained start and the trained model reordering the same hybrid documents."""

    customer: str
    run_id: str
    path: str  # local folder (a bi-encoder or a CrossEncoder: search.reranker.folder_kind)
    key: str  # its copy in the artifact store
    base: str
    train: dict[str, Any]
    dev: dict[str, dict[str, Any]]  # hybrid | start | trained -> recall_at_k, mrr, ...
    selection: dict[str, Any] = field(default_factory=dict)  # the calibrated policy weight (training.selection_weight)
    # The dev figures with each task asked by a short view of its question (synth.query_views):
    # whether the reranker helps when the question does not copy the passage, as people's do not.
    dev_brief: dict[str, dict[str, Any]] = field(default_factory=dict)
    reused: bool = False
    created_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat())

    @property
    def beats_start(self) -> bool:
        trained, start = self.dev.get("trained", {}), self.dev.get("start", {})
        return (trained.get("recall_at_k", 0.0), trained.get("mrr", 0.0)) > (start.get("recall_at_k", 0.0), start.get("mrr", 0.0))

    @property
    def start_at_ceiling(self) -> bool:
        """The untrained start already ranks every dev task perfectly (recall@k and MRR 1), so the
        dev split cannot show a gain: on a small corpus the bi-encoder's start often does."""
        start = self.dev.get("start", {})
        return start.get("recall_at_k", 0.0) >= 1.0 and start.get("mrr", 0.0) >= 1.0

    def verdict(self) -> tuple[str, str]:
        """`pass`, `warn` or `fail` for the dev check, with why. `warn`: the start is at the ceiling
        and the trained model matches it, so nothing was lost and nothing can be shown; the lineage
        goes on rather than stopping a small customer on a check its data cannot decide."""
        trained, start = self.dev.get("trained", {}), self.dev.get("start", {})
        tasks = int(trained.get("tasks", 0))
        if self.beats_start:
            return "pass", f"trained recall@k {trained.get('recall_at_k')} / MRR {trained.get('mrr')} over the start's {start.get('recall_at_k')} / {start.get('mrr')} on {tasks} dev tasks"
        if self.start_at_ceiling and trained.get("recall_at_k", 0.0) >= 1.0 and trained.get("mrr", 0.0) >= 1.0:
            return "warn", (f"the untrained start already ranks all {tasks} dev tasks perfectly (recall@k and MRR 1.0), and so does "
                            "the trained reranker: this dev split cannot show a gain (more verified tasks would)")
        return "fail", (f"trained recall@k {trained.get('recall_at_k')} / MRR {trained.get('mrr')} does not beat the start's "
                        f"{start.get('recall_at_k')} / {start.get('mrr')} on {tasks} dev tasks")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "beats_start": self.beats_start}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RerankerCheckpoint:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def read_reranker(store: ArtifactStore, customer: str) -> RerankerCheckpoint | None:
    key = reranker_manifest_key(customer)
    return store.read_record(key, RerankerCheckpoint.from_dict) if store.exists(key) else None


def local_reranker(store: ArtifactStore, checkpoint: RerankerCheckpoint) -> Path:
    """The reranker's folder on this machine, pulled from the store when another worker trained it."""
    folder = Path(checkpoint.path)
    if not (folder / "config.json").is_file() and pull_folder(store, checkpoint.key, folder) == 0:
        raise FileNotFoundError(f"reranker of {checkpoint.customer} is neither at {folder} nor in the store at {checkpoint.key}")
    return folder


def _calibrate_selection(folder: Path, dev: list, chunks: Any, backend: SearchBackend, k: int) -> dict[str, Any]:
    """The policy weight and way of judging selection uses with this reranker, chosen on the dev
    split and written beside its weights (`training.selection_weight`)."""
    from evaluation.synth_tasks import tasks_from_synth
    from search.reranker import Reranker, write_selection
    from training.selection_weight import calibrate

    calibration = calibrate(tasks_from_synth(dev, chunks), backend, Reranker.load(folder), k)
    write_selection(Path(folder), calibration)
    for policy, choice in calibration["by_policy"].items():
        how = f"chains from {choice['chain_anchors']} first links" if choice["chain_anchors"] else "the question alone"
        LOG.info(f"selection for {policy}: weight {choice['policy_weight']}, judged by {how} "
                 f"(dev recall@{k} by weight {choice['recall_at_k_by_weight']})")
    return calibration


def _calibrated(selection: dict[str, Any]) -> bool:
    """A calibration of today's choices: chains (2026-12-05) and a choice per kind of candidate
    (2026-12-07). One from before is made again, once, beside the reused weights."""
    return "chain_anchors" in selection and "by_policy" in selection


# Written beside the weights once training ends: a rerun after a later step failed (the dev check,
# the calibration, the upload) resumes from the weights instead of paying for the training again.
RERANKER_TRAINED_FILE = "searchsmith_trained.json"


def _finished_training(folder: Path, run_id: str) -> Any:
    """The `RerankerRun` an earlier attempt of this run finished in `folder`, or None."""
    from training.reranker import RerankerRun

    record = folder / RERANKER_TRAINED_FILE
    if not record.is_file() or not (folder / "config.json").is_file():
        return None
    data = json.loads(record.read_text(encoding="utf-8"))
    if data.pop("run_id", None) != run_id:
        return None
    return RerankerRun(**{**data, "path": folder})


# The dev check's figures and the calibration of one run on one dev split, kept as each finishes.
RERANKER_CHECKED_FILE = "searchsmith_checked.json"


def _finished_checks(folder: Path, run_id: str, dev: list) -> dict[str, Any]:
    """What an earlier attempt of this run recorded in `folder` for these dev tasks ({} if none)."""
    record = folder / RERANKER_CHECKED_FILE
    if not record.is_file():
        return {}
    data = json.loads(record.read_text(encoding="utf-8"))
    if data.get("run_id") != run_id or data.get("dev_ids") != sorted(t.id for t in dev):
        return {}
    return {key: data[key] for key in ("dev", "dev_brief", "selection") if key in data}


def _record_checks(folder: Path, run_id: str, dev: list, checks: dict[str, Any]) -> dict[str, Any]:
    record = {"run_id": run_id, "dev_ids": sorted(t.id for t in dev), **checks}
    (folder / RERANKER_CHECKED_FILE).write_text(json.dumps(record, indent=2, default=str), encoding="utf-8")
    return checks


def reranker_identity(settings: RerankerSettings) -> dict[str, Any]:
    """The settings that decide the trained weights. Short views and chain pairs off leave them
    out, and a cross-encoder leaves its kind out, so a reranker trained before either existed is still reused,
    not paid for again; so does precision `auto`, which is how fast this machine computes, like the thread count
    (a precision named in the customer file is part of the identity)."""
    exclude = {"torch_threads", "eval_tasks", "eval_depth"}
    if settings.precision == "auto":
        exclude |= {"precision"}
    if not settings.short_queries:
        exclude |= {"short_queries", "short_query_words"}
    if not settings.chain_pairs:
        exclude |= {"chain_pairs"}
    if settings.kind == "cross":
        exclude |= {"kind"}
    return settings.model_dump(exclude=exclude)


def train_reranker_checkpoint(customer: str, store: ArtifactStore, backend: SearchBackend, tasks: list, chunks: Any,
                              settings: RerankerSettings, home: Path, k: int = 5) -> RerankerCheckpoint:
    """Train on the verified train split and judge on the dev split (`training.reranker`); an
    identical earlier run (same start, settings and tasks) is reused, not trained again."""
    from search.reranker import Reranker, start_model_dir, write_selection
    from training.reranker import dev_recall, train_reranker, training_pairs

    train = [t for t in tasks if t.split == "train"][: settings.max_tasks]
    dev = [t for t in tasks if t.split == "dev"][: settings.eval_tasks]
    base = settings.base or str(start_model_dir())
    run_id = run_identity("reranker", base, reranker_identity(settings), sorted(t.id for t in train), k)
    previous = read_reranker(store, customer)
    if previous is not None and previous.run_id == run_id:
        try:
            folder = local_reranker(store, previous)
            previous.reused = True
            if not _calibrated(previous.selection):  # calibrated before today's choices (or never): calibrate it now
                previous.selection = _calibrate_selection(folder, dev, chunks, backend, k)
                push_folder(store, folder, previous.key)
                store.write_text(reranker_manifest_key(customer), json.dumps(previous.to_dict(), indent=2, default=str))
            return previous
        except FileNotFoundError:
            LOG.warning("the reranker's files are gone; training again")
    out = models_dir(home, customer, "reranker", run_id)
    run = _finished_training(out, run_id)
    if run is None:
        (out / RERANKER_CHECKED_FILE).unlink(missing_ok=True)  # checks of weights this training replaces
        run = train_reranker(training_pairs(train, chunks, backend, settings), settings, out)
        (out / RERANKER_TRAINED_FILE).write_text(json.dumps({"run_id": run_id, **run.as_dict()}, indent=2), encoding="utf-8")
    else:
        LOG.info(f"reranker {out}: trained by an earlier attempt that stopped after training; checking it, not training again")
    # The dev check and the calibration are recorded beside the weights as each finishes, for the
    # same reason as the training: a rerun after the upload failed repeats none of them.
    checks = _finished_checks(out, run_id, dev)
    if "dev" not in checks:
        figures = {"hybrid": dev_recall(None, dev, chunks, backend, settings.eval_depth, k, label="hybrid"),
                   "start": dev_recall(Reranker.load(base, kind=settings.kind), dev, chunks, backend, settings.eval_depth, k, label="start"),
                   "trained": dev_recall(Reranker.load(out), dev, chunks, backend, settings.eval_depth, k, label="trained")}
        # The same dev tasks asked briefly (the synthetic questions copy document sentences, people's do
        # not): does the trained order still beat hybrid's? The untrained start is not worth the minutes.
        brief = {name: dev_recall(model, dev, chunks, backend, settings.eval_depth, k, label=f"{name}, asked briefly",
                                  short_words=settings.short_query_words)
                 for name, model in (("hybrid", None), ("trained", Reranker.load(out)))}
        checks = _record_checks(out, run_id, dev, {"dev": figures, "dev_brief": brief})
    else:
        LOG.info(f"reranker {out}: judged on the dev split by an earlier attempt; not judging again")
    if not _calibrated(checks.get("selection", {})):
        checks = _record_checks(out, run_id, dev, {**checks, "selection": _calibrate_selection(out, dev, chunks, backend, k)})
    else:
        write_selection(out, checks["selection"])  # where `Reranker.load` reads it
    figures, brief, selection = checks["dev"], checks["dev_brief"], checks["selection"]
    checkpoint = RerankerCheckpoint(customer, run_id, str(out.resolve()), adapter_prefix(customer, "reranker", run_id), base,
                                    {**run.as_dict(), "train_tasks": len(train)}, figures, selection, dev_brief=brief)
    push_folder(store, out, checkpoint.key)
    store.write_text(reranker_manifest_key(customer), json.dumps(checkpoint.to_dict(), indent=2, default=str))
    return checkpoint


def calibrated_start(tasks: list, chunks: Any, backend: SearchBackend, settings: RerankerSettings, out: Path, k: int = 5) -> Path:
    """The reranker's untrained start as a reranker folder, calibrated by the same rule on the same
    dev tasks as a trained one (`_calibrate_selection`): the baseline a trained reranker has to beat
    on real questions for the recipe's claim (training on the customer's own tasks, not the start,
    is what selection gains from) to hold. `bench/reranker_dev.py --against-start` measures it.

    Only a bi-encoder's start is a folder: a cross-encoder's is the same encoder with a fresh,
    seeded head, which exists only once it has been built."""
    import shutil

    from search.reranker import start_model_dir

    if settings.kind != "bi":
        raise ValueError(f"training.reranker.kind {settings.kind}: only a bi-encoder's untrained start is a folder to calibrate "
                         "(a cross-encoder starts from a fresh head)")
    dev = [t for t in tasks if t.split == "dev"][: settings.eval_tasks]
    if not dev:
        raise ValueError("no dev-split tasks to calibrate the start on: run `searchsmith tasks CUSTOMER` first")
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(Path(settings.base or start_model_dir()), out)
    _calibrate_selection(out, dev, chunks, backend, k)
    return out
