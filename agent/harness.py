"""The agent harness: one provider-agnostic observe -> infer -> act state machine.

Shared unchanged by distillation (a teacher policy), RL rollouts (the policy being trained,
soft hints on), evaluation and serving (a checkpoint under the profile it was trained in, hints
included; baselines without): whatever differs is configuration
(`HarnessConfig`) or the policy, never the loop. Each episode is recorded whole as a
`Trajectory` (every turn with the exact messages the model saw, every tool call with its result
ids, pruned ids, token counts and timings).

Budget (Context-1): the view is counted with the policy's tokenizer; every observation ends
with `[Token usage: N/T]`; past `soft_threshold * T` a prune-or-finish hint is added when
enabled; past `hard_cutoff * T` every tool except `prune_chunks` is rejected with an error.
Search and read results are cut to the per-call budget and to what is left of `T` after a
reserve for the model's next reply.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agent.compact_view import parse_reference_answer, pruned_reference_marker
from agent.final_answer import parse_final_answer
from agent.harness_view import MESSAGE_OVERHEAD_TOKENS, View, pruned_marker
from agent.policy_base import EpisodePolicy, Policy, PolicyStep, TokenCounter, ToolCall
from agent.prompts import (
    ANSWER_OPENING,
    COMPACT_FORCE_FINAL,
    COMPACT_MALFORMED_REPLY,
    FORCE_FINAL,
    HARD_CUTOFF_ERROR,
    MALFORMED_REPLY,
    PRUNE_CHUNKS,
    SOFT_HINT,
    USAGE_LINE,
    VIEWS,
    prompt_version,
    system_prompt,
    tool_schemas,
)
from agent.tools import EpisodeState, Fetched, Outcome, Toolbox, argument_error, content_terms
from agent.trajectory import RankedDocument, Trajectory, Turn
from core.harness_settings import HarnessSettings
from search.backend import SearchBackend

LOG = logging.getLogger(__name__)

# Chat-template tokens around the messages that per-message counts do not see (role headers of a
# long episode, the generation prompt); the window check keeps this much slack.
TEMPLATE_MARGIN_TOKENS = 256

# The settings a checkpoint is trained under and must run under everywhere (its profile).
PROFILE_FIELDS = (
    "view", "token_budget", "soft_threshold", "soft_hint", "hard_cutoff", "search_budget_tokens", "search_candidates",
    "grep_limit", "response_reserve_tokens", "max_turns", "max_output_docs",
)


class PolicyError(RuntimeError):
    """The policy (model, endpoint or script) failed; recorded in the trajectory, not a harness bug."""


class ProfileError(ValueError):
    """A harness profile that cannot run with this policy (it does not fit the model's window, or
    the policy cannot read its view)."""


class HarnessConfig(HarnessSettings):
    """The harness's settings (`core.harness_settings`) with what running them needs: the prompt
    version a view renders, a checkpoint's profile, the window check."""

    @property
    def hard_cutoff_tokens(self) -> int:
        return int(self.hard_cutoff * self.token_budget)

    @property
    def soft_threshold_tokens(self) -> int:
        return int(self.soft_threshold * self.token_budget)

    @classmethod
    def for_training(cls, **overrides) -> HarnessConfig:
        """Rollout settings: the soft hint is shown. Context-1 shows it only during training; here
        it is part of the profile, so a checkpoint whose samples had it keeps it wherever it runs."""
        return cls(**{"soft_hint": True, **overrides})

    @property
    def prompt_version(self) -> str:
        return prompt_version(self.view)

    def profile(self) -> dict[str, Any]:
        """What a checkpoint records in its sidecar: the settings it learned to work under."""
        return {**{name: getattr(self, name) for name in PROFILE_FIELDS}, "prompt_version": self.prompt_version}

    @classmethod
    def from_profile(cls, profile: dict[str, Any] | None, **overrides: Any) -> HarnessConfig:
        """A config for running a checkpoint: its recorded profile, then explicit overrides."""
        profile = dict(profile or {})
        recorded = profile.pop("prompt_version", None)
        values = {name: profile[name] for name in PROFILE_FIELDS if name in profile}
        if values and "soft_hint" not in values:
            # Profiles recorded before the hint was part of them: every checkpoint was trained on
            # rollouts of `for_training`, whose observations past the soft threshold carry the hint.
            values["soft_hint"] = True
        config = cls(**{**values, **overrides})
        if recorded is not None and recorded != config.prompt_version:
            LOG.warning("the checkpoint was trained with prompt version %s; this code renders version %s",
                        recorded, config.prompt_version)
        return config

    def check_window(self, window: int | None, tool_tokens: int) -> None:
        """Raise `ProfileError` when budget + template + tool schemas + reply reserve exceed `window`."""
        if window is None:
            return
        need = self.token_budget + TEMPLATE_MARGIN_TOKENS + tool_tokens + self.response_reserve_tokens
        if need > window:
            raise ProfileError(
                f"the harness profile does not fit the model's {window:,}-token context window: token_budget "
                f"{self.token_budget:,} + chat template {TEMPLATE_MARGIN_TOKENS} + tool schemas {tool_tokens:,} + "
                f"response_reserve_tokens {self.response_reserve_tokens:,} = {need:,}. Lower token_budget to at most "
                f"{max(0, window - TEMPLATE_MARGIN_TOKENS - tool_tokens - self.response_reserve_tokens):,}.")


