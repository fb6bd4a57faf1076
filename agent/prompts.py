"""The words the harness says to the model: system prompt, tool schemas and harness notices.

Why here and not in the harness: the system prompt and tool schemas are part of the training
data (SFT and RL condition on them), so they live in one place, are versioned
(`PROMPT_VERSION` goes into every trajectory's config) and are rendered identically for every
policy. The prompt follows Context-1's appendix: decompose, plan several non-overlapping
strategies, issue parallel calls, reflect after each round (what do I know, what next, what to
prune, is it enough), answer with a ranked list of `<Document id=...>` entries.
"""

from __future__ import annotations

from typing import Any

PROMPT_VERSION = "1"
COMPACT_PROMPT_VERSION = "compact-1"
VIEWS = ("full", "compact")

SEARCH_CORPUS = "search_corpus"
GREP_CORPUS = "grep_corpus"
READ_DOCUMENT = "read_document"
PRUNE_CHUNKS = "prune_chunks"
TOOL_NAMES = (SEARCH_CORPUS, GREP_CORPUS, READ_DOCUMENT, PRUNE_CHUNKS)

SYSTEM_PROMPT = """You are a search agent. Your job is to find the documents in a corpus that \
contain the information needed to answer the user's question, and hand a ranked list of them to \
another model that will write the answer. You do not answer the question yourself.

Tools:
- search_corpus(query): hybrid keyword + semantic search. Returns the best chunks that you have \
not seen yet, up to {search_budget} tokens per call.
- grep_corpus(pattern): regular-expression search over the corpus text. Returns at most \
{grep_limit} unseen chunks that match. Use it for exact names, numbers, dates and phrases.
- read_document(doc_id): the chunks of one document that are not already in your context, most \
relevant to the question first, cut to the remaining budget.
- prune_chunks(chunk_ids): removes chunks you judged irrelevant from your context to free space. \
Pruned chunks cannot be shown again by search.

Results are shown as <Chunk id=CHUNK_ID doc=DOC_ID title="...">text</Chunk>.

How to work:
1. Decompose the question into the facts you need. Questions often need several hops: find an \
intermediate entity first, then search for it.
2. Each turn, issue several parallel tool calls with different, non-overlapping queries.
3. After each round ask yourself: what do I know now, what is still missing, which chunks are \
irrelevant (prune them), do I have enough to stop?
4. Your context holds at most {token_budget} tokens; the usage is shown after every turn as \
[Token usage: N/T]. Past {hard_cutoff} tokens only prune_chunks is allowed.

When you are done, reply without tool calls, with the supporting documents ranked from most to \
least relevant, up to {max_docs} documents, and nothing else:
<Document id=DOC_ID><Justification>1-3 sentences on what this document contributes.</Justification></Document>
"""

USAGE_LINE = "[Token usage: {used:,}/{budget:,}]"

SOFT_HINT = (
    "[Your context is more than {percent}% full. Prune chunks you no longer need with "
    "prune_chunks, or give your final answer.]"
)

HARD_CUTOFF_ERROR = (
    "Error: {tool} was rejected because the context holds {used:,} tokens, past the hard cutoff of "
    "{cutoff:,} of {budget:,}. Only prune_chunks is allowed now: prune irrelevant chunks or give "
    "your final answer."
)

FORCE_FINAL = (
    "{reason} Give your final answer now, without tool calls: up to {max_docs} "
    "<Document id=DOC_ID><Justification>...</Justification></Document> entries, most relevant first."
)

MALFORMED_REPLY = (
    "Error: your reply could not be parsed ({error}). Either call a tool with valid JSON arguments "
    "or give the final answer as <Document id=DOC_ID><Justification>...</Justification></Document> entries."
)


