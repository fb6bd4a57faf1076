"""The `openai` policy: any OpenAI-compatible chat-completions endpoint with tool calling.

Why one client for everything remote: teachers (hosted APIs), vLLM-served checkpoints and
`transformers serve` all speak this protocol, so distillation, RL rollouts on vLLM and
benchmarks of served models share one code path. The transport is `llm.client.LLMClient`, the
same one the task generator's teacher uses: timeouts, retries with capped jittered backoff
(connection errors, 408/409/425/429/5xx) and call counts are defined once.

Failure policy: a reply that cannot be understood (invalid JSON arguments, a truncated call, a
request the server rejects as too long) is recorded in `PolicyStep.error` for the trajectory;
an endpoint that stays unreachable after the retries raises, because silently turning an outage
into empty turns would poison SFT data and RL rewards.

Prompts as tokens (`prompt_as_tokens=True`, with `tokenizer_path`): the prompt is rendered here
with the tokenizer folder's chat template (ours for harmony) and sent to the text completions
endpoint as token ids, and the completion is parsed here with the family's parser. Why: RL
recomputes each turn's log-probs from the prompt the trainer renders, so the sampler must have
continued from exactly those tokens. A chat request lets the server render instead; vLLM renders
gpt-oss requests with openai-harmony's renderer, not the folder's template, so the two differ.
vLLM is asked for token ids (`return_tokens_as_token_ids`) and keeps special tokens in the text
(`skip_special_tokens: false`), which harmony's tool calls are made of.

Secrets: the API key is read from the environment variable *named* by `api_key_env` when the
client is built; it is never stored on the policy, put in its name, or logged.

Token budgets: with `tokenizer_path` (the served model's Hugging Face tokenizer folder) the
harness counts exactly what the model sees. Without it we fall back to the all-MiniLM-L6-v2
word-piece tokenizer shipped for embeddings (`search.embedding_window.load_token_offsets`):
an approximation, offline and deterministic, that tends to UNDERcount (measured here on the demo
wiki pages: 0.7-1.0x of SmolLM2's BPE count, ~0.87x typical), so a budget counted with it runs
over by that much on the real model; pass the real tokenizer whenever budgets matter (RL,
benchmarks).
"""

from __future__ import annotations

import json
import threading
from typing import Any

from agent.policies.tool_parsing import TOOL_CALL_OPEN, parse_arguments, parse_tool_calls
from agent.policies.transformers_policy import TokenizerCounter, load_tokenizer, turn_seed
from agent.policy_base import Message, PolicyStep, TokenCounter, ToolCall
from llm.client import LLMClient, LLMRejected

# Request fields some OpenAI-compatible servers reject; dropped (once, then remembered) when a
# 400/422 names them. `logprobs` is never dropped silently: RL depends on it.
OPTIONAL_FIELDS = ("parallel_tool_calls", "tool_choice", "seed")
# Episodes run in threads (a benchmark's questions, an RL group): the endpoint, not this client,
# bounds how many turns are in flight.
POLICY_CONCURRENCY = 64
_MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")


def openai_messages(messages: list[Message]) -> list[Message]:
    """Messages as the protocol wants them: known keys only, tool-call arguments as JSON strings."""
    out: list[Message] = []
    for message in messages:
        m = {k: message[k] for k in _MESSAGE_KEYS if k in message}
        if m.get("tool_calls"):
            calls = []
            for call in m["tool_calls"]:
                fn = dict(call.get("function") or {})
                args = fn.get("arguments")
                if not isinstance(args, str):
                    fn["arguments"] = json.dumps(args if args is not None else {})
                calls.append({"id": call.get("id"), "type": call.get("type", "function"), "function": fn})
            m["tool_calls"] = calls
        elif "tool_calls" in m:
            del m["tool_calls"]
        out.append(m)
    return out


def parse_token_id(token: str) -> int | None:
    """vLLM's `return_tokens_as_token_ids` writes tokens as `token_id:123`."""
    if token.startswith("token_id:"):
        try:
            return int(token[len("token_id:"):])
        except ValueError:
            return None
    return None


