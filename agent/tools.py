"""The four tools, exactly as Context-1: search, grep, read, prune, under a token budget.

Execution is split in two so parallel calls are both concurrent and deterministic:
`fetch` (the backend call; runs in a thread pool, one per call) and `materialize` (dedup against
every chunk already shown, budget cut, rendering; runs in call order on the harness thread).
Two searches in one turn may fetch the same chunk; the first in call order shows it, the second
drops it, so a chunk is never returned twice. Chunks that were cut by the budget are not marked
seen: they were never shown.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.compact_view import References, render_compact_chunk
from agent.final_answer import format_id
from agent.harness_view import ChunkPart, Part, View
from agent.policy_base import TokenCounter, ToolCall
from agent.prompts import GREP_CORPUS, PRUNE_CHUNKS, READ_DOCUMENT, SEARCH_CORPUS, TOOL_NAMES
from agent.trajectory import ToolCallRecord
from core.harness_settings import HarnessSettings
from search.backend import Hit, SearchBackend

_WORD = re.compile(r"[A-Za-z0-9]+(?:'[a-z]+)?")
STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have
    having he her here hers herself him himself his how i if in into is it its itself just me more most my
    myself no nor not now of off on once only or other our ours ourselves out over own same she should so
    some such than that the their theirs them themselves then there these they this those through to too
    under until up very was we were what when where which while who whom why will with would you your
    yours yourself also did does whose known name named called one many much""".split()
)

_CHUNK_BLOCK = re.compile(
    r'<Chunk id=(?P<id>"[^"]*"|\S+?) doc=(?P<doc>"[^"]*"|\S+?) title="(?P<title>[^"]*)">\n(?P<text>.*?)\n</Chunk>',
    flags=re.DOTALL,
)


def content_terms(text: str) -> list[str]:
    """Lower-cased words minus stopwords, in order, deduplicated (for overlap scoring)."""
    return list(dict.fromkeys(w.lower() for w in _WORD.findall(text) if w.lower() not in STOPWORDS))


def render_chunk(hit: Hit) -> str:
    title = hit.title.replace('"', "'").replace("\n", " ")
    return f'<Chunk id={format_id(hit.chunk_id)} doc={format_id(hit.doc_id)} title="{title}">\n{hit.text}\n</Chunk>\n'


@dataclass(frozen=True)
class RenderedChunk:
    chunk_id: str
    doc_id: str
    title: str
    text: str


def parse_rendered_chunks(content: str) -> list[RenderedChunk]:
    """The chunks shown in a tool message (scripted policies read their observations with this)."""
    return [
        RenderedChunk(m["id"].strip('"'), m["doc"].strip('"'), m["title"], m["text"])
        for m in _CHUNK_BLOCK.finditer(content)
    ]


@dataclass
class Fetched:
    hits: list[Hit] = field(default_factory=list)
    error: str | None = None
    backend_ms: float = 0.0


@dataclass
class Outcome:
    """A finished call: its trajectory record and the parts of the tool message the model sees."""

    record: ToolCallRecord
    parts: list[Part]
    part_tokens: list[int]


@dataclass
class EpisodeState:
    question: str
    question_terms: list[str]
    seen: dict[str, str] = field(default_factory=dict)  # chunk id -> doc id, every chunk ever shown
    references: References = field(default_factory=References)  # the compact view's [n] numbers

    def resolve(self, call: ToolCall) -> ToolCall:
        """The call with compact-view references replaced by the chunk and document ids they name;
        values that name nothing are left as written (the tool reports them as unknown)."""
        if call.name == READ_DOCUMENT and "doc_id" in call.arguments:
            chunk_id = self.references.chunk(call.arguments["doc_id"])
            if chunk_id is not None and chunk_id in self.seen:
                return _with_arguments(call, {**call.arguments, "doc_id": self.seen[chunk_id]})
        elif call.name == PRUNE_CHUNKS and call.arguments.get("chunk_ids"):
            ids = [self.references.chunk(value) or value for value in prune_ids(call.arguments)]
            return _with_arguments(call, {**call.arguments, "chunk_ids": ids})
        return call


def _with_arguments(call: ToolCall, arguments: dict[str, Any]) -> ToolCall:
    return ToolCall(id=call.id, name=call.name, arguments=arguments, raw_arguments=call.raw_arguments)


