"""The customer file's `training:` section: base model, teacher, LoRA shape, SFT and CISPO settings.

Why Pydantic models in core: a customer file carries them and a typo must fail when the file is
loaded (`extra="forbid"`), not silently train with a default; the training stage runs them. A
snapshot (`model_dump()`) is written into each adapter's sidecar, so a checkpoint says how it
was made. Checks that need the base model's files on this machine (its family's LoRA targets)
run in `training.per_customer.training_settings`.

Defaults are sized for the offline demo (SmolLM2-135M on 2 CPU cores, a few minutes); a GPU
customer raises `max_length`, `epochs` and `max_steps`. Precision and gradient checkpointing
are "auto": bf16 with checkpointing on CUDA; on CPU bf16 where it is native (AVX512-BF16, AMX),
fp32 elsewhere, without checkpointing (`core.cpu_precision`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from core.base_models import LLAMA_LORA_TARGETS, profile_for
from core.harness_settings import HarnessOverrides


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---- the reward's defaults (evaluation.reward scores with them) ----

DEFAULT_EPS = 0.01

# The output size RL rewards are scored at: the benchmark's k (`benchmark.k` of a customer file,
# `searchsmith bench --k`, both 5 by default). The harness may return more documents
# (`max_output_docs`, 10); scoring the reward there would train for a figure nobody reports.
DEFAULT_REWARD_K = 5


class TeacherSettings(_Strict):
    """How teacher trajectories are collected over the train split."""

    # `auto`: the customer's `teacher:` endpoint when it has one, else the offline heuristic;
    # offline, `heuristic+rerank` once the promotion gate serves it (it won on the test split);
    # `teacher`: that endpoint (an error without one); anything else is a `load_policy` spec (`+rerank` allowed).
    policy: str = "auto"
    k_rollouts: int = Field(1, ge=1, description="rollouts per task, seeds seed..seed+k-1")
    workers: int = Field(4, ge=1, description="concurrent episodes")
    seed: int = 0
    max_attempts: int = Field(2, ge=1, description="tries per rollout within one run before it is recorded as failed")
    max_tasks: int | None = Field(None, ge=1, description="cap on train tasks (demo runs)")
    filter_seed: int = 0
    k: int | None = Field(None, ge=1, description="output size the filter scores at (None: the whole ranking)")


class LoraSettings(_Strict):
    """The adapter's shape; saved into adapter_config.json by peft."""

    rank: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(default_factory=lambda: list(LLAMA_LORA_TARGETS))


class SFTSettings(_Strict):
    """Optimisation and data-shaping settings of one SFT run."""

    learning_rate: float = Field(2e-4, gt=0)
    epochs: float = Field(1.0, gt=0)
    max_steps: int = Field(-1, description="> 0 caps the episode optimizer steps (overrides epochs); 0 with answer_steps: "
                                          "no episode steps, only the answer-choice phase")
    max_length: int = Field(2048, ge=16, description="longer samples are reported and dropped, never truncated")
    max_samples: int | None = Field(None, ge=1, description="cap on training samples (seeded choice)")
    batch_size: int = Field(1, ge=1)
    grad_accum: int = Field(4, ge=1)
    warmup_ratio: float = Field(0.0, ge=0.0, lt=1.0, description="share of the steps spent warming up")
    weight_decay: float = Field(0.0, ge=0.0)
    lr_scheduler: str = "linear"
    seed: int = 0
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    gradient_checkpointing: bool | None = None  # None: on with CUDA, off on CPU
    torch_threads: int | None = Field(
        None, ge=1, description="CPU threads; 1 is fastest for tiny models on a busy machine"
    )
    logging_steps: int = Field(1, ge=1)
    final_answer_weight: float = Field(
        1.0, gt=0, description="loss weight of a final answer's tokens against the tool calls' (1: every token alike); "
                               "in a merged episode the answer is about 15 of 2,500 tokens")
    answer_steps: int = Field(0, ge=0, description="after the episodes, optimizer steps on the final answers alone with "
                                                   "their context frozen (training.answer_choice); 0: none")
    answer_batch_size: int = Field(8, ge=1, description="final answers per answer-choice step")
    answer_learning_rate: float | None = Field(None, gt=0, description="the answer-choice phase's (None: learning_rate)")
    answer_target: Literal["gold", "teacher"] = Field(
        "gold", description="gold: the teacher's answer relabelled from the verified task (answer documents first); "
                            "teacher: as the teacher wrote it")
    answer_order: Literal["ranked", "reading"] = Field(
        "ranked", description="ranked: the answer-choice phase teaches compact answers most relevant first; reading: "
                              "their first max_output_docs references in the order shown (scored as a set at k, so "
                              "the student's counting form is kept and only which references to skip is taught)")
    answer_train_opening: bool = Field(
        False, description="train the answer's opening ('[') in the answer-choice phase too; off: only the choice is "
                           "trained there, the decision to answer is the episodes' (training.answer_choice)")

    def identity(self) -> dict[str, Any]:
        """The settings that decide the trained weights. With no answer-choice phase its fields are
        left out, so an adapter trained before they existed is still reused, not paid for again."""
        if self.answer_steps:  # the default order is left out too: adapters trained before it existed are reused
            return self.model_dump(exclude={"answer_order"} if self.answer_order == "ranked" else set())
        return self.model_dump(exclude={name for name in type(self).model_fields if name.startswith("answer_")})

    @model_validator(mode="after")
    def _check(self) -> SFTSettings:
        if self.max_steps < -1 or (self.max_steps == 0 and not self.answer_steps):
            raise ValueError("max_steps must be -1 (use epochs) or positive (0 only with answer_steps: the answer-choice "
                             "phase alone, continuing init_adapter)")
        return self


