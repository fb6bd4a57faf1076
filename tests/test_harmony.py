"""Harmony (gpt-oss) rendering and parsing: our template, the tolerant parser, and the token spans
that SFT trains on and generation stops at. Pure text and a tokenizer trained on the fly (no model).

The property that holds the stages together: what the template renders for an assistant turn,
cut where generation stops (the first <|call|> or <|return|>), parses back into the same tool
calls and answer, and is exactly the span SFT puts loss on.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.policies.model_family import chat_format_of
from agent.policies.tool_parsing import parse_harmony, parse_reply, split_harmony
from agent.policies.transformers_policy import template_messages
from agent.prompts import tool_schemas
from agent.small_model import HARMONY_SPECIALS, train_harmony_tokenizer
from training.sft_samples import IGNORE_INDEX, end_token_ids, tokenize_turn

TOOLS = tool_schemas()
PROMPT = [{"role": "system", "content": "Search the corpus."}, {"role": "user", "content": "Who designed the lighthouse?"}]


@pytest.fixture(scope="module")
def tokenizer():
    return train_harmony_tokenizer([json.dumps(TOOLS), "Search the corpus. Who designed the lighthouse?"], vocab_size=600)


def call(name: str, arguments: dict, call_id: str = "c") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def render(tokenizer, messages, tools=TOOLS, generation_prompt=False, **kwargs) -> str:
    return tokenizer.apply_chat_template(template_messages(messages), tools=tools, tokenize=False,
                                         add_generation_prompt=generation_prompt, **kwargs)


def reply_text(tokenizer, reply: dict, tools=TOOLS) -> str:
    """What the model would generate for `reply`: the full render past the generation prompt."""
    prompt = render(tokenizer, PROMPT, tools, generation_prompt=True)
    full = render(tokenizer, [*PROMPT, reply], tools)
    assert full.startswith(prompt), "the prompt must be a prefix of prompt + reply"
    return full[len(prompt):]


def test_system_and_developer_messages_carry_effort_instructions_and_the_tool_namespace(tokenizer):
    text = render(tokenizer, PROMPT, generation_prompt=True, reasoning_effort="high")
    assert text.startswith("<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n")
    assert "\nReasoning: high\n" in text and "Current date" not in text  # deterministic: no date unless given
    assert "Calls to these tools must go to the commentary channel: 'functions'.<|end|>" in text
    assert "<|start|>developer<|message|># Instructions\n\nSearch the corpus.\n\n# Tools\n\n## functions\n\nnamespace functions {\n" in text
    assert "type search_corpus = (_: {\n// A focused search query.\nquery: string,\n}) => any;" in text
    assert "chunk_ids: string[]," in text and "} // namespace functions<|end|>" in text
    assert text.endswith("<|start|>user<|message|>Who designed the lighthouse?<|end|><|start|>assistant")
    # the tokenizer's own default effort (low), and no tool lines without tools
    plain = render(tokenizer, PROMPT, tools=None, generation_prompt=True)
    assert "\nReasoning: low\n" in plain and "namespace functions" not in plain and "'functions'" not in plain
    assert "Current date: 2026-01-02\n" in render(tokenizer, PROMPT, generation_prompt=True, current_date="2026-01-02")


def test_calls_results_and_answers_render_on_their_channels(tokenizer):
    messages = [*PROMPT,
                {"role": "assistant", "content": "Look it up.", "tool_calls": [call("search_corpus", {"query": "lighthouse"}, "a")]},
                {"role": "tool", "tool_call_id": "a", "name": "search_corpus", "content": "<Chunk id=c1>Mara Quell</Chunk>"},
                {"role": "assistant", "content": "<Document id=d1>"},
                {"role": "user", "content": "Thanks"}]
    text = render(tokenizer, messages)
    assert ("<|start|>assistant<|channel|>analysis<|message|>Look it up.<|end|>"
            '<|start|>assistant<|channel|>commentary to=functions.search_corpus <|constrain|>json<|message|>{"query": "lighthouse"}<|call|>') in text
    assert "<|start|>functions.search_corpus to=assistant<|channel|>commentary<|message|><Chunk id=c1>Mara Quell</Chunk><|end|>" in text
    # a past answer is stored with <|end|>; the last message of a chat ends its turn with <|return|>
    assert "<|start|>assistant<|channel|>final<|message|><Document id=d1><|end|><|start|>user" in text
    assert render(tokenizer, messages[:-1]).endswith("<|channel|>final<|message|><Document id=d1><|return|>")
    # a tool result without a name finds it through its call id
    unnamed = [*messages[:3], {"role": "tool", "tool_call_id": "a", "content": "R"}]
    assert "<|start|>functions.search_corpus to=assistant" in render(tokenizer, unnamed)


def test_several_calls_in_one_turn_end_with_one_call_token(tokenizer):
    calls = [call("search_corpus", {"query": "a"}, "1"), call("grep_corpus", {"pattern": "Quell"}, "2"),
             call("read_document", {"doc_id": "d1"}, "3")]
    text = reply_text(tokenizer, {"role": "assistant", "content": "", "tool_calls": calls})
    assert text.count("<|call|>") == 1 and text.endswith("<|call|>")
    assert text.count("<|end|><|start|>assistant<|channel|>commentary to=functions.") == 2
    parsed = parse_harmony(text)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("search_corpus", {"query": "a"}), ("grep_corpus", {"pattern": "Quell"}), ("read_document", {"doc_id": "d1"})]
    assert parsed.content is None and parsed.errors == []
    assert [c.id for c in parse_harmony(text, id_prefix="call_3").tool_calls] == ["call_3_0", "call_3_1", "call_3_2"]


_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=30).filter(
    lambda s: "<|" not in s and "|>" not in s and s.strip() == s)
_CALL = st.tuples(st.sampled_from(["search_corpus", "grep_corpus", "read_document", "prune_chunks"]),
                  st.dictionaries(st.sampled_from(["query", "pattern", "doc_id", "chunk_ids"]),
                                  st.one_of(_TEXT, st.lists(_TEXT, max_size=3)), min_size=1, max_size=2))


@settings(max_examples=40, deadline=None)
@given(calls=st.lists(_CALL, min_size=0, max_size=4), note=_TEXT, answer=_TEXT.filter(bool))
def test_rendered_replies_parse_back_to_the_same_calls_and_answer(tokenizer, calls, note, answer):
    if calls:
        reply = {"role": "assistant", "content": note,
                 "tool_calls": [call(name, args, str(i)) for i, (name, args) in enumerate(calls)]}
    else:
        reply = {"role": "assistant", "content": answer}
    text = reply_text(tokenizer, reply)
    for completion in (text, text.removesuffix("<|call|>").removesuffix("<|return|>")):  # the policy cuts the stop token
        parsed = parse_reply(completion, "harmony")
        assert parsed.errors == []
        assert [(c.name, c.arguments) for c in parsed.tool_calls] == [(name, args) for name, args in calls]
        assert parsed.content == ((note or None) if calls else answer)


def test_the_sft_span_is_the_generated_span_and_ends_at_the_turn_stop(tokenizer):
    """Loss covers exactly the tokens after `<|start|>assistant` up to the first <|call|>, through the
    <|end|> tokens that close the analysis and the first of two calls."""
    reply = {"role": "assistant", "content": "Two searches.",
             "tool_calls": [call("search_corpus", {"query": "Alpha"}, "1"), call("grep_corpus", {"pattern": "Quell"}, "2")]}
    ids, labels = tokenize_turn(tokenizer, PROMPT, reply, TOOLS)
    vocab = tokenizer.get_vocab()
    assert end_token_ids(tokenizer) == {vocab["<|call|>"], vocab["<|return|>"]}
    trained = [i for i, label in enumerate(labels) if label != IGNORE_INDEX]
    assert trained == list(range(trained[0], len(ids))), "one contiguous span to the end of the turn"
    head = tokenizer("<|start|>assistant", add_special_tokens=False)["input_ids"]
    assert ids[trained[0] - len(head):trained[0]] == head
    assert ids[trained[-1]] == vocab["<|call|>"]
    span = [ids[i] for i in trained]
    assert span.count(vocab["<|end|>"]) == 2 and span.count(vocab["<|call|>"]) == 1
    assert tokenizer.decode(span, skip_special_tokens=False) == reply_text(tokenizer, reply)
    # the template's own {% generation %} marks agree with the span
    marked = tokenizer.apply_chat_template(template_messages([*PROMPT, reply]), tools=TOOLS, tokenize=True, return_dict=True,
                                           return_assistant_tokens_mask=True)
    assert [i for i, m in enumerate(marked["assistant_masks"]) if m] == trained


def test_final_answers_end_with_return_and_train_through_it(tokenizer):
    reply = {"role": "assistant", "content": "<Document id=d1><Justification>Named.</Justification></Document>"}
    ids, labels = tokenize_turn(tokenizer, PROMPT, reply, TOOLS)
    trained = [ids[i] for i, label in enumerate(labels) if label != IGNORE_INDEX]
    assert trained[-1] == tokenizer.convert_tokens_to_ids("<|return|>")
    assert parse_harmony(tokenizer.decode(trained, skip_special_tokens=False)).content == reply["content"]


@pytest.mark.parametrize("text, calls, content, error", [
    # the recipient in the role part, no constrain token (also valid harmony)
    (' to=functions.search_corpus<|channel|>commentary json<|message|>{"query": "x"}<|call|>',
     [("search_corpus", {"query": "x"})], None, None),
    # analysis, then an answer; the analysis is not the answer
    ("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Done<|return|>", [], "Done", None),
    # a call whose JSON is broken keeps its raw text and records an error
    ('<|channel|>commentary to=functions.grep_corpus <|constrain|>json<|message|>{"pattern": "Q', [("grep_corpus", {})],
     None, "grep_corpus: arguments are not valid JSON"),
    ("<|channel|>analysis<|message|>Only thinking<|end|>", [], "Only thinking", "no final-channel answer"),
    ("no markers at all", [], "no markers at all", None),
    ("<|channel|>commentary to=functions. <|message|>{}<|call|>", [], None, "names no function"),
])
def test_parser_is_tolerant_and_records_errors(text, calls, content, error):
    parsed = parse_harmony(text)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == calls
    assert parsed.content == content
    assert (error is None and parsed.error is None) or (error is not None and error in (parsed.error or ""))


def test_broken_call_keeps_raw_arguments_for_the_harness():
    parsed = parse_harmony('<|channel|>commentary to=functions.grep_corpus <|constrain|>json<|message|>{"pattern": "Q')
    assert parsed.tool_calls[0].raw_arguments == '{"pattern": "Q' and "cut off" in parsed.error


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.sampled_from([*HARMONY_SPECIALS, "assistant", " to=functions.search_corpus", "to=",
                                            "commentary", "final", "analysis", "json", '{"query": "x"}', "{"]),
                          st.text(max_size=5)), max_size=25))
def test_parser_never_raises_on_any_token_soup(pieces):
    parsed = parse_harmony("".join(pieces))
    assert all(c.name for c in parsed.tool_calls)
    split_harmony("".join(pieces))


def test_chat_format_is_chosen_from_the_tokenizer(tokenizer):
    from agent.small_model import train_tiny_tokenizer

    assert chat_format_of(tokenizer) == "harmony"
    assert chat_format_of(train_tiny_tokenizer(["hello"], vocab_size=300)) == "chatml"
    assert parse_reply('<tool_call>\n{"name": "search_corpus", "arguments": {"query": "q"}}\n</tool_call>', "chatml").tool_calls
