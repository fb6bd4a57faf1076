"""The quote-matching cascade: each rung on a hand-made case, then invariants by hypothesis."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.text_match import contains_answer, match_quote, normalize_text, strip_links, text_contains_quote, words_in_order

PAGE = (
    "The 1872 FA Cup Final was a football match between Wanderers and Royal Engineers on 16 March 1872\n"
    "at  Kennington Oval in [London](https://en.wikipedia.org/wiki/London). It was the final of the first staging\n"
    "of the Football Association Challenge Cup \u2014 known as the \u201cFA Cup\u201d \u2014 which became the oldest "
    "football competition in the world. Queen\u2019s Park withdrew from the semi-finals."
)


@pytest.mark.parametrize(
    "quote, rung",
    [
        ("football match between WANDERERS and royal engineers", "substring"),
        ("on 16 March 1872 at Kennington Oval", "whitespace"),  # a line break and a double space in the page
        ("at Kennington Oval in London. It was the final", "links"),  # the page has a markdown link
        ('Cup - known as the "FA Cup" - which became', "normalized"),  # straight quotes and hyphens for typographic ones
        ("Queen's Park withdrew from the semi-finals", "normalized"),
        ("the Football Association Challenge Cup, which became the oldest football competition", "ordered"),
    ],
)
def test_each_rung_of_the_cascade_is_reached(quote, rung):
    assert match_quote(PAGE, quote) == rung


def test_unmatched_quotes_and_empty_inputs():
    assert match_quote(PAGE, "Blackburn Rovers won the replay at Bramall Lane") is None
    assert match_quote(PAGE, "   ") is None
    assert match_quote("", "anything at all") is None


def test_ordered_rung_needs_three_long_words_in_order():
    # Two long words only: the regex rung does not apply, and the quote is not a substring.
    assert match_quote(PAGE, "Wanderers ... Engineers") is None
    # Right words, wrong order: rejected.
    assert match_quote(PAGE, "competition oldest football became Challenge") is None


def test_ordered_rung_does_not_span_the_whole_page():
    """Words scattered far apart are not a quote (a bounded gap, unlike an unbounded `.*?`)."""
    filler = " ".join(["lorem"] * 200)
    page = f"The team arrived. {filler} They played. {filler} It was the first. {filler} A match followed."
    assert match_quote(page, "team played first match") is None
    assert match_quote("The team had played their first ever match here.", "team played first match") == "ordered"


@pytest.mark.parametrize("quote", ["https://evil.example/proof", "[](https://evil.example)", "<https://a.b/c> ...", " -- ", "\u2026", "()"])
def test_a_quote_that_normalizes_to_nothing_or_only_links_to_nowhere_never_matches(quote):
    """Stripping links from the quote used to leave '', which is a substring of every page."""
    assert match_quote(PAGE, quote) is None
    assert match_quote("A page with -- dashes, (brackets) and an ellipsis\u2026 in it.", quote) is None


def test_a_url_in_the_quote_must_be_the_page_s_url():
    page = "Founded by [Acme](https://acme.example/about) in 1990."
    assert match_quote(page, "Acme (https://evil.example)") is None
    assert match_quote(page, "Founded by Acme (https://evil.example/about) in 1990") is None
    assert match_quote(page, "Founded by Acme in 1990") == "links"  # the link's text read as prose still matches
    assert match_quote(page, "[Acme](https://acme.example/about)") == "substring"
    assert match_quote("Docs live at https://acme.example/docs today.", "docs live at https://acme.example/docs") == "substring"


def test_strip_links_keeps_link_text():
    assert strip_links("see [the docs](http://x.y/z) or <a href='q'>here</a> at https://a.b/c") == "see the docs or here at  "


def test_contains_answer_uses_word_boundaries_and_normalization():
    assert contains_answer("It opened in 2012.", "2012")
    assert not contains_answer("It opened in 2012.", "12")
    assert contains_answer("Queen\u2019s Park FC", "queen's park")
    assert not contains_answer("anything", "")


words = st.lists(st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=9), min_size=3, max_size=12)
spacing = st.lists(st.sampled_from([" ", "  ", "\n", "\t", " \n "]), min_size=12, max_size=12)


@settings(max_examples=150, deadline=None)
@given(words=words, seps=spacing, start=st.integers(0, 5), length=st.integers(1, 8), upper=st.booleans())
def test_matching_is_invariant_to_whitespace_and_case(words, seps, start, length, upper):
    page = "".join(w + seps[i % len(seps)] for i, w in enumerate(words)).strip()
    chosen = words[start % len(words): start % len(words) + length]
    quote = " ".join(chosen)
    variant = "  \n".join(chosen)
    variant = variant.upper() if upper else variant.title()
    assert text_contains_quote(page, quote)
    assert text_contains_quote(page, variant)
    assert text_contains_quote(page.upper(), quote)


prose = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126) | st.sampled_from("\u2018\u2019\u201c\u201d\u2013\u2014\u2026\u00e9"),
                max_size=60)


@settings(max_examples=150, deadline=None)
@given(text=prose)
def test_normalization_is_idempotent_and_case_free(text):
    once = normalize_text(text)
    assert normalize_text(once) == once
    assert normalize_text(text.upper()) == normalize_text(text.lower())


def test_ordered_rung_on_an_adversarial_page_answers_right():
    """Five words where the first four are everywhere and the last nowhere: the bounded regex
    backtracked through every gap of every word (8.6 s on 10,000 characters of "that")."""
    page = "that " * 2_000
    assert match_quote(page, "that that that that zzzz") is None
    assert match_quote(page + "x zzzz", "that that that that zzzz") == "ordered"
    assert match_quote(page + "x" * 200 + " zzzz", "that that that that zzzz") is None  # beyond the gap


def reference_words_in_order(text: str, words: list[str], gap: int) -> bool:
    """The rule as the bounded regex states it (fine on the short texts hypothesis makes)."""
    return re.search((r".{0,%d}?" % gap).join(re.escape(word) for word in words), text) is not None


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="ab ", max_size=60),
    words=st.lists(st.text(alphabet="ab", min_size=1, max_size=3), min_size=1, max_size=5),
    gap=st.integers(0, 6),
)
def test_linear_ordered_scan_agrees_with_the_bounded_regex(text, words, gap):
    assert words_in_order(text, words, gap) == reference_words_in_order(text, words, gap)
