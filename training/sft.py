"""LoRA SFT with TRL's `SFTTrainer` on pre-tokenized per-turn samples; a peft adapter plus a sidecar.

Why pre-tokenized: the samples' labels already mask everything but the assistant's tokens
(`sft_samples`), per turn, against views the conversation format cannot express (pruning
rewrites the context). TRL 1.16 takes an `input_ids` + `labels` dataset as is; we also pass
`skip_prepare_dataset` so it neither re-tokenizes nor truncates (overlong samples were already
reported and left out) and its collator only pads (labels with -100).

Precision (`auto`): bf16 wherever it is fast, that is on CUDA and on CPUs that multiply bf16
natively (`core.cpu_precision`), fp32 on other CPUs; fp16 only on CUDA. In bf16 the base model
is loaded in bf16, peft keeps the LoRA weights (and so the optimizer) in fp32, and Trainer
autocasts. Gradient checkpointing is on with CUDA. Seeded through `SFTConfig.seed` (model init
of the adapter, data order).

Output: the adapter in peft's standard layout (`adapter_config.json` +
`adapter_model.safetensors`, what vLLM's `--lora-modules name=path` loads) and
`searchsmith_adapter.json` next to it: base model, data lineage, settings, metrics and the
loss curve. `SFTResult` carries the same fields for the asset and the CLI.
"""

from __future__ import annotations

import hashlib
import logging
import resource
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.adapter_sidecar import SIDECAR, write_sidecar
from agent.trajectory import Trajectory
from core.cpu_precision import cpu_training_precision
from core.training_settings import LoraSettings, SFTSettings
from training.searchers import ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapter_digest
from training.sft_samples import SampleSet, build_samples

if TYPE_CHECKING:
    from training.answer_choice import AnswerSample

ADAPTER_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS)

log = logging.getLogger(__name__)