@dataclass
class NxResult:
    """Nx mode: N independent rollouts and their final rankings merged by reciprocal rank fusion."""

    ranking: list[RankedDocument]
    scores: dict[str, float]
    trajectories: list[Trajectory]

    def summary(self) -> dict[str, int]:
        parts = [t.summary() for t in self.trajectories]
        return {
            "turns": sum(p["turns"] for p in parts),
            "tool_calls": sum(p["tool_calls"] for p in parts),
            "peak_tokens": max((p["peak_tokens"] for p in parts), default=0),
            "pruned": sum(p["pruned"] for p in parts),
        }


class Harness:
    """Runs episodes of one policy against one backend. Thread-safe: episodes share no state."""

    def __init__(self, backend: SearchBackend, policy: Policy, config: HarnessConfig | None = None):
        self.backend = backend
        self.policy = policy
        self.config = config or HarnessConfig()
        self.counter: TokenCounter = policy.token_counter()
        self.toolbox = Toolbox(backend, self.counter, self.config)
        self.tools = tool_schemas(self.config.view)
        self.tool_tokens = tool_overhead_tokens(policy, self.counter, self.tools)
        self.config.check_window(context_window(policy), self.tool_tokens)
        check_view(policy, self.config.view)
        self._executor: ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()
        self._system = system_prompt(
            token_budget=self.config.token_budget, hard_cutoff_tokens=self.config.hard_cutoff_tokens,
            search_budget=self.config.search_budget_tokens, grep_limit=self.config.grep_limit,
            max_docs=self.config.max_output_docs, view=self.config.view,
        )
        notices = "\n" + USAGE_LINE.format(used=self.config.token_budget, budget=self.config.token_budget)
        if self.config.soft_hint:
            notices += "\n" + SOFT_HINT.format(percent=round(100 * self.config.soft_threshold))
        self._notice_tokens = self.counter.count(notices)
        compact = self.config.view == "compact"
        self._force_text = COMPACT_FORCE_FINAL if compact else FORCE_FINAL
        self._malformed_text = COMPACT_MALFORMED_REPLY if compact else MALFORMED_REPLY

    # ---- lifecycle --------------------------------------------------------------------------
    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with self._executor_lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    def _pool(self) -> ThreadPoolExecutor:
        with self._executor_lock:  # episodes of one harness may run on several threads (Nx, teachers)
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.config.parallel_tool_workers, thread_name_prefix="harness-tool")
            return self._executor

    # ---- one episode ------------------------------------------------------------------------
    def run(self, question: str, *, seed: int = 0, task_id: str | None = None, metadata: dict | None = None) -> Trajectory:
        cfg = self.config
        started = time.perf_counter()
        trajectory = Trajectory(
            question=question, policy=self.policy.name, seed=seed, task_id=task_id,
            config={**cfg.model_dump(), "prompt_version": cfg.prompt_version, "backend": type(self.backend).__name__},
            tools=self.tools, metadata=dict(metadata or {}),
        )
        state = EpisodeState(question=question, question_terms=content_terms(question))
        marker = (lambda chunk_id: pruned_reference_marker(state.references.by_chunk.get(chunk_id, 0))) if cfg.view == "compact" else pruned_marker
        view = View(self.counter, marker=marker, fixed_tokens=self.tool_tokens)
        view.add_text("system", self._system)
        view.add_text("user", question)
        final_step: PolicyStep | None = None
        malformed = 0
        try:
            try:
                episode = self.policy.new_episode(question, seed=seed)
            except Exception as error:
                raise PolicyError(f"{type(error).__name__}: {error}") from error
            for index in range(cfg.max_turns):
                turn, step = self._infer(episode, view, index, self.tools)
                trajectory.turns.append(turn)
                if step.window_full:  # without the tool schemas the answer request may still fit
                    final_step = self._force_final(episode, view, trajectory, "The context window is full.", "window")
                    break
                if step.tool_calls:
                    malformed = 0
                    self._act(step, view, state, turn)
                    if view.total_tokens >= cfg.token_budget:
                        final_step = self._force_final(episode, view, trajectory, "The context is full.", "overflow")
                        break
                    continue
                if step.error and "<document" not in (step.content or "").lower() and malformed < cfg.max_malformed_replies:
                    malformed += 1
                    view.add_assistant(step.content or step.raw_text or "", [])
                    self._observe(view, view.add_text("user", self._malformed_text.format(error=step.error)), turn)
                    continue
                final_step, trajectory.stop_reason = step, "answer" if not step.error else "malformed"
                break
            else:
                reason = f"You have used all {cfg.max_turns} turns."
                final_step = self._force_final(episode, view, trajectory, reason, "max_turns")
        except PolicyError as error:  # recorded in the trajectory, re-raised on request
            trajectory.error = str(error)
            trajectory.stop_reason = "policy_error"
            if cfg.raise_policy_errors:
                raise error.__cause__ or error
        if final_step is not None:
            self._parse_answer(final_step, trajectory, state)
        trajectory.chunk_docs = dict(state.seen)
        trajectory.peak_tokens = max([t.prompt_tokens for t in trajectory.turns] + [view.total_tokens])
        trajectory.total_prompt_tokens = sum(t.prompt_tokens for t in trajectory.turns)
        trajectory.wall_s = time.perf_counter() - started
        return trajectory

    def _infer(self, episode: EpisodePolicy, view: View, index: int, tools: list, *, opening: str | None = None) -> tuple[Turn, PolicyStep]:
        """One model turn; with `opening` (forced final only) a policy that can begin its reply
        (`AnsweringEpisode`) is asked to answer starting with it, any other is asked as usual."""
        messages = view.snapshot()
        turn = Turn(index=index, prompt_tokens=view.total_tokens, view_messages=messages if self.config.record_view_messages else [])
        start = time.perf_counter()
        try:
            answer = getattr(episode, "answer", None) if opening else None
            step = answer(messages, opening) if answer is not None else episode.act(messages, tools)
        except Exception as error:
            raise PolicyError(f"{type(error).__name__}: {error}") from error
        turn.timings["infer_ms"] = (time.perf_counter() - start) * 1000
        turn.completion = step.content
        turn.completion_tokens = step.completion_tokens
        turn.completion_token_ids = step.completion_token_ids
        turn.completion_logprobs = step.completion_logprobs
        turn.raw_text = step.raw_text
        turn.prefill = step.prefill
        turn.policy_error = step.error
        return turn, step

    def _act(self, step: PolicyStep, view: View, state: EpisodeState, turn: Turn) -> None:
        """Run a turn's tool calls: prunes first, cutoff check, concurrent fetch, ordered results."""
        cfg = self.config
        start = time.perf_counter()
        written = _unique_ids(step.tool_calls, turn.index)
        view.add_assistant(step.content, written)
        calls = [state.resolve(call) for call in written] if cfg.view == "compact" else written
        outcomes: dict[int, Outcome] = {}
        pending: list[int] = []
        for position, call in enumerate(calls):
            error = argument_error(call, cfg.max_pattern_chars)
            if error:
                outcomes[position] = self.toolbox.text_outcome(call, error + "\n", error=error)
            elif call.name == PRUNE_CHUNKS:
                outcomes[position] = self.toolbox.prune(call, view)
                turn.pruned_ids.extend(outcomes[position].record.pruned_chunk_ids)
            else:
                pending.append(position)
        used = view.total_tokens
        turn.past_hard_cutoff = used >= cfg.hard_cutoff_tokens
        if turn.past_hard_cutoff:
            for position in pending:
                call = calls[position]
                message = HARD_CUTOFF_ERROR.format(tool=call.name, used=used, cutoff=cfg.hard_cutoff_tokens, budget=cfg.token_budget)
                outcomes[position] = self.toolbox.text_outcome(call, message + "\n", error=message, rejected=True)
            pending = []
        fetch_start = time.perf_counter()
        exclude = frozenset(state.seen)
        if len(pending) == 1:
            fetched = {pending[0]: self.toolbox.fetch(calls[pending[0]], state, exclude)}
        else:
            futures = {p: self._pool().submit(self.toolbox.fetch, calls[p], state, exclude) for p in pending}
            fetched = {p: future.result() for p, future in futures.items()}
        turn.timings["backend_ms"] = (time.perf_counter() - fetch_start) * 1000 if pending else 0.0
        last_index = -1
        # What the observation will end with (usage line, hint) is paid for before results are cut.
        # So is the one-line header every later call of this turn gets even when nothing of it fits.
        ceiling = cfg.token_budget - cfg.response_reserve_tokens - self._notice_tokens
        later = [0] * len(calls)
        for position in range(len(calls) - 2, -1, -1):
            following = position + 1
            done = outcomes.get(following)
            floor = sum(done.part_tokens) if done is not None else self.toolbox.header_floor(calls[following])
            later[position] = later[following] + floor + MESSAGE_OVERHEAD_TOKENS
        for position, call in enumerate(calls):
            outcome = outcomes.get(position)
            if outcome is None:
                remaining = max(0, ceiling - used - later[position])
                outcome = self.toolbox.materialize(call, fetched.get(position, Fetched()), state, view, remaining)
            used += sum(outcome.part_tokens) + MESSAGE_OVERHEAD_TOKENS
            last_index = view.add_tool_result(call.id, call.name, outcome.parts, outcome.part_tokens)
            # The record keeps the call as the model wrote it (SFT replays it; references stay references).
            outcome.record.arguments, outcome.record.raw_arguments = written[position].arguments, written[position].raw_arguments
            turn.tool_calls.append(outcome.record)
        self._observe(view, last_index, turn)
        act_ms = (time.perf_counter() - start) * 1000
        turn.timings["act_ms"] = act_ms
        turn.timings["overhead_ms"] = act_ms - turn.timings["backend_ms"]

    def _observe(self, view: View, last_index: int, turn: Turn) -> None:
        """End the observation with the usage line (and the soft hint past the threshold)."""
        cfg = self.config
        used = view.total_tokens
        note = "\n" + USAGE_LINE.format(used=used, budget=cfg.token_budget)
        if cfg.soft_hint and used >= cfg.soft_threshold_tokens:
            note += "\n" + SOFT_HINT.format(percent=round(100 * cfg.soft_threshold))
            turn.hint_shown = True
        view.append_to_message(last_index, note)
        turn.view_token_usage = view.total_tokens

    def _force_final(self, episode: EpisodePolicy, view: View, trajectory: Trajectory, reason: str, stop: str) -> PolicyStep:
        """Ask once for the final answer with no tools offered, the reply begun with the view's answer
        opening where the policy can (`prefill_final_answer`); tool calls in the reply are ignored."""
        view.add_text("user", self._force_text.format(reason=reason, max_docs=self.config.max_output_docs))
        view.fixed_tokens, view.total_tokens = 0, view.total_tokens - view.fixed_tokens  # no tools are offered
        opening = ANSWER_OPENING[self.config.view] if self.config.prefill_final_answer else None
        turn, step = self._infer(episode, view, len(trajectory.turns), [], opening=opening)
        turn.forced_final = True
        turn.view_token_usage = view.total_tokens
        if step.window_full:
            stop = "overflow"
        if step.tool_calls:
            trajectory.parse_errors.append(f"{len(step.tool_calls)} tool calls after the final-answer request were ignored")
        trajectory.turns.append(turn)
        trajectory.stop_reason = stop
        return step

    def _parse_answer(self, step: PolicyStep, trajectory: Trajectory, state: EpisodeState) -> None:
        trajectory.final_text = step.content
        if self.config.view == "compact":
            parsed = parse_reference_answer(step.content, state.references, state.seen,
                                            document_title=self.backend.document_title, max_docs=self.config.max_output_docs)
        else:
            parsed = parse_final_answer(
                step.content, document_title=self.backend.document_title, chunk_docs=state.seen,
                max_docs=self.config.max_output_docs,
            )
        trajectory.final_ranking = parsed.documents
        trajectory.parse_errors.extend(parsed.errors)

    # ---- Nx mode ----------------------------------------------------------------------------
    def run_nx(self, question: str, n: int, *, seed: int = 0, task_id: str | None = None, rrf_k: int = 60) -> NxResult:
        """N independent episodes (seeds seed..seed+n-1) run concurrently, merged by RRF."""
        if n <= 1:
            trajectories = [self.run(question, seed=seed, task_id=task_id)]
        else:
            with ThreadPoolExecutor(n, thread_name_prefix="harness-nx") as pool:
                futures = [pool.submit(self.run, question, seed=seed + i, task_id=task_id) for i in range(n)]
                trajectories = [future.result() for future in futures]
        ranking, scores = merge_rankings(trajectories, k=rrf_k, limit=self.config.max_output_docs)
        return NxResult(ranking=ranking, scores=scores, trajectories=trajectories)


