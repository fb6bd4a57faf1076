"""The offline generator: real multi-hop tasks from the corpus itself, with no LLM.

For `make demo` and CI. What was simplified relative to the LLM path, and why it is still a
real task:
- facts are sentences holding a date, year, number or capitalized name (`synth.facts`);
- a clue is a sentence with the document's subject masked as the pack's subject token, every
  hop's answer masked as `[X1]`, `[X2]`, ... and other dates blurred to decades (obfuscation by
  masking and templating); the question is a pack template asking for the last mask;
- hop 0 uses two sentences of the seed document (one identifies it, one holds the answer);
- hop n+1 bridges through the previous answer: a *different* document whose fact sentence
  names that answer (preferring the document titled by it), whose other span is the new
  answer. So a level-1 task needs two documents found in order, exactly like Context-1's
  chaining, and each level is emitted as its own task;
- quotes are verbatim sentences of the documents and spans of the clues, so the same code
  verifier must accept them; whatever it rejects is kept with the reason.
Every task records `generator="extractive"`. Choices are seeded per seed document, so a run is
deterministic and does not depend on the order seeds are processed in.

Two question styles (`question_style`):
- `cloze` (the default): masked clues plus a templated question ("Which name does [X2] stand
  for in the clues?"). Hard to search, far from how people ask.
- `natural`: a wh-question in the words of the documents, closer to how people ask: the subject
  keeps its name, the answer becomes a wh-phrase in place ("... a cargo flight from what to
  Cincinnati?"), nothing is blurred. A bridged task first states the earlier hop
  with its answer called X, then asks about X ("Air Tahoma Flight 185 was a cargo flight from X
  to Cincinnati. Along with other suburbs in what, Olive Branch ... from central X?"), since
  naming the bridge would skip the hop. Same hops, documents, answers and verification as the
  cloze style; only the words the agent is given differ.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from functools import lru_cache

from core.task_settings import QuestionStyle
from synth.corpus_view import CorpusView
from synth.facts import Span, answer_spans, entity_key, fact_sentences, obfuscate_dates
from synth.packs import PromptPack
from synth.schema import BridgingItem, SupportingItem, SynthTask

GENERATOR = "extractive"
QUESTION_STYLES: tuple[str, ...] = ("cloze", "natural")
BRIDGE_NAMES = ("X", "Y", "Z", "W", "V", "U", "T", "S")  # hop i's answer, named in the statements after it
PRONOUN_SUBJECTS = {"He": "", "She": "", "It": "", "They": "", "His": "'s", "Her": "'s", "Its": "'s", "Their": "'s"}
MIN_NAME_CHARS = 4
MAX_BRIDGE_CANDIDATES = 40


@dataclass(frozen=True)
class Fact:
    text: str
    spans: tuple[Span, ...]


@dataclass
class Hop:
    doc_id: str
    sentences: list[str]
    fact: str
    answer: Span


@dataclass
class EntityIndex:
    """Fact sentences per document and, for each capitalized name, the documents naming it."""

    facts: dict[str, list[Fact]] = field(default_factory=dict)
    docs_by_entity: dict[str, set[str]] = field(default_factory=dict)
    title_keys: dict[str, str] = field(default_factory=dict)

    @classmethod
    def build(cls, corpus: CorpusView, doc_ids: list[str]) -> "EntityIndex":
        index = cls()
        for doc_id in doc_ids:
            facts = [Fact(s.text, tuple(answer_spans(s.text))) for s in fact_sentences(corpus[doc_id])]
            facts = [f for f in facts if f.spans]
            index.facts[doc_id] = facts
            index.title_keys[doc_id] = entity_key(corpus.title(doc_id))
            for fact in facts:
                for span in fact.spans:
                    if span.kind == "name":
                        index.docs_by_entity.setdefault(entity_key(span.text), set()).add(doc_id)
        return index


@lru_cache(maxsize=1 << 16)
def _word_pattern(value: str) -> re.Pattern[str]:
    """`value` as a whole-word, case-insensitive pattern (compiled once per value)."""
    return re.compile(rf"(?<!\w){re.escape(value)}(?!\w)", flags=re.IGNORECASE)


def subject_names(title: str) -> list[str]:
    """How a document refers to its subject: the title, and for a person-like title of two to
    four capitalized words, the surname alone ("Greene" for "Melissa Fay Greene")."""
    title = title.strip()
    if not title:
        return []
    words = title.split()
    names = [title]
    if 2 <= len(words) <= 4 and all(w[:1].isupper() and w.isalpha() for w in words) and len(words[-1]) >= 4:
        names.append(words[-1])
    return names


def answer_rank(span: Span) -> int:
    """Prefer answers a solver can state unambiguously: multi-word names, then dates, numbers
    and years, then single-word names."""
    if span.kind == "name":
        return 0 if " " in span.text else 3
    return {"date": 1, "number": 2, "year": 2}.get(span.kind, 3)


@lru_cache(maxsize=1 << 12)
def _subject_pattern(name: str) -> re.Pattern[str]:
    """The subject's name, with a leading "the" swallowed ("the [the subject]" reads badly)."""
    return re.compile(rf"(?:\bthe\s+)?(?<!\w){re.escape(name)}(?!\w)", flags=re.IGNORECASE)


