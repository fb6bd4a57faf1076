"""Pure text helpers of the `heuristic` policy: entity spans, name normalization, title keys,
question terms and sentence splitting.

They live apart from the episode logic in `heuristic.py` so that module stays readable (and
under the house size) and these string functions can be tested on their own. Simplified on
purpose: entities are capitalized spans (no NER model) and names are compared after
`normalize` (case, punctuation, `&`).
"""

from __future__ import annotations

import re

import regex

from agent.tools import STOPWORDS, content_terms

_CONNECTOR = r"(?:of|the|and|de|for|in|on|von|van|der|den|la|le|du|del|da|di|y|&)"
_CAP = r"\p{Lu}[\p{L}\p{M}\d'’.\-]*"
_NUM = r"\d(?:[\d\-]|[,.]\d)*\p{L}*"
_ENTITY = regex.compile(rf"(?:{_NUM}[ \t]+)?{_CAP}(?:[ \t]+(?:{_CONNECTOR}[ \t]+)*{_CAP}|[ \t]+{_NUM})*")
_QUOTED = re.compile(r"[\"“”]([^\"“”]{3,80})[\"“”]")
_LOWER_WORD = regex.compile(r"(?<![\p{L}\p{N}])\p{Ll}+(?![\p{L}\p{N}])")
_WORDS = regex.compile(r"[\p{L}\p{N}]+")
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"“])")
_MONTHS = frozenset("january february march april may june july august september october november december".split())
_WEAK_STARTS = STOPWORDS | frozenset("he she it his her they their this these those its after during however although while".split())


def _clean_span(words: list[str], sentence_start: bool) -> str:
    # A word ending a sentence ("China." before "Administratively") ends the span; initials
    # and abbreviations ("J.", "U.S.") do not.
    for position, word in enumerate(words[:-1]):
        if word.endswith(".") and len(word.rstrip(".")) >= 3 and "." not in word.rstrip("."):
            words = words[: position + 1]
            break
    months = [position for position, word in enumerate(words) if word.rstrip(".,").lower() in _MONTHS]
    if months:  # a date glued to a name (`6 March 1982 in Windhoek`): keep the name after it
        words = words[months[-1] + 1 :]
        while words and (words[0][0].isdigit() or words[0].lower() in STOPWORDS):
            words = words[1:]
    while words and words[-1].rstrip(".,").lower() in STOPWORDS | {"&"}:
        words = words[:-1]
    if sentence_start:
        while words and words[0].lower() in _WEAK_STARTS:
            words = words[1:]
    return " ".join(words).rstrip(".,'’-").removesuffix("'s").removesuffix("’s")


def entity_spans(text: str) -> list[str]:
    """Capitalized multi-word spans (`First for Women`, `Kiss and Tell`), cleaned, in order."""
    spans: dict[str, None] = {}
    for match in _ENTITY.finditer(text):
        before = text[: match.start()].rstrip()
        span = _clean_span(match.group(0).split(), not before or before[-1] in ".!?\"“:;(")
        if len(span) < 3 or span.lower() in _WEAK_STARTS or span.lower() in _MONTHS:
            continue
        spans.setdefault(span, None)
    return list(spans)


def is_bridge_entity(span: str) -> bool:
    """Names worth a follow-up search: not dates or numbers, not a month-bearing phrase."""
    words = span.lower().split()
    return span[0].isalpha() and not _MONTHS.intersection(words) and not any(w.isdigit() for w in words[:1])


def split_conjunction(span: str) -> list[str]:
    """`A and B` / `A or B` -> [A, B] (kept whole too by callers: `Kiss and Tell` is a title)."""
    parts = [part for part in re.split(r"\s+(?:and|or|&)\s+", span) if len(part) >= 3]
    return parts if len(parts) > 1 else []


def question_entities(question: str) -> tuple[list[str], list[str]]:
    """(every entity to match, the entities to search): quoted strings and capitalized spans;
    a conjunction `A and B` is matched whole and as A and B, and searched as A and B."""
    matched: list[str] = [q.strip() for q in _QUOTED.findall(question)]
    searched: list[str] = list(matched)
    for span in entity_spans(question):
        parts = split_conjunction(span)
        matched += [span, *parts]
        searched += parts or [span]
    return list(dict.fromkeys(matched)), list(dict.fromkeys(searched))


def normalize(text: str) -> str:
    """Lower-cased words joined by single spaces, `&` read as `and`: how names are compared
    (`Batman: Under the Red Hood` names `Batman Under the Red Hood`)."""
    return " ".join(_WORDS.findall(text.lower().replace("&", " and ")))


def question_terms(text: str) -> list[str]:
    """Content words with the possessive dropped (`Gisvi's` -> `gisvi`), in order, deduplicated."""
    return list(dict.fromkeys(term.removesuffix("'s") for term in content_terms(text)))


def lowercase_words(text: str) -> list[str]:
    """The words `text` writes wholly in lower case."""
    return _LOWER_WORD.findall(text)


def is_common_word(entity: str, lower_words: set[str]) -> bool:
    """A one-word span whose words the seen texts also write in lower case (`lower_words`:
    `Early`, `Country-formatted`)."""
    words = _WORDS.findall(entity)
    return len(entity.split()) == 1 and all(w.lower() in lower_words for w in words)


def split_sentences(text: str) -> list[str]:
    """`text` cut after `.`, `!` or `?` where the next sentence starts with a capital, digit or quote."""
    return _SENTENCE.split(text)


def has_phrase(text: str, phrase: str) -> bool:
    """`phrase` occurs in `text` (both normalized) as whole words (plain `find`, no regex)."""
    if not phrase:
        return False
    start = text.find(phrase)
    while start >= 0:
        end = start + len(phrase)
        if (start == 0 or text[start - 1] == " ") and (end == len(text) or text[end] == " "):
            return True
        start = text.find(phrase, start + 1)
    return False


def title_keys(title: str) -> tuple[str, ...]:
    """Ways a text names a document, normalized: `Copake Lake, New York` -> `copake lake`;
    `Nottingham Forest F.C.` -> `nottingham forest`; `Kiss and Tell (1945 film)` -> `kiss and tell`."""
    bare = re.sub(r"\s*\([^)]*\)\s*$", "", title).strip().lower()
    keys = [bare, bare.split(",")[0].strip()]
    words = keys[-1].split()
    while len(words) > 1 and ("." in words[-1] or words[-1] in {"fc", "inc", "ltd", "band", "film"}):
        words = words[:-1]
    keys.append(" ".join(words))
    return tuple(key for key in dict.fromkeys(normalize(key) for key in keys) if len(key) > 3)


def title_match(name: str, keys: tuple[str, ...]) -> float:
    """1 when `name` (normalized) is a document's title (`keys`: its `title_keys`), 0.7 when it
    is part of the title (or the title part of `name`)."""
    if name in keys:
        return 1.0
    if keys and (has_phrase(keys[0], name) or any(has_phrase(name, key) for key in keys)):
        return 0.7
    return 0.0


def best_sentence(texts: list[str], terms: set[str]) -> str:
    """The first sentence of `texts` whose question terms share most with `terms`, stripped."""
    best, best_overlap = "", -1
    for text in texts:
        for sentence in split_sentences(text):
            overlap = len(terms & set(question_terms(sentence)))
            if overlap > best_overlap:
                best, best_overlap = sentence.strip(), overlap
    return best
