"""The answer-choice phase (training.answer_choice): hindsight answers that put the answer's
documents first, a frozen-context loss that is the full sequence's loss on the answer, and a tiny
model that learns, in a few steps, to answer with the references it is taught."""

from __future__ import annotations

import pytest

from agent.harness import HarnessConfig, run_episode
from agent.policies.transformers_policy import TokenizerCounter
from agent.policy_base import PolicyStep, ToolCall
from agent.adapter_sidecar import read_sidecar
from core.training_settings import LoraSettings, SFTSettings
from evaluation.metrics import Gold
from tests.support.tiny_models import TinyBackend, tiny_model_dir
from training.answer_choice import answer_loss, answer_samples, gold_first_answer, in_reading_order, train_answer_choice
from training.sft_samples import IGNORE_INDEX, tokenize_turn, turn_chat

COMPACT = HarnessConfig(view="compact", token_budget=2048, response_reserve_tokens=256, search_budget_tokens=512,
                        max_output_docs=3)


class Scripted:
    """Searches twice, prunes one reference, then answers with the references it was given."""

    name = "scripted"

    def __init__(self, counter, answer: str, prune: str | None = None):
        self.counter, self.answer, self.prune = counter, answer, prune

    def token_counter(self):
        return self.counter

    def new_episode(self, question, seed=0):
        self.turn = 0
        return self

    def act(self, messages, tools):
        self.turn += 1
        if self.turn == 1:
            return PolicyStep(content=None, tool_calls=[ToolCall("a", "search_corpus", {"query": "Corven Point Alpha Lighthouse"})])
        if self.turn == 2:
            calls = [ToolCall("b", "search_corpus", {"query": "Mara Quell Lisbon"})]
            if self.prune:
                calls.append(ToolCall("c", "prune_chunks", {"chunk_ids": [self.prune]}))
            return PolicyStep(content=None, tool_calls=calls)
        return PolicyStep(content=self.answer)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def episode(tokenizer, answer: str, prune: str | None = None, task_id: str = "t"):
    return run_episode(TinyBackend(), Scripted(TokenizerCounter(tokenizer), answer, prune), "Where did the designer of the Alpha Lighthouse teach?",
                       COMPACT, task_id=task_id)


def reference_of(trajectory, doc_id: str) -> int:
    return 1 + next(i for i, chunk in enumerate(trajectory.seen_chunk_ids()) if trajectory.chunk_docs[chunk] == doc_id)


def test_the_hindsight_answer_puts_the_answer_documents_first_and_keeps_the_teachers_other_choices(tokenizer):
    trajectory = episode(tokenizer, "[1] [2] [3]")  # the teacher named the lighthouse twice and the river
    quell, lighthouse, river = (reference_of(trajectory, doc) for doc in ("quell", "lighthouse", "river"))
    assert quell > 3, "the teacher did not name the answer's document"
    gold = Gold(doc_ids=frozenset({"lighthouse", "quell"}), answer="Lisbon", answer_doc_ids=frozenset({"quell"}))
    answer = gold_first_answer(trajectory, gold.doc_ids, gold.answer_doc_ids, max_docs=3)
    # the answer's document, then the other supporting one, then the teacher's other choice (one per document)
    assert answer == [quell, lighthouse, river]
    assert gold_first_answer(trajectory, gold.doc_ids, gold.answer_doc_ids, max_docs=1) == [quell]


def test_a_pruned_reference_is_never_taught(tokenizer):
    unpruned = episode(tokenizer, "[1]")
    quell_refs = [n for n, chunk in enumerate(unpruned.seen_chunk_ids(), start=1) if unpruned.chunk_docs[chunk] == "quell"]
    pruned = episode(tokenizer, "[1]", prune=str(quell_refs[0]))
    gold = Gold(doc_ids=frozenset({"quell"}), answer="Lisbon", answer_doc_ids=frozenset({"quell"}))
    answer = gold_first_answer(pruned, gold.doc_ids, gold.answer_doc_ids, max_docs=3)
    assert quell_refs[0] not in answer
    if len(quell_refs) > 1:  # another chunk of the same document still in view stands for it
        assert answer[0] == quell_refs[1]