def merge_rankings(trajectories: list[Trajectory], *, k: int = 60, limit: int = 10) -> tuple[list[RankedDocument], dict[str, float]]:
    """Fuse the final rankings of several rollouts; each document keeps its best-ranked entry."""
    from search.fusion import rrf

    fused = rrf([t.output_doc_ids() for t in trajectories], k=k)
    best: dict[str, tuple[int, RankedDocument]] = {}
    for trajectory in trajectories:
        for rank, document in enumerate(trajectory.final_ranking):
            if document.doc_id not in best or rank < best[document.doc_id][0]:
                best[document.doc_id] = (rank, document)
    ranking = [best[doc_id][1] for doc_id, _ in fused[:limit]]
    return ranking, {doc_id: float(score) for doc_id, score in fused}


def context_window(policy: Policy) -> int | None:
    """The policy's context window in tokens, when it has one it can tell without loading weights."""
    window = getattr(policy, "context_window", None)
    return window() if callable(window) else None


def check_view(policy: Policy, view: str) -> None:
    """Raise `ProfileError` when `policy` cannot read `view`. A scripted policy parses what the
    harness renders; in a view it cannot parse it would see no results and answer that nothing was
    found, a zero that reads like a score. Models read any view; a policy says otherwise with `readable_views`."""
    views = getattr(policy, "readable_views", VIEWS)
    if view not in views:
        raise ProfileError(
            f"the {policy.name} policy reads only the {' or '.join(views)} view and cannot run in the {view!r} view "
            f"(set by harness overrides, e.g. a customer file's benchmark.harness.view: checkpoints carry their own "
            f"view in their profile, so it need not be set there)")


