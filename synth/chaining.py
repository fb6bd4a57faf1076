"""Chaining: bridge a verified task's answer into a new task one hop deeper.

Context-1 controls hop count by recursion: take a task whose answer was found in document D,
find another document that mentions that answer, and ask for a new fact in it. The new task
keeps every previous clue, adds the new one, moves `contains_truth` to the new document, and
records a `bridging_item` (new document, the previous document it bridges from, why). Its
`level` is the parent's plus one; we stop at `max_hops` levels (default 4, Context-1's web
maximum). `compose_extension` is shared by the LLM path and the extractive generator's logic
mirrors it.
"""

from __future__ import annotations

import json

from llm.client import LLMClient
from search.backend import SearchBackend
from synth.corpus_view import CorpusView
from synth.explore import LoopResult, LoopSettings, ToolRunner, run_tool_loop
from synth.packs import PromptPack
from synth.schema import GeneratedExtension, SupportingItem, SynthTask


def compose_extension(previous: SynthTask, extension: GeneratedExtension) -> SynthTask:
    """The chained task: previous clues and items (no longer holding the answer) + the new hop."""
    carried = [item.model_copy(update={"contains_truth": False, "truth_quotes": []}) for item in previous.supporting_items]
    added = [SupportingItem(**item.model_dump()) for item in extension.supporting_items]
    bridging = extension.bridging_item
    if not bridging.relevant_prev_id:
        holder = next((item.id for item in previous.supporting_items if item.contains_truth), "")
        bridging = bridging.model_copy(update={"relevant_prev_id": holder})
    task = SynthTask(
        level=previous.level + 1,
        clues=previous.clues + [clue for clue in extension.clues if clue.strip()],
        question=extension.question,
        truth=extension.truth,
        truth_type=extension.truth_type,
        supporting_items=carried + added,
        bridging_item=bridging,
        parent_id=previous.id,
        seed_doc_id=previous.seed_doc_id,
        generator=previous.generator,
        domain=previous.domain,
    )
    return task.with_id()


def extend_with_llm(
    llm: LLMClient,
    backend: SearchBackend,
    corpus: CorpusView,
    pack: PromptPack,
    previous: SynthTask,
    settings: LoopSettings,
) -> LoopResult[GeneratedExtension]:
    """Run the extend loop from a verified task; the caller composes and verifies the result."""
    holder = next((item.id for item in previous.supporting_items if item.contains_truth), previous.seed_doc_id)
    summary = {"clues": previous.clues, "question": previous.question, "answer": previous.truth,
               "answer_type": previous.truth_type, "supporting_doc_ids": previous.supporting_ids}
    messages = [
        {"role": "system", "content": pack.render("extend", prev_doc_id=holder)},
        {"role": "user", "content": "Previous task:\n" + json.dumps(summary, ensure_ascii=False, indent=1)
         + f"\n\nFind a document other than {', '.join(previous.supporting_ids)} that mentions "
           f"\"{previous.truth}\", then reply with the JSON object."},
    ]
    runner = ToolRunner(backend, corpus, settings)
    return run_tool_loop(llm, runner, messages, GeneratedExtension, name="task_extension", settings=settings)
