"""The one client for OpenAI-compatible chat endpoints: cached, retried, bounded and counted.

Who uses it: the task generator's teacher (`chat`, `chat_json`: replies as plain records,
cached in the artifact store) and every policy behind an endpoint (`create`: the raw
completion, for tool calls, logprobs and token ids): a hosted teacher, a vLLM-served checkpoint,
RL rollouts on vLLM. One transport means one definition of what is retried, what is counted and
how a key is read, whoever calls.

Why our own retry loop instead of the `openai` package's: we need the failures *counted* for
the asset metadata and the backoff jittered and capped by us, and we must not retry a 400
(a bad request never heals). Why a semaphore: a materialization fans out over seeds and
supporting documents in threads; the endpoint's rate limit is the customer's, so the
concurrency limit is configuration, not a thread-pool accident.

The API key is read from the environment variable *named* by `api_key_env` when the client is
first built; the key itself never enters config, metadata, logs, reprs or cache keys.

Structured outputs: `chat_json` sends `response_format={"type": "json_schema", ...}`; a server
that rejects it (400) is asked again without it, once, and remembered; every reply is parsed
tolerantly (code fences stripped, first balanced `{...}` block) because small and local
models often wrap JSON in prose.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from llm.cache import ResponseCache, cache_key

log = logging.getLogger(__name__)

Message = dict[str, Any]
M = TypeVar("M", bound=BaseModel)
_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", flags=re.DOTALL)
RETRYABLE_STATUS = {408, 409, 425, 429}


_SETTINGS = ("base_url", "model", "api_key_env", "timeout_s", "max_retries", "backoff_s", "backoff_max_s", "concurrency",
             "temperature", "max_tokens", "seed", "structured_outputs", "cache", "extra_body")


class LLMError(RuntimeError):
    """A call that failed after its retries (or could not be retried); the message says why."""


class LLMRejected(LLMError):
    """The server refused the request itself (a 4xx other than the retryable ones): asking
    again cannot help, changing the request might (`status` says which refusal)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class ReplyParseError(ValueError):
    """A delivered reply that is not the JSON we asked for."""


def first_json_object(text: str) -> str | None:
    """The first balanced `{...}` block of `text`, respecting strings and escapes."""
    start = text.find("{")
    while start != -1:
        depth, in_string, escaped = 0, False, False
        for pos in range(start, len(text)):
            char = text[pos]
            if in_string:
                if escaped:
                    escaped = False
                elif char == "\\":
                    escaped = True
                elif char == '"':
                    in_string = False
            elif char == '"':
                in_string = True
            elif char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0:
                    return text[start : pos + 1]
        start = text.find("{", start + 1)
    return None


def parse_json_reply(text: str | None) -> dict[str, Any]:
    """Parse a model's JSON object reply: as is, then inside code fences, then the first
    `{...}` block. Raises `ReplyParseError` with a short reason."""
    if not text or not text.strip():
        raise ReplyParseError("empty reply")
    candidates = [text.strip()]
    candidates += [m.group(1).strip() for m in _FENCE.finditer(text)]
    block = first_json_object(text)
    if block:
        candidates.append(block)
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    raise ReplyParseError(f"no JSON object in reply ({len(text)} chars)")