def test_answer_samples_relabel_compact_answers_and_train_only_the_answer(tokenizer):
    trajectory = episode(tokenizer, "[1] [2]")
    gold = Gold(doc_ids=frozenset({"quell"}), answer="Lisbon", answer_doc_ids=frozenset({"quell"}))
    [as_written] = answer_samples([trajectory], tokenizer)
    [relabelled] = answer_samples([trajectory], tokenizer, golds={"t": gold}, max_docs=3)
    assert not as_written.relabelled and relabelled.relabelled
    assert as_written.input_ids[: as_written.answer_start] == relabelled.input_ids[: relabelled.answer_start]  # same prompt
    taught = tokenizer.decode(relabelled.input_ids[relabelled.answer_start:])
    assert taught.startswith(f"{reference_of(trajectory, 'quell')}]"), taught  # the opening "[" is the prompt's
    # the prompt is the final turn's, exactly as SFT and inference render it
    final = trajectory.turns[-1]
    prompt, reply, tools = turn_chat(trajectory, final)
    ids, labels = tokenize_turn(tokenizer, prompt, reply, tools)
    assert as_written.input_ids == ids[: max(i for i, label in enumerate(labels) if label != IGNORE_INDEX) + 1]
    assert answer_samples([trajectory], tokenizer, max_length=as_written.answer_start) == []  # too long: left out


def test_the_answers_opening_belongs_to_the_prompt_unless_asked(tokenizer):
    """The phase trains which references, not whether to answer: the `[` that opens an answer
    (what the forced final is begun with) stays in the prompt; `train_opening` trains it too."""
    trajectory = episode(tokenizer, "[2] [1]")
    [choice] = answer_samples([trajectory], tokenizer)
    [whole] = answer_samples([trajectory], tokenizer, train_opening=True)
    assert choice.input_ids == whole.input_ids
    assert tokenizer.decode(whole.input_ids[whole.answer_start:]).startswith("[2]")
    assert tokenizer.decode(choice.input_ids[: choice.answer_start]).endswith("[")
    assert tokenizer.decode(choice.input_ids[choice.answer_start:]).startswith("2]")
    prose = episode(tokenizer, "The lighthouse [1]")  # no opening: nothing moves into the prompt
    [as_prose] = answer_samples([prose], tokenizer)
    [as_prose_whole] = answer_samples([prose], tokenizer, train_opening=True)
    assert as_prose.answer_start == as_prose_whole.answer_start


def test_the_frozen_context_loss_is_the_full_sequences_loss_on_the_answer(tokenizer, model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    [sample] = answer_samples([episode(tokenizer, "[2] [1]")], tokenizer)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([sample.input_ids])).logits[0, sample.answer_start - 1:-1]
        full = torch.nn.functional.cross_entropy(logits, torch.tensor(sample.input_ids[sample.answer_start:]))
        frozen = answer_loss(model, sample)
    assert frozen.item() == pytest.approx(full.item(), rel=1e-4)


