"""Whole-word answer matching after normalization: the one definition of "contains the answer".

Why whole words: a plain substring test credits "no" inside "not" and "1988" inside "19880",
which inflates answer-found on yes/no and numeric questions. Why this normalization (SQuAD's:
lowercase, accents folded, punctuation to spaces, articles dropped): the answer string and the
paragraph spell the same thing with different punctuation ("Arthur's Magazine" vs "Arthur's
magazine,"), and both sides go through the same function, so the test stays symmetric.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_NON_WORD = re.compile(r"[^\w\s]|_")
_SPACES = re.compile(r"\s+")

YES_NO = frozenset({"yes", "no"})


def normalize_text(text: str) -> str:
    """Lowercase, fold accents, punctuation to spaces, drop articles, collapse whitespace."""
    folded = unicodedata.normalize("NFKD", text)
    folded = "".join(ch for ch in folded if not unicodedata.combining(ch)).lower()
    folded = _NON_WORD.sub(" ", folded)
    folded = _ARTICLES.sub(" ", folded)
    return _SPACES.sub(" ", folded).strip()


def contains_answer(text: str, answer: str) -> bool:
    """True when the normalized answer occurs in the normalized text as whole words.

    An answer that normalizes to nothing (only punctuation or articles) matches nothing: an
    empty needle would otherwise match every document.
    """
    needle = normalize_text(answer)
    if not needle:
        return False
    return f" {needle} " in f" {normalize_text(text)} "


def is_yes_no(answer: str) -> bool:
    return normalize_text(answer) in YES_NO


def answer_doc_ids(answer: str, texts: Mapping[str, str], among: Iterable[str] | None = None) -> frozenset[str]:
    """The documents (of `among`, default all of `texts`) whose text contains the answer.

    Yes/no answers never count as contained: "no" in a paragraph says nothing about whether
    the paragraph answers the question, so those tasks fall back to the all-gold rule.
    """
    if is_yes_no(answer):
        return frozenset()
    ids = texts.keys() if among is None else among
    return frozenset(doc_id for doc_id in ids if doc_id in texts and contains_answer(texts[doc_id], answer))