class OpenAIPolicy:
    """A policy backed by an OpenAI-compatible endpoint; see the module docstring for the why."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None = None,
        timeout: float = 60,
        max_retries: int = 3,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        seed: int | None = None,
        *,
        logprobs: bool = False,
        token_ids: bool = False,
        tokenizer_path: str | None = None,
        parallel_tool_calls: bool | None = True,
        tool_choice: str | None = "auto",
        max_tokens_param: str = "max_tokens",
        extra_body: dict[str, Any] | None = None,
        name: str | None = None,
        backoff_s: float = 1.0,
        backoff_max_s: float = 30.0,
        prompt_as_tokens: bool = False,
    ):
        if prompt_as_tokens and not tokenizer_path:
            raise ValueError("prompt_as_tokens renders the prompt here: it needs tokenizer_path (the served model's tokenizer folder)")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.prompt_as_tokens = prompt_as_tokens
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.seed = seed
        self.logprobs = logprobs  # request per-token logprobs (RL rollouts on vLLM)
        self.token_ids = token_ids  # ask vLLM for token ids too (`return_tokens_as_token_ids`)
        self.tokenizer_path = tokenizer_path
        self.parallel_tool_calls = parallel_tool_calls
        self.tool_choice = tool_choice
        self.max_tokens_param = max_tokens_param  # `max_completion_tokens` for newer OpenAI models
        self.extra_body = dict(extra_body or {})
        self.name = name or f"openai:{self.base_url}#{model}"
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._dropped: set[str] = set()

    @classmethod
    def over(cls, client: LLMClient, **options: Any) -> OpenAIPolicy:
        """A policy on a client someone already holds (a Dagster resource's): its endpoint,
        limits, concurrency and counters are the policy's."""
        policy = cls(client.base_url, client.model, api_key_env=client.api_key_env, timeout=client.timeout_s,
                     max_retries=client.max_retries, backoff_s=client.backoff_s, backoff_max_s=client.backoff_max_s, **options)
        policy._client = client
        return policy

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_client"], state["_client_lock"]  # rebuilt on the other side of a pickle
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _client=None, _client_lock=threading.Lock())

    def client(self) -> LLMClient:
        """The endpoint's client, built once (thread-safe; it pools connections)."""
        with self._client_lock:
            if self._client is None:
                self._client = LLMClient(
                    base_url=self.base_url, model=self.model, api_key_env=self.api_key_env, timeout_s=self.timeout,
                    max_retries=self.max_retries, backoff_s=self.backoff_s, backoff_max_s=self.backoff_max_s,
                    concurrency=POLICY_CONCURRENCY,
                )
            return self._client

    def token_counter(self) -> TokenCounter:
        if self.tokenizer_path:
            return TokenizerCounter(load_tokenizer(self.tokenizer_path))
        from search.embedding_window import load_token_offsets

        return load_token_offsets()

    def tool_overhead_tokens(self, tools: list[dict[str, Any]]) -> int | None:
        """With prompts rendered here, what the template adds for the tools is known exactly."""
        if not self.prompt_as_tokens:
            return None
        from agent.policies.transformers_policy import template_tool_overhead

        return template_tool_overhead(self._template()[0], tools)

    def context_window(self) -> int | None:
        """The served model's window, when its folder (the tokenizer's) says it."""
        if not self.tokenizer_path:
            return None
        from agent.policies.transformers_policy import resolve_model_dir, window_of

        try:
            return window_of(resolve_model_dir(self.tokenizer_path))
        except FileNotFoundError:  # a tokenizer folder without the model's config
            return None

    def new_episode(self, question: str, seed: int = 0) -> OpenAIEpisode:
        return OpenAIEpisode(self, seed)

    def request(self, messages: list[Message], tools: list[dict[str, Any]] | None, seed: int | None) -> dict[str, Any]:
        """The keyword arguments of one `chat.completions.create` call."""
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": openai_messages(messages),
            "temperature": self.temperature,
            self.max_tokens_param: self.max_tokens,
        }
        if tools:
            kwargs["tools"] = tools
            if self.tool_choice is not None:
                kwargs["tool_choice"] = self.tool_choice
            if self.parallel_tool_calls is not None:
                kwargs["parallel_tool_calls"] = self.parallel_tool_calls
        if seed is not None:
            kwargs["seed"] = seed
        if self.logprobs:
            kwargs["logprobs"] = True
        extra = dict(self.extra_body)
        if self.token_ids:
            extra["return_tokens_as_token_ids"] = True
        if extra:
            kwargs["extra_body"] = extra
        for field in self._dropped:
            kwargs.pop(field, None)
        return kwargs

    def complete(self, messages: list[Message], tools: list[dict[str, Any]] | None, seed: int | None, id_prefix: str = "call",
                 *, opening: str | None = None) -> PolicyStep:
        """One turn against the endpoint (see the module docstring for what raises and what is
        recorded); `opening` begins the reply, which only a prompt rendered here can do."""
        if self.prompt_as_tokens:
            return self._complete_tokens(messages, tools, seed, id_prefix, opening)
        kwargs = self.request(messages, tools, seed)
        for _ in range(len(OPTIONAL_FIELDS) + 1):
            try:
                response = self.client().create(**kwargs)
                break
            except LLMRejected as exc:
                if exc.status not in (400, 422):
                    raise
                rejected = [f for f in OPTIONAL_FIELDS if f in kwargs and f in str(exc)]
                if not rejected:
                    return PolicyStep(content=None, error=f"request rejected by the server: {_short(exc)}")
                self._dropped.update(rejected)
                for field in rejected:
                    kwargs.pop(field, None)
        else:  # pragma: no cover - every optional field dropped and still rejected
            return PolicyStep(content=None, error="request rejected by the server")
        return step_from_response(response, id_prefix)


    def _template(self) -> tuple[Any, str, list[int]]:
        """(tokenizer with the family's template, chat format, end-of-turn token ids)."""
        from agent.policies.model_family import chat_format_of, end_of_turn_ids, prepare_tokenizer

        tokenizer = prepare_tokenizer(load_tokenizer(self.tokenizer_path))
        chat_format = chat_format_of(tokenizer)
        return tokenizer, chat_format, end_of_turn_ids(tokenizer, chat_format)

    def _complete_tokens(self, messages: list[Message], tools: list[dict[str, Any]] | None, seed: int | None, id_prefix: str,
                         opening: str | None = None) -> PolicyStep:
        """One turn with the prompt rendered here and sent as token ids (module docstring); with
        `opening` the reply is begun with it, as the `transformers` policy does."""
        from agent.policies.model_family import reply_opening
        from agent.policies.tool_parsing import parse_reply
        from agent.policies.transformers_policy import strip_end_markers, template_messages

        tokenizer, chat_format, ends = self._template()
        prefill = reply_opening(chat_format, opening) if opening else None
        prompt = tokenizer.apply_chat_template(template_messages(messages), tools=tools or None, add_generation_prompt=True, tokenize=False)
        prompt += prefill or ""
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        request: dict[str, Any] = {"model": self.model, "prompt": prompt_ids, "temperature": self.temperature,
                                   "max_tokens": self.max_tokens,
                                   "extra_body": {**self.extra_body, "return_tokens_as_token_ids": True, "skip_special_tokens": False}}
        if seed is not None:
            request["seed"] = seed
        if self.logprobs:
            request["logprobs"] = 1
        try:
            response = self.client().complete(**request)
        except LLMRejected as exc:
            if exc.status not in (400, 422):
                raise
            return PolicyStep(content=None, prompt_tokens=len(prompt_ids), error=f"request rejected by the server: {_short(exc)}")
        choice = response.choices[0]
        raw = choice.text or ""
        ids, logprobs = _completion_logprobs(choice)
        if ids is None:  # no logprobs asked for: the text is the record
            ids = tokenizer(raw, add_special_tokens=False)["input_ids"]
        parsed = parse_reply(strip_end_markers((prefill or "") + raw, tokenizer, ends), chat_format, id_prefix=id_prefix)
        error = parsed.error
        if not parsed.tool_calls and parsed.content is None and error is None:
            error = "empty completion"
        if choice.finish_reason == "length" and error:
            error += "; the reply hit max_tokens"
        usage = getattr(response, "usage", None)
        return PolicyStep(
            content=parsed.content,
            tool_calls=parsed.tool_calls,
            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or len(prompt_ids)),
            completion_tokens=int(getattr(usage, "completion_tokens", 0) or len(ids)),
            completion_token_ids=ids,
            completion_logprobs=logprobs,
            raw_text=raw,
            error=error,
            prefill=prefill,
        )


