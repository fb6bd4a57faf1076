"""Fact sentences and answerable spans, found with regexes and capitalization alone.

The offline generator must run in CI with no model downloads, so "named entity" here means a
run of capitalized words (with `of`, `the`, `de`... allowed inside), and "fact" means a
well-formed prose sentence that holds a date, a year, a number or such a name. This is cruder
than NER, but the spans are exact substrings of the document, which is what the verifier
needs, and it is deterministic. Sentences are returned with their offsets so quotes are
verbatim by construction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
_MONTH = "(?:" + "|".join(MONTHS) + ")"
DATE_PATTERNS = (
    re.compile(rf"\b\d{{1,2}} {_MONTH} \d{{3,4}}\b"),
    re.compile(rf"\b{_MONTH} \d{{1,2}}, \d{{3,4}}\b"),
    re.compile(rf"\b{_MONTH} \d{{4}}\b"),
)
YEAR = re.compile(r"\b(?:1[0-9]{3}|20[0-9]{2})\b(?!s)")
NUMBER = re.compile(r"(?<![\w.,])(?:\d{1,3}(?:,\d{3})+|\d+\.\d+|\d{2,})(?![\w,]|\.\d)")
_TOKEN = re.compile(r"[A-Za-z\u00c0-\u024f][\w'\u2019\-\.]*|\S")
CONNECTORS = frozenset({"of", "the", "de", "da", "del", "della", "di", "du", "la", "le", "van", "von", "der", "den",
                        "y", "al", "bin", "&"})
LEADING_STOP = frozenset({
    "The", "A", "An", "In", "On", "At", "By", "For", "From", "To", "Of", "As", "After", "Before", "During", "Since",
    "Following", "His", "Her", "Its", "Their", "This", "That", "These", "Those", "It", "He", "She", "They", "We",
    "When", "While", "Although", "However", "Despite", "With", "Under", "Between", "Both", "Many", "Some", "Most",
    "There", "Upon", "Unlike", "According", "Also", "But", "And", "Or", "If", "Because", "Then", "Each", "Several",
    "One", "Two", "Three", "Other", "Another", "Such", "All", "Later", "Early", "Today", "Originally", "Currently",
})
GENERIC = frozenset({
    "President", "King", "Queen", "Church", "Army", "Navy", "God", "Emperor", "Parliament", "Congress", "Senate",
    "Government", "University", "College", "School", "Court", "State", "City", "Republic", "Empire", "Kingdom",
    "Party", "Council", "Prince", "Princess", "Duke", "Lord", "Sir", "Saint", "Pope", "Bishop", "Governor", "General",
    "Captain", "Chief", "Minister", "Prime", "North", "South", "East", "West", "Northern", "Southern", "Eastern",
    "Western", "Catholic", "Christian", "Muslim", "Jewish", "Protestant", "Internet", "Act", "Award", "Awards",
    "Series", "Season", "Book", "Film", "Album", "Records", "Island", "River", "Lake", "Mount", "County", "District",
    "Province", "Department", "Ministry", "Company", "Corporation", "Club", "League", "Cup", "Championship", "Games",
    "Olympics", "War", "Battle", "Museum", "Library", "Hospital", "Station", "Street", "Road", "Airport", "Bridge",
    "Christmas", "Easter", "Bible", "Earth", "Sun", "Moon", "Latin", "Greek", "Roman", "Western", "Professor",
})
DEMONYM_SUFFIXES = ("an", "ans", "ish", "ese", "ian", "ians", "ic", "i")
DAYS = frozenset({"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"})
ABBREVIATIONS = frozenset({"mr", "mrs", "ms", "dr", "st", "jr", "sr", "inc", "ltd", "co", "vs", "no", "mt", "ft",
                           "gen", "col", "lt", "sgt", "capt", "prof", "rev", "hon", "fr", "ca", "c", "approx", "e.g",
                           "i.e", "u.s", "u.k", "a.m", "p.m", "etc", "vol", "ed", "op", "jan", "feb", "aug", "sept",
                           "oct", "nov", "dec"})
_BOUNDARY = re.compile(r"[.!?][\"'\u201d\u2019)\]]?\s+(?=[\"\u201c(\[]?[A-Z0-9])")
BAD_CHARS = set("|`{}<>=\\#*_~^$")
MIN_SENTENCE_CHARS = 50
MAX_SENTENCE_CHARS = 400
MIN_SENTENCE_WORDS = 8


@dataclass(frozen=True)
class Sentence:
    start: int
    end: int
    text: str


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    text: str
    kind: str  # date | year | number | name

    def overlaps(self, other: "Span") -> bool:
        return self.start < other.end and other.start < self.end


def _blocks(text: str) -> list[tuple[int, int]]:
    """Prose paragraphs: blank-line separated, outside code fences, not headings/lists/tables."""
    blocks, in_fence, pos = [], False, 0
    for part in re.split(r"(\n[ \t]*\n)", text):
        start, pos = pos, pos + len(part)
        stripped = part.strip()
        if not stripped:
            continue
        if stripped.count("```") % 2 == 1:
            in_fence = not in_fence
            continue
        if in_fence or stripped.startswith(("```", "#", "|", "- ", "* ", ">", "<", "[", "!")):
            continue
        lead = len(part) - len(part.lstrip())
        blocks.append((start + lead, start + lead + len(stripped)))
    return blocks


def _is_abbreviation(text: str, dot: int) -> bool:
    word = re.search(r"([\w.]+)$", text[:dot])
    if not word:
        return False
    token = word.group(1).lower().rstrip(".")
    return token in ABBREVIATIONS or (len(token) == 1 and token.isalpha())


def split_sentences(text: str) -> list[Sentence]:
    """Every sentence of the prose blocks, with offsets into `text`."""
    out = []
    for block_start, block_end in _blocks(text):
        block = text[block_start:block_end]
        cursor = 0
        for match in _BOUNDARY.finditer(block):
            if block[match.start()] == "." and _is_abbreviation(block, match.start()):
                continue
            end = match.end() - len(match.group(0)) + len(match.group(0).rstrip())
            out.append(Sentence(block_start + cursor, block_start + end, block[cursor:end]))
            cursor = match.end()
        if cursor < len(block):
            out.append(Sentence(block_start + cursor, block_end, block[cursor:]))
    return out


def is_fact_sentence(sentence: str) -> bool:
    """Well-formed prose a clue can be made of: length, words, no markup, ends like a sentence."""
    text = sentence.strip()
    if not (MIN_SENTENCE_CHARS <= len(text) <= MAX_SENTENCE_CHARS) or len(text.split()) < MIN_SENTENCE_WORDS:
        return False
    if any(char in BAD_CHARS for char in text) or "\n\n" in text or "http" in text:
        return False
    if not re.search(r"[.!?][\"'\u201d\u2019)\]]?$", text):
        return False
    return text[0].isupper() or text[0].isdigit() or text[0] in "\"\u201c"


def fact_sentences(text: str) -> list[Sentence]:
    return [s for s in split_sentences(text) if is_fact_sentence(s.text)]


def _date_spans(text: str) -> list[Span]:
    spans: list[Span] = []
    for pattern in DATE_PATTERNS:
        for m in pattern.finditer(text):
            span = Span(m.start(), m.end(), m.group(0), "date")
            if not any(span.overlaps(other) for other in spans):
                spans.append(span)
    return spans


def name_spans(text: str) -> list[Span]:
    """Runs of capitalized words (connectors allowed inside), minus sentence-initial filler."""
    tokens = [(m.start(), m.end(), m.group(0)) for m in _TOKEN.finditer(text)]
    spans, i = [], 0
    while i < len(tokens):
        word = tokens[i][2]
        if not word[0].isupper():
            i += 1
            continue
        j, last = i, i
        while j + 1 < len(tokens):
            nxt = tokens[j + 1][2]
            if nxt[0].isupper() and nxt[0].isalpha():
                j += 1
                last = j
            elif nxt in CONNECTORS and j + 2 < len(tokens) and tokens[j + 2][2][0].isupper():
                j += 1
            else:
                break
        run = tokens[i : last + 1]
        while run and (run[0][2] in LEADING_STOP or run[0][2] in CONNECTORS):
            run = run[1:]
        i = last + 1
        if not run:
            continue
        start, end = run[0][0], run[-1][1]
        while end > start and text[end - 1] in ".'\u2019-":
            end -= 1
        name = text[start:end]
        words = name.split()
        if any(ch.isdigit() for ch in name) or name in MONTHS or name in DAYS:
            continue
        acronym = name.isupper() and len(name) <= 6
        if len(words) == 1 and (len(name) < 4 or start == 0 or not name[1:].islower() and not acronym
                                or name in GENERIC or name.endswith(DEMONYM_SUFFIXES)):
            continue
        spans.append(Span(start, end, name, "name"))
    return spans


def answer_spans(text: str) -> list[Span]:
    """Dates, then years, numbers and names, without overlaps (earlier kinds win)."""
    spans = _date_spans(text)
    for kind, pattern in (("year", YEAR), ("number", NUMBER)):
        for m in pattern.finditer(text):
            span = Span(m.start(), m.end(), m.group(0), kind)
            if not any(span.overlaps(other) for other in spans):
                spans.append(span)
    for span in name_spans(text):
        if not any(span.overlaps(other) for other in spans):
            spans.append(span)
    return sorted(spans, key=lambda s: s.start)


def entity_key(name: str) -> str:
    return re.sub(r"\s+", " ", name.strip().lower())


def decade(year: str) -> str:
    return f"the {year[:-1]}0s"


_ARTICLE_YEAR = re.compile(r"\b([Aa]n?|[Tt]he)\s+(1[0-9]{3}|20[0-9]{2})\b(?!s)")


def obfuscate_dates(text: str) -> str:
    """Blur dates and years that are not the answer: `on 16 March 1872` -> `on a date in the
    1870s`, `in 1872` -> `in the 1870s`, `a 1972 graduate` -> `a 1970s graduate`."""
    if not any(char.isdigit() for char in text):
        return text
    for pattern in DATE_PATTERNS:
        text = pattern.sub(lambda m: f"a date in {decade(m.group(0).split()[-1])}", text)
    text = _ARTICLE_YEAR.sub(lambda m: f"{m.group(1)[0] if m.group(1)[0] in 'aA' else m.group(1)} {m.group(2)[:-1]}0s", text)
    return YEAR.sub(lambda m: decade(m.group(0)), text)