def argument_error(call: ToolCall, max_pattern_chars: int) -> str | None:
    """Why a call cannot run as given (unknown tool, unreadable or missing arguments), else None."""
    if call.name not in TOOL_NAMES:
        return f"Error: unknown tool {call.name!r}. Available tools: {', '.join(TOOL_NAMES)}."
    if call.raw_arguments is not None and not call.arguments:
        return f"Error: the arguments of {call.name} are not valid JSON: {call.raw_arguments[:200]!r}"
    required = {SEARCH_CORPUS: "query", GREP_CORPUS: "pattern", READ_DOCUMENT: "doc_id", PRUNE_CHUNKS: "chunk_ids"}[call.name]
    value = call.arguments.get(required)
    if value is None or (isinstance(value, (str, list)) and not value):
        return f"Error: {call.name} needs a non-empty {required!r} argument."
    if call.name == GREP_CORPUS and len(str(value)) > max_pattern_chars:
        return f"Error: grep patterns are limited to {max_pattern_chars} characters."
    return None


def prune_ids(arguments: dict[str, Any]) -> list[str]:
    """Tolerate a list, a single id, or a comma/space separated string."""
    value = arguments.get("chunk_ids", [])
    if isinstance(value, str):
        value = re.split(r"[\s,]+", value)
    return [str(item).strip().strip('"') for item in value if str(item).strip()]


