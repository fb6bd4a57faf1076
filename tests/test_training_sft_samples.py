"""SFT samples: one per assistant turn, prompt = the (pruned) view the model saw, loss on the reply only.

The trajectory is real: a scripted policy drives the harness over a tiny in-memory backend
(parallel searches, a prune, a read, an answer), so the views carry real pruning markers.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agent.final_answer import format_final_answer
from agent.harness import HarnessConfig, run_episode
from agent.policies.transformers_policy import TokenizerCounter, template_messages
from agent.policy_base import PolicyStep, ToolCall
from tests.support.tiny_models import TinyBackend, tiny_model_dir
from training.sft_samples import IGNORE_INDEX, MissingTurnKind, TemplatePrefixError, assistant_message, build_samples, tokenize_turn, turn_chat

QUESTION = "Which engineer designed the Alpha Lighthouse, and where did she teach?"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir(tmp_path_factory)))


class PlanPolicy:
    """Two parallel searches; prune one shown chunk and read a document; answer."""

    name = "plan"

    def __init__(self, counter):
        self.counter = counter

    def token_counter(self):
        return self.counter

    def new_episode(self, question, seed=0):
        return _PlanEpisode()


class _PlanEpisode:
    def __init__(self):
        self.turn = 0

    def act(self, messages, tools) -> PolicyStep:
        turn, self.turn = self.turn, self.turn + 1
        if turn == 0:
            return PolicyStep(content=None, tool_calls=[
                ToolCall("a", "search_corpus", {"query": "Alpha Lighthouse Corven Point engineer"}),
                ToolCall("b", "search_corpus", {"query": "Mara Quell taught Lisbon"}),
            ])
        if turn == 1:
            return PolicyStep(content="Dropping the river chunk.", tool_calls=[
                ToolCall("c", "prune_chunks", {"chunk_ids": ["river-0"]}),
                ToolCall("d", "read_document", {"doc_id": "quell"}),
            ])
        return PolicyStep(content=format_final_answer([("lighthouse", "designed by Mara Quell"), ("quell", "taught in Lisbon")]))


@pytest.fixture(scope="module")
def trajectory(tokenizer):
    config = HarnessConfig(token_budget=4096, response_reserve_tokens=256, search_budget_tokens=512)
    trajectory = run_episode(TinyBackend(), PlanPolicy(TokenizerCounter(tokenizer)), QUESTION, config, task_id="t1")
    assert [len(t.tool_calls) for t in trajectory.turns] == [2, 2, 0]
    assert trajectory.turns[1].pruned_ids == ["river-0"], "the plan must prune a chunk it was shown"
    return trajectory


def _prompt_text(tokenizer, trajectory, turn):
    prompt, _, tools = turn_chat(trajectory, turn)
    return tokenizer.apply_chat_template(template_messages(prompt), tools=tools, add_generation_prompt=True, tokenize=False)


def _spans(sample) -> list[list[int]]:
    """The contiguous runs of labelled positions (one per assistant turn in the sequence)."""
    spans: list[list[int]] = []
    for i, label in enumerate(sample.labels):
        if label == IGNORE_INDEX:
            continue
        if spans and spans[-1][-1] == i - 1:
            spans[-1].append(i)
        else:
            spans.append([i])
    return spans


def test_turns_merge_into_one_sequence_until_a_prune_rewrites_the_context(tokenizer, trajectory):
    samples = build_samples([trajectory], tokenizer, max_length=100_000).samples
    assert [s.turn_indices for s in samples] == [(0, 1), (2,)]
    for sample, turn in zip(samples, [trajectory.turns[0], trajectory.turns[2]]):
        n_prompt = _spans(sample)[0][0]
        assert tokenizer.decode(sample.input_ids[:n_prompt]) == _prompt_text(tokenizer, trajectory, turn)
    merged = samples[0]
    last_ids, _ = tokenize_turn(tokenizer, *turn_chat(trajectory, trajectory.turns[1]))
    assert merged.input_ids == last_ids, "the merged sequence is the last turn's own tokens"


def test_the_pruned_chunk_is_gone_from_later_prompts_only(tokenizer, trajectory):
    river = "flows into the Grey Sea"
    before, after = (_prompt_text(tokenizer, trajectory, trajectory.turns[i]) for i in (1, 2))
    assert river in before and "[pruned chunk river-0]" not in before
    assert river not in after and "[pruned chunk river-0]" in after


def test_labels_cover_exactly_the_assistant_reply(tokenizer, trajectory):
    samples = build_samples([trajectory], tokenizer, max_length=100_000).samples
    expected = [
        '<tool_call>\n{"name": "search_corpus", "arguments": {"query": "Alpha Lighthouse Corven Point engineer"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "search_corpus", "arguments": {"query": "Mara Quell taught Lisbon"}}\n</tool_call><|im_end|>',
        'Dropping the river chunk.\n<tool_call>\n{"name": "prune_chunks", "arguments": {"chunk_ids": ["river-0"]}}\n</tool_call>\n'
        '<tool_call>\n{"name": "read_document", "arguments": {"doc_id": "quell"}}\n</tool_call><|im_end|>',
        trajectory.final_text + "<|im_end|>",
    ]
    spans = [(sample, span) for sample in samples for span in _spans(sample)]
    assert len(spans) == len(expected), "one labelled span per assistant turn"
    for (sample, positions), text in zip(spans, expected):
        assert [sample.labels[i] for i in positions] == [sample.input_ids[i] for i in positions]
        assert tokenizer.decode([sample.input_ids[i] for i in positions]) == text
        assert positions[-1] < len(sample.input_ids) - 1, "the template's trailing newline is not trained on"


def test_labels_match_the_templates_generation_mask(tokenizer, trajectory):
    """Cross-check against `{% generation %}`: the last assistant message's mask equals our labels."""
    turn = trajectory.turns[1]
    prompt, reply, tools = turn_chat(trajectory, turn)
    input_ids, labels = tokenize_turn(tokenizer, prompt, reply, tools)
    rendered = tokenizer.apply_chat_template(
        template_messages([*prompt, reply]), tools=tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assert rendered["input_ids"] == input_ids
    n_prompt = next(i for i, label in enumerate(labels) if label != IGNORE_INDEX)
    mask = rendered["assistant_masks"]
    assert [int(label != IGNORE_INDEX) for label in labels] == [0] * n_prompt + mask[n_prompt:]


def test_rebuilt_reply_is_the_message_the_next_view_shows(trajectory):
    for turn, following in zip(trajectory.turns, trajectory.turns[1:]):
        in_view = following.view_messages[len(turn.view_messages)]
        assert assistant_message(turn) == {k: in_view[k] for k in ("role", "content", "tool_calls") if k in in_view}


def test_parallel_calls_stay_one_assistant_turn(tokenizer, trajectory):
    first = build_samples([trajectory], tokenizer, max_length=100_000).samples[0]
    text = tokenizer.decode([first.input_ids[i] for i in _spans(first)[0]])
    assert text.count("<tool_call>") == 2 and text.count("<|im_end|>") == 1


def test_a_turn_kind_that_loses_every_turn_is_an_error_naming_it_and_the_length_that_fits(tokenizer, trajectory):
    lengths = [len(tokenize_turn(tokenizer, *turn_chat(trajectory, turn))[0]) for turn in trajectory.turns]
    with pytest.raises(MissingTurnKind, match=rf"final \(the shortest is {lengths[2]:,} tokens\)") as raised:
        build_samples([trajectory], tokenizer, max_length=lengths[0])
    assert "prune" in str(raised.value) and "read" in str(raised.value)


def test_turn_kinds_are_counted_and_sequences_stay_within_max_length(tokenizer, trajectory):
    result = build_samples([trajectory, trajectory], tokenizer, max_length=100_000)
    assert result.kinds == {k: {"kept": n, "dropped": 0} for k, n in
                            {"search": 2, "prune": 2, "read": 2, "final": 2}.items()}
    meta = result.metadata()
    assert meta["turns"] == 6 and meta["samples"] == 4 and meta["overlong"] == 0


def test_dataset_is_input_ids_and_labels(tokenizer, trajectory):
    samples = build_samples([trajectory], tokenizer, max_length=100_000)
    dataset = samples.to_dataset()
    assert dataset.column_names == ["input_ids", "labels"] and len(dataset) == 2
    assert dataset[1]["labels"] == samples.samples[1].labels
    assert len(samples.select(1, seed=1).samples) == 1


def test_the_final_answer_mask_covers_exactly_the_answers_labels(tokenizer, trajectory):
    samples = build_samples([trajectory], tokenizer, max_length=100_000).samples
    assert [s.turn_indices for s in samples] == [(0, 1), (2,)], "the prune ends the first sequence"
    assert samples[0].n_final_tokens == 0, "tool-call turns are not answers"
    marked = [i for i, flag in enumerate(samples[1].final_mask) if flag]
    assert marked == _spans(samples[1])[-1] and len(samples[1].final_mask) == len(samples[1].labels)


def test_loss_weights_favour_the_answer_and_average_one_over_the_labels(tokenizer, trajectory):
    from training.sft_samples import SFTSample

    # A merged episode in miniature: prompt, a tool call's 3 tokens, prompt, the answer's 2 tokens.
    sample = SFTSample("t", None, 0, list(range(10)), [IGNORE_INDEX, IGNORE_INDEX, 5, 6, 7, IGNORE_INDEX, IGNORE_INDEX, 8, 9,
                                                      IGNORE_INDEX], (0, 1), (0, 0, 0, 0, 0, 0, 0, 1, 1, 0))
    weights = sample.loss_weights(4.0)
    assert weights == pytest.approx([0, 0, 5 / 11, 5 / 11, 5 / 11, 0, 0, 20 / 11, 20 / 11, 0])
    assert sum(weights) == pytest.approx(sample.n_loss_tokens), "labelled tokens average 1"
    assert sample.loss_weights(1.0) == [0.0 if label == IGNORE_INDEX else 1.0 for label in sample.labels]
    samples = build_samples([trajectory], tokenizer, max_length=100_000)
    assert "loss_weights" not in samples.to_dataset().column_names, "weight 1 trains on TRL's own columns"
    dataset = samples.to_dataset(4.0)
    assert dataset.column_names == ["input_ids", "labels", "loss_weights"]
    assert dataset[1]["loss_weights"] == pytest.approx(samples.samples[1].loss_weights(4.0))


def test_a_template_that_rewrites_the_prompt_is_refused(tokenizer, trajectory):
    import copy

    broken = copy.deepcopy(tokenizer)
    broken.chat_template = tokenizer.chat_template.replace(
        "{{- '<|im_start|>system\\n' + system_text -}}", "{{- '<|im_start|>system\\n' + (messages | length | string) + system_text -}}")
    assert broken.chat_template != tokenizer.chat_template
    with pytest.raises(TemplatePrefixError, match="prefix"):
        build_samples([trajectory], broken, max_length=100_000)


def test_forced_final_turn_is_rendered_without_tools(tokenizer, trajectory):
    turn = trajectory.turns[-1].model_copy(update={"forced_final": True})
    _, _, tools = turn_chat(trajectory, turn)
    assert tools is None
    assert "<tools>" not in _prompt_text(tokenizer, trajectory, turn)
    assert "<tools>" in _prompt_text(tokenizer, trajectory, trajectory.turns[-1])


@settings(max_examples=40, deadline=None)
@example(content="\n\n  leading newlines merge with the generation prompt's")
@given(content=st.text(alphabet=st.characters(blacklist_characters="<", blacklist_categories=("Cs",)), min_size=1, max_size=60))
def test_any_reply_text_is_labelled_exactly_after_the_prompts_own_tokens(tokenizer, content):
    """Property: the prompt's tokens are those it has alone (as at inference); the labels decode to the reply."""
    prompt = [{"role": "system", "content": "s"}, {"role": "user", "content": "q?"}]
    input_ids, labels = tokenize_turn(tokenizer, prompt, {"role": "assistant", "content": content}, None)
    prompt_text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    n_prompt = len(tokenizer(prompt_text, add_special_tokens=False)["input_ids"])
    assert all(label == IGNORE_INDEX for label in labels[:n_prompt])
    assert tokenizer.decode([t for t, label in zip(input_ids, labels) if label != IGNORE_INDEX]) == content + "<|im_end|>"


def test_a_token_merging_across_the_prompt_end_keeps_the_prompts_own_tokens():
    """SmolLM2's BPE merges a reply's leading newlines with the generation prompt's; the sample
    must still start with the prompt's own tokens (what the model is given at inference)."""
    from agent.small_model import SMOLLM2_DIRNAME, default_models_dir, is_complete

    folder = default_models_dir() / SMOLLM2_DIRNAME
    if not is_complete(folder):
        pytest.skip("SmolLM2 is not cached here")
    from transformers import AutoTokenizer

    smol = AutoTokenizer.from_pretrained(str(folder))
    prompt = [{"role": "system", "content": "s"}, {"role": "user", "content": "q?"}]
    reply = {"role": "assistant", "content": "\n\n  leading"}
    prompt_text = smol.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    prompt_ids = smol(prompt_text, add_special_tokens=False)["input_ids"]
    full_ids = smol(smol.apply_chat_template([*prompt, reply], tokenize=False), add_special_tokens=False)["input_ids"]
    assert full_ids[: len(prompt_ids)] != prompt_ids, "the premise: a token merges across the boundary"
    input_ids, labels = tokenize_turn(smol, prompt, reply, None)
    assert input_ids[: len(prompt_ids)] == prompt_ids
    assert smol.decode([t for t, label in zip(input_ids, labels) if label != IGNORE_INDEX]) == "\n\n  leading<|im_end|>"