def _completion_logprobs(choice: Any) -> tuple[list[int] | None, list[float] | None]:
    """(token ids, log-probs) of a text completion's sampled tokens (`logprobs.tokens` written as
    `token_id:N` by vLLM's `return_tokens_as_token_ids`)."""
    block = getattr(choice, "logprobs", None)
    tokens, values = getattr(block, "tokens", None), getattr(block, "token_logprobs", None)
    if not tokens or values is None:
        return None, None
    ids = [parse_token_id(token) for token in tokens]
    return (None if any(i is None for i in ids) else ids), [float(v) for v in values]  # type: ignore[return-value]


def step_from_response(response: Any, id_prefix: str = "call") -> PolicyStep:
    """A `PolicyStep` from a chat-completions response object (tolerant of odd servers)."""
    if not getattr(response, "choices", None):
        return PolicyStep(content=None, error="response has no choices")
    choice = response.choices[0]
    message = choice.message
    content = message.content if isinstance(message.content, str) and message.content.strip() else None
    errors: list[str] = []
    calls: list[ToolCall] = []
    for i, call in enumerate(message.tool_calls or []):
        fn = getattr(call, "function", None)
        name = getattr(fn, "name", None)
        if not name:
            errors.append("a tool call has no function name")
            continue
        arguments, kept, error = parse_arguments(getattr(fn, "arguments", None))
        calls.append(ToolCall(id=call.id or f"{id_prefix}_{i}", name=name, arguments=arguments, raw_arguments=kept))
        if error:
            errors.append(f"{name}: {error}")
    if not calls and content and TOOL_CALL_OPEN in content:
        # The server returned a call as text (no tool parser, or its parser gave up): parse it here.
        parsed = parse_tool_calls(content, id_prefix=id_prefix)
        content, calls = parsed.content, parsed.tool_calls
        errors.extend(parsed.errors)
    if not calls and content is None and not errors:
        errors.append("empty reply" + (f" (finish_reason={choice.finish_reason})" if choice.finish_reason else ""))
    if choice.finish_reason == "length" and errors:
        errors.append("the reply hit max_tokens")
    usage = getattr(response, "usage", None)
    ids, logprobs = _logprobs(choice)
    return PolicyStep(
        content=content,
        tool_calls=calls,
        prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        completion_token_ids=ids,
        completion_logprobs=logprobs,
        raw_text=message.content,
        error="; ".join(errors) if errors else None,
    )


