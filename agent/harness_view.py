"""The model's view of an episode: the message list, its token count, and pruning.

Why a separate object: the context is not append-only. `prune_chunks` rewrites earlier tool
messages (a pruned chunk is replaced by a one-line `[pruned chunk ID]` marker), so the view
keeps each tool message as parts (text and chunk blocks) and re-renders only the message it
edits. Token counts are kept per part and summed, so a turn never re-tokenizes the whole
context (the harness-overhead goal is <= 10 ms per turn): the sum of the parts' counts differs
from counting the joined text by at most a token or so per part boundary, which is far below
the budget's granularity.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.policy_base import Message, TokenCounter, ToolCall

MESSAGE_OVERHEAD_TOKENS = 4  # role markers and separators a chat template adds per message


@dataclass
class ChunkPart:
    chunk_id: str
    doc_id: str
    text: str
    tokens: int
    pruned: bool = False


Part = str | ChunkPart


def pruned_marker(chunk_id: str) -> str:
    return f"[pruned chunk {chunk_id}]\n"


class View:
    """Messages sent to the policy, with per-message token counts and chunk locations."""

    def __init__(self, counter: TokenCounter, *, marker: Callable[[str], str] = pruned_marker, fixed_tokens: int = 0):
        """`fixed_tokens`: what the model is shown besides the messages (the tool schemas the chat
        template declares), counted in the total so the usage line tells the whole size."""
        self.counter = counter
        self.marker = marker
        self.fixed_tokens = fixed_tokens
        self.messages: list[Message] = []
        self._tokens: list[int] = []
        self._parts: dict[int, list[Part]] = {}
        self._part_tokens: dict[int, list[int]] = {}
        self.visible: dict[str, int] = {}  # chunk id -> index of the message that shows it
        self.pruned: dict[str, str] = {}  # chunk id -> doc id, in pruning order
        self.total_tokens = fixed_tokens

    # ---- building -------------------------------------------------------------------------
    def _append(self, message: Message, tokens: int) -> int:
        self.messages.append(message)
        self._tokens.append(tokens)
        self.total_tokens += tokens
        return len(self.messages) - 1

    def add_text(self, role: str, content: str) -> int:
        tokens = self.counter.count(content) + MESSAGE_OVERHEAD_TOKENS
        return self._append({"role": role, "content": content}, tokens)

    def add_assistant(self, content: str | None, tool_calls: list[ToolCall]) -> int:
        message: Message = {"role": "assistant", "content": content or ""}
        tokens = MESSAGE_OVERHEAD_TOKENS + (self.counter.count(content) if content else 0)
        if tool_calls:
            rendered = []
            for call in tool_calls:
                arguments = call.raw_arguments if call.raw_arguments is not None and not call.arguments else json.dumps(call.arguments, ensure_ascii=False)
                rendered.append({"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}})
                tokens += self.counter.count(call.name) + self.counter.count(arguments) + 2
            message["tool_calls"] = rendered
        return self._append(message, tokens)

    def add_tool_result(self, call_id: str, name: str, parts: list[Part], part_tokens: list[int]) -> int:
        """Append a tool message; `part_tokens[i]` is the count of `parts[i]` (counted by the caller)."""
        message = {"role": "tool", "tool_call_id": call_id, "name": name, "content": _join(parts)}
        index = self._append(message, sum(part_tokens) + MESSAGE_OVERHEAD_TOKENS)
        self._parts[index] = list(parts)
        self._part_tokens[index] = list(part_tokens)
        for part in parts:
            if isinstance(part, ChunkPart):
                self.visible[part.chunk_id] = index
        return index

    def append_to_message(self, index: int, text: str) -> None:
        """Add a text part (usage line, hint) to an existing message."""
        tokens = self.counter.count(text)
        message = self.messages[index]
        if index in self._parts:
            self._parts[index].append(text)
            self._part_tokens[index].append(tokens)
            message["content"] = _join(self._parts[index])
        else:
            message["content"] = (message.get("content") or "") + text
        self._tokens[index] += tokens
        self.total_tokens += tokens

    # ---- pruning ---------------------------------------------------------------------------
    def prune(self, chunk_ids: list[str]) -> tuple[list[str], list[str], list[str], int]:
        """Remove chunks from the view: returns (pruned, already_pruned, unknown, tokens freed)."""
        before = self.total_tokens
        removed: list[str] = []
        already: list[str] = []
        unknown: list[str] = []
        touched: set[int] = set()
        for chunk_id in dict.fromkeys(chunk_ids):
            index = self.visible.pop(chunk_id, None)
            if index is None:
                (already if chunk_id in self.pruned else unknown).append(chunk_id)
                continue
            parts = self._parts[index]
            for position, part in enumerate(parts):
                if isinstance(part, ChunkPart) and part.chunk_id == chunk_id and not part.pruned:
                    part.pruned = True
                    marker = self.marker(chunk_id)
                    marker_tokens = self.counter.count(marker)
                    delta = marker_tokens - self._part_tokens[index][position]
                    parts[position] = marker
                    self._part_tokens[index][position] = marker_tokens
                    self._tokens[index] += delta
                    self.total_tokens += delta
                    self.pruned[chunk_id] = part.doc_id
                    break
            removed.append(chunk_id)
            touched.add(index)
        for index in touched:
            self.messages[index]["content"] = _join(self._parts[index])
        return removed, already, unknown, before - self.total_tokens

    # ---- reading ---------------------------------------------------------------------------
    def snapshot(self) -> list[Message]:
        """Copies of the message dicts (content strings are immutable; prune replaces them)."""
        return [dict(message) for message in self.messages]

    def message_tokens(self, index: int) -> int:
        return self._tokens[index]

    def recount(self) -> int:
        """The sum of the per-message counts recomputed from scratch (tests check consistency)."""
        return self.fixed_tokens + sum(self._tokens)

    def has_parts(self, index: int) -> bool:
        return index in self._parts

    def parts(self, index: int) -> list[Any]:
        return list(self._parts.get(index, []))


def _join(parts: list[Part]) -> str:
    return "".join(part.text if isinstance(part, ChunkPart) else part for part in parts)