@dataclass
class SFTResult:
    adapter_path: str
    base_model: str
    steps: int
    metrics: dict[str, Any]
    loss_curve: list[tuple[int, float]] = field(default_factory=list)
    sidecar_path: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fingerprint(values: Iterable[str]) -> str:
    """Order-free content hash of a set of ids (trajectories, tasks): the data lineage."""
    digest = hashlib.sha256()
    for value in sorted(set(values)):
        digest.update(value.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def data_lineage(trajectories: Sequence[Trajectory], **extra: Any) -> dict[str, Any]:
    """What the adapter was trained on: trajectory and task fingerprints, teachers, counts."""
    return {
        "trajectories": len(trajectories),
        "trajectory_fingerprint": fingerprint(t.id for t in trajectories),
        "tasks": len({t.task_id for t in trajectories}),
        "task_fingerprint": fingerprint(str(t.task_id) for t in trajectories),
        "teachers": sorted({t.policy for t in trajectories}),
        **extra,
    }


def resolve_base_model(base_model: str | Path) -> Path:
    """A local model folder; `smollm2` is the cached SmolLM2-135M-Instruct copy (never downloaded)."""
    from agent.policies.transformers_policy import resolve_model_dir

    return resolve_model_dir(base_model)


def load_tokenizer(base_model: str | Path) -> Any:
    """The base model's tokenizer with the chat template its family renders with (`model_family`)."""
    from transformers import AutoTokenizer

    from agent.policies.model_family import prepare_tokenizer

    return prepare_tokenizer(AutoTokenizer.from_pretrained(str(resolve_base_model(base_model))))


def prepare_samples(trajectories: Sequence[Trajectory], base_model: str | Path, sft: SFTSettings) -> SampleSet:
    """Samples in the base model's chat format, overlong ones reported, capped to `max_samples`."""
    samples = build_samples(trajectories, load_tokenizer(base_model), sft.max_length)
    return samples.select(sft.max_samples, sft.seed)


def _device(device: str | None) -> str:
    import torch

    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def _precision(sft: SFTSettings, device: str) -> str:
    import torch

    if sft.precision == "fp16" and not device.startswith("cuda"):
        raise ValueError("sft.precision fp16 needs a CUDA device; on CPU use bf16 or fp32")
    if sft.precision != "auto":
        return sft.precision
    if device.startswith("cuda"):
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return cpu_training_precision()


def _loss_curve_callback() -> Any:
    """A `TrainerCallback` collecting (step, loss) and the token count from the trainer's logs."""
    from transformers import TrainerCallback

    class LossCurve(TrainerCallback):
        def __init__(self) -> None:
            self.points: list[tuple[int, float]] = []
            self.tokens = 0

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.points.append((int(state.global_step), float(logs["loss"])))
                log.info("SFT step %d/%d, loss %.3f", state.global_step, state.max_steps, float(logs["loss"]))
            if logs and "num_tokens" in logs:
                self.tokens = int(float(logs["num_tokens"]))

    return LossCurve()


def train_sft(
    samples: SampleSet,
    base_model: str | Path,
    output_dir: str | Path,
    *,
    lora: LoraSettings | None = None,
    sft: SFTSettings | None = None,
    lineage: dict[str, Any] | None = None,
    device: str | None = None,
    base_model_name: str | None = None,
    harness_profile: dict[str, Any] | None = None,
    init_adapter: str | Path | None = None,
    answers: Sequence[AnswerSample] = (),
) -> SFTResult:
    """Train a LoRA adapter on `samples` and save it (plus sidecar) to `output_dir`.

    `answers`: the final answers of the answer-choice phase that follows the episodes when
    `sft.answer_steps` is set (`training.answer_choice`, context frozen).

    `init_adapter`: an adapter folder to continue (a shipped searcher, `training.searchers`)
    instead of a fresh LoRA of shape `lora`; the sidecar records its shape and digest.

    `samples` must come from the same tokenizer as `base_model` (see `prepare_samples`).
    `base_model_name` is what the sidecar and the result report (the customer's spelling, e.g.
    `smollm2`); adapter_config.json keeps the loadable folder as `base_model_name_or_path`.
    `harness_profile` (`HarnessConfig.profile()` of the trajectories' view) is recorded so the
    adapter runs under the settings it learned everywhere (benchmark, RL, serving).
    """
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM

    from agent.policies.model_family import load_options, lora_targets
    from core.base_models import profile_for
    from training.lora_shape import lora_shape

    lora = lora or LoraSettings()
    sft = sft or SFTSettings()
    if not samples.samples and sft.max_steps != 0:
        raise ValueError(f"no training samples ({len(samples.overlong)} longer than max_length {samples.max_length})")
    model_dir = resolve_base_model(base_model)
    device = _device(device)
    precision = _precision(sft, device)
    on_gpu = device.startswith("cuda")
    checkpointing = on_gpu if sft.gradient_checkpointing is None else sft.gradient_checkpointing
    threads_before = torch.get_num_threads()
    if sft.torch_threads and not on_gpu:
        torch.set_num_threads(sft.torch_threads)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        tokenizer = load_tokenizer(model_dir)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        profile = profile_for(model_dir)
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype,
                                                     **load_options(profile))
        if on_gpu:
            torch.cuda.reset_peak_memory_stats()
        if init_adapter is not None:
            model, lora, targets, dropout = _continued_adapter(model, Path(init_adapter))
            peft_config = None
        else:
            target_names, dropout = lora_shape(lora, profile)
            targets = lora_targets(target_names, model)
            peft_config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=dropout, **targets,
                                     bias="none", task_type="CAUSAL_LM")
        if sft.max_steps == 0:  # the answer-choice phase alone (SFTSettings allows it only then)
            if peft_config is not None:
                from peft import get_peft_model

                model = get_peft_model(model, peft_config)
            run = EpisodeRun(model)
        else:
            run = _train_episodes(model, peft_config, samples, sft, tokenizer, precision, checkpointing, on_gpu)
        if sft.answer_steps and not run.single_process:
            raise ValueError("sft.answer_steps: the answer-choice phase trains in one process; run it without torchrun")
        answer_metrics = _answer_phase(run.model, answers, sft, dtype if precision == "bf16" else None)
        if run.main_process:  # under torchrun, one rank writes
            run.model.save_pretrained(str(out))
            missing = [name for name in ADAPTER_FILES if not (out / name).is_file()]
            if missing:
                raise RuntimeError(f"peft did not write {missing} to {out}")
    finally:
        torch.set_num_threads(threads_before)
    tokens, wall = run.tokens or _tokens_seen(samples, run.steps, sft), run.wall_s
    metrics = {
        "train_loss": run.loss,
        "first_loss": run.curve[0][1] if run.curve else None,
        "final_loss": run.curve[-1][1] if run.curve else None,
        "steps": run.steps,
        "epochs": run.epochs,
        "samples": len(samples.samples),
        "overlong": len(samples.overlong),
        "tokens": tokens,
        "loss_tokens": sum(s.n_loss_tokens for s in samples.samples),
        "final_answer_loss_tokens": sum(s.n_final_tokens for s in samples.samples),
        "final_answer_weight": sft.final_answer_weight,
        "wall_s": round(wall, 2),
        "tokens_per_s": round(tokens / wall, 1) if wall > 0 else None,
        "device": device,
        "precision": precision,
        "gradient_checkpointing": checkpointing,
        **answer_metrics,
        **_peak_memory(on_gpu),
    }
    base_name = base_model_name or str(model_dir)
    sidecar = {
        "kind": "sft",
        "base_model": base_name,
        "base_model_path": str(model_dir),
        "adapter_files": list(ADAPTER_FILES),
        "lineage": {**_init_lineage(init_adapter, lineage or {}), **(lineage or {})},
        "data": samples.metadata(),
        "config": {"lora": lora.model_dump(), "sft": sft.model_dump()},
        "lora_targets": {**targets, "dropout": dropout},
        "base_profile": profile.to_dict() if profile is not None else None,
        "harness_profile": harness_profile or {},
        "metrics": metrics,
        "loss_curve": run.curve,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if run.main_process:
        write_sidecar(out, sidecar)
    steps = metrics["steps"] + metrics.get("answer_steps", 0)  # optimizer steps in all, both phases
    return SFTResult(str(out), base_name, steps, metrics, list(run.curve), str(out / SIDECAR))


@dataclass
class EpisodeRun:
    """What the episode phase left: the trained peft model and its figures (none when it ran no step)."""

    model: Any
    loss: float | None = None
    steps: int = 0
    epochs: float = 0.0
    wall_s: float = 0.0
    tokens: int = 0
    curve: list[tuple[int, float]] = field(default_factory=list)
    main_process: bool = True
    single_process: bool = True


def _train_episodes(model: Any, peft_config: Any, samples: SampleSet, sft: SFTSettings, tokenizer: Any, precision: str,
                    checkpointing: bool, on_gpu: bool) -> EpisodeRun:
    """TRL's SFTTrainer on the episode samples (a fresh LoRA from `peft_config`, or the peft model given)."""
    from trl import SFTConfig, SFTTrainer

    from training.weighted_sft_loss import WeightPaddingCollator, weighted_sft_trainer_class

    weighted = sft.final_answer_weight != 1.0
    with tempfile.TemporaryDirectory(prefix="sft-trainer-") as scratch:
        args = SFTConfig(
            output_dir=scratch, num_train_epochs=sft.epochs, max_steps=sft.max_steps,
            per_device_train_batch_size=sft.batch_size, gradient_accumulation_steps=sft.grad_accum,
            learning_rate=sft.learning_rate, lr_scheduler_type=sft.lr_scheduler,
            weight_decay=sft.weight_decay, seed=sft.seed, data_seed=sft.seed, logging_steps=sft.logging_steps,
            bf16=precision == "bf16", fp16=precision == "fp16",
            use_cpu=not on_gpu, report_to="none", save_strategy="no",
            **_renamed_args(SFTConfig, checkpointing, sft.warmup_ratio),
            max_length=None, dataset_kwargs={"skip_prepare_dataset": True}, packing=False,
            dataloader_num_workers=0, disable_tqdm=not sys.stderr.isatty(),
            remove_unused_columns=not weighted,  # the weights column reaches the collator
        )
        curve = _loss_curve_callback()
        trainer_class, collator = SFTTrainer, None
        if weighted:
            trainer_class, collator = weighted_sft_trainer_class(), WeightPaddingCollator(tokenizer.pad_token_id)
        trainer = trainer_class(
            model=model, args=args, train_dataset=samples.to_dataset(sft.final_answer_weight),
            processing_class=tokenizer, peft_config=peft_config, callbacks=[curve], data_collator=collator,
        )
        started = time.perf_counter()
        output = trainer.train()
        wall = time.perf_counter() - started
    return EpisodeRun(trainer.model, float(output.training_loss), int(trainer.state.global_step), float(trainer.state.epoch or 0.0),
                      wall, curve.tokens, list(curve.points), trainer.accelerator.is_main_process,
                      trainer.accelerator.num_processes == 1)


def _answer_phase(model: Any, answers: Sequence[AnswerSample], sft: SFTSettings, autocast_dtype: Any) -> dict[str, Any]:
    """The answer-choice phase after the episodes (`sft.answer_steps`), on the trained peft model."""
    if not sft.answer_steps:
        return {}
    from training.answer_choice import train_answer_choice

    if not answers:
        raise ValueError("sft.answer_steps is set but the trajectories have no final answer to train the choice on")
    return train_answer_choice(model, answers, steps=sft.answer_steps, batch_size=sft.answer_batch_size,
                               learning_rate=sft.answer_learning_rate or sft.learning_rate, seed=sft.seed,
                               autocast_dtype=autocast_dtype)


def _continued_adapter(model: Any, folder: Path) -> tuple[Any, LoraSettings, dict[str, Any], float]:
    """`model` wrapped in the trainable adapter at `folder`, with that adapter's shape as settings."""
    from peft import PeftConfig, PeftModel

    config = PeftConfig.from_pretrained(str(folder))
    model = PeftModel.from_pretrained(model, str(folder), config=config, is_trainable=True)
    named = config.target_modules or []
    modules = [named] if isinstance(named, str) else sorted(named)
    lora = LoraSettings(rank=config.r, alpha=config.lora_alpha, dropout=config.lora_dropout,
                        target_modules=modules or list(LoraSettings().target_modules))
    targets = {"target_modules": modules}
    if getattr(config, "target_parameters", None):
        targets["target_parameters"] = sorted(config.target_parameters)
    return model, lora, targets, config.lora_dropout


def _init_lineage(init_adapter: str | Path | None, lineage: dict[str, Any]) -> dict[str, Any]:
    """Which adapter this run continued, by content; a caller that keyed its run by the digest
    passes it in `lineage` and the weights are not hashed again."""
    if init_adapter is None or "init_adapter_digest" in lineage:
        return {}
    return {"init_adapter": str(init_adapter), "init_adapter_digest": adapter_digest(init_adapter)}


def run_sft(
    trajectories: Sequence[Trajectory],
    base_model: str | Path,
    output_dir: str | Path,
    *,
    lora: LoraSettings | None = None,
    sft: SFTSettings | None = None,
    lineage: dict[str, Any] | None = None,
    device: str | None = None,
    harness_profile: dict[str, Any] | None = None,
    init_adapter: str | Path | None = None,
    golds: Mapping[str, Any] | None = None,
) -> SFTResult:
    """Kept trajectories -> per-turn samples in the base model's format -> adapter (what the asset calls).

    `lineage` adds to the computed trajectory/task fingerprints (e.g. the filter's counts or
    upstream data versions); `base_model` is recorded as given (`smollm2`, a folder, an id).
    `golds` (task id -> `Gold`) relabels the answer-choice phase's answers when `sft.answer_target`
    is `gold`; that phase needs them then.
    """
    sft = sft or SFTSettings()
    samples = prepare_samples(trajectories, base_model, sft)
    answers: list[AnswerSample] = []
    if sft.answer_steps:
        from training.answer_choice import answer_samples

        if sft.answer_target == "gold" and golds is None:
            raise ValueError("sft.answer_target gold relabels answers from the verified tasks: pass their golds")
        max_docs = (harness_profile or _recorded_profile(trajectories)).get("max_output_docs", 5)
        answers = answer_samples(trajectories, load_tokenizer(base_model), golds=golds if sft.answer_target == "gold" else None,
                                 max_docs=max_docs, max_length=sft.max_length, train_opening=sft.answer_train_opening,
                                 reading_order=sft.answer_order == "reading")
    if harness_profile is None:  # the trajectories were recorded under one profile: the first says which
        harness_profile = _recorded_profile(trajectories)
    return train_sft(samples, base_model, output_dir, lora=lora, sft=sft, device=device,
                     lineage=data_lineage(trajectories, **(lineage or {})), base_model_name=str(base_model),
                     harness_profile=harness_profile, init_adapter=init_adapter, answers=answers)


def _recorded_profile(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    from agent.harness import HarnessConfig

    if not trajectories:
        return {}
    recorded = {k: v for k, v in trajectories[0].config.items() if k in HarnessConfig.model_fields}
    return HarnessConfig(**recorded).profile()


def _renamed_args(config_class: Any, checkpointing: bool, warmup_ratio: float) -> dict[str, Any]:
    """Arguments transformers 5 renamed: activation checkpointing, warmup as a float `warmup_steps`."""
    fields = getattr(config_class, "__dataclass_fields__", {})
    out: dict[str, Any] = {}
    out["activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"] = checkpointing
    if "warmup_ratio" in fields:
        out["warmup_ratio"] = warmup_ratio
    else:
        out["warmup_steps"] = warmup_ratio  # a float in [0, 1) is a ratio of the total steps
    return out


def _tokens_seen(samples: SampleSet, steps: int, sft: SFTSettings) -> int:
    per_step = sft.batch_size * sft.grad_accum
    lengths = [len(s.input_ids) for s in samples.samples]
    mean = sum(lengths) / len(lengths) if lengths else 0
    return int(mean * per_step * steps)


def _peak_memory(on_gpu: bool) -> dict[str, float]:
    """Peak CUDA memory on GPU; on CPU the process's peak resident set (includes everything loaded)."""
    import torch

    peak = {"peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    if on_gpu:
        peak["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return peak