def tool_overhead_tokens(policy: Policy, counter: TokenCounter, tools: list[dict[str, Any]]) -> int:
    """Tokens the tool schemas add to every prompt: measured with the policy's chat template when it
    can render one, else the schemas' JSON counted with the policy's tokenizer."""
    measure = getattr(policy, "tool_overhead_tokens", None)
    if callable(measure):
        measured = measure(tools)
        if measured is not None:
            return int(measured)
    return counter.count(json.dumps(tools, ensure_ascii=False))


def _unique_ids(calls: list[ToolCall], turn_index: int) -> list[ToolCall]:
    """Tool results are matched to calls by id: give missing or repeated ids fresh ones."""
    seen: set[str] = set()
    unique = []
    for position, call in enumerate(calls):
        call_id = call.id
        if not call_id or call_id in seen:
            call_id = f"call_{turn_index}_{position}"
            call = ToolCall(id=call_id, name=call.name, arguments=call.arguments, raw_arguments=call.raw_arguments)
        seen.add(call_id)
        unique.append(call)
    return unique


def run_episode(backend: SearchBackend, policy: Policy, question: str, config: HarnessConfig | None = None, **kwargs) -> Trajectory:
    """One episode with a throwaway harness (the CLI and tests; long runs keep a Harness)."""
    with Harness(backend, policy, config) as harness:
        return harness.run(question, **kwargs)


def run_nx(backend: SearchBackend, policy: Policy, question: str, n: int, config: HarnessConfig | None = None, **kwargs) -> NxResult:
    with Harness(backend, policy, config) as harness:
        return harness.run_nx(question, n, **kwargs)
