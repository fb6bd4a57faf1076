"""Tool calls out of raw model text, for models whose tool calls arrive as text.

Why one tolerant parser: in-process models (the `transformers` policy) and servers that return
the raw text of a call they could not parse (a `transformers serve` without a response
template, a vLLM tool parser that gave up on a truncated call) both leave us with text. A small
or half-trained model emits broken calls often; a broken call must become a recorded error in
the trajectory (the harness tells the model, RL penalises it), never an exception.

Formats understood, in the order tried:
- Hermes / Qwen: one `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` block per call
  (what our `chatml_tools.jinja` template teaches);
- SmolLM2's function-calling format: `<tool_call>[{"name": ..., "arguments": ...}, ...]</tool_call>`;
- a bare JSON list (or object) of calls as the whole reply, optionally in a ```json fence.
`parameters` is accepted for `arguments`, and arguments given as a JSON string are decoded.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from retrieval.policy_base import ToolCall

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


@dataclass
class ParsedReply:
    """Content (text outside tool-call blocks, or None when there is none), calls, and errors."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def error(self) -> str | None:
        return "; ".join(self.errors) if self.errors else None


def parse_arguments(raw: Any) -> tuple[dict[str, Any], str | None, str | None]:
    """(arguments, raw_arguments kept when invalid, error) from a JSON string or an object."""
    if raw is None:
        return {}, None, None
    if isinstance(raw, dict):
        return raw, None, None
    if isinstance(raw, str):
        if not raw.strip():
            return {}, None, None
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            return {}, raw, f"arguments are not valid JSON ({exc.msg} at char {exc.pos})"
        if isinstance(value, dict):
            return value, None, None
        return {}, raw, f"arguments must be a JSON object, got {type(value).__name__}"
    return {}, json.dumps(raw, default=str), f"arguments must be a JSON object, got {type(raw).__name__}"


def call_from_object(obj: Any, call_id: str) -> tuple[ToolCall | None, str | None]:
    """One call from a decoded `{"name": ..., "arguments": ...}`; (None, error) when it is not one."""
    if not isinstance(obj, dict):
        return None, f"a tool call must be a JSON object, got {type(obj).__name__}"
    if "function" in obj and isinstance(obj["function"], dict):  # OpenAI shape, emitted verbatim
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None, "a tool call has no function name"
    raw_args = obj.get("arguments", obj.get("parameters"))
    arguments, kept, error = parse_arguments(raw_args)
    call = ToolCall(id=call_id, name=name, arguments=arguments, raw_arguments=kept)
    return call, (f"{name}: {error}" if error else None)


def _decode_calls(text: str, next_id: Any, reply: ParsedReply) -> bool:
    """Decode one JSON object or list of call objects; False when the text is not JSON at all."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    for obj in value if isinstance(value, list) else [value]:
        call, error = call_from_object(obj, next_id())
        if call is not None:
            reply.tool_calls.append(call)
        if error:
            reply.errors.append(error)
    return True


def parse_tool_calls(text: str, id_prefix: str = "call") -> ParsedReply:
    """Split a raw completion into content and tool calls; never raises."""
    counter = iter(range(1_000_000))

    def next_id() -> str:
        return f"{id_prefix}_{next(counter)}"

    reply = ParsedReply(content=None)
    if TOOL_CALL_OPEN in text:
        for match in _BLOCK.finditer(text):
            body = match.group(1).strip()
            closed = match.group(0).endswith(TOOL_CALL_CLOSE)
            if not body:
                reply.errors.append("empty <tool_call> block" if closed else "a <tool_call> block was cut off before </tool_call>")
            elif not _decode_calls(body, next_id, reply):
                reason = "is not valid JSON" if closed else "was cut off before </tool_call>"
                reply.errors.append(f"tool call {body[:80]!r} {reason}")
        outside = _BLOCK.sub("", text).strip()
        reply.content = outside or None
        return reply
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    candidate = fenced.group(1) if fenced else stripped
    if candidate.startswith("[") or (candidate.startswith("{") and '"name"' in candidate):
        probe = ParsedReply(content=None)
        if _decode_calls(candidate, next_id, probe) and probe.tool_calls:
            return probe
    reply.content = stripped or None
    return reply