class Toolbox:
    """Runs tool calls against one backend with one tokenizer; shared by an episode's turns."""

    def __init__(self, backend: SearchBackend, counter: TokenCounter, config: HarnessSettings):
        self.backend = backend
        self.counter = counter
        self.config = config
        self._chunk_tokens: dict[str, int] = {}

    # ---- backend side (thread pool) -------------------------------------------------------
    def fetch(self, call: ToolCall, state: EpisodeState, exclude: frozenset[str]) -> Fetched:
        start = time.perf_counter()
        fetched = Fetched()
        try:
            if call.name == SEARCH_CORPUS:
                fetched.hits = self.backend.search(str(call.arguments["query"]), k=self.config.search_candidates, exclude=exclude)
            elif call.name == GREP_CORPUS:
                fetched.hits = self.backend.grep(str(call.arguments["pattern"]), limit=self.config.grep_limit, exclude=exclude)
            elif call.name == READ_DOCUMENT:
                fetched.hits = self.backend.document_chunks(str(call.arguments["doc_id"]))
        except ValueError as error:  # invalid or too-slow regex, bad query: the model is told
            fetched.error = f"Error: {error}"
        except Exception as error:  # noqa: BLE001 - a backend failure is recorded and reported
            if self.config.raise_tool_errors:
                raise
            fetched.error = f"Error: {call.name} failed in the search backend ({type(error).__name__}: {error})"
        fetched.backend_ms = (time.perf_counter() - start) * 1000
        return fetched

    # ---- harness side (call order) --------------------------------------------------------
    def chunk_tokens(self, hit: Hit, rendered: str) -> int:
        tokens = self._chunk_tokens.get(hit.chunk_id)
        if tokens is None:
            if len(self._chunk_tokens) > 200_000:
                self._chunk_tokens.clear()
            tokens = self._chunk_tokens[hit.chunk_id] = self.counter.count(rendered)
        return tokens

    def text_outcome(self, call: ToolCall, text: str, *, error: str | None = None, rejected: bool = False) -> Outcome:
        tokens = self.counter.count(text)
        record = ToolCallRecord(
            id=call.id, name=call.name, arguments=call.arguments, raw_arguments=call.raw_arguments,
            error=error, rejected=rejected, tokens=tokens,
        )
        return Outcome(record, [text], [tokens])

    def materialize(self, call: ToolCall, fetched: Fetched, state: EpisodeState, view: View, remaining: int) -> Outcome:
        """Dedup, order, budget-cut and render fetched hits; marks the shown chunks seen."""
        if fetched.error:
            outcome = self.text_outcome(call, fetched.error + "\n", error=fetched.error)
            outcome.record.backend_ms = fetched.backend_ms
            return outcome
        hits = fetched.hits
        if call.name == READ_DOCUMENT:
            doc_id = str(call.arguments["doc_id"])
            if not hits:
                message = f"Error: unknown document id {doc_id!r}. Use a doc=... id shown in a chunk."
                outcome = self.text_outcome(call, message + "\n", error=message)
                outcome.record.backend_ms = fetched.backend_ms
                return outcome
            hits = self.rerank([h for h in hits if h.chunk_id not in view.visible], state.question_terms)
            limit = remaining
        else:
            hits = [h for h in hits if h.chunk_id not in state.seen]
            limit = min(remaining, self.config.search_budget_tokens)
        header_budget = 48
        shown: list[tuple[Hit, str, int]] = []
        used = 0
        compact = self.config.view == "compact"
        terms = set(state.question_terms)
        for hit in hits:
            if limit - header_budget - used < 16:
                break  # nothing more can fit; do not tokenize the rest
            if compact:  # the number this chunk gets if shown: references are never skipped
                rendered = render_compact_chunk(len(state.references.chunks) + len(shown) + 1, hit.title, hit.text, terms)
                tokens = self.counter.count(rendered)
            else:
                rendered = render_chunk(hit)
                tokens = self.chunk_tokens(hit, rendered)
            if used + tokens > limit - header_budget:
                continue
            shown.append((hit, rendered, tokens))
            used += tokens
        header = self._header(call, len(shown), used, len(hits) - len(shown), len(fetched.hits))
        header_tokens = self.counter.count(header)
        while shown and used + header_tokens > limit:  # the header counts against the cap too
            used -= shown.pop()[2]
            header = self._header(call, len(shown), used, len(hits) - len(shown), len(fetched.hits))
            header_tokens = self.counter.count(header)
        parts: list[Part] = [header]
        part_tokens = [header_tokens]
        for hit, rendered, tokens in shown:
            parts.append(ChunkPart(hit.chunk_id, hit.doc_id, rendered, tokens))
            part_tokens.append(tokens)
            state.seen[hit.chunk_id] = hit.doc_id
            if compact:
                state.references.assign(hit.chunk_id)
        record = ToolCallRecord(
            id=call.id, name=call.name, arguments=call.arguments, raw_arguments=call.raw_arguments,
            result_chunk_ids=[h.chunk_id for h, _, _ in shown],
            result_doc_ids=list(dict.fromkeys(h.doc_id for h, _, _ in shown)),
            tokens=sum(part_tokens), candidates=len(fetched.hits), backend_ms=fetched.backend_ms,
        )
        return Outcome(record, parts, part_tokens)

    def header_floor(self, call: ToolCall) -> int:
        """Tokens of the longest header this call can get when none of its results fit."""
        if call.name not in (SEARCH_CORPUS, GREP_CORPUS, READ_DOCUMENT):
            return 0
        return self.counter.count(self._header(call, 0, 0, 99, 99))

    def _header(self, call: ToolCall, n_shown: int, tokens: int, left_out: int, candidates: int) -> str:
        argument = {SEARCH_CORPUS: "query", GREP_CORPUS: "pattern", READ_DOCUMENT: "doc_id"}[call.name]
        value = str(call.arguments[argument]).replace("\n", " ")[:200]
        head = f'{call.name}({argument}="{value}"): '
        if self.config.view == "compact":  # the reader knows what it asked; ids here would be long hashes
            if n_shown == 0:
                if candidates == 0:
                    return f"{call.name}: no new results.\n"
                if call.name == READ_DOCUMENT and left_out == 0:
                    return f"{call.name}: nothing new.\n"
                return f"{call.name}: {left_out} new, none fits; prune or answer.\n"
            return f"{call.name}: {n_shown} new.\n"
        if n_shown == 0:
            if candidates == 0:
                return head + "no new chunks found.\n"
            if call.name == READ_DOCUMENT and left_out == 0:
                return head + "every chunk of this document is already in your context.\n"
            return head + f"{left_out} new chunks matched but none fits the remaining token budget; prune or answer.\n"
        more = f"; {left_out} more matched but did not fit the budget" if left_out else ""
        return head + f"{n_shown} new chunks ({tokens:,} tokens{more}).\n"

    @staticmethod
    def rerank(hits: Sequence[Hit], question_terms: Sequence[str]) -> list[Hit]:
        """Order a document's chunks by question-term overlap (reading order breaks ties).

        Why lexical: the offline default has no cross-encoder; the hybrid score is not defined
        for a single document's chunks without another search. A configured reranker can replace this.
        """
        terms = set(question_terms)

        def overlap(hit: Hit) -> int:
            return len(terms.intersection(w.lower() for w in _WORD.findall(hit.text)))

        scored = [(-overlap(hit), position, hit) for position, hit in enumerate(hits)]
        return [hit for _, _, hit in sorted(scored, key=lambda item: (item[0], item[1]))]

    def prune(self, call: ToolCall, view: View) -> Outcome:
        removed, already, unknown, freed = view.prune(prune_ids(call.arguments))
        lines = [f"prune_chunks: removed {len(removed)} chunks from your context ({freed:,} tokens freed)."]
        if already:
            lines.append(f"Already pruned: {', '.join(already)}.")
        if unknown:
            lines.append(f"Unknown chunk ids (not in your context): {', '.join(unknown)}.")
        text = " ".join(lines) + "\n"
        outcome = self.text_outcome(call, text, error=None)
        outcome.record.pruned_chunk_ids = removed
        outcome.record.unknown_chunk_ids = unknown
        return outcome
