"""Which documents of a task hold its answer (the answer-found metric's gold), and which answers
say nothing about that (yes/no). Whether a text contains an answer is `core.text_match`'s
`contains_answer`, the one definition verification and scoring share.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from core.text_match import answer_form, contains_answer

YES_NO = frozenset({"yes", "no"})


def is_yes_no(answer: str) -> bool:
    return answer_form(answer) in YES_NO


def answer_doc_ids(answer: str, texts: Mapping[str, str], among: Iterable[str] | None = None) -> frozenset[str]:
    """The documents (of `among`, default all of `texts`) whose text contains the answer.

    Yes/no answers never count as contained: "no" in a paragraph says nothing about whether
    the paragraph answers the question, so those tasks fall back to the all-gold rule.
    """
    if is_yes_no(answer):
        return frozenset()
    ids = texts.keys() if among is None else among
    return frozenset(doc_id for doc_id in ids if doc_id in texts and contains_answer(texts[doc_id], answer))