def test_a_few_steps_lower_the_answer_loss_and_change_only_the_adapter(tokenizer, model_dir):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.1,
                                            target_modules=["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    frozen = {name: p.detach().clone() for name, p in model.named_parameters() if not p.requires_grad}
    samples = answer_samples([episode(tokenizer, "[3] [1]", task_id=f"t{i}") for i in range(2)], tokenizer)
    before = answer_loss(model.eval(), samples[0]).item()
    model.train()
    losses: list[float] = []
    figures = train_answer_choice(model, samples, steps=20, batch_size=2, learning_rate=2e-2, on_step=lambda step, loss: losses.append(loss))
    assert model.training, "the caller's mode is restored"
    after = answer_loss(model.eval(), samples[0]).item()
    assert after < before - 0.5, (before, after, losses)
    assert figures["answer_steps"] == 20 == len(losses) and figures["answer_samples"] == 2
    assert figures["answer_final_loss"] < figures["answer_first_loss"]
    assert all(torch.equal(p, frozen[name]) for name, p in model.named_parameters() if not p.requires_grad)


def test_run_sft_adds_the_phase_and_its_figures_and_leaves_old_runs_reusable(tokenizer, model_dir, tmp_path):
    from training.sft import run_sft

    trajectory = episode(tokenizer, "[1] [2]")
    gold = Gold(doc_ids=frozenset({"quell"}), answer="Lisbon", answer_doc_ids=frozenset({"quell"}))
    sft = SFTSettings(learning_rate=1e-2, max_steps=2, batch_size=1, grad_accum=1, max_length=4096, torch_threads=1,
                      answer_steps=3, answer_batch_size=1)
    result = run_sft([trajectory], str(model_dir), tmp_path / "adapter", lora=LoraSettings(rank=4, alpha=8, dropout=0.0),
                     sft=sft, golds={"t": gold})
    assert result.steps == 2 + 3 and result.metrics["steps"] == 2 and result.metrics["answer_steps"] == 3
    assert result.metrics["answer_relabelled"] == 1
    # no episode steps: the phase alone, continuing the adapter just trained (what a shipped searcher gets)
    alone = run_sft([trajectory], str(model_dir), tmp_path / "alone", sft=sft.model_copy(update={"max_steps": 0}),
                    golds={"t": gold}, init_adapter=result.adapter_path)
    assert alone.steps == 3 and alone.metrics["steps"] == 0 and alone.metrics["train_loss"] is None
    assert read_sidecar(alone.adapter_path)["lineage"]["init_adapter"] == result.adapter_path
    with pytest.raises(ValueError, match="0 only with answer_steps"):
        SFTSettings(max_steps=0)
    with pytest.raises(ValueError, match="golds"):
        run_sft([trajectory], str(model_dir), tmp_path / "again", sft=sft)
    # the phase's settings join an SFT run's identity only when the phase runs
    phase = {"answer_steps", "answer_batch_size", "answer_learning_rate", "answer_target", "answer_order", "answer_train_opening"}
    assert SFTSettings().identity() == SFTSettings().model_dump(exclude=phase)
    assert SFTSettings(answer_target="teacher").identity() == SFTSettings().identity()
    assert SFTSettings(answer_steps=4).identity()["answer_steps"] == 4
    # the default order leaves a phase's identity as it was before the order existed; reading changes it
    assert "answer_order" not in SFTSettings(answer_steps=4).identity()
    assert SFTSettings(answer_steps=4, answer_order="reading").identity() != SFTSettings(answer_steps=4).identity()


def test_reading_order_teaches_the_first_k_references_as_shown(tokenizer):
    """Scored as a set at k, an answer's order carries nothing: in reading order the answer keeps
    its first `max_docs` references (what the harness would keep) and lists them as shown."""
    assert in_reading_order("[7] [2] [9] [2] [4]", max_docs=3) == "[2] [7] [9]"
    assert in_reading_order("No supporting documents were found.", max_docs=3) == "No supporting documents were found."
    trajectory = episode(tokenizer, "[3] [1] [2]")
    [ranked] = answer_samples([trajectory], tokenizer, max_docs=2)
    [reading] = answer_samples([trajectory], tokenizer, max_docs=2, reading_order=True)
    assert not ranked.relabelled and reading.relabelled
    assert ranked.input_ids[: ranked.answer_start] == reading.input_ids[: reading.answer_start]  # same prompt
    assert tokenizer.decode(reading.input_ids[reading.answer_start:]).startswith("1] [3]")  # [3] [1] kept, as shown
    gold = Gold(doc_ids=frozenset({"quell"}), answer="Lisbon", answer_doc_ids=frozenset({"quell"}))
    [both] = answer_samples([trajectory], tokenizer, golds={"t": gold}, max_docs=3, reading_order=True)
    taught = tokenizer.decode(both.input_ids[both.answer_start:])
    numbers = [int(n) for n in taught.replace("[", " ").replace("]", " ").split() if n.isdigit()]
    assert numbers == sorted(numbers) and reference_of(trajectory, "quell") in numbers  # the hindsight set, as shown