def _count_words(text: str, value: str, stop_at: int = 2) -> int:
    """Case-insensitive whole-word occurrences of `value` in `text` (plain `str.find`: the
    generator asks this hundreds of thousands of times; compiling a regex per value costs more)."""
    haystack, needle = text.lower(), value.lower()
    count, pos = 0, haystack.find(needle)
    while pos != -1 and needle:
        end = pos + len(needle)
        before = haystack[pos - 1] if pos else " "
        after = haystack[end] if end < len(haystack) else " "
        if not (before.isalnum() or before == "_") and not (after.isalnum() or after == "_"):
            count += 1
            if count >= stop_at:
                break
        pos = haystack.find(needle, pos + 1)
    return count


def _occurs_once(sentence: str, value: str) -> bool:
    return _count_words(sentence, value) == 1


def _mentions(text: str, value: str) -> bool:
    return bool(value) and _count_words(text, value, stop_at=1) == 1


class ExtractiveGenerator:
    """Build the chain of tasks (levels 0..max_hops-1) grown from one seed document."""

    def __init__(self, corpus: CorpusView, pack: PromptPack, *, max_hops: int = 4, seed: int = 0,
                 exclude_kinds: tuple[str, ...] = ("code",), question_style: QuestionStyle = "cloze"):
        if question_style not in QUESTION_STYLES:
            raise ValueError(f"unknown question_style {question_style!r} (known: {', '.join(QUESTION_STYLES)})")
        self.question_style = question_style
        self.corpus = corpus
        self.pack = pack
        self.max_hops = max(1, max_hops)
        self.seed = seed
        self.allowed = sorted(d for d, doc in corpus.docs.items() if doc.kind not in exclude_kinds)
        self.index = EntityIndex.build(corpus, self.allowed)
        self._options: dict[tuple[str, str], list[tuple[Fact, Span]]] = {}

    def eligible_seeds(self) -> list[str]:
        return [doc_id for doc_id in self.allowed if self.index.facts.get(doc_id)]

    def generate(self, seed_doc_id: str) -> list[SynthTask]:
        rng = random.Random(f"{self.seed}:{seed_doc_id}")
        first = self._first_hop(seed_doc_id, rng)
        if first is None:
            return []
        hops = [first]
        tasks = [self._assemble(hops, rng, parent=None)]
        while len(hops) < self.max_hops:
            nxt = self._next_hop(hops, rng)
            if nxt is None:
                break
            hops.append(nxt)
            tasks.append(self._assemble(hops, rng, parent=tasks[-1].id))
        return tasks

    # -- choosing facts ------------------------------------------------------------------------

    def _valid_answer(self, fact: Fact, span: Span, doc_id: str) -> bool:
        title = self.corpus.title(doc_id)
        if span.kind == "name" and len(span.text) < MIN_NAME_CHARS:
            return False
        if title and (_mentions(title, span.text) or _mentions(span.text, title)):
            return False
        return _occurs_once(fact.text, span.text)

    def _bridgeable(self, span: Span, exclude: set[str]) -> bool:
        if span.kind != "name":
            return False
        docs = self.index.docs_by_entity.get(entity_key(span.text), set()) - exclude
        return any(self._bridge_options(doc_id, span.text, exclude, []) for doc_id in sorted(docs)[:MAX_BRIDGE_CANDIDATES])

    def _first_hop(self, doc_id: str, rng: random.Random) -> Hop | None:
        facts = self.index.facts.get(doc_id) or []
        options = [(fact, span) for fact in facts for span in fact.spans if self._valid_answer(fact, span, doc_id)]
        if not options:
            return None
        rng.shuffle(options)
        chain = self.max_hops > 1
        options.sort(key=lambda option: (chain and not self._bridgeable(option[1], {doc_id}), answer_rank(option[1])))
        fact, span = options[0]
        title = self.corpus.title(doc_id)
        others = [f.text for f in facts if f.text != fact.text]
        identifying = next((text for text in others if title and _mentions(text, title)), others[0] if others else None)
        sentences = [identifying, fact.text] if identifying else [fact.text]
        return Hop(doc_id, sentences, fact.text, span)

    def _bridge_options(self, doc_id: str, entity: str, exclude: set[str], previous: list[str]) -> list[tuple[Fact, Span]]:
        """Fact sentences of `doc_id` naming `entity` once, with another span to ask for that
        the previous clues do not already name."""
        key = (doc_id, entity.lower())
        options = self._options.get(key)
        if options is None:
            options = []
            for fact in self.index.facts.get(doc_id, []):
                if not _occurs_once(fact.text, entity):
                    continue
                for span in fact.spans:
                    if _mentions(span.text, entity) or _mentions(entity, span.text) or not self._valid_answer(fact, span, doc_id):
                        continue
                    options.append((fact, span))
            self._options[key] = options
        return [option for option in options if not any(_mentions(text, option[1].text) for text in previous)]

    def _next_hop(self, hops: list[Hop], rng: random.Random) -> Hop | None:
        entity = hops[-1].answer
        if entity.kind != "name":
            return None
        used = {hop.doc_id for hop in hops}
        previous = [text for hop in hops for text in hop.sentences]
        key = entity_key(entity.text)
        docs = sorted(self.index.docs_by_entity.get(key, set()) - used)
        rng.shuffle(docs)
        docs.sort(key=lambda d: self.index.title_keys.get(d) != key)  # the article about the entity first
        last = len(hops) + 1 >= self.max_hops
        for doc_id in docs[:MAX_BRIDGE_CANDIDATES]:
            options = self._bridge_options(doc_id, entity.text, used, previous)
            if not options:
                continue
            rng.shuffle(options)
            options.sort(key=lambda option: (not last and not self._bridgeable(option[1], used | {doc_id}), answer_rank(option[1])))
            fact, span = options[0]
            return Hop(doc_id, [fact.text], fact.text, span)
        return None

    # -- writing the task ----------------------------------------------------------------------

    def _mask(self, text: str, subject: str, values: list[tuple[str, str]]) -> str:
        """Subject -> subject token, each answer -> its [Xn] token, other dates -> decades."""
        slots: list[str] = []

        def slot(token: str) -> str:
            slots.append(token)
            return f"\x00{len(slots) - 1}\x00"

        for name in subject_names(subject):
            text = _subject_pattern(name).sub(lambda m: slot(self.pack.subject_token), text)
        for value, token in sorted(values, key=lambda pair: -len(pair[0])):
            text = _word_pattern(value).sub(lambda m, t=token: slot(t), text)
        text = obfuscate_dates(text)
        return re.sub(r"\x00(\d+)\x00", lambda m: slots[int(m.group(1))], text)

    def _assemble(self, hops: list[Hop], rng: random.Random, parent: str | None) -> SynthTask:
        template_choice = rng.randrange(1 << 16)  # drawn in both styles, so both choose the same hops
        level = len(hops) - 1
        answer = hops[-1].answer
        if self.question_style == "natural":
            names = list(BRIDGE_NAMES)
            hop_clues = self._natural_statements(hops)
            hop_quotes = [[hop.fact] for hop in hops]
            question = " ".join(text for texts in hop_clues for text in texts)
            clues = [question]
        else:
            names = [f"[X{i + 1}]" for i in range(len(hops))]
            values = [(hop.answer.text, token) for hop, token in zip(hops, names)]
            subject = self.corpus.title(hops[0].doc_id)
            hop_clues = [[self._mask(sentence, subject, values) for sentence in hop.sentences] for hop in hops]
            hop_quotes = [list(hop.sentences) for hop in hops]
            question = self.pack.extractive_question(answer.kind, names[level], template_choice)
            clues = [text for texts in hop_clues for text in texts]
        items = [
            SupportingItem(
                id=hop.doc_id,
                reasoning=("holds the answer" if i == level else f"names {names[i]}, the answer of hop {i + 1}"),
                clue_quotes=hop_clues[i],
                item_quotes=hop_quotes[i],
                contains_truth=i == level,
                truth_quotes=[hop.fact] if i == level else [],
            )
            for i, hop in enumerate(hops)
        ]
        bridging = None
        if level:
            bridging = BridgingItem(id=hops[-1].doc_id, relevant_prev_id=hops[-2].doc_id,
                                    reasoning=f"names {hops[-2].answer.text}, the previous hop's answer")
        task = SynthTask(
            level=level,
            clues=clues,
            question=question,
            truth=answer.text,
            truth_type=answer.kind,
            supporting_items=items,
            bridging_item=bridging,
            parent_id=parent,
            seed_doc_id=hops[0].doc_id,
            generator=GENERATOR,
            domain=self.pack.domain,
        )
        return task.with_id()

    def _natural_statements(self, hops: list[Hop]) -> list[list[str]]:
        """Per hop, its part of the natural question: earlier hops as statements whose answer is
        called X (then Y, ...), the last hop's fact sentence as the question, its answer turned
        into a wh-phrase in place."""
        level = len(hops) - 1
        subject = self.corpus.title(hops[0].doc_id)
        parts = []
        for i, hop in enumerate(hops):
            final = i == level
            # The wh-phrase first: the answer's offsets are offsets into the untouched sentence.
            text = wh_in_place(hop.fact, hop.answer) if final else _word_pattern(hop.answer.text).sub(BRIDGE_NAMES[i], hop.fact)
            if i > 0:  # the sentence names the previous hop's answer: that is the previous statement's name
                text = _word_pattern(hops[i - 1].answer.text).sub(BRIDGE_NAMES[i - 1], text)
            if i == 0:  # later hops stay unnamed: naming their document would skip the hop before
                text = name_the_subject(text, subject)
            text = text.rstrip().rstrip(".;:,")
            parts.append([f"{text}?" if final else f"{text}."])
        return parts


