"""Small environments for the CISPO tests (no test functions here): an in-memory search backend
and a tiny Llama whose reward depends on which document token it emits.

Why this environment: a random tiny model never writes a parseable final answer, so every
group would have equal (zero) rewards and be dropped. Here the answers are single added tokens
(`<Document id=dN>`), and the output rows of those tokens are set so that, at the harness's
first-turn prompt, the model emits one of them most of the time, about uniformly. The reward
(THE reward, through the real harness) is 2.0 for the gold document (F_beta, trajectory recall
and the answer bonus all 1) and 0 for any other: CISPO must move probability onto the gold
token, which LoRA can do only through the hidden state (the embeddings are not trained).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from pathlib import Path

import pytest
import torch

from agent.prompts import SYSTEM_PROMPT, tool_schemas
from evaluation.metrics import Gold
from evaluation.tasks import Task
from search.backend import Hit

DOCS = {
    "d1": ("Alpha Lighthouse", ["The Alpha Lighthouse was designed by the engineer Mara Quell in 1901."]),
    "d2": ("Corven River", ["The Corven River flows into the Grey Sea near Corven Point."]),
    "d3": ("Quell Bakery", ["Quell Bakery in Lisbon was founded by Tomas Quell."]),
    "d4": ("Tallis Railway", ["The Tallis Railway connected the Tallis Hills to the coast."]),
}
ANSWER_TOKENS = [f"<Document id={doc}>" for doc in DOCS]


class MemoryBackend:
    """A `SearchBackend` over a dict: word-overlap search, regex grep. Deterministic, instant."""

    def __init__(self, docs: dict[str, tuple[str, list[str]]] = DOCS):
        self.docs = docs
        self.hits = [Hit(f"{doc}-c{i}", doc, title, text, 0.0, len(text.split()), 0)
                     for doc, (title, texts) in docs.items() for i, text in enumerate(texts)]

    def search(self, query: str, k: int = 50, exclude: Collection[str] = ()) -> list[Hit]:
        words = set(re.findall(r"\w+", query.lower()))
        scored = [(len(words & set(re.findall(r"\w+", h.text.lower()))), h) for h in self.hits if h.chunk_id not in exclude]
        return [h for s, h in sorted(scored, key=lambda p: -p[0]) if s > 0][:k]

    search_bm25 = search
    search_dense = search

    def grep(self, pattern: str, limit: int = 5, exclude: Collection[str] = ()) -> list[Hit]:
        regex = re.compile(pattern)
        return [h for h in self.hits if h.chunk_id not in exclude and regex.search(h.text)][:limit]

    def document_chunks(self, doc_id: str) -> list[Hit]:
        return [h for h in self.hits if h.doc_id == doc_id]

    def document_title(self, doc_id: str) -> str | None:
        return self.docs[doc_id][0] if doc_id in self.docs else None


def lighthouse_tasks() -> list[Task]:
    gold = Gold(doc_ids=frozenset({"d1"}), answer="Mara Quell", answer_doc_ids=frozenset({"d1"}))
    return [
        Task("t-1hop", "Who designed the Alpha Lighthouse?", gold, hops=1),
        Task("t-2hop", "Which engineer designed the lighthouse on Corven Point?", gold, hops=2),
    ]


def first_turn_messages(question: str) -> list[dict]:
    from agent.harness import HarnessConfig
    from agent.prompts import system_prompt

    cfg = HarnessConfig.for_training()
    system = system_prompt(token_budget=cfg.token_budget, hard_cutoff_tokens=cfg.hard_cutoff_tokens,
                           search_budget=cfg.search_budget_tokens, grep_limit=cfg.grep_limit, max_docs=cfg.max_output_docs)
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def build_answer_model(folder: Path, questions: list[str], seed: int = 0, answer_mass: float = 0.85,
                        spread: float = 0.3, hidden_size: int = 32, num_layers: int = 1, num_heads: int = 2) -> Path:
    """A tiny Llama (see the module docstring) written to `folder`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent.policies.transformers_policy import template_messages
    from agent.small_model import build_tiny_model

    texts = [SYSTEM_PROMPT, json.dumps(tool_schemas()), *questions] * 2
    build_tiny_model(folder, texts, seed=seed, vocab_size=1024, hidden_size=hidden_size, num_layers=num_layers,
                     num_heads=num_heads)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.add_tokens(ANSWER_TOKENS)
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    answer_ids = tokenizer.convert_tokens_to_ids(ANSWER_TOKENS)
    states = []
    with torch.no_grad():
        for question in questions:
            text = tokenizer.apply_chat_template(template_messages(first_turn_messages(question)), tools=tool_schemas(),
                                                 add_generation_prompt=True, tokenize=False)
            ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
            out = model(input_ids=ids, output_hidden_states=True)
            states.append(out.hidden_states[-1][0, -1])  # after the final norm
        h = torch.stack(states).mean(0)
        others = len(tokenizer) - len(answer_ids)
        # each answer logit L with len(answers) * e^L / (len(answers) * e^L + others) = answer_mass
        target = float(torch.log(torch.tensor(answer_mass * others / ((1 - answer_mass) * len(answer_ids)))))
        generator = torch.Generator().manual_seed(seed)
        embeddings = model.get_input_embeddings().weight
        unit = h / h.norm()
        for token_id in answer_ids:
            # a direction orthogonal to h per answer: equal logits at h, separable once h moves
            noise = torch.randn(h.shape, generator=generator) * spread
            noise -= (noise @ unit) * unit
            embeddings[token_id] = h * (target / float(h @ h)) + noise
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def answer_model_dir(tmp_path_factory) -> Path:
    """The answer model, built once per test session (about 10 s) and shared by the CISPO tests."""
    folder = tmp_path_factory.getbasetemp() / "cispo_answer_model"
    if not (folder / "done").is_file():
        build_answer_model(folder, [t.question for t in lighthouse_tasks()])
        (folder / "done").write_text("ok")
    return folder


