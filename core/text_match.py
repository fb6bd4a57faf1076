"""How text is matched, defined once for task verification, distractor checks and scoring:
whether a document contains a quote (`QuoteMatcher`, the cascade below) and whether a text
contains an answer (`contains_answer`, at the end).

Does a document really contain a quote? The matching cascade of Context-1's verifier.

Why a cascade and not one fuzzy score: an LLM copying a span out of a page changes it in a few
predictable ways (case, line breaks, a markdown link it read as plain text, typographic quotes
and dashes, a dropped comma, an ellipsis in the middle). Each rung forgives exactly one more of
these, in order, and the first rung that matches is reported, so a verifier report says *how*
a quote matched, not just whether it did:

1. `substring`   case-insensitive substring;
2. `whitespace`  the same with every whitespace run collapsed to one space;
3. `links`       the same against the page with its links stripped (markdown `[text](url)`,
                 `<a>` tags, bare URLs): the model quoted a link's text as plain prose;
4. `normalized`  full normalization: NFKC, unicode quotes/dashes/ellipsis folded, punctuation
                 turned into spaces;
5. `ordered`     the first five words longer than three characters of the normalized quote, in
                 order, with bounded gaps, when it has at least three such words.

Deliberate differences from Context-1's `text_contains_quote`, each closing a hole or fixing a
case it gets wrong:

- **An empty quote never matches.** A quote that normalizes to nothing (only punctuation, only
  whitespace) is no evidence of anything, and an empty string is a substring of every page.
- **Links are stripped from the page only, never from the quote.** Context-1 strips both
  sides, so a quote made only of URLs becomes the empty string and "matches" every page (a task
  whose quotes are fabricated URLs passed verification), and "Acme (https://evil.example)"
  matches a page that links Acme somewhere else, because the quote's URL is never checked. A
  URL the model quotes must be in the page as written (the substring rungs find it there).
- **Punctuation becomes a space, not nothing.** Deleting it glues the words it separated
  ("1872–1873" becomes "18721873", "and/or" becomes "andor"), so the ordered rung would look for
  words the page does not have, and `contains_answer`'s word boundaries would fall in the wrong
  places. A dropped comma is still forgiven, because whitespace runs collapse; the price is
  that "dont" no longer matches "don't".
- **The ordered rung's gaps are bounded.** Context-1 joins the words with an unbounded `.*?`,
  so over a long page a fabricated sentence made of common words ("team", "played", "first",
  "match") matches with its words scattered across the page. We bound each gap to
  `max(80, 2 * len(quote))` normalized characters: an elided clause up to twice the quote's
  length is still forgiven (on the demo corpus this accepts as many elided quotes as the
  unbounded rule), a page-wide scatter is not.
- **The ordered rung is a linear scan, not a regex.** The same question as the bounded regex
  (`w1.{0,gap}?w2...`), answered by walking each word's occurrences once: the regex backtracks
  through every gap of every word and took 35 s on 40,000 characters of "that" for the quote
  "that that that that zzzz" (`bench/quote_matcher.py` prints the figures).
"""

from __future__ import annotations

import re
import unicodedata
from functools import cached_property

RUNGS = ("substring", "whitespace", "links", "normalized", "ordered")

_WS = re.compile(r"\s+")
_MD_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_HTML_LINK = re.compile(r"<a\s[^>]*>(.*?)</a>", flags=re.IGNORECASE | re.DOTALL)
_URL = re.compile(r"(?:https?|ftp)://[^\s<>\[\]\"')]+")
_SINGLE_QUOTES = re.compile("[\u2018\u2019\u201a\u201b\u2032\u2035`\u00b4]")
_DOUBLE_QUOTES = re.compile("[\u201c\u201d\u201e\u201f\u2033\u2036\u00ab\u00bb]")
_DASHES = re.compile("[\u2010\u2011\u2012\u2013\u2014\u2015\u2212]")
_PUNCT = re.compile(r"[^\w\s]|_")
MIN_ORDERED_WORDS = 3
ORDERED_WORDS = 5
MIN_ORDERED_WORD_CHARS = 4  # "longer than three characters"


def collapse_whitespace(text: str) -> str:
    return _WS.sub(" ", text).strip()


def strip_links(text: str) -> str:
    """Keep a link's visible text, drop its target (models quote what they read, not URLs)."""
    text = _MD_LINK.sub(r"\1", text)
    text = _HTML_LINK.sub(r"\1", text)
    text = _URL.sub(" ", text)
    return text


