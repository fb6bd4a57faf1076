"""Explore and generate in one agent loop (Context-1: no separate "evolve" step).

The teacher gets the seed document and two tools over the customer's index,
`search_corpus(query)` and `read_document(doc_id)`, and works until it replies with the task
as JSON. This is deliberately simpler than the training harness (no token budget, no pruning,
no exclusion of seen chunks): the teacher is a strong model writing data, not the policy being
trained. Every turn is one cached `LLMClient.chat` call; tool results are deterministic for a
given index, so a rerun replays the same conversation from the cache without paying.

A reply that is not the JSON asked for gets one corrective user turn per remaining turn; the
last turn offers no tools and asks for structured output. Failures are returned as a reason,
never raised, so one bad seed does not stop a materialization.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from agent.tools import render_chunk
from llm.client import ChatReply, LLMClient, LLMError, ReplyParseError
from search.backend import SearchBackend
from synth.corpus_view import CorpusView

M = TypeVar("M", bound=BaseModel)

SEARCH_TOOL = "search_corpus"
READ_TOOL = "read_document"
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": SEARCH_TOOL,
        "description": "Hybrid keyword and semantic search over the corpus; returns the best chunks.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
    {"type": "function", "function": {
        "name": READ_TOOL,
        "description": "The full text of one document, by its DOC_ID.",
        "parameters": {"type": "object", "properties": {"doc_id": {"type": "string"}}, "required": ["doc_id"]}}},
]
FINAL_NUDGE = "Stop exploring now. Reply with the JSON object only."


@dataclass
class LoopSettings:
    max_turns: int = 10
    search_k: int = 5
    read_chars: int = 6000


@dataclass
class LoopResult(Generic[M]):
    value: M | None
    error: str | None = None
    detail: str = ""
    turns: int = 0
    visited: list[str] = field(default_factory=list)


class ToolRunner:
    """Executes the teacher's tool calls against the index and the corpus."""

    def __init__(self, backend: SearchBackend, corpus: CorpusView, settings: LoopSettings):
        self.backend = backend
        self.corpus = corpus
        self.settings = settings
        self.visited: list[str] = []

    def run(self, name: str, raw_arguments: str) -> str:
        try:
            arguments = json.loads(raw_arguments or "{}")
            if not isinstance(arguments, dict):
                raise ValueError("arguments must be a JSON object")
        except ValueError as error:
            return f"Error: invalid arguments for {name}: {error}"
        if name == SEARCH_TOOL:
            query = str(arguments.get("query") or "").strip()
            if not query:
                return "Error: search_corpus needs a non-empty query"
            hits = self.backend.search(query, k=self.settings.search_k)
            self.visited.extend(hit.doc_id for hit in hits)
            return "".join(render_chunk(hit) for hit in hits) or "No results."
        if name == READ_TOOL:
            doc_id = str(arguments.get("doc_id") or "").strip()
            if doc_id not in self.corpus.docs:
                return f"Error: unknown doc_id {doc_id!r}"
            self.visited.append(doc_id)
            text = self.corpus[doc_id]
            cut = text[: self.settings.read_chars]
            more = f"\n[... {len(text) - len(cut)} more characters]" if len(cut) < len(text) else ""
            return f'<Document id={doc_id} title="{self.corpus.title(doc_id)}">\n{cut}{more}\n</Document>'
        return f"Error: unknown tool {name!r}; use {SEARCH_TOOL} or {READ_TOOL}"


def _assistant_message(reply: ChatReply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or ""}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in reply.tool_calls
        ]
    return message


def run_tool_loop(
    llm: LLMClient,
    runner: ToolRunner,
    messages: list[dict[str, Any]],
    output: type[M],
    *,
    name: str,
    settings: LoopSettings,
) -> LoopResult[M]:
    """Let the teacher search and read until it returns a valid `output` object."""
    messages = list(messages)
    parse_error = ""
    for turn in range(settings.max_turns):
        final = turn == settings.max_turns - 1
        try:
            if final:
                reply = llm.chat(messages + [{"role": "user", "content": FINAL_NUDGE}],
                                 response_format=llm.response_format(output, name))
            else:
                reply = llm.chat(messages, tools=TOOLS)
        except LLMError as error:
            return LoopResult(None, "generation_llm_error", str(error)[:300], turn + 1, runner.visited)
        if reply.tool_calls and not final:
            messages.append(_assistant_message(reply))
            for call in reply.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": runner.run(call.name, call.arguments)})
            continue
        try:
            return LoopResult(llm.parse(reply, output), None, "", turn + 1, runner.visited)
        except ReplyParseError as error:
            parse_error = str(error)
            messages.append(_assistant_message(reply))
            messages.append({"role": "user", "content": f"That was not the JSON object asked for ({parse_error}). {FINAL_NUDGE}"})
    return LoopResult(None, "generation_unparseable", parse_error[:300], settings.max_turns, runner.visited)


def seed_message(corpus: CorpusView, doc_id: str, read_chars: int) -> str:
    text = corpus[doc_id][:read_chars]
    return f'Seed document {doc_id} (title: "{corpus.title(doc_id)}"):\n<document>\n{text}\n</document>'
