"""Short views of a synthetic question: a few of its words, the way people ask.

Why: the offline generator's questions copy whole document sentences (the natural style puts a
wh-word in place of the answer; the cloze style masks it), so a reranker trained on them learns
to spot a near-copy of the question in a chunk. Measured on the multi-hop dev file: a reranker
trained on 726 such tasks lowered hybrid's answer found from 0.656 to 0.541. The questions people
ask name an entity or two and a relation in a dozen words, and share only those with the
passage that answers them. A short view keeps what such a question would keep: the wh-word, a
named entity or two, and a handful of the other content words, in their original order. It is
a training-time augmentation and a way to judge a reranker on the customer's own tasks asked
briefly; the task, its documents and its answer are unchanged.
"""

from __future__ import annotations

import random
import re

from agent.policies.heuristic_text import entity_spans
from agent.tools import STOPWORDS

_ABOUT = re.compile(r"^About ([^:]{1,120}):\s*")  # the natural style's topic prefix
_MASK = re.compile(r"\[X\d+\]|\bX\b")  # cloze masks and the natural style's bridge name
_WORD = re.compile(r"\w[\w'’\-]*")
_WH = ("how many", "how much", "what", "which", "who", "whom", "whose", "when", "where", "why", "how")


def wh_word(question: str) -> str:
    """The question's own wh-word (`what` when it has none)."""
    lower = _ABOUT.sub("", question).lower()
    found = [(match.start(), wh) for wh in _WH for match in re.finditer(rf"\b{wh}\b", lower)]
    return min(found, key=lambda item: (item[0], -len(item[1])))[1] if found else "what"


def short_view(question: str, rng: random.Random, max_words: int = 10, max_entities: int = 2) -> str | None:
    """At most `max_words` words of `question`: its wh-word, up to `max_entities` of its named
    entities (the topic of an `About T:` prefix first) and a sample of its other content words,
    in the order the question has them. None when the question has too few words to shorten."""
    topic = _ABOUT.match(question)
    body = _MASK.sub(" ", question[topic.end():] if topic else question)
    entities = [span for span in entity_spans(body) if not _MASK.fullmatch(span)]
    if topic:
        entities = [topic.group(1).strip(), *(e for e in entities if e != topic.group(1).strip())]
    entities = entities[:1] + rng.sample(entities[1:], min(len(entities) - 1, max_entities - 1)) if entities else []
    named = {w.lower() for entity in entities for w in _WORD.findall(entity)}
    words = [(m.start(), m.group(0)) for m in _WORD.finditer(body)]
    content = [(at, w) for at, w in words if w.lower() not in STOPWORDS and w.lower() not in named and w.lower() not in _WH]
    budget = max_words - 1 - sum(len(_WORD.findall(e)) for e in entities)
    if budget < 1 or len(content) + len(entities) < 3:
        return None
    picked = sorted(rng.sample(content, min(budget, len(content))))
    placed = [(body.find(e), e) for e in entities]  # the topic is not in the body: -1, first
    parts = [text for _, text in sorted(placed + picked, key=lambda item: item[0])]
    return " ".join([wh_word(question), *parts])


def short_views(question: str, count: int, seed: str, max_words: int = 10) -> list[str]:
    """`count` distinct short views of `question`, drawn reproducibly from `seed` (the task id)."""
    rng = random.Random(f"{seed}:short")
    views: list[str] = []
    for _ in range(count * 3):
        if len(views) == count:
            break
        view = short_view(question, rng, max_words)
        if view is not None and view not in views and view != question:
            views.append(view)
    return views
