"""The LLM half of verification: extract quotes per supporting document, then check by code.

Why extraction and not "LLM, is this task correct?": a judge's yes is unfalsifiable, a quote
is not. The verifier model copies spans (document quotes, clue quotes, answer quotes) and
says whether the document holds the answer; `synth.verify.check_item` then decides with the
quote cascade and the 2/3 rule. A document whose extraction fails the code check is asked
again, up to `attempts` times (each attempt is its own cache key, so a rerun replays the same
attempts for free). Items are extracted in parallel; the teacher's semaphore bounds the load.

The distractor check is the complementary extraction: "does this chunk state the answer in
any form?"; a chunk the teacher flags, or that could not be checked, is not a distractor.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from core.text_match import QuoteMatcher
from llm.client import LLMClient, LLMError, ReplyParseError
from search.backend import Hit
from synth.corpus_view import CorpusView
from synth.distractors import AnswerChecker, CheckOutcome
from synth.packs import PromptPack
from synth.schema import AnswerCheck, ExtractedQuotes, SupportingItem, SynthTask
from synth.verify import ItemCheck, TaskCheck, VerifyRules, apply_check, check_item, check_task, keep_matched_quotes

DEFAULT_ATTEMPTS = 3
DEFAULT_DOC_CHARS = 30_000
NO_EXTRACTION = {"extraction_not_run", "extraction_llm_error", "extraction_unparseable"}


def _extract_messages(pack: PromptPack, task: SynthTask, doc_id: str, document: str) -> list[dict[str, str]]:
    prompt = pack.render("verify", clues="\n".join(f"- {c}" for c in task.clues), question=task.question,
                         truth=task.truth, doc_id=doc_id, document=document)
    return [{"role": "user", "content": prompt}]


def extract_item(
    llm: LLMClient,
    pack: PromptPack,
    task: SynthTask,
    item: SupportingItem,
    corpus: CorpusView,
    rules: VerifyRules,
    *,
    attempts: int = DEFAULT_ATTEMPTS,
    doc_chars: int = DEFAULT_DOC_CHARS,
) -> tuple[SupportingItem, ItemCheck]:
    """The item as the verifier extracted it, and its code check (best of `attempts`)."""
    if item.id not in corpus.docs:
        return item, ItemCheck(item.id, False, "missing_document")
    document = corpus[item.id]
    clues, page = QuoteMatcher(task.clues_text), QuoteMatcher(document)
    messages = _extract_messages(pack, task, item.id, document[:doc_chars])
    best: tuple[SupportingItem, ItemCheck] = (item, ItemCheck(item.id, False, "extraction_not_run"))
    for attempt in range(max(1, attempts)):
        try:
            extracted, _ = llm.chat_json(messages, ExtractedQuotes, name="extracted_quotes", attempt=attempt)
        except (LLMError, ReplyParseError) as error:
            if best[1].reason in NO_EXTRACTION:  # a real extraction that failed the check says more
                reason = "extraction_llm_error" if isinstance(error, LLMError) else "extraction_unparseable"
                best = (item, ItemCheck(item.id, False, reason))
            continue
        candidate = SupportingItem(id=item.id, reasoning=extracted.reasoning or item.reasoning,
                                   clue_quotes=extracted.clue_quotes, item_quotes=extracted.item_quotes,
                                   contains_truth=extracted.contains_truth, truth_quotes=extracted.truth_quotes)
        check = check_item(candidate, clues, page, task.truth, rules)
        best = (candidate, check)
        if check.passed:
            break
    return best


def verify_by_extraction(
    llm: LLMClient,
    pack: PromptPack,
    task: SynthTask,
    corpus: CorpusView,
    rules: VerifyRules = VerifyRules(),
    *,
    attempts: int = DEFAULT_ATTEMPTS,
    doc_chars: int = DEFAULT_DOC_CHARS,
) -> SynthTask:
    """The task with the verifier's quotes in place of the generator's, and the verdict."""
    if not task.supporting_items:
        return apply_check(task, TaskCheck(False, "no_supporting_items", []))
    workers = min(len(task.supporting_items), llm.concurrency)
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="synth-verify") as pool:
        results = list(pool.map(
            lambda item: extract_item(llm, pack, task, item, corpus, rules, attempts=attempts, doc_chars=doc_chars),
            task.supporting_items,
        ))
    extracted = task.model_copy(update={"supporting_items": [item for item, _ in results]})
    failed = next((check for _, check in results if not check.passed), None)
    if failed is not None:
        return apply_check(extracted, TaskCheck(False, failed.reason, [check for _, check in results]))
    checked = apply_check(extracted, check_task(extracted, corpus, rules))
    return keep_matched_quotes(checked, corpus) if checked.passed_verification else checked


def llm_answer_checker(llm: LLMClient, pack: PromptPack, *, attempts: int = 2, passage_chars: int = 6000) -> AnswerChecker:
    """A distractor check by extraction: reject chunks that state the answer in any form."""

    def check(task: SynthTask, hit: Hit) -> CheckOutcome:
        prompt = pack.render("distractor", question=task.question, truth=task.truth, chunk_id=hit.chunk_id,
                             passage=hit.text[:passage_chars])
        messages = [{"role": "user", "content": prompt}]
        reason = "check_failed"
        for attempt in range(max(1, attempts)):
            try:
                result, _ = llm.chat_json(messages, AnswerCheck, name="answer_check", attempt=attempt)
            except LLMError:
                reason = "check_failed_llm_error"
                continue
            except ReplyParseError:
                reason = "check_failed_unparseable"
                continue
            if result.contains_answer:
                return CheckOutcome(True, "llm_found_answer", "llm")
            return CheckOutcome(False, None, "llm")
        return CheckOutcome(True, reason, "llm")

    return check
