"""The policy interface: what the harness asks of any model (or script) that drives an episode.

Messages are OpenAI chat-completions dicts (`role`, `content`, `tool_calls`, `tool_call_id`),
because every backend we support either speaks that protocol (teachers, vLLM-served
checkpoints) or renders it through a chat template (in-process transformers). The harness owns
the context (it prunes it), so a policy receives the whole current view every turn and must not
keep its own copy of the conversation; an episode object exists only for scripted policies that
keep plans between turns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

Message = dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]
    raw_arguments: str | None = None  # what the model emitted, kept when it was not valid JSON


@dataclass
class PolicyStep:
    """One model turn: either tool calls or a final text answer (or, for a broken model, neither)."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # For RL: the sampled completion token ids and their log-probabilities under the sampler.
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    raw_text: str | None = None
    error: str | None = None  # a malformed reply that could not be parsed, recorded not raised
    window_full: bool = False  # the prompt left no room to reply in the model's context window
    # Text the policy appended to the rendered prompt before generating (`AnsweringEpisode`): the
    # reply's text begins with it, the sampled token ids and log-probs do not include it.
    prefill: str | None = None


class TokenCounter(Protocol):
    def count(self, text: str) -> int: ...


class EpisodePolicy(Protocol):
    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> PolicyStep: ...


class AnsweringEpisode(EpisodePolicy, Protocol):
    """An episode whose policy renders its own prompt and can therefore begin the reply.

    Why: on the forced final turn no tools are offered, yet a small model trained on episodes
    that always answered on their own keeps writing tool calls there, and the episode ends with
    no ranking. Beginning the reply with the answer's opening (`[` in the compact view) makes the
    model choose *which* documents, not *whether* to answer. Policies behind a chat API (the
    server renders the prompt) do not implement it and are asked with `act`.
    """

    def answer(self, messages: list[Message], opening: str) -> PolicyStep: ...


class Policy(Protocol):
    """A factory of episodes plus the tokenizer the token budget is counted with."""

    name: str

    def new_episode(self, question: str, seed: int = 0) -> EpisodePolicy: ...

    def token_counter(self) -> TokenCounter: ...