class CispoConfig(BaseModel):
    """Run settings; stored in every checkpoint's sidecar.

    `lora_dropout` must be 0: the policy that computes the importance ratio has no dropout (see
    `load_trainable_model`); the field stays so older sidecars and customer files still validate.
    `reward_k`: the output size the reward scores, the benchmark's k (`benchmark.k` of the
    customer file, 5 by default), not the harness's `max_output_docs` (10): RL must optimize the
    figure the benchmark and the promotion gate report.
    """

    group_size: int = Field(8, ge=2)
    tasks_per_step: int = Field(4, ge=1)  # Context-1: 128 queries x 8 rollouts
    steps: int | None = Field(None, ge=1)  # None: `epochs` passes over the tasks
    epochs: float = Field(5.0, gt=0)
    substeps: int = Field(4, ge=1)  # optimizer steps per rollout batch
    passes: int = Field(1, ge=1)  # passes over the rollout batch (each split into `substeps`)
    learning_rate: float = Field(5e-5, gt=0)
    warmup_steps: int = Field(0, ge=0)  # optimizer steps of linear warmup
    weight_decay: float = Field(0.0, ge=0.0)
    eps_low: float = Field(1.0, ge=0)  # >= 1: no lower bound on the IS weight (MiniMax)
    eps_high: float = Field(4.0, ge=0)  # weight capped at 1 + eps_high = 5 (ScaleRL's eps_max, TRL's default advice)
    max_grad_norm: float = Field(1.0, gt=0)
    abort_loss: float = Field(1e3, gt=0)
    abort_grad_norm: float = Field(1e5, gt=0)
    temperature: float = Field(1.0, gt=0)
    max_new_tokens: int = Field(512, ge=1)
    lora_r: int = Field(16, ge=1)
    lora_alpha: int = Field(32, ge=1)
    lora_dropout: float = Field(0.0, ge=0, lt=1)  # must be 0 (validator below)
    lora_target_modules: str | list[str] = "all-linear"
    micro_batch_tokens: int | None = Field(None, ge=1)  # None: `memory_plan()`
    merge_turns: bool = True
    gradient_checkpointing: bool | None = None  # None: `memory_plan()`
    curriculum: bool = True
    curriculum_floor: float = Field(0.1, ge=0)
    beta_start: float = Field(4.0, gt=0)  # F-beta's beta, annealed from start to end: recall weighed beta^2 times precision
    beta_end: float = Field(2.0, gt=0)
    reward_eps: float = Field(DEFAULT_EPS, ge=0)
    reward_k: int = Field(DEFAULT_REWARD_K, ge=1)  # output size the reward scores: the benchmark's k
    granularity: Literal["document", "fact"] = "document"
    harness: HarnessOverrides = Field(default_factory=HarnessOverrides)  # over HarnessConfig.for_training
    max_rollout_retries: int = Field(2, ge=0)
    rollout_workers: int = Field(8, ge=1)
    checkpoint_every: int = Field(10, ge=1)
    save_trajectories: bool = False  # every rollout, whole, under trajectories/step-N.jsonl
    keep_checkpoints: int | None = Field(None, ge=1)  # None: keep every step's checkpoint
    seed: int = 0
    device: str = "cpu"
    dtype: str | None = None  # default float32 on CPU (measured: core/cpu_precision.py), bfloat16 elsewhere

    def memory_plan(self) -> tuple[int, bool]:
        """(tokens per forward, recompute activations) for this run, unset fields filled per device.

        Why these defaults: a trained searcher's rollout is a 5-6K-token sequence, and a forward
        keeps every layer's activations for the backward pass. Measured on SmolLM2-135M with a
        rank-32 LoRA in fp32 (`bench/cispo_memory.py`, 2026-12-02, one thread on a loaded 2-core
        machine, peak RSS of one forward and backward): 4,096 tokens took 10.7-10.9 GB without
        recomputation and 5.4-5.6 GB with it, at 1.16-1.26x the time (1.5x at 512 tokens); 8,192
        tokens with it took 9.9 GB; a 16,384-token forward without it (the old default) was killed
        at 22.7 GB on a 24 GB machine. A sequence is never split, so a long rollout is forwarded
        whole whatever the micro-batch; recomputation is what keeps it in memory. So on CPU a step
        forwards 4,096 tokens at a time with recomputed activations (training is about half of a
        CPU step, so the step pays roughly 10-15% for it; `gradient_checkpointing: false` buys it
        back where memory allows); on an accelerator 16,384 tokens at a time, also recomputed (as
        SFT does with CUDA: large models need it).
        """
        on_cpu = self.device == "cpu"
        tokens = self.micro_batch_tokens or (4_096 if on_cpu else 16_384)
        recompute = True if self.gradient_checkpointing is None else self.gradient_checkpointing
        return tokens, recompute

    @field_validator("lora_dropout")
    @classmethod
    def _no_dropout(cls, value: float) -> float:
        if value != 0:
            raise ValueError(f"lora_dropout={value}: CISPO trains without dropout (the importance ratio pi/pi_old "
                             "must be 1 on the sampler's own weights; sampling runs without dropout); use 0")
        return value


