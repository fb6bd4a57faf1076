"""The code verifier: the 2/3 rule, answer quotes, "some document holds the answer", and that
corrupting any quote a rule depends on turns a passing task into a failing one."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synth.schema import SupportingItem, SynthTask
from synth.verify import VerifyRules, check_task, keep_matched_quotes, required_matches, verify_task

DOCS = {
    "alder": "The Alder Bridge was completed in 1911 by the engineer Mara Quill. It spans the river Tessel. "
             "Its central arch is the longest in the county. Traffic was closed to lorries in 1987.",
    "quill": "Mara Quill was an engineer born in Ostwick. She designed seven bridges. Her last bridge opened in 1925.",
}
CLUES = [
    "A crossing finished in the early 1910s by a female engineer.",
    "It has the county's longest central arch.",
    "Its builder came from a fishing village on the coast.",
]


def good_task() -> SynthTask:
    return SynthTask(
        clues=CLUES,
        question="In which village was the builder of this crossing born?",
        truth="Ostwick",
        truth_type="location",
        supporting_items=[
            SupportingItem(id="alder", clue_quotes=[CLUES[0], CLUES[1]],
                           item_quotes=["The Alder Bridge was completed in 1911 by the engineer Mara Quill.",
                                        "Its central arch is the longest in the county."]),
            SupportingItem(id="quill", clue_quotes=[CLUES[2]], item_quotes=["Mara Quill was an engineer born in Ostwick."],
                           contains_truth=True, truth_quotes=["born in Ostwick"]),
        ],
    ).with_id()


def with_item(task: SynthTask, index: int, **changes) -> SynthTask:
    items = list(task.supporting_items)
    items[index] = items[index].model_copy(update=changes)
    return task.model_copy(update={"supporting_items": items})


def test_a_correct_task_passes():
    check = check_task(good_task(), DOCS)
    assert check.passed, check.reason
    assert verify_task(good_task(), DOCS).verification == {"alder": "ok", "quill": "ok"}


@pytest.mark.parametrize("total, needed", [(0, 0), (1, 1), (2, 2), (3, 2), (4, 3), (5, 4), (6, 4), (9, 6)])
def test_two_thirds_rounded_up(total, needed):
    assert required_matches(total) == needed


def test_two_of_three_document_quotes_pass_one_of_three_fails():
    real = ["The Alder Bridge was completed in 1911 by the engineer Mara Quill.", "It spans the river Tessel.",
            "Its central arch is the longest in the county."]
    fake = ["It was painted bright green every spring.", "A toll was charged until the war ended in Europe."]
    assert check_task(with_item(good_task(), 0, item_quotes=real[:2] + fake[:1]), DOCS).passed
    failing = check_task(with_item(good_task(), 0, item_quotes=real[:1] + fake), DOCS)
    assert not failing.passed and failing.reason == "item_quotes_unmatched"


def test_two_thirds_rule_applies_to_clue_quotes():
    ok = with_item(good_task(), 0, clue_quotes=[CLUES[0], CLUES[1], "a clue nobody wrote down at all"])
    assert check_task(ok, DOCS).passed
    bad = with_item(good_task(), 0, clue_quotes=[CLUES[0], "a clue nobody wrote", "another invented clue text"])
    assert check_task(bad, DOCS).reason == "clue_quotes_unmatched"


def test_every_answer_quote_must_match():
    bad = with_item(good_task(), 1, truth_quotes=["born in Ostwick", "born in the harbour town of Westwick"])
    assert check_task(bad, DOCS).reason == "truth_quotes_unmatched"


def test_missing_answer_quotes_fail_an_item_that_claims_the_answer():
    assert check_task(with_item(good_task(), 1, truth_quotes=[]), DOCS).reason == "truth_quotes_missing"
    relaxed = VerifyRules(require_truth_quotes=False)
    assert check_task(with_item(good_task(), 1, truth_quotes=[]), DOCS, relaxed).passed


def test_some_document_must_contain_the_answer():
    task = with_item(good_task(), 1, contains_truth=False, truth_quotes=[])
    assert check_task(task, DOCS).reason == "no_item_contains_truth"


def test_other_task_level_failures():
    assert check_task(with_item(good_task(), 1, id="unknown"), DOCS).reason == "missing_document"
    assert check_task(with_item(good_task(), 0, item_quotes=[]), DOCS).reason == "no_item_quotes"
    assert check_task(with_item(good_task(), 0, clue_quotes=[]), DOCS).reason == "no_clue_quotes"
    assert check_task(good_task().model_copy(update={"supporting_items": []}), DOCS).reason == "no_supporting_items"
    leaked = good_task().model_copy(update={"clues": CLUES + ["Its builder was from Ostwick."]})
    assert check_task(leaked, DOCS).reason == "truth_in_clues"
    dup = good_task().model_copy(update={"supporting_items": good_task().supporting_items + [good_task().supporting_items[1]]})
    assert check_task(dup, DOCS).reason == "duplicate_supporting_items"
    strict = VerifyRules(truth_in_quotes=True)
    assert check_task(with_item(good_task(), 1, truth_quotes=["Mara Quill was an engineer"]), DOCS, strict).reason == "truth_not_in_quotes"
    # An answer swapped after the quote's fifth long word passes the ordered rung, not the document check.
    swapped = good_task().model_copy(update={"truth": "1931"})
    swapped = with_item(swapped, 1, truth_quotes=["She designed seven bridges. Her last bridge opened in 1931"])
    assert check_task(swapped, DOCS).passed  # Context-1's rules alone accept it
    assert check_task(swapped, DOCS, strict).reason == "truth_not_in_document"


def test_failed_tasks_keep_their_reason_and_passing_tasks_keep_only_matched_quotes():
    failed = verify_task(with_item(good_task(), 1, contains_truth=False, truth_quotes=[]), DOCS)
    assert not failed.passed_verification and failed.failure_reason == "no_item_contains_truth"
    extra = with_item(good_task(), 0, item_quotes=good_task().supporting_items[0].item_quotes + ["Invented sentence about it."])
    kept = verify_task(extra, DOCS)
    assert kept.passed_verification
    assert "Invented sentence about it." not in kept.supporting_items[0].item_quotes
    assert keep_matched_quotes(kept, DOCS) == kept


# -- properties -------------------------------------------------------------------------------

SPACES = st.sampled_from([" ", "  ", "\n", " \t "])


@settings(max_examples=60, deadline=None)
@given(sep=SPACES, upper=st.booleans())
def test_verdict_is_invariant_to_whitespace_and_case_of_quotes(sep, upper):
    def reshape(quote: str) -> str:
        quote = sep.join(quote.split(" "))
        return quote.upper() if upper else quote.lower()

    task = good_task()
    items = [item.model_copy(update={"item_quotes": [reshape(q) for q in item.item_quotes],
                                     "clue_quotes": [reshape(q) for q in item.clue_quotes],
                                     "truth_quotes": [reshape(q) for q in item.truth_quotes]})
             for item in task.supporting_items]
    assert check_task(task.model_copy(update={"supporting_items": items}), DOCS).passed


FIELDS = st.sampled_from(["item_quotes", "clue_quotes", "truth_quotes"])


@settings(max_examples=80, deadline=None)
@given(item=st.integers(0, 1), field=FIELDS, position=st.integers(0, 3), junk=st.text("qxzjvkw", min_size=4, max_size=10))
def test_corrupting_a_required_quote_fails_the_task(item, field, position, junk):
    """Replace every quote of one kind on one item by text absent from its source: with at most
    three quotes per kind, 2/3 can no longer be met (or the answer quote is gone)."""
    task = good_task()
    target = task.supporting_items[item]
    quotes = getattr(target, field)
    if not quotes:  # the alder item has no answer quotes: corrupt its document quotes instead
        field, quotes = "item_quotes", target.item_quotes
    corrupted = [f"{junk} {' '.join(reversed(q.split()))} {junk}"[: max(12, len(q))] for q in quotes]
    assert check_task(with_item(task, item, **{field: corrupted}), DOCS).passed is False


@settings(max_examples=60, deadline=None)
@given(word_index=st.integers(0, 4), junk=st.text("qxzjvkw", min_size=5, max_size=9))
def test_corrupting_a_word_of_the_answer_quote_fails(word_index, junk):
    """A single substituted word among the first long words breaks the answer quote."""
    task = with_item(good_task(), 1, truth_quotes=["Mara Quill was an engineer born in Ostwick"])
    words = "Mara Quill was an engineer born in Ostwick".split()
    long_positions = [i for i, w in enumerate(words) if len(w) > 3]
    words[long_positions[word_index % len(long_positions)]] = junk
    assert check_task(with_item(task, 1, truth_quotes=[" ".join(words)]), DOCS).reason == "truth_quotes_unmatched"


def fabricated_url_task() -> SynthTask:
    """Real clue quotes, but every document and answer quote is a made-up URL, and the answer
    ("Zanzibar") is in no document: what a generator that invents citations produces."""
    task = good_task()
    task = with_item(task, 0, item_quotes=["https://alder-bridge.example/history", "https://alder-bridge.example/arch"])
    task = with_item(task, 1, item_quotes=["[source](https://quill.example/bio)"], truth_quotes=["https://quill.example/born-in-zanzibar"])
    return task.model_copy(update={"truth": "Zanzibar"})


def test_fabricated_url_quotes_fail_verification_under_the_llm_rules():
    from synth.generate import LLM_RULES

    check = check_task(fabricated_url_task(), DOCS, LLM_RULES)
    assert not check.passed and check.reason == "item_quotes_unmatched"
    assert check.items[0].item_matched == 0


def test_fabricated_url_quotes_are_not_kept_as_evidence():
    kept = keep_matched_quotes(fabricated_url_task(), DOCS)
    assert [item.item_quotes for item in kept.supporting_items] == [[], []]