def normalize_text(text: str) -> str:
    """The most forgiving form: lowercase, NFKC, folded quotes and dashes, no punctuation."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = _SINGLE_QUOTES.sub("'", text)
    text = _DOUBLE_QUOTES.sub('"', text)
    text = _DASHES.sub("-", text)
    text = text.replace("\u2026", "...")
    text = _PUNCT.sub(" ", text)
    return collapse_whitespace(text)


def ordered_words(normalized_quote: str) -> list[str]:
    return [word for word in normalized_quote.split() if len(word) >= MIN_ORDERED_WORD_CHARS][:ORDERED_WORDS]


def _occurrences(text: str, word: str) -> list[int]:
    """Every start of `word` in `text`, overlapping ones included (as a regex search would try)."""
    starts, at = [], text.find(word)
    while at != -1:
        starts.append(at)
        at = text.find(word, at + 1)
    return starts


def words_in_order(text: str, words: list[str], gap: int) -> bool:
    """Do `words` occur in `text` in order, each starting at most `gap` characters after the
    previous one ends? Equivalent to searching `w1.{0,gap}?w2.{0,gap}?...` (on text without line
    breaks), in time linear in the words' occurrences: for each word, keep the ends of the
    occurrences reachable so far, and accept an occurrence of the next word when the nearest
    reachable end before it is close enough (one sweep over two sorted lists)."""
    ends = [start + len(words[0]) for start in _occurrences(text, words[0])]
    for word in words[1:]:
        reachable, previous = [], 0
        for start in _occurrences(text, word):
            while previous + 1 < len(ends) and ends[previous + 1] <= start:
                previous += 1
            if ends and ends[previous] <= start <= ends[previous] + gap:
                reachable.append(start + len(word))
        if not reachable:
            return False
        ends = reachable
    return bool(ends)


class QuoteMatcher:
    """One document (or clue text) prepared once, then asked about many quotes.

    The normalized variants of a long document are computed lazily and kept, because a task
    checks a dozen quotes against the same page and the benchmark checks thousands.
    """

    def __init__(self, text: str):
        self.text = text or ""

    @cached_property
    def _lower(self) -> str:
        return self.text.lower()

    @cached_property
    def _collapsed(self) -> str:
        return collapse_whitespace(self._lower)

    @cached_property
    def _no_links(self) -> str:
        return collapse_whitespace(strip_links(self.text).lower())

    @cached_property
    def _normalized(self) -> str:
        return normalize_text(strip_links(self.text))

    def match(self, quote: str) -> str | None:
        """The name of the first rung that finds `quote`, or None (empty quotes never match)."""
        quote = (quote or "").strip()
        normalized = normalize_text(quote)
        if not normalized or not self.text:
            return None
        lowered = quote.lower()
        if lowered in self._lower:
            return "substring"
        collapsed = collapse_whitespace(lowered)
        if collapsed in self._collapsed:
            return "whitespace"
        if collapsed in self._no_links:
            return "links"
        if normalized in self._normalized:
            return "normalized"
        words = ordered_words(normalized)
        if len(words) >= MIN_ORDERED_WORDS and words_in_order(self._normalized, words, max(80, 2 * len(normalized))):
            return "ordered"
        return None

    def contains(self, quote: str) -> bool:
        return self.match(quote) is not None


def match_quote(text: str, quote: str) -> str | None:
    """Which rung of the cascade finds `quote` in `text` (None: not found)."""
    return QuoteMatcher(text).match(quote)


def text_contains_quote(text: str, quote: str) -> bool:
    return QuoteMatcher(text).contains(quote)


_ARTICLES = re.compile(r"\b(a|an|the)\b")


def answer_form(text: str) -> str:
    """The form answers are compared in (SQuAD's normalization, folded a little further):
    accents folded, case folded, punctuation to spaces, articles dropped, whitespace collapsed."""
    folded = unicodedata.normalize("NFKD", text)
    folded = "".join(ch for ch in folded if not unicodedata.combining(ch)).casefold()
    folded = _PUNCT.sub(" ", folded)
    folded = _ARTICLES.sub(" ", folded)
    return collapse_whitespace(folded)


def contains_answer(text: str, answer: str) -> bool:
    """Does `answer` occur in `text` (its links' targets dropped) as whole words, both sides in
    `answer_form`? The one definition of "contains the answer": the benchmark's answer-found
    metric and the RL reward, the verifier's "truth in the quotes" and "answer leaked into the
    clues" checks, and the distractor check all ask this.

    Why whole words: a plain substring test credits "no" inside "not" and "12" inside "2012",
    which inflates answer found on yes/no and numeric questions and lets a leaked "12" pass as
    absent. Why this normalization: the answer string and the paragraph spell the same thing
    with different punctuation, case or accents ("Arthur's Magazine" vs "Arthur's magazine,"),
    and both sides go through the same function, so the test stays symmetric. An answer that
    normalizes to nothing (only punctuation or articles) matches nothing: an empty needle would
    match every text.
    """
    needle = answer_form(answer)
    if not needle:
        return False
    return f" {needle} " in f" {answer_form(strip_links(text))} "