class RLSettings(CispoConfig):
    """The customer file's `training.rl` section: `CispoConfig` fields plus task selection.
    The LoRA shape of a fresh adapter comes from `training.lora`; when an SFT adapter exists,
    RL continues it (its shape is fixed)."""

    model_config = ConfigDict(extra="forbid")

    max_tasks: int | None = Field(None, ge=1, description="cap on train tasks (demo runs)")
    from_sft: bool = True  # start from the SFT adapter when one exists


# Per kind, what a customer file leaves unset (`RerankerSettings.kind`). A bi-encoder learns from
# in-batch negatives plus one hard negative per positive, so verified distractors (which share the
# seed document's words, not its topic) are left out and a batch is as large as CPU memory allows;
# it starts from a working judge, so it moves gently. A cross-encoder starts from a fresh head.
RERANKER_KIND_DEFAULTS: dict[str, dict[str, Any]] = {
    "bi": {"distractors": 0, "short_queries": 1, "batch_size": 32, "learning_rate": 2e-5},
    "cross": {"distractors": 4, "short_queries": 0, "batch_size": 16, "learning_rate": 5e-5},
}


class RerankerSettings(_Strict):
    """The customer's reranker, trained on (question, chunk) pairs of its own verified train split
    (supporting chunks positive; hybrid hard negatives, and for a cross-encoder verified
    distractors, negative), judged on the dev split against the start it was trained from.

    `kind`: `bi` (default) fine-tunes the packaged all-MiniLM-L6-v2 bi-encoder, which already ranks
    by relevance (it is hybrid's dense leg), with a ranking loss; `cross` trains a cross-encoder,
    whose start is the same encoder with a fresh head. Measured on the multi-hop dev file (453 real
    questions, k=5, `bench/bench_dev.py`, docs/results.md): hybrid 0.653, hybrid+rerank 0.658 with the
    fine-tuned cross-encoder, 0.678 with the fine-tuned bi-encoder. Fields left unset take the kind's defaults
    (`RERANKER_KIND_DEFAULTS`)."""

    enabled: bool = True
    kind: Literal["bi", "cross"] = "bi"
    base: str | None = None  # a local folder of the kind's model; None: the packaged all-MiniLM-L6-v2
    max_tasks: int | None = Field(None, ge=1, description="cap on train tasks (demo runs)")
    distractors: int = Field(0, ge=0, description="verified distractors per task used as negatives")
    hard_negatives: int = Field(4, ge=0, description="top hybrid hits outside the gold documents per task")
    short_queries: int = Field(1, ge=0, description="short views of each train question added as queries "
                               "(synth.query_views: its wh-word, an entity or two, a few other words)")
    short_query_words: int = Field(10, ge=3, description="words per short view")
    chain_pairs: bool = Field(True, description="for each later hop of a multi-hop task, also the question extended "
                              "with the previous hop's evidence against this hop's evidence: how selection judges "
                              "chains (search.reranker.Reranker.chain_order), which calibration usually picks. On by "
                              "default since 2026-12-07: on the dev file's 453 real questions heuristic+rerank 0.837 "
                              "against 0.817 without (paired +0.020 [0.007, 0.035]), hybrid+rerank 0.689 against 0.675, "
                              "for 1.55x the training time (docs/results.md)")
    epochs: float = Field(1.0, gt=0)
    batch_size: int = Field(32, ge=1)
    learning_rate: float = Field(2e-5, gt=0)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    max_length: int = Field(256, ge=16)
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="auto: bf16 autocast where the CPU has bf16 natively or on a bf16 GPU, fp32 elsewhere "
        "(training.reranker.training_precision)")
    seed: int = 0
    eval_tasks: int | None = Field(100, ge=1, description="dev-split tasks the check runs (None: all)")
    eval_depth: int = Field(20, ge=2, description="hybrid documents reordered per dev task")
    torch_threads: int | None = Field(None, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _kind_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {**RERANKER_KIND_DEFAULTS.get(data.get("kind", "bi"), {}), **data}
        return data


class TrainingSettings(BaseModel):
    """The customer file's `training:` section."""

    model_config = ConfigDict(extra="forbid")

    base_model: str = "smollm2"  # `smollm2`, a local model folder; never downloaded at run time
    # A searcher adapter SFT continues instead of a fresh LoRA: a packaged searcher's name
    # (`smollm2-searcher`, see `training.searchers`) or an adapter folder (relative to the customer
    # file). Its shape is fixed, so `lora` may not be set with it; it must have been trained on
    # `base_model` under this section's `harness` profile.
    init_adapter: str | None = None
    teacher: TeacherSettings = Field(default_factory=TeacherSettings)
    lora: LoraSettings = Field(default_factory=LoraSettings)
    sft: SFTSettings = Field(default_factory=SFTSettings)
    rl: RLSettings = Field(default_factory=RLSettings)
    reranker: RerankerSettings = Field(default_factory=RerankerSettings)
    # HarnessConfig overrides for teacher and RL rollouts (the student's budget: a small model's
    # context); `rl.harness` adds to these for RL alone.
    harness: HarnessOverrides = Field(default_factory=HarnessOverrides)

    @model_validator(mode="after")
    def _fits_base_model(self) -> TrainingSettings:
        """The base model's family decides the chat format, LoRA targets and loading options
        (`core.base_models`); only a setting that cannot work with it is refused here, when the
        model's folder is on this machine (a machine without it validates the rest)."""
        if self.init_adapter is not None and "lora" in self.model_fields_set:
            raise ValueError(f"training.lora and training.init_adapter {self.init_adapter!r} are both set: a continued "
                             "adapter keeps the shape it was trained with; remove training.lora")
        profile = profile_for(self.base_model)
        forced = profile.lora_dropout if profile is not None else None
        if (forced is not None and "dropout" in self.lora.model_fields_set and self.lora.dropout != forced
                and "target_modules" not in self.lora.model_fields_set):
            raise ValueError(f"training.lora.dropout {self.lora.dropout}: a {profile.family} base model trains LoRA on "
                             f"its fused experts through peft's parameter targeting, which has no dropout; use "
                             f"{forced} or leave it unset")
        return self