class ScriptedPolicy:
    """A policy that plays a fixed plan and records, as its sampled tokens, exactly the tokens the
    chat template renders for its message (what a model that emits canonical text would sample).

    `plan(seed)` returns the list of turns: ("call", name, arguments) or ("answer", text).
    `crash(seed, turn)` may raise, to simulate an engine failure.
    """

    def __init__(self, tokenizer, plan, crash=None, logprob: float = -0.5, name: str = "scripted"):
        self.tokenizer = tokenizer
        self.plan = plan
        self.crash = crash
        self.logprob = logprob
        self.name = name

    def token_counter(self):
        from agent.policies.transformers_policy import TokenizerCounter

        return TokenizerCounter(self.tokenizer)

    def new_episode(self, question: str, seed: int = 0):
        return _ScriptedEpisode(self, self.plan(seed), seed)


class _ScriptedEpisode:
    def __init__(self, policy: ScriptedPolicy, plan: list, seed: int):
        self.policy, self.plan, self.seed, self.turn = policy, plan, seed, 0

    def act(self, messages, tools):
        from agent.policies.transformers_policy import template_messages
        from agent.policy_base import PolicyStep, ToolCall

        policy = self.policy
        if policy.crash is not None:
            policy.crash(self.seed, self.turn)
        entry = self.plan[min(self.turn, len(self.plan) - 1)] if tools else self.plan[-1]
        self.turn += 1
        if entry[0] == "call":
            call = ToolCall(id=f"call_{self.turn}", name=entry[1], arguments=entry[2])
            message = {"role": "assistant", "content": "", "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}]}
            step = PolicyStep(content=None, tool_calls=[call])
        else:
            message = {"role": "assistant", "content": entry[1]}
            step = PolicyStep(content=entry[1])
        tok = policy.tokenizer
        prefix = tok.apply_chat_template(template_messages(messages), tools=tools or None, add_generation_prompt=True, tokenize=False)
        full = tok.apply_chat_template(template_messages(messages + [message]), tools=tools or None, tokenize=False)
        assert full.startswith(prefix)
        completion = full[len(prefix):].removesuffix("\n")
        step.completion_token_ids = tok(completion, add_special_tokens=False)["input_ids"]
        step.completion_logprobs = [policy.logprob] * len(step.completion_token_ids)
        step.completion_tokens = len(step.completion_token_ids)
        step.raw_text = completion
        return step


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread, most of all on a shared, loaded machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return answer_model_dir(tmp_path_factory)
