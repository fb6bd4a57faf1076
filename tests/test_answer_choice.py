"""`bench/answer_choice.py`: the figures that tell counting from choosing in compact-view answers."""

from __future__ import annotations

from bench.answer_choice import Choice, choice_figures, is_first_references


def test_counting_answers_and_a_missed_late_passage_are_told_apart_from_a_chosen_one():
    counting = Choice([1, 2, 3, 4, 5], frozenset({7}), forced=False)  # the answer shown at [7], not taken
    choosing = Choice([7, 1, 3], frozenset({7, 9}), forced=True)
    early = Choice([2, 1], frozenset({1}), forced=False)
    figures = choice_figures([counting, choosing, early, Choice([], frozenset(), forced=True)])
    assert figures["answers"] == 3
    assert figures["begin_with_1"] == 1 / 3
    assert figures["first_references"] == 1 / 3
    assert figures["counting_pairs"] == 4 / 7  # 1-2, 2-3, 3-4, 4-5 of 4 + 2 + 1 pairs
    assert figures["past_first_search"] == 1 / 3
    assert figures["answer_shown_late"] == 2 and figures["late_answer_chosen"] == 0.5


def test_only_the_first_references_in_the_order_shown_count_as_counting():
    assert is_first_references([1, 2, 3]) and is_first_references([1])
    assert not is_first_references([2, 3]) and not is_first_references([1, 3]) and not is_first_references([2, 1])
