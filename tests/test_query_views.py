"""Short views of synthetic questions (synth.query_views): the words a person would keep."""

from __future__ import annotations

import random
import re

from synth.query_views import short_view, short_views, wh_word

NATURAL = ("About Icehouse (song): In what, the song peaked at number 28 on the \"Billboard\" Top Tracks chart "
           "in 1981, after the band toured the United States with Cheap Trick?")
BRIDGED = ("Air Tahoma Flight 185 was a scheduled cargo flight from X to the Cincinnati/Northern Kentucky International "
           "Airport. Along with other suburbs in what, Olive Branch is one of the fastest growing areas south of central X?")


def words(text: str) -> list[str]:
    return re.findall(r"\w[\w'’\-]*", text)


def test_a_view_is_short_starts_with_the_wh_word_and_keeps_the_topic_and_the_question_order():
    for seed in range(20):
        view = short_view(NATURAL, random.Random(seed), max_words=8)
        assert view is not None and len(words(view)) <= 8
        assert view.startswith("what Icehouse (song)")
        rest = words(view)[3:]
        source = words(NATURAL)
        positions = [source.index(w) for w in rest]
        assert positions == sorted(positions)  # the question's own words, in its order
        assert not {"the", "on", "in", "at"} & {w.lower() for w in rest}  # no stopwords


def test_masks_never_appear_and_the_bridged_question_keeps_its_names():
    views = short_views(BRIDGED, 3, seed="task-1")
    assert len(views) == 3 and len(set(views)) == 3
    assert all(" X " not in f" {v} " and "[X" not in v for v in views)
    assert all(v.startswith("what ") for v in views)
    assert short_views(BRIDGED, 3, seed="task-1") == views  # reproducible from the task id
    assert short_views(BRIDGED, 3, seed="task-2") != views


def test_the_wh_word_is_the_questions_own():
    assert wh_word("How many people live in the X?") == "how many"
    assert wh_word("About How I Met Your Mother: Who played Ted Mosby?") == "who"
    assert wh_word("Name the capital of France.") == "what"


def test_a_question_too_short_to_shorten_has_no_view():
    assert short_view("Who is X?", random.Random(0)) is None
    assert short_views("Who is X?", 2, seed="t") == []
