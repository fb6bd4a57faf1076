"""A looping turn stops where the loop is evident; a turn that does not loop is never touched."""

from __future__ import annotations

import pytest

from agent.policies.runaway import is_runaway, repeated_call_block, repeating_tail
from agent.policies.tool_parsing import distinct_calls, parse_reply

CALL = '<tool_call>\n{"name": "search_corpus", "arguments": {"query": "The man with one sandal"}}\n</tool_call>\n'


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "search_corpus", "arguments": {"query": "Sid Haig, 2020, 11, 2020, 11, 2020, 11, 2020, 11, ',
    '{"query": "Brian [Brian [Brian [Brian [Brian [',
    "DIM_GRAY_BAR_10_10_10_10_10_10_10_10_10_10_10_10_10",
    "\n" * 30,
    CALL + CALL,
])
def test_loops_are_caught(text):
    assert is_runaway(text)


@pytest.mark.parametrize("text", [
    "[3] [1] [7] [2] [5]",
    "[1] [2] [3] [4] [5] [6] [7] [8] [9] [10]",
    CALL + CALL.replace("one sandal", "Jason father"),
    '<tool_call>\n{"name": "prune_chunks", "arguments": {"chunk_ids": ["1", "2", "3", "4", "5", "6", "7", "8"]}}\n</tool_call>',
    "The 1872 FA Cup Final was played at Kennington Oval; Wanderers beat Royal Engineers 1-0.",
    CALL,
    CALL + CALL[:40],  # the second copy has not closed yet: only a closed repeat is a repeat
])
def test_well_formed_replies_are_not_loops(text):
    assert not is_runaway(text)


def test_a_repeated_block_counts_only_once_it_closes():
    assert not repeated_call_block(CALL + CALL[:-15])
    assert repeated_call_block(CALL + CALL)
    assert not repeating_tail("abc")


def test_a_loop_of_one_call_is_the_call_it_meant():
    reply = parse_reply(CALL * 3 + CALL.replace("one sandal", "Pelias"))
    kept = distinct_calls(reply.tool_calls)
    assert [call.arguments["query"] for call in kept] == ["The man with one sandal", "The man with Pelias"]
    assert [call.id for call in kept] == [reply.tool_calls[0].id, reply.tool_calls[3].id]


@pytest.fixture(scope="module")
def looping_model(tmp_path_factory):
    """A tiny random model that, greedy, writes one token again and again (measured: newlines)."""
    from agent.small_model import build_tiny_model

    texts = ["Acme was founded by Jane Roe in 1901 in Springfield.", "The river flows north past the mill."] * 20
    return build_tiny_model(tmp_path_factory.mktemp("tiny-loop") / "model", texts, seed=11)


def test_a_looping_turn_stops_early_with_the_same_tokens_and_logprobs(looping_model):
    from agent.policies.transformers_policy import TransformersPolicy

    messages = [{"role": "user", "content": "Who founded Acme?"}]
    unguarded = TransformersPolicy(str(looping_model), max_new_tokens=96, dtype="float32", stop_runaway=False)
    guarded = TransformersPolicy(str(looping_model), max_new_tokens=96, dtype="float32")
    full = unguarded.generate(messages, None, seed=0)
    cut = guarded.generate(messages, None, seed=0)
    assert full.completion_tokens == 96 and is_runaway(full.raw_text)  # the model does loop
    assert 0 < cut.completion_tokens < full.completion_tokens
    assert is_runaway(cut.raw_text) and not is_runaway(cut.raw_text[:-1])  # stopped where the loop became evident
    assert cut.completion_token_ids == full.completion_token_ids[: cut.completion_tokens]
    assert cut.completion_logprobs == pytest.approx(full.completion_logprobs[: cut.completion_tokens], abs=1e-5)
