"""Task generation end to end, as plain functions the assets call.

`generate_tasks` = `synthesize_tasks` (seeds -> generated and verified tasks, chained up to
`max_hops` levels, failures kept with reasons) + `attach_all_distractors` (verified tasks
only) + `apply_splits`, summarized as a `TaskGenResult` whose `summary()` is exactly the
`searchsmith tasks --json` object. The three stages are public so the `synthetic_tasks`,
`verified_tasks` and `distractor_sets` assets can each run one.

Two generators share everything downstream of generation:
- `extractive` (offline, no LLM): `synth.extractive`, verified by code with the same rules;
- `llm`: the explore-and-generate loop over a `LLMClient`, verified by extraction.
Seeds are chosen by a seeded hash order over eligible documents, so the same seed and corpus
pick the same seeds. With a store, every finished LLM seed is recorded (`synth.records`) and
every teacher reply cached (`llm.cache`): a rerun skips finished seeds and pays for nothing
it already asked.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from core.progress import Progress
from core.storage import ArtifactStore
from core.task_settings import TaskGenConfig
from llm.cache import ResponseCache
from llm.client import LLMClient
from search.backend import SearchBackend
from synth.chaining import compose_extension, extend_with_llm
from synth.corpus_view import CorpusView
from synth.distractors import attach_distractors
from synth.explore import LoopSettings, ToolRunner, run_tool_loop, seed_message
from synth.extractive import ExtractiveGenerator
from synth.llm_verification import llm_answer_checker, verify_by_extraction
from synth.packs import PromptPack, load_pack, pack_fingerprint
from synth.records import SeedRecords
from synth.schema import SPLITS, GeneratedTask, SupportingItem, SynthTask
from synth.split import apply_splits
from synth.verify import VerifyRules, verify_task

log = logging.getLogger(__name__)

EXTRACTIVE_RULES = VerifyRules(truth_in_quotes=True)
LLM_RULES = VerifyRules()
TRANSIENT = "llm_error"


def task_fingerprint(config: TaskGenConfig, model: str | None) -> str:
    """What a finished seed's record depends on (distractor and split settings excluded)."""
    keys = ("generator", "domain", "seed", "max_hops", "docs_per_task", "extraction_attempts", "max_turns",
            "search_k", "read_chars", "verify_doc_chars")
    body = {key: getattr(config, key) for key in keys} | {"model": model, "pack": pack_fingerprint(config.domain)}
    if config.question_style != "cloze":  # cloze runs keep the fingerprints (and resumable seeds) they had
        body["question_style"] = config.question_style
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class SynthesisResult:
    tasks: list[SynthTask]
    seeds: int = 0
    seeds_resumed: int = 0
    seeds_without_tasks: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass
class TaskGenResult:
    tasks: list[SynthTask]
    generated: int
    verified: int
    failed_reasons: dict[str, int]
    by_split: dict[str, int]
    by_hops: dict[str, int]
    distractors_count: int
    llm_usage: dict[str, int]
    seeds: int = 0
    seeds_resumed: int = 0
    seeds_without_tasks: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def verified_tasks(self) -> list[SynthTask]:
        return [task for task in self.tasks if task.passed_verification]

    def summary(self) -> dict[str, Any]:
        """The `searchsmith tasks --json` keys."""
        return {"generated": self.generated, "verified": self.verified, "failed": dict(self.failed_reasons),
                "by_split": dict(self.by_split), "by_hops": dict(self.by_hops), "distractors": self.distractors_count}

    def metadata(self) -> dict[str, Any]:
        """Everything worth attaching to the asset materialization."""
        return self.summary() | {"llm_usage": dict(self.llm_usage), "seeds": self.seeds, "seeds_resumed": self.seeds_resumed,
                                 "seeds_without_tasks": self.seeds_without_tasks, "errors": len(self.errors)}


def select_seeds(doc_ids: list[str], seed: int, limit: int) -> list[str]:
    """`limit` documents in a seeded hash order (stable under reordering of the corpus)."""
    return sorted(doc_ids, key=lambda d: hashlib.sha256(f"{seed}\x00{d}".encode()).hexdigest())[:limit]


def _failed(seed_doc_id: str, level: int, reason: str, detail: str, config: TaskGenConfig, generator: str,
            parent: str | None = None) -> SynthTask:
    """A generation that produced no task is still a recorded failure, with its reason."""
    digest = hashlib.sha256(f"{generator}\x00{seed_doc_id}\x00{level}\x00{reason}\x00{parent}".encode()).hexdigest()[:20]
    return SynthTask(id=digest, level=level, seed_doc_id=seed_doc_id, parent_id=parent, generator=generator,
                     domain=config.domain, passed_verification=False, failure_reason=reason, verification={"error": detail})