def _logprobs(choice: Any) -> tuple[list[int] | None, list[float] | None]:
    entries = getattr(getattr(choice, "logprobs", None), "content", None)
    if not entries:
        return None, None
    logprobs = [float(e.logprob) for e in entries]
    ids = [parse_token_id(e.token) for e in entries]
    return (None if any(i is None for i in ids) else ids), logprobs  # type: ignore[return-value]


def _short(exc: Exception, limit: int = 300) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + "..."


class OpenAIEpisode:
    """Holds only the turn counter (for per-turn seeds and call ids); the harness owns the context."""

    def __init__(self, policy: OpenAIPolicy, seed: int):
        self.policy = policy
        self.seed = seed
        self.turn = 0

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> PolicyStep:
        return self._turn(messages, tools)

    def answer(self, messages: list[Message], opening: str) -> PolicyStep:
        """The forced final turn: begun with `opening` when this policy renders the prompt itself
        (`prompt_as_tokens`); a chat endpoint renders its own, so it is asked as usual."""
        return self._turn(messages, None, opening if self.policy.prompt_as_tokens else None)

    def _turn(self, messages: list[Message], tools: list[dict[str, Any]] | None, opening: str | None = None) -> PolicyStep:
        policy = self.policy
        seed = turn_seed(policy.seed, self.seed, self.turn) if policy.seed is not None or self.seed else None
        step = policy.complete(messages, tools, seed, id_prefix=f"call_{self.turn}", opening=opening)
        self.turn += 1
        return step


def policy_from_spec(rest: str, **options: Any) -> OpenAIPolicy:
    """`openai:URL#MODEL` (CLI spec); options (api_key_env, timeout, ...) go to the constructor."""
    url, sep, model = rest.rpartition("#")
    if not sep or not url or not model:
        raise ValueError(f"openai policy spec must be openai:URL#MODEL, got openai:{rest}")
    return OpenAIPolicy(url, model, **options)