@dataclass(frozen=True)
class ToolCallRequest:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ChatReply:
    content: str | None
    tool_calls: tuple[ToolCallRequest, ...] = ()
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: bool = False

    def to_cache(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("cached")
        data["tool_calls"] = [asdict(call) for call in self.tool_calls]
        return data

    @classmethod
    def from_cache(cls, data: dict[str, Any]) -> "ChatReply":
        calls = tuple(ToolCallRequest(**call) for call in data.get("tool_calls") or [])
        return cls(data.get("content"), calls, data.get("finish_reason"), int(data.get("prompt_tokens") or 0),
                   int(data.get("completion_tokens") or 0), cached=True)


@dataclass
class LLMUsage:
    """Counts for asset metadata; `calls` are paid requests, `cached` are free replays."""

    calls: int = 0  # HTTP requests answered successfully
    cached: int = 0  # replies served from the cache (not paid for)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failures: int = 0  # HTTP attempts that failed (5xx, timeouts, malformed bodies, 4xx)
    retries: int = 0
    errors: int = 0  # calls given up on after retries
    parse_failures: int = 0  # delivered replies that were not the JSON asked for
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        """Thread-safe increments (seeds and documents are processed in parallel)."""
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def as_dict(self) -> dict[str, int]:
        with self._lock:
            return {name: getattr(self, name) for name in USAGE_FIELDS}


USAGE_FIELDS = ("calls", "cached", "prompt_tokens", "completion_tokens", "failures", "retries", "errors", "parse_failures")


class LLMClient:
    """A cached, retried, concurrency-limited client for one model on one endpoint."""

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key_env: str | None = "OPENAI_API_KEY",
        timeout_s: float = 120.0,
        max_retries: int = 4,
        backoff_s: float = 1.0,
        backoff_max_s: float = 30.0,
        concurrency: int = 4,
        temperature: float = 0.0,
        max_tokens: int | None = 4096,
        seed: int | None = 0,
        structured_outputs: bool = True,
        cache: ResponseCache | None = None,
        extra_body: dict[str, Any] | None = None,
    ):
        self.base_url = base_url
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.backoff_max_s = float(backoff_max_s)
        self.concurrency = max(1, int(concurrency))
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.seed = seed
        self.structured_outputs = structured_outputs
        self.cache = cache
        self.extra_body = dict(extra_body or {})
        self.usage = LLMUsage()
        self._semaphore = threading.BoundedSemaphore(self.concurrency)
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._jitter = random.Random(seed if seed is not None else 0)
        self._jitter_lock = threading.Lock()

    def clone(self, **overrides: Any) -> "LLMClient":
        """The same endpoint and settings with fresh usage counters (one per materialization),
        optionally another cache or setting."""
        settings = {name: getattr(self, name) for name in _SETTINGS}
        settings.update(overrides)
        return LLMClient(**settings)

    def __repr__(self) -> str:
        return f"LLMClient(base_url={self.base_url!r}, model={self.model!r}, api_key_env={self.api_key_env!r})"

    def describe(self) -> dict[str, Any]:
        """Settings safe to put in asset metadata (the key's variable name, never the key)."""
        return {"base_url": self.base_url, "model": self.model, "api_key_env": self.api_key_env,
                "timeout_s": self.timeout_s, "max_retries": self.max_retries, "concurrency": self.concurrency,
                "temperature": self.temperature, "structured_outputs": self.structured_outputs}

    def _openai(self):
        with self._client_lock:
            if self._client is None:
                from openai import OpenAI

                key = (os.environ.get(self.api_key_env) if self.api_key_env else None) or "EMPTY"  # local servers take any key
                self._client = OpenAI(base_url=self.base_url, api_key=key, timeout=self.timeout_s, max_retries=0)
            return self._client

    def _params(self, temperature: float | None, max_tokens: int | None) -> dict[str, Any]:
        params: dict[str, Any] = {"temperature": self.temperature if temperature is None else temperature}
        tokens = self.max_tokens if max_tokens is None else max_tokens
        if tokens:
            params["max_tokens"] = tokens
        if self.seed is not None:
            params["seed"] = self.seed
        return params

    def chat(
        self,
        messages: list[Message],
        *,
        tools: list[dict[str, Any]] | None = None,
        response_format: dict[str, Any] | None = None,
        attempt: int = 0,
        temperature: float | None = None,
        max_tokens: int | None = None,
    ) -> ChatReply:
        """One chat completion, from the cache when this exact request was answered before.

        `attempt` is part of the cache key only: a caller retrying a bad-but-delivered reply
        passes `attempt + 1` to get a fresh sample that is cached under its own key.
        """
        params = self._params(temperature, max_tokens)
        key = cache_key({"model": self.model, "messages": messages, "tools": tools, "response_format": response_format,
                         "params": params, "extra_body": self.extra_body, "attempt": attempt})
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                self.usage.add(cached=1)
                return ChatReply.from_cache(hit)
        reply = self._call_with_retries(messages, tools, response_format, params)
        if self.cache is not None:
            self.cache.put(key, reply.to_cache())
        return reply

    def chat_json(self, messages: list[Message], model: type[M], *, name: str, attempt: int = 0,
                  temperature: float | None = None) -> tuple[M, ChatReply]:
        """A reply parsed into `model`; raises `ReplyParseError` (counted) or `LLMError`."""
        reply = self.chat(messages, response_format=self.response_format(model, name), attempt=attempt, temperature=temperature)
        return self.parse(reply, model), reply

    def response_format(self, model: type[BaseModel], name: str) -> dict[str, Any] | None:
        """The `json_schema` response format for `model`, or None when the endpoint lacks it."""
        if not self.structured_outputs:
            return None
        return {"type": "json_schema", "json_schema": {"name": name, "schema": model.model_json_schema(), "strict": False}}

    def parse(self, reply: ChatReply, model: type[M]) -> M:
        try:
            return model.model_validate(parse_json_reply(reply.content))
        except (ReplyParseError, ValidationError) as error:
            self.usage.add(parse_failures=1)
            raise ReplyParseError(f"{model.__name__}: {str(error).splitlines()[0][:200]}") from None

    # -- transport -----------------------------------------------------------------------------

    def create(self, **request: Any) -> Any:
        """One `chat.completions.create(**request)`, retried on transient failures (connection
        errors, timeouts, 408/409/425/429/5xx, bodies without choices) with capped jittered
        backoff, and counted. Raises `LLMRejected` for a refused request, `LLMError` after the
        retries. Not cached: a caller that replays replies keys them itself (`chat`)."""
        try:
            return self._create(request)
        except LLMRejected:
            self.usage.add(errors=1)
            raise

    def complete(self, **request: Any) -> Any:
        """One text `completions.create(**request)` (a prompt of token ids or text, no chat
        template on the server), retried and counted like `create`."""
        try:
            return self._create(request, chat=False)
        except LLMRejected:
            self.usage.add(errors=1)
            raise

    def _create(self, request: dict[str, Any], chat: bool = True) -> Any:
        last = "no attempt"
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.usage.add(retries=1)
                time.sleep(self._backoff(attempt))
            try:
                with self._semaphore:
                    completion = self._create_once(request, chat)
                usage = getattr(completion, "usage", None)
                self.usage.add(calls=1, prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
                               completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0))
                return completion
            except _Transient as error:
                last = str(error)
                log.warning("call to %s failed (attempt %d/%d): %s", self.base_url, attempt + 1, self.max_retries + 1, last)
        self.usage.add(errors=1)
        raise LLMError(f"gave up after {self.max_retries + 1} attempts: {last}")

    def _call_with_retries(self, messages, tools, response_format, params) -> ChatReply:
        request: dict[str, Any] = {"model": self.model, "messages": messages, **params}
        if tools:
            request["tools"] = tools
        if self.extra_body:
            request["extra_body"] = self.extra_body
        if response_format is not None:
            try:
                return _to_reply(self._create({**request, "response_format": response_format}))
            except LLMRejected as error:
                if error.status != 400 or not self.structured_outputs:
                    self.usage.add(errors=1)
                    raise
                log.warning("endpoint rejected response_format (%s); falling back to prompt-only JSON", error)
                self.structured_outputs = False
        return _to_reply(self.create(**request))

    def _backoff(self, attempt: int) -> float:
        with self._jitter_lock:
            jitter = 0.5 + self._jitter.random()
        return min(self.backoff_max_s, self.backoff_s * (2 ** (attempt - 1)) * jitter)

    def _create_once(self, request: dict[str, Any], chat: bool = True) -> Any:
        import openai

        endpoint = self._openai().chat.completions if chat else self._openai().completions
        try:
            completion = endpoint.create(**request)
        except openai.APIStatusError as error:
            self.usage.add(failures=1)
            status = error.status_code
            if status >= 500 or status in RETRYABLE_STATUS:
                raise _Transient(f"HTTP {status}") from None
            raise LLMRejected(status, f"HTTP {status}: {str(error)[:300]}") from None
        except (openai.APIConnectionError, openai.APIResponseValidationError, ValueError) as error:
            self.usage.add(failures=1)
            raise _Transient(f"{type(error).__name__}: {str(error)[:200]}") from None
        choices = getattr(completion, "choices", None) or []
        if not choices or getattr(choices[0], "message" if chat else "text", None) is None:
            self.usage.add(failures=1)
            raise _Transient("reply without choices")
        return completion


class _Transient(Exception):
    pass


def _to_reply(completion: Any) -> ChatReply:
    """A `ChatCompletion` (with choices: `create` checked) as our plain record."""
    choices = completion.choices
    message = choices[0].message
    calls = tuple(
        ToolCallRequest(call.id or f"call_{i}", call.function.name, call.function.arguments or "{}")
        for i, call in enumerate(message.tool_calls or [])
        if getattr(call, "function", None) is not None
    )
    usage = getattr(completion, "usage", None)
    return ChatReply(
        content=message.content,
        tool_calls=calls,
        finish_reason=choices[0].finish_reason,
        prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
    )