# -- generation --------------------------------------------------------------------------------


def synthesize_extractive(corpus: CorpusView, config: TaskGenConfig, pack: PromptPack | None = None) -> SynthesisResult:
    """Offline tasks, verified by code; a chain stops at its first task that fails."""
    generator = ExtractiveGenerator(corpus, pack or load_pack(config.domain), max_hops=config.max_hops, seed=config.seed,
                                    exclude_kinds=config.excluded_kinds(), question_style=config.question_style)
    seeds = select_seeds(generator.eligible_seeds(), config.seed, config.max_seeds)
    result = SynthesisResult([], seeds=len(seeds))
    progress = Progress(log, "seed documents", len(seeds))
    for seed_doc_id in seeds:
        chain = generator.generate(seed_doc_id)
        result.seeds_without_tasks += not chain
        progress.advance(note=f"{len(result.tasks) + len(chain):,} tasks")
        for task in chain:
            checked = verify_task(task, corpus, EXTRACTIVE_RULES)
            result.tasks.append(checked)
            if not checked.passed_verification:
                break
    return result


def _from_generated(value: GeneratedTask, seed_doc_id: str, generator: str, domain: str) -> SynthTask:
    items = [SupportingItem(**item.model_dump()) for item in value.supporting_items]
    return SynthTask(level=0, clues=value.clues, question=value.question, truth=value.truth, truth_type=value.truth_type,
                     supporting_items=items, seed_doc_id=seed_doc_id, generator=generator, domain=domain).with_id()


def _llm_seed(seed_doc_id: str, corpus: CorpusView, backend: SearchBackend, llm: LLMClient, pack: PromptPack,
              config: TaskGenConfig) -> list[SynthTask]:
    generator = f"llm:{llm.model}"
    settings = LoopSettings(max_turns=config.max_turns, search_k=config.search_k, read_chars=config.read_chars)
    messages = [{"role": "system", "content": pack.render("explore", n_docs=config.docs_per_task)},
                {"role": "user", "content": seed_message(corpus, seed_doc_id, config.read_chars)}]
    loop = run_tool_loop(llm, ToolRunner(backend, corpus, settings), messages, GeneratedTask, name="search_task",
                         settings=settings)
    if loop.value is None:
        return [_failed(seed_doc_id, 0, loop.error or "generation_failed", loop.detail, config, generator)]

    def verify(task: SynthTask) -> SynthTask:
        return verify_by_extraction(llm, pack, task, corpus, LLM_RULES, attempts=config.extraction_attempts,
                                    doc_chars=config.verify_doc_chars)

    task = verify(_from_generated(loop.value, seed_doc_id, generator, config.domain))
    tasks = [task]
    while task.passed_verification and task.level + 1 < config.max_hops:
        extension = extend_with_llm(llm, backend, corpus, pack, task, settings)
        if extension.value is None:
            tasks.append(_failed(seed_doc_id, task.level + 1, f"extension_{extension.error}", extension.detail, config,
                                 generator, parent=task.id))
            break
        task = verify(compose_extension(task, extension.value))
        tasks.append(task)
    return tasks


def synthesize_with_llm(corpus: CorpusView, backend: SearchBackend, llm: LLMClient, config: TaskGenConfig,
                        store: ArtifactStore | None, prefix: str, pack: PromptPack | None = None) -> SynthesisResult:
    """Teacher-generated tasks, one seed per worker; finished seeds are recorded and skipped on rerun."""
    pack = pack or load_pack(config.domain)
    excluded = config.excluded_kinds()
    eligible = [doc_id for doc_id, doc in corpus.docs.items() if doc.kind not in excluded and doc.text.strip()]
    seeds = select_seeds(eligible, config.seed, config.max_seeds)
    records = SeedRecords(store, prefix, task_fingerprint(config, llm.model)) if store is not None else None
    result = SynthesisResult([], seeds=len(seeds))

    def run(seed_doc_id: str) -> tuple[list[SynthTask], bool, str | None]:
        if records is not None:
            cached = records.load(seed_doc_id, corpus)
            if cached is not None:
                return cached, True, None
        try:
            tasks = _llm_seed(seed_doc_id, corpus, backend, llm, pack, config)
        except Exception as error:  # recorded per seed and re-raised below if nothing worked
            log.exception("seed %s failed", seed_doc_id)
            detail = f"{type(error).__name__}: {error}"
            return [_failed(seed_doc_id, 0, "seed_error", detail, config, f"llm:{llm.model}")], False, detail
        if records is not None and not any(TRANSIENT in (task.failure_reason or "") for task in tasks):
            records.save(seed_doc_id, tasks, corpus)  # a seed that hit a dead endpoint is retried next run
        return tasks, False, None

    with ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="synth-seed") as pool:
        for tasks, resumed, error in pool.map(run, seeds):
            result.tasks.extend(tasks)
            result.seeds_resumed += resumed
            if error:
                result.errors.append(error)
    if seeds and len(result.errors) == len(seeds):
        raise RuntimeError(f"every seed failed; first error: {result.errors[0]}")
    return result