def wh_in_place(sentence: str, answer: Span) -> str:
    """`sentence` with its answer replaced by the wh-phrase a person would put there: "in 1981"
    -> "in what year", "91 films" -> "how many films", a name -> "what"."""
    before, after = sentence[: answer.start], sentence[answer.end:]
    before = re.sub(r"(?i)(^|\s)(?:the|an?)\s+$", r"\1", before)  # "in the United States" -> "in what"
    if answer.kind == "date":
        phrase = "what date"
    elif answer.kind == "year":
        phrase = "what year"
    elif answer.kind == "number":
        phrase = "how many" if re.match(r"\s+[a-z]", after) else "what number"
    else:
        phrase = "what"
    if not before.strip():
        phrase = phrase[:1].upper() + phrase[1:]
    return before + phrase + after


def name_the_subject(sentence: str, title: str) -> str:
    """A question must name what it is about: a sentence that opens with a pronoun gets the
    document's title in its place ("It peaked ..." -> "Icehouse (song) peaked ..."); one that
    never names its subject is introduced by it ("About Icehouse (song): In the ...")."""
    if not title or any(_mentions(sentence, name) for name in subject_names(title)):
        return sentence
    first, _, rest = sentence.partition(" ")
    if first in PRONOUN_SUBJECTS and rest:
        return f"{title}{PRONOUN_SUBJECTS[first]} {rest}"
    return f"About {title}: {sentence}"
