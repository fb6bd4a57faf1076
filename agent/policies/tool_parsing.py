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

Harmony (gpt-oss) is a format of its own, parsed by `parse_harmony` and chosen by the model family
(`parse_reply(text, chat_format)`): a turn is a sequence of messages, each
`[<|start|>ROLE]<|channel|>CHANNEL[ to=functions.NAME][ <|constrain|>json]<|message|>BODY` closed by
`<|end|>`, `<|call|>` or `<|return|>`. A message addressed `to=functions.NAME` (the recipient may
also stand in the role part, `assistant to=functions.NAME<|channel|>commentary json`) is a tool
call whose body is its JSON arguments; one turn may hold several. `final` messages are the
answer; `analysis` and recipient-less `commentary` text is the reasoning beside tool calls. A
completion with no harmony markers at all is plain content, as in the other formats.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from agent.policy_base import ToolCall

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


# ---- harmony (gpt-oss) ---------------------------------------------------------------------------

HARMONY_START, HARMONY_MESSAGE, HARMONY_CHANNEL, HARMONY_CONSTRAIN = "<|start|>", "<|message|>", "<|channel|>", "<|constrain|>"
HARMONY_ENDS = ("<|end|>", "<|call|>", "<|return|>", "<|endoftext|>")
HARMONY_MARKERS = (HARMONY_START, HARMONY_MESSAGE, HARMONY_CHANNEL, HARMONY_CONSTRAIN, *HARMONY_ENDS)
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL_NAME = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")
_HARMONY_END = re.compile("|".join(re.escape(end) for end in HARMONY_ENDS))


@dataclass(frozen=True)
class HarmonyMessage:
    """One harmony message of a completion: `end` is the token that closed it (None: cut off)."""

    role: str
    channel: str | None
    recipient: str | None
    body: str
    end: str | None


def split_harmony(text: str) -> list[HarmonyMessage]:
    """The messages of a completion that continues `<|start|>assistant` (the generation prompt), so
    its first message has no role of its own. A header without `<|message|>` becomes a message
    with an empty body and no end (the parser reports it); never raises."""
    messages: list[HarmonyMessage] = []
    for position, segment in enumerate(text.split(HARMONY_START)):
        if position > 0 and not segment.strip():
            continue
        header, found, rest = segment.partition(HARMONY_MESSAGE)
        if not found:
            header, rest = segment, ""
        end_match = _HARMONY_END.search(rest)
        body = rest[: end_match.start()] if end_match else rest
        end = end_match.group(0) if end_match and found else None
        role_part = header.split(HARMONY_CHANNEL, 1)[0]
        role = role_part.split(" to=", 1)[0].strip() or "assistant"
        channel = _CHANNEL_NAME.search(header)
        recipient = _RECIPIENT.search(header)
        if not found and not header.strip():
            continue
        messages.append(HarmonyMessage(role, channel.group(1) if channel else None,
                                       recipient.group(1) if recipient else None, body if found else "", end))
    return messages


def parse_harmony(text: str, id_prefix: str = "call") -> ParsedReply:
    """Split a harmony completion into the answer, the reasoning and tool calls; never raises.

    Tool calls: every message addressed to a function (`functions.NAME`, or a bare `NAME`), in
    order; invalid JSON keeps the call with its raw arguments and records an error (the harness
    tells the model). Content: the `final` messages' text when there is one; otherwise, beside
    tool calls, the analysis/commentary text; otherwise (no call, no final) the text of the last
    message, with an error saying no final answer was given. The turn's stop token (`<|call|>`,
    `<|return|>`) may already have been cut off by the caller: a last message without an end is
    accepted when it is complete JSON (a call) or any text (an answer)."""
    if not any(marker in text for marker in HARMONY_MARKERS):
        stripped = text.strip()
        return ParsedReply(content=stripped or None)
    reply = ParsedReply(content=None)
    messages = split_harmony(text)
    finals: list[str] = []
    notes: list[str] = []
    for index, message in enumerate(messages):
        last = index == len(messages) - 1
        if message.recipient and message.recipient != "assistant":
            name = message.recipient.removeprefix("functions.")
            if not name:
                reply.errors.append(f"a tool call to {message.recipient!r} names no function")
                continue
            arguments, kept, error = parse_arguments(message.body.strip() or "{}")
            call_id = f"{id_prefix}_{len(reply.tool_calls)}"
            reply.tool_calls.append(ToolCall(id=call_id, name=name, arguments=arguments, raw_arguments=kept))
            if error:
                cut = message.end is None and last
                reply.errors.append(f"{name}: {error}" + (" (the call was cut off)" if cut else ""))
            continue
        if message.end is None and not last:
            reply.errors.append(f"a harmony message header without <|message|>: {message.role!r}")
            continue
        if message.channel in (None, "final"):
            finals.append(message.body)
        else:
            notes.append(message.body)
    if finals:
        reply.content = "".join(finals).strip() or None
    elif notes:
        reply.content = "\n".join(n.strip() for n in notes if n.strip()) or None
        if not reply.tool_calls:
            reply.errors.append("the reply has no final-channel answer and no tool call (it stopped after its analysis)")
    return reply


def distinct_calls(calls: list[ToolCall]) -> list[ToolCall]:
    """`calls` without repeats of an earlier call (same tool, same arguments): a model that
    loops writes one call many times and means it once."""
    seen: set[str] = set()
    kept = []
    for call in calls:
        key = json.dumps([call.name, call.arguments, call.raw_arguments], sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            kept.append(call)
    return kept


def parse_reply(text: str, chat_format: str = "chatml", id_prefix: str = "call") -> ParsedReply:
    """Parse a completion in the model family's format: `harmony` (gpt-oss) or the Hermes/ChatML
    family (`parse_tool_calls`, every other value)."""
    if chat_format == "harmony":
        return parse_harmony(text, id_prefix)
    return parse_tool_calls(text, id_prefix)