# The compact view (small models): the same four tools and rules, said in fewer words; results
# are `[n] Title: best sentences` and the answer may be references alone, so a 135M model's
# window holds a whole episode and its answer is a few tokens instead of 500.
COMPACT_SYSTEM_PROMPT = """You are a search agent. Find the passages of a corpus that answer the \
user's question; another model writes the answer.
Tools: search_corpus(query) hybrid search; grep_corpus(pattern) exact regex search; \
read_document(doc_id) more of the document of a reference; prune_chunks(chunk_ids) drop references.
Results are shown as [n] Title: text. Search for each entity of the question, then for the \
entities the results point to. Context: at most {token_budget} tokens; past {hard_cutoff} only \
prune_chunks is allowed.
When done, reply without tool calls with the references of the supporting passages, most \
relevant first, at most {max_docs}, like: [3] [1] [7]
"""

COMPACT_FORCE_FINAL = "{reason} Answer now with up to {max_docs} references, most relevant first, like: [3] [1] [7]"

COMPACT_MALFORMED_REPLY = "Error: your reply could not be parsed ({error}). Call a tool, or answer with references like [3] [1] [7]."


# What a final answer starts with in each view: the forced final turn's reply is begun with it
# (`HarnessSettings.prefill_final_answer`), and both answer parsers read it as an answer.
ANSWER_OPENING = {"compact": "[", "full": "<Document id="}


def prompt_version(view: str) -> str:
    return COMPACT_PROMPT_VERSION if view == "compact" else PROMPT_VERSION


def system_prompt(*, token_budget: int, hard_cutoff_tokens: int, search_budget: int, grep_limit: int, max_docs: int,
                  view: str = "full") -> str:
    if view == "compact":
        return COMPACT_SYSTEM_PROMPT.format(
            token_budget=f"{token_budget:,}", hard_cutoff=f"{hard_cutoff_tokens:,}", max_docs=max_docs)
    return SYSTEM_PROMPT.format(
        token_budget=f"{token_budget:,}",
        hard_cutoff=f"{hard_cutoff_tokens:,}",
        search_budget=f"{search_budget:,}",
        grep_limit=grep_limit,
        max_docs=max_docs,
    )


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required, "additionalProperties": False},
        },
    }


def tool_schemas(view: str = "full") -> list[dict[str, Any]]:
    """OpenAI function-calling schemas for the four tools (also fed to chat templates).

    The compact view keeps names and argument names (one parser, one trajectory schema) with
    one-line descriptions; its ids are the episode's references (`3`), not chunk or document ids.
    """
    if view == "compact":
        return [
            _function(SEARCH_CORPUS, "Search the corpus.", {"query": {"type": "string"}}, ["query"]),
            _function(GREP_CORPUS, "Regex search.", {"pattern": {"type": "string"}}, ["pattern"]),
            _function(READ_DOCUMENT, "Read the document of a reference.", {"doc_id": {"type": "string"}}, ["doc_id"]),
            _function(PRUNE_CHUNKS, "Drop references from the context.",
                      {"chunk_ids": {"type": "array", "items": {"type": "string"}}}, ["chunk_ids"]),
        ]
    return [
        _function(
            SEARCH_CORPUS,
            "Hybrid (BM25 + dense) search over the corpus. Returns unseen chunks that fit the per-call token budget.",
            {"query": {"type": "string", "description": "A focused search query."}},
            ["query"],
        ),
        _function(
            GREP_CORPUS,
            "Regular-expression search over chunk texts. Returns at most a few unseen matching chunks.",
            {"pattern": {"type": "string", "description": "A Python regular expression, e.g. an exact name."}},
            ["pattern"],
        ),
        _function(
            READ_DOCUMENT,
            "Read one document: its chunks not already in context, most relevant first, cut to the remaining budget.",
            {"doc_id": {"type": "string", "description": "A document id as shown in doc=... of a chunk."}},
            ["doc_id"],
        ),
        _function(
            PRUNE_CHUNKS,
            "Remove chunks from the context to free space. Use it for chunks that are irrelevant.",
            {"chunk_ids": {"type": "array", "items": {"type": "string"}, "description": "Chunk ids to remove."}},
            ["chunk_ids"],
        ),
    ]