def synthesize_tasks(corpus: CorpusView, backend: SearchBackend | None, config: TaskGenConfig, llm: LLMClient | None = None,
                     store: ArtifactStore | None = None, prefix: str = "synth") -> SynthesisResult:
    """Stage 1 (+ verification and chaining, which need each other): generated tasks, failures kept."""
    if config.generator == "extractive":
        return synthesize_extractive(corpus, config)
    if llm is None:
        raise ValueError("generator 'llm' needs a LLMClient (customer file: teacher endpoint)")
    if backend is None:
        raise ValueError("generator 'llm' needs the customer's search index")
    return synthesize_with_llm(corpus, backend, llm, config, store, prefix)


# -- distractors, split, summary ---------------------------------------------------------------


def attach_all_distractors(tasks: list[SynthTask], backend: SearchBackend, config: TaskGenConfig,
                           llm: LLMClient | None = None) -> list[SynthTask]:
    """Distractors for every verified task (failed tasks pass through untouched)."""
    checker = llm_answer_checker(llm, load_pack(config.domain)) if llm is not None and config.llm_distractor_check else None

    def one(task: SynthTask) -> SynthTask:
        if not task.passed_verification or config.distractors_per_task == 0:
            return task
        return attach_distractors(task, backend, n=config.distractors_per_task, per_query_k=config.distractor_query_k,
                                  llm_check=checker)

    workers = config.workers if checker is not None else 1
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="synth-distract") as pool:
        return list(pool.map(one, tasks))


def summarize(tasks: list[SynthTask], synthesis: SynthesisResult, llm_usage: dict[str, int] | None = None) -> TaskGenResult:
    verified = [task for task in tasks if task.passed_verification]
    failed = Counter(task.failure_reason or "unknown" for task in tasks if not task.passed_verification)
    splits = Counter(task.split for task in verified)
    hops = Counter(str(task.hops) for task in verified)
    return TaskGenResult(
        tasks=tasks, generated=len(tasks), verified=len(verified), failed_reasons=dict(sorted(failed.items())),
        by_split={split: splits.get(split, 0) for split in SPLITS}, by_hops=dict(sorted(hops.items(), key=lambda kv: int(kv[0]))),
        distractors_count=sum(len(task.distractors) for task in verified), llm_usage=dict(llm_usage or {}),
        seeds=synthesis.seeds, seeds_resumed=synthesis.seeds_resumed, seeds_without_tasks=synthesis.seeds_without_tasks,
        errors=list(synthesis.errors),
    )


def generate_tasks(
    chunks: pl.DataFrame,
    documents: pl.DataFrame | None,
    backend: SearchBackend | None,
    config: TaskGenConfig,
    llm: LLMClient | None = None,
    store: ArtifactStore | None = None,
    *,
    prefix: str = "synth",
) -> TaskGenResult:
    """Seeds -> verified, chained, distracted, split tasks (failed ones kept with reasons).

    `prefix` is where this customer's records and teacher cache live in `store`, e.g.
    `"{customer}/synth"`. The teacher is cloned so `llm_usage` counts this run only; when it
    has no cache of its own and a store is given, the cache goes under `{prefix}/llm_cache`.
    Without a backend no distractors are mined.
    """
    corpus = CorpusView.from_frames(chunks, documents)
    run_llm = None
    if llm is not None and config.generator == "llm":
        cache = llm.cache if llm.cache is not None or store is None else ResponseCache(store, f"{prefix}/llm_cache")
        run_llm = llm.clone(cache=cache)
    synthesis = synthesize_tasks(corpus, backend, config, run_llm, store, prefix)
    tasks = synthesis.tasks
    if backend is not None:
        tasks = attach_all_distractors(tasks, backend, config, run_llm)
    tasks = apply_splits(tasks, config.split_fractions, config.split_salt)
    return summarize(tasks, synthesis, run_llm.usage.as_dict() if run_llm is not None else {})
