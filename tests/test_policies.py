"""Model-backed policies: tool-call parsing, the transformers policy, the openai policy, SmolLM2.

Fast tests use a tiny random Llama built on the fly (tokenizer trained here) and the scripted
OpenAI stub; `integration` tests drive a real OpenAI-compatible server (vLLM CPU or
`transformers serve`) serving SmolLM2 on loopback; `slow` tests convert and run SmolLM2.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.policies.tool_parsing import parse_tool_calls
from agent.policy_base import PolicyStep
from tests.support.openai_scripted import Reply, ScriptedOpenAI, completion

REPO = Path(__file__).resolve().parents[1]
# Read at import, before any test's monkeypatch: the SmolLM2 copy is shared across tests and runs.
STABLE_HOME = Path(os.environ.get("SEARCHSMITH_HOME") or REPO / ".searchsmith")

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_corpus",
        "description": "Hybrid search over the corpus.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}
GREP_TOOL = {
    "type": "function",
    "function": {
        "name": "grep_corpus",
        "description": "Regex search over the corpus.",
        "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}}, "required": ["pattern"]},
    },
}
TOOLS = [SEARCH_TOOL, GREP_TOOL]
BASE_MESSAGES = [
    {"role": "system", "content": "You are a search agent. Always call search_corpus."},
    {"role": "user", "content": "Who founded the Acme company?"},
]


def _call(call_id: str, query: str) -> dict:
    return {"id": call_id, "type": "function",
            "function": {"name": "search_corpus", "arguments": json.dumps({"query": query})}}


# Three earlier turns that each made two parallel calls: SmolLM2-135M copies the pattern (greedy).
# With two examples it prefers <tool_response> by a hair (log p -0.65 vs -0.98 for <tool_call>);
# with three, <tool_call> wins clearly (-0.40 vs -1.38), so backends' numerics do not flip it.
FEW_SHOT = [
    BASE_MESSAGES[0],
    {"role": "user", "content": "Who founded Acme?"},
    {"role": "assistant", "content": "", "tool_calls": [_call("c1", "Acme founder"), _call("c2", "Acme history")]},
    {"role": "tool", "tool_call_id": "c1", "content": "No results."},
    {"role": "tool", "tool_call_id": "c2", "content": "No results."},
    {"role": "user", "content": "Who founded Globex?"},
    {"role": "assistant", "content": "", "tool_calls": [_call("c3", "Globex founder"), _call("c4", "Globex history")]},
    {"role": "tool", "tool_call_id": "c3", "content": "No results."},
    {"role": "tool", "tool_call_id": "c4", "content": "No results."},
    {"role": "user", "content": "Who founded Hooli?"},
    {"role": "assistant", "content": "", "tool_calls": [_call("c5", "Hooli founder"), _call("c6", "Hooli history")]},
    {"role": "tool", "tool_call_id": "c5", "content": "No results."},
    {"role": "tool", "tool_call_id": "c6", "content": "No results."},
    {"role": "user", "content": "Who founded Initech?"},
]


# ---------------------------------------------------------------- tool-call parsing

def test_parse_hermes_blocks_with_leading_text():
    text = ('Let me search.\n<tool_call>\n{"name": "search_corpus", "arguments": {"query": "acme founder"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "grep_corpus", "arguments": {"pattern": "Acme (Inc|Corp)"}}\n</tool_call>')
    reply = parse_tool_calls(text, id_prefix="call_0")
    assert reply.error is None
    assert reply.content == "Let me search."
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("call_0_0", "search_corpus", {"query": "acme founder"}),
        ("call_0_1", "grep_corpus", {"pattern": "Acme (Inc|Corp)"}),
    ]


def test_parse_smollm2_list_inside_one_block():
    text = '<tool_call>[{"name": "search_corpus", "arguments": {"query": "a"}}, {"name": "read_document", "arguments": {"doc_id": "d1"}}]</tool_call>'
    reply = parse_tool_calls(text)
    assert reply.error is None and reply.content is None
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("search_corpus", {"query": "a"}), ("read_document", {"doc_id": "d1"})]


@pytest.mark.parametrize("text", [
    '[{"name": "search_corpus", "arguments": {"query": "a"}}]',
    '```json\n[{"name": "search_corpus", "arguments": {"query": "a"}}]\n```',
    '{"name": "search_corpus", "parameters": {"query": "a"}}',
    '[{"name": "search_corpus", "arguments": "{\\"query\\": \\"a\\"}"}]',  # arguments as a JSON string
])
def test_parse_bare_json_calls(text):
    reply = parse_tool_calls(text)
    assert reply.error is None and reply.content is None
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("search_corpus", {"query": "a"})]


def test_parse_final_answer_is_content():
    text = "<Document id=d1><Justification>Names the founder.</Justification></Document>\n"
    reply = parse_tool_calls(text)
    assert reply.tool_calls == [] and reply.error is None
    assert reply.content == text.strip()


@pytest.mark.parametrize("text, expect", [
    ('<tool_call>\n{"name": "search_corpus", "arguments": {"query": "a"</tool_call>', "not valid JSON"),
    ('<tool_call>\n{"name": "search_corpus", "argum', "cut off"),
    ("<tool_call></tool_call>", "empty <tool_call>"),
    ("<tool_call>\n", "cut off"),
    ('<tool_call>{"arguments": {"query": "a"}}</tool_call>', "no function name"),
    ('<tool_call>"search_corpus"</tool_call>', "must be a JSON object"),
])
def test_parse_malformed_blocks_record_errors(text, expect):
    reply = parse_tool_calls(text)
    assert reply.tool_calls == []
    assert expect in reply.error


def test_parse_invalid_arguments_keep_raw_text():
    reply = parse_tool_calls('<tool_call>{"name": "search_corpus", "arguments": "{query: a"}</tool_call>')
    assert len(reply.tool_calls) == 1
    call = reply.tool_calls[0]
    assert call.name == "search_corpus" and call.arguments == {} and call.raw_arguments == "{query: a"
    assert "not valid JSON" in reply.error


# ---------------------------------------------------------------- tiny model + transformers policy

@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from agent.small_model import build_tiny_model

    texts = ["Acme was founded by Jane Roe in 1901 in Springfield.", "The river flows north past the mill."] * 20
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", texts, seed=7)


def test_tiny_model_is_deterministic(tmp_path, tiny_dir):
    from safetensors.torch import load_file

    from agent.small_model import build_tiny_model

    texts = ["Acme was founded by Jane Roe in 1901 in Springfield.", "The river flows north past the mill."] * 20
    again = build_tiny_model(tmp_path / "again", texts, seed=7)
    assert (again / "tokenizer.json").read_text() == (tiny_dir / "tokenizer.json").read_text()
    a, b = load_file(str(tiny_dir / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def test_tiny_chat_template_renders_tools_calls_and_results(tiny_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dir))
    messages = FEW_SHOT[:5]
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a search agent.")
    assert '"name": "grep_corpus"' in text and "<tools>" in text
    assert '<tool_call>\n{"name": "search_corpus", "arguments": {"query": "Acme founder"}}\n</tool_call>' in text
    assert text.count("<tool_response>") == 2 and text.count("<|im_start|>user") == 2  # results share one turn
    assert text.endswith("<|im_start|>assistant\n")
    # {% generation %} marks assistant tokens, so SFT can train on them only.
    encoded = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assistant = tokenizer.decode([t for t, m in zip(encoded["input_ids"], encoded["assistant_masks"]) if m])
    assert assistant.startswith("<tool_call>") and assistant.endswith("</tool_call><|im_end|>")
    # The response template lets `transformers serve` turn <tool_call> blocks into tool calls.
    ids = tokenizer.encode('<tool_call>\n{"name": "search_corpus", "arguments": {"query": "x"}}\n</tool_call><|im_end|>', add_special_tokens=False)
    parsed = tokenizer.parse_response(ids, prefix="<|im_start|>assistant\n")
    assert parsed["tool_calls"][0]["function"] == {"name": "search_corpus", "arguments": {"query": "x"}}


def _forward_logprobs(policy, step: PolicyStep, messages, tools, temperature: float) -> list[float]:
    import torch

    lm = policy.loaded()
    prompt = lm.tokenizer(policy.render_prompt(messages, tools), add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt + step.completion_token_ids])
    with torch.no_grad():
        logits = lm.model(ids).logits[0, len(prompt) - 1:-1].float()
    if temperature > 0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, -1)
    return logp.gather(1, torch.tensor(step.completion_token_ids).unsqueeze(1)).squeeze(1).tolist()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_transformers_policy_generates_with_logprobs(tiny_dir, temperature):
    from agent.policies.transformers_policy import TransformersPolicy

    # fp32: the recorded logprobs must equal a forward pass to 1e-4 (bf16, the CPU inference default, rounds coarser)
    policy = TransformersPolicy(str(tiny_dir), max_new_tokens=24, temperature=temperature, seed=3, dtype="float32")
    step = policy.new_episode("q", seed=1).act(BASE_MESSAGES, TOOLS)
    assert step.completion_tokens == len(step.completion_token_ids) == len(step.completion_logprobs) > 0
    prompt = policy.render_prompt(BASE_MESSAGES, TOOLS)
    assert step.prompt_tokens == policy.token_counter().count(prompt)
    assert step.raw_text is not None
    assert step.tool_calls or step.content or step.error  # a random model: anything, but never a raise
    assert _forward_logprobs(policy, step, BASE_MESSAGES, TOOLS, temperature) == pytest.approx(step.completion_logprobs, abs=1e-4)
    again = policy.new_episode("q", seed=1).act(BASE_MESSAGES, TOOLS)
    assert again.completion_token_ids == step.completion_token_ids  # same seeds, same sample
    if temperature > 0:
        others = [policy.new_episode("q", seed=s).act(BASE_MESSAGES, TOOLS).completion_token_ids for s in (2, 3)]
        assert any(o != step.completion_token_ids for o in others)


def _forced(monkeypatch, policy, text: str) -> None:
    """Make the policy's model 'generate' exactly `text` (+ <|im_end|>), with real logits."""
    import torch

    lm = policy.loaded()
    forced = lm.tokenizer(text, add_special_tokens=False)["input_ids"] + [lm.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    model = lm.model

    def generate(input_ids, attention_mask=None, generation_config=None, **_cache):  # the full prompt is recomputed
        sequences = torch.cat([input_ids, torch.tensor([forced])], dim=1)
        logits = model(sequences).logits[0, input_ids.shape[1] - 1:-1]
        return SimpleNamespace(sequences=sequences, logits=tuple(step.unsqueeze(0) for step in logits))

    monkeypatch.setattr(model, "generate", generate)


@pytest.fixture
def forced_policy(tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent.policies.transformers_policy import TransformersPolicy

    model = AutoModelForCausalLM.from_pretrained(str(tiny_dir))
    return TransformersPolicy.from_loaded(model, AutoTokenizer.from_pretrained(str(tiny_dir)), max_new_tokens=64)


@pytest.mark.parametrize("text, calls", [
    ('<tool_call>\n{"name": "search_corpus", "arguments": {"query": "acme"}}\n</tool_call>\n'
     '<tool_call>\n{"name": "grep_corpus", "arguments": {"pattern": "Roe"}}\n</tool_call>',
     [("search_corpus", {"query": "acme"}), ("grep_corpus", {"pattern": "Roe"})]),
    ('<tool_call>[{"name": "search_corpus", "arguments": {"query": "acme"}}]</tool_call>', [("search_corpus", {"query": "acme"})]),
    ('[{"name": "search_corpus", "arguments": {"query": "acme"}}]', [("search_corpus", {"query": "acme"})]),
])
def test_transformers_policy_parses_each_format(monkeypatch, forced_policy, text, calls):
    _forced(monkeypatch, forced_policy, text)
    step = forced_policy.new_episode("q").act(BASE_MESSAGES, TOOLS)
    assert step.error is None and step.content is None
    assert [(c.name, c.arguments) for c in step.tool_calls] == calls
    assert [c.id for c in step.tool_calls] == [f"call_0_{i}" for i in range(len(calls))]
    assert step.raw_text.endswith("<|im_end|>") and len(step.completion_logprobs) == step.completion_tokens


def test_transformers_policy_final_answer(monkeypatch, forced_policy):
    answer = "<Document id=d1><Justification>Names the founder.</Justification></Document>"
    _forced(monkeypatch, forced_policy, answer)
    step = forced_policy.new_episode("q").act(BASE_MESSAGES, TOOLS)
    assert step.content == answer and step.tool_calls == [] and step.error is None


@pytest.mark.parametrize("text, expect", [
    ('<tool_call>\n{"name": "search_corpus", "arguments": {"query": "acme"</tool_call>', "not valid JSON"),
    ('<tool_call>\n{"name": "search_corpus", "argu', "cut off"),
    ('<tool_call>{"name": "search_corpus", "arguments": "{query"}</tool_call>', "arguments are not valid JSON"),
    ("", "empty completion"),
])
def test_transformers_policy_malformed_completion_is_recorded(monkeypatch, forced_policy, text, expect):
    _forced(monkeypatch, forced_policy, text)
    step = forced_policy.new_episode("q").act(BASE_MESSAGES, TOOLS)  # never raises
    assert step.error is not None and expect in step.error
    assert step.completion_token_ids and len(step.completion_logprobs) == step.completion_tokens


def test_transformers_policy_prompt_longer_than_window(tmp_path):
    from agent.policies.transformers_policy import TransformersPolicy
    from agent.small_model import build_tiny_model

    folder = build_tiny_model(tmp_path / "short", ["short window"], seed=0, max_position_embeddings=32)
    step = TransformersPolicy(str(folder), max_new_tokens=8).new_episode("q").act(BASE_MESSAGES, TOOLS)
    assert step.error and "window" in step.error and step.prompt_tokens > 32
    assert step.window_full, "the harness forces the final answer on this signal"


def test_transformers_policy_loads_lora_adapter(tmp_path, tiny_dir):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from agent.policies.transformers_policy import TransformersPolicy

    base = AutoModelForCausalLM.from_pretrained(str(tiny_dir))
    torch.manual_seed(0)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    peft_model.save_pretrained(str(tmp_path / "adapter"))
    plain = TransformersPolicy(str(tiny_dir), max_new_tokens=12).new_episode("q").act(BASE_MESSAGES, TOOLS)
    adapted_policy = TransformersPolicy(str(tiny_dir), adapter_path=tmp_path / "adapter", max_new_tokens=12, dtype="float32")
    adapted = adapted_policy.new_episode("q").act(BASE_MESSAGES, TOOLS)
    merged = adapted_policy.loaded().model
    assert not type(merged).__name__.startswith("Peft"), "inference folds the LoRA into the weights"
    assert adapted.completion_logprobs != plain.completion_logprobs  # the adapter changes the model
    ids = torch.tensor([[5, 17, 42, 99, 3]])
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits, peft_model.eval()(input_ids=ids).logits, atol=1e-4)
    assert "+" in adapted_policy.name


def test_policy_specs_and_token_counters(tiny_dir):
    from agent.policies import openai_policy, transformers_policy

    policy = transformers_policy.policy_from_spec(str(tiny_dir), max_new_tokens=4)
    assert policy.name == f"transformers:{tiny_dir}" and policy.max_new_tokens == 4
    counter = policy.token_counter()
    assert counter.count("<tool_call>") == 1  # the model's own tokenizer
    remote = openai_policy.policy_from_spec("http://127.0.0.1:9/v1#served-model", timeout=5)
    assert (remote.base_url, remote.model, remote.timeout) == ("http://127.0.0.1:9/v1", "served-model", 5)
    assert remote.name == "openai:http://127.0.0.1:9/v1#served-model"
    assert remote.token_counter().count("the river flows north") == 4  # MiniLM word pieces (fallback)
    exact = openai_policy.OpenAIPolicy("http://x/v1", "m", tokenizer_path=str(tiny_dir))
    assert exact.token_counter().count("<tool_call>") == 1
    with pytest.raises(ValueError):
        openai_policy.policy_from_spec("http://no-model/v1")
    with pytest.raises(FileNotFoundError):
        transformers_policy.TransformersPolicy("/nonexistent/model").token_counter()


def test_policies_pickle_without_their_clients_or_models(tiny_dir):
    """Policies cross process boundaries (executors, workers): live clients and models stay behind."""
    import pickle

    from agent.policies.openai_policy import OpenAIPolicy
    from agent.policies.transformers_policy import TransformersPolicy

    remote = OpenAIPolicy("http://127.0.0.1:9/v1", "m", timeout=3)
    remote.client()
    copy = pickle.loads(pickle.dumps(remote))
    assert copy._client is None and copy.client().timeout_s == 3 and copy.name == remote.name
    local = TransformersPolicy(str(tiny_dir), max_new_tokens=3)
    local.loaded()
    clone = pickle.loads(pickle.dumps(local))
    assert clone._loaded is None and clone.max_new_tokens == 3
    assert clone.new_episode("q").act(BASE_MESSAGES, TOOLS).completion_tokens <= 3


# ---------------------------------------------------------------- openai policy against the scripted stub

def _ok(content=None, tool_calls=None):
    return Reply(body=completion(content=content, tool_calls=tool_calls))


def test_openai_policy_request_and_tool_calls(monkeypatch):
    from agent.policies.openai_policy import OpenAIPolicy

    monkeypatch.setenv("SEARCHSMITH_TEST_KEY", "sk-test-secret")
    with ScriptedOpenAI(lambda req, n: _ok(tool_calls=[{"name": "search_corpus", "arguments": {"query": "acme"}},
                                                        {"name": "grep_corpus", "arguments": {"pattern": "Roe"}}])) as stub:
        policy = OpenAIPolicy(stub.base_url, "teacher", api_key_env="SEARCHSMITH_TEST_KEY", timeout=7, max_retries=2,
                              temperature=0.3, max_tokens=99, seed=5)
        history = BASE_MESSAGES + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "search_corpus", "arguments": {"query": "x"}}}],
             "internal_note": "harness-only keys are not sent"},
            {"role": "tool", "tool_call_id": "a", "content": "No results."},
        ]
        step = policy.new_episode("q", seed=2).act(history, TOOLS)
        request, headers = stub.requests[0], stub.headers[0]
    assert [(c.name, c.arguments) for c in step.tool_calls] == [("search_corpus", {"query": "acme"}), ("grep_corpus", {"pattern": "Roe"})]
    assert step.error is None and (step.prompt_tokens, step.completion_tokens) == (11, 7)
    assert request["model"] == "teacher" and request["tools"] == TOOLS
    assert request["tool_choice"] == "auto" and request["parallel_tool_calls"] is True
    assert request["max_tokens"] == 99 and request["temperature"] == 0.3 and isinstance(request["seed"], int)
    assert request["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"query": "x"}'
    assert "internal_note" not in request["messages"][2]
    assert headers["authorization"] == "Bearer sk-test-secret"
    client = policy.client()
    assert client.timeout_s == 7 and client.max_retries == 2 and client.usage.calls == 1  # one transport, counted
    assert "sk-test-secret" not in repr(vars(policy)) and "sk-test-secret" not in policy.name


def test_openai_policy_without_key_env_sends_empty():
    from agent.policies.openai_policy import OpenAIPolicy

    with ScriptedOpenAI(lambda req, n: _ok(content="done")) as stub:
        step = OpenAIPolicy(stub.base_url, "m").new_episode("q").act(BASE_MESSAGES, [])
        assert stub.headers[0]["authorization"] == "Bearer EMPTY"
        assert "tools" not in stub.requests[0] and "tool_choice" not in stub.requests[0]
    assert step.content == "done" and step.tool_calls == []


def test_openai_policy_malformed_arguments_are_recorded():
    from agent.policies.openai_policy import OpenAIPolicy

    body = completion(content=None)
    body["choices"][0]["message"]["tool_calls"] = [
        {"id": "t1", "type": "function", "function": {"name": "search_corpus", "arguments": '{"query": "acme"'}},
        {"id": "t2", "type": "function", "function": {"name": "grep_corpus", "arguments": '{"pattern": "Roe"}'}},
    ]
    with ScriptedOpenAI(lambda req, n: Reply(body=body)) as stub:
        step = OpenAIPolicy(stub.base_url, "m", max_retries=0).new_episode("q").act(BASE_MESSAGES, TOOLS)
    bad, good = step.tool_calls
    assert bad.raw_arguments == '{"query": "acme"' and bad.arguments == {}
    assert good.arguments == {"pattern": "Roe"} and good.raw_arguments is None
    assert "search_corpus: arguments are not valid JSON" in step.error


def test_openai_policy_parses_calls_left_in_text():
    """A server without a tool parser (or whose parser gave up) returns the call as text."""
    from agent.policies.openai_policy import OpenAIPolicy

    text = '<tool_call>\n{"name": "search_corpus", "arguments": {"query": "acme"}}\n</tool_call>\n<tool_call>\n{"name": "grep'
    with ScriptedOpenAI(lambda req, n: _ok(content=text)) as stub:
        step = OpenAIPolicy(stub.base_url, "m").new_episode("q").act(BASE_MESSAGES, TOOLS)
    assert [(c.name, c.arguments) for c in step.tool_calls] == [("search_corpus", {"query": "acme"})]
    assert "cut off" in step.error and step.raw_text == text


def test_openai_policy_timeout_retries_then_raises():
    from agent.policies.openai_policy import OpenAIPolicy
    from llm.client import LLMError

    with ScriptedOpenAI(lambda req, n: Reply(body=completion(content="late"), delay_s=1.5)) as stub:
        policy = OpenAIPolicy(stub.base_url, "m", timeout=0.3, max_retries=2, backoff_s=0.1)
        started = time.monotonic()
        with pytest.raises(LLMError, match="gave up after 3 attempts: APITimeoutError"):
            policy.new_episode("q").act(BASE_MESSAGES, TOOLS)
        assert stub.count == 3  # one try + two retries
        assert time.monotonic() - started < 20


def test_openai_policy_retries_server_errors_with_backoff():
    from agent.policies.openai_policy import OpenAIPolicy

    def responder(req, n):
        return Reply(503, {"error": {"message": "overloaded"}}) if n <= 2 else _ok(content="ok")

    with ScriptedOpenAI(responder) as stub:
        step = OpenAIPolicy(stub.base_url, "m", max_retries=3, backoff_s=0.1).new_episode("q").act(BASE_MESSAGES, TOOLS)
        assert stub.count == 3
    assert step.content == "ok" and step.error is None


def test_openai_policy_drops_fields_a_server_rejects():
    from agent.policies.openai_policy import OpenAIPolicy

    def responder(req, n):
        if "parallel_tool_calls" in req:
            return Reply(400, {"error": {"message": "Unsupported parameter: parallel_tool_calls"}})
        return _ok(content="ok")

    with ScriptedOpenAI(responder) as stub:
        policy = OpenAIPolicy(stub.base_url, "m", max_retries=0)
        episode = policy.new_episode("q")
        assert episode.act(BASE_MESSAGES, TOOLS).content == "ok"
        assert episode.act(BASE_MESSAGES, TOOLS).content == "ok"
        assert stub.count == 3  # rejected once, then remembered
        assert "tool_choice" in stub.requests[2] and "parallel_tool_calls" not in stub.requests[2]


def test_openai_policy_rejected_request_is_recorded():
    from agent.policies.openai_policy import OpenAIPolicy

    with ScriptedOpenAI(lambda req, n: Reply(400, {"error": {"message": "maximum context length is 8192 tokens"}})) as stub:
        step = OpenAIPolicy(stub.base_url, "m", max_retries=0).new_episode("q").act(BASE_MESSAGES, TOOLS)
    assert step.content is None and "maximum context length" in step.error


def test_openai_policy_reads_logprobs_and_token_ids():
    from agent.policies.openai_policy import OpenAIPolicy

    body = completion(content="Paris", completion_tokens=2)
    body["choices"][0]["logprobs"] = {"content": [
        {"token": "token_id:42", "logprob": -0.5, "bytes": None, "top_logprobs": []},
        {"token": "token_id:2", "logprob": -0.1, "bytes": None, "top_logprobs": []},
    ]}
    with ScriptedOpenAI(lambda req, n: Reply(body=body)) as stub:
        step = OpenAIPolicy(stub.base_url, "m", logprobs=True, token_ids=True).new_episode("q").act(BASE_MESSAGES, TOOLS)
        assert stub.requests[0]["logprobs"] is True and stub.requests[0]["return_tokens_as_token_ids"] is True
    assert step.completion_token_ids == [42, 2] and step.completion_logprobs == [-0.5, -0.1]


# ---------------------------------------------------------------- SmolLM2 (real model) and a real server

@pytest.fixture(scope="session")
def smollm2_dir():
    from agent.small_model import SMOLLM2_DIRNAME, ensure_smollm2, smollm2_gguf_path

    try:
        smollm2_gguf_path()
    except FileNotFoundError as error:
        pytest.skip(str(error))
    return ensure_smollm2(STABLE_HOME / "models" / SMOLLM2_DIRNAME)


@pytest.mark.slow
def test_smollm2_converts_from_gguf_once(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    from agent.small_model import ensure_smollm2, smollm2_gguf_path

    try:
        smollm2_gguf_path()
    except FileNotFoundError as error:
        pytest.skip(str(error))
    folder = ensure_smollm2(tmp_path / "smollm2")
    assert (folder / "model.safetensors").stat().st_size > 400_000_000  # fp32, 135M parameters
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
    started = time.monotonic()
    assert ensure_smollm2(tmp_path / "smollm2") == folder
    assert time.monotonic() - started < 1.0  # cached: idempotent and cheap
    config = AutoConfig.from_pretrained(str(folder))
    assert config.model_type == "llama" and not hasattr(config, "quantization_config")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    text = tokenizer.apply_chat_template(FEW_SHOT[:3], tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert "<tools>" in text and "<tool_call>" in text


@pytest.mark.slow
def test_smollm2_generates_with_its_chat_template(smollm2_dir):
    from agent.policies.transformers_policy import TransformersPolicy

    policy = TransformersPolicy(str(smollm2_dir), max_new_tokens=12)
    step = policy.new_episode("q").act([{"role": "user", "content": "What is the capital of France?"}], [])
    assert "Paris" in step.content and step.error is None
    assert len(step.completion_logprobs) == step.completion_tokens <= 12
    # With tools and two worked examples in the context, the real model makes real tool calls.
    # 40 new tokens hold one call (34 tokens) and cut the second: the first is parsed, the cut
    # one is recorded as an error.
    policy = TransformersPolicy(str(smollm2_dir), max_new_tokens=40)
    step = policy.new_episode("q").act(FEW_SHOT, TOOLS)
    assert step.tool_calls and all(c.name == "search_corpus" for c in step.tool_calls), step.raw_text
    assert "Initech" in step.tool_calls[0].arguments["query"]
    assert step.error is None or "cut off" in step.error


@pytest.fixture(scope="session")
def openai_server(smollm2_dir):
    from tests.support.openai_server import openai_server_for

    with openai_server_for(smollm2_dir) as server:
        yield server


@pytest.mark.integration
@pytest.mark.slow
def test_openai_policy_against_real_server(openai_server):
    from agent.policies.openai_policy import OpenAIPolicy

    policy = OpenAIPolicy(openai_server.base_url, openai_server.model, timeout=300, max_retries=1, max_tokens=80, seed=0)
    assert policy.client().timeout_s == 300 and policy.client().max_retries == 1
    step = policy.new_episode("q").act(FEW_SHOT, TOOLS)
    assert isinstance(step, PolicyStep) and step.prompt_tokens > 0 and step.completion_tokens > 0
    assert step.tool_calls or step.content
    assert step.tool_calls, f"{openai_server.backend}: no tool calls in {step.raw_text!r} ({step.error})"
    assert all(c.name == "search_corpus" and "query" in c.arguments for c in step.tool_calls)


@pytest.mark.integration
@pytest.mark.slow
def test_openai_policy_logprobs_from_real_server(openai_server):
    from agent.policies.openai_policy import OpenAIPolicy

    if not openai_server.supports_logprobs:
        pytest.skip(f"{openai_server.backend} does not return logprobs")
    policy = OpenAIPolicy(openai_server.base_url, openai_server.model, timeout=300, max_retries=1, max_tokens=12,
                          logprobs=True, token_ids=True)
    step = policy.new_episode("q").act([{"role": "user", "content": "What is the capital of France?"}], [])
    assert "Paris" in (step.content or "")
    assert len(step.completion_logprobs) == len(step.completion_token_ids) == step.completion_tokens
    assert all(lp <= 0 for lp in step.completion_logprobs)


@pytest.mark.integration
@pytest.mark.slow
def test_prompts_as_tokens_against_real_vllm(openai_server, smollm2_dir):
    """The RL rollout path (issue 16): the prompt rendered here with the model's template, sent as
    token ids to /v1/completions, the reply parsed with the family's parser, its token ids and
    logprobs the ones vLLM sampled. The same turn through chat completions gives the same tokens."""
    from agent.policies.openai_policy import OpenAIPolicy

    if openai_server.backend != "vllm":
        pytest.skip(f"{openai_server.backend} has no token-id prompts on /v1/completions")
    options = {"timeout": 300, "max_retries": 1, "max_tokens": 48, "seed": 0, "logprobs": True, "token_ids": True}
    as_tokens = OpenAIPolicy(openai_server.base_url, openai_server.model, prompt_as_tokens=True,
                             tokenizer_path=str(smollm2_dir), **options).new_episode("q").act(FEW_SHOT, TOOLS)
    assert as_tokens.error is None or "cut off" in as_tokens.error, as_tokens.error
    assert as_tokens.tool_calls and all(c.name == "search_corpus" for c in as_tokens.tool_calls), as_tokens.raw_text
    assert len(as_tokens.completion_logprobs) == len(as_tokens.completion_token_ids) == as_tokens.completion_tokens > 0
    assert all(lp <= 0 for lp in as_tokens.completion_logprobs) and as_tokens.prompt_tokens > 0
    as_chat = OpenAIPolicy(openai_server.base_url, openai_server.model, **options).new_episode("q").act(FEW_SHOT, TOOLS)
    assert as_chat.completion_token_ids[: len(as_tokens.completion_token_ids)] == as_tokens.completion_token_ids[: len(as_chat.completion_token_ids)]


# ---- the heuristic policy's pure helpers and its bridge hop, on hand-made chunks -----------

from agent.policies.heuristic import HeuristicEpisode, Weights  # noqa: E402
from agent.policies.heuristic_text import entity_spans, normalize, question_terms, title_keys  # noqa: E402

ALL_TOOLS = [{"type": "function", "function": {"name": name}} for name in ("search_corpus", "grep_corpus", "read_document", "prune_chunks")]


def _tool_results(step: PolicyStep, results: dict[int, list[tuple[str, str]]]) -> list[dict]:
    """Tool messages answering `step`'s calls: call i shows the (title, text) chunks results[i]."""
    messages = []
    for position, call in enumerate(step.tool_calls):
        chunks = "".join(
            f'<Chunk id={call.id}_{n} doc=d_{title.replace(" ", "_")} title="{title}">\n{text}\n</Chunk>\n'
            for n, (title, text) in enumerate(results.get(position, []))
        )
        messages.append({"role": "tool", "tool_call_id": call.id, "content": chunks + "[Token usage: 1,000/32,768]"})
    return messages


def test_normalize_compares_names_across_punctuation():
    assert normalize("Batman: Under the Red Hood") == normalize("Batman Under the Red Hood")
    assert normalize("Thelma & Louise") == "thelma and louise"


def test_question_terms_drop_the_possessive():
    assert question_terms("What is Gisvi's city of birth?") == ["gisvi", "city", "birth"]


def test_title_keys_are_normalized_and_drop_qualifiers():
    assert title_keys("Nottingham Forest F.C.") == ("nottingham forest f c", "nottingham forest")
    assert title_keys("Kiss and Tell (1945 film)") == ("kiss and tell",)


def test_entity_spans_keep_titles_and_drop_sentence_openers():
    spans = entity_spans("The film Kiss and Tell was directed by Richard Wallace in 1945.")
    assert "Kiss and Tell" in spans and "Richard Wallace" in spans and "The" not in spans


def test_variants_of_question_entities_are_not_bridges():
    episode = HeuristicEpisode("Ernest Foot was the best friend of the fighter pilot who had how many victories?")
    assert episode._is_known("Major Ernest Leslie Foot")
    assert not episode._is_known("Albert Ball")


def test_bridge_is_read_from_the_question_entity_document():
    """The document titled by the question's entity (`Gisvi`) gives the bridge (`Windhoek`),
    not the top-ranked neighbour's own subject (`Toronto` in `Hotels in Toronto`)."""
    episode = HeuristicEpisode("What is the most popular hotel in Gisvi's city of birth?")
    hop1 = episode.act([], ALL_TOOLS)
    assert all(call.name == "search_corpus" for call in hop1.tool_calls)
    results = {0: [
        ("Hotels in Toronto", "The most popular hotel in Toronto is the Royal York. Toronto is a city in Canada."),
        ("Gisvi", "Gisvi (born 6 March 1982 in Windhoek, South-West Africa) is a Portuguese retired footballer."),
    ]}
    hop2 = episode.act(_tool_results(hop1, results), ALL_TOOLS)
    queries = [call.arguments["query"] for call in hop2.tool_calls if call.name == "search_corpus"]
    assert queries and queries[0].startswith("Windhoek")
    assert "popular" in queries[0] and "hotel" in queries[0]  # the question's words the first hop did not cover


def test_answer_keeps_a_slot_for_the_bridge_document():
    """A bridge document that covers the question's remaining words is answered early, even
    though near-duplicates of the first hop share more of the question's words."""
    episode = HeuristicEpisode("What is the most popular hotel in Gisvi's city of birth?")
    hop1 = episode.act([], ALL_TOOLS)
    hop1_results = {0: [("Gisvi", "Gisvi (born 6 March 1982 in Windhoek, South-West Africa) is a Portuguese retired footballer.")]}
    hop1_results |= {
        n: [(f"Gisvi {n} (disambiguation)", f"Gisvi may also refer to a popular footballer born in {n} in the city.")]
        for n in range(1, len(hop1.tool_calls))
    }
    hop2 = episode.act(_tool_results(hop1, hop1_results), ALL_TOOLS)
    first_search = next(n for n, call in enumerate(hop2.tool_calls) if call.name == "search_corpus")
    assert hop2.tool_calls[first_search].arguments["query"].startswith("Windhoek")
    bridge = {first_search: [("Windhoek", "Windhoek is the capital. Its most popular hotel is the Windhoek Country Club Resort.")]}
    step = episode.act(_tool_results(hop2, bridge), ALL_TOOLS)
    while step.tool_calls:
        step = episode.act(_tool_results(step, {}), ALL_TOOLS)
    docs = [doc for doc, _ in episode._answer_ranking()]
    assert docs.index("d_Windhoek") < 3


def test_free_answer_slots_go_to_the_question_words_not_yet_covered():
    """After the chain's slots, a document adding the words the question asks of the last hop
    (`stalemate`, `end`) is answered before one that scores a little higher on words the first
    document already covers (`war`, `troops`, `approached`); without coverage it is the other way."""
    question = "When did the stalemate end in the war where UN troops approached the Gisvi River?"
    results = {0: [
        ("Gisvi River", "In the war of 1950, UN troops approached the Gisvi River."),
        ("Tarsan War", "The stalemate began in 1951 and would end in 1953."),
        ("Old Bridge", "In the war the old bridge was destroyed when UN troops approached it."),
    ]}
    answers = {}
    for coverage in (0.0, Weights().coverage):
        episode = HeuristicEpisode(question, max_docs=2, weights=Weights(coverage=coverage))
        step = episode.act([], ALL_TOOLS)
        step = episode.act(_tool_results(step, results), ALL_TOOLS)
        while step.tool_calls:
            step = episode.act(_tool_results(step, {}), ALL_TOOLS)
        answers[coverage] = [doc for doc, _ in episode._answer_ranking()]
        assert dict(episode._doc_ranking())["d_Old_Bridge"] > dict(episode._doc_ranking())["d_Tarsan_War"]
    assert answers[0.0][:2] == ["d_Gisvi_River", "d_Old_Bridge"]
    assert answers[Weights().coverage][:2] == ["d_Gisvi_River", "d_Tarsan_War"]


def test_heuristic_episode_is_deterministic_for_seed_zero():
    steps = [HeuristicEpisode("Which composer was born first, Antonín Dvořák or Giuseppe Verdi?").act([], ALL_TOOLS) for _ in range(2)]
    assert [[c.arguments for c in s.tool_calls] for s in steps][0] == [[c.arguments for c in s.tool_calls] for s in steps][1]


def _chain_episode(hops: int, seed: int = 0) -> tuple[HeuristicEpisode, PolicyStep]:
    """An episode past its first two hops on a three-hop chain: Gisvi Suite -> its composer
    (Elena Marku) -> her birthplace (Tirvana), whose document names the river."""
    episode = HeuristicEpisode("Which river flows through the birthplace of the composer of the Gisvi Suite?", hops=hops, seed=seed)
    hop1 = episode.act([], ALL_TOOLS)
    suite = {0: [("Gisvi Suite", "The Gisvi Suite is an orchestral work composed by Elena Marku in 1950.")]}
    hop2 = episode.act(_tool_results(hop1, suite), ALL_TOOLS)
    first_search = next(n for n, call in enumerate(hop2.tool_calls) if call.name == "search_corpus")
    assert hop2.tool_calls[first_search].arguments["query"].startswith("Elena Marku")
    composer = {first_search: [("Elena Marku", "Elena Marku was born in Tirvana, a town in the north. She studied music in Vienna.")]}
    return episode, episode.act(_tool_results(hop2, composer), ALL_TOOLS)


def test_a_third_hop_reads_its_bridge_from_where_the_second_hop_led():
    """With `hops=3` the chain goes on from the composer's document (it names no river) to her
    birthplace, and that document gets an early slot in the answer."""
    episode, hop3 = _chain_episode(hops=3)
    queries = [call.arguments["query"] for call in hop3.tool_calls if call.name == "search_corpus"]
    assert queries and queries[0].startswith("Tirvana") and "river" in queries[0]
    first_search = next(n for n, call in enumerate(hop3.tool_calls) if call.name == "search_corpus")
    town = {first_search: [("Tirvana", "Tirvana is a town on the banks of the Drin river, which flows west to the sea.")]}
    step = episode.act(_tool_results(hop3, town), ALL_TOOLS)
    while step.tool_calls:
        step = episode.act(_tool_results(step, {}), ALL_TOOLS)
    docs = [doc for doc, _ in episode._answer_ranking()]
    assert docs.index("d_Tirvana") < 4 and episode.rounds == [["Elena Marku"], ["Tirvana", "Vienna"]]


def test_the_default_two_hops_read_instead_of_a_third_search():
    _, step = _chain_episode(hops=2)
    assert step.tool_calls and not any(call.name == "search_corpus" for call in step.tool_calls)
    assert any(call.name == "read_document" for call in step.tool_calls)


def test_nx_seeds_follow_different_bridges():
    """Each seed > 0 leaves out a different one of the strongest bridges, so rollouts explore."""
    question = "What is the most popular hotel in Gisvi's city of birth?"
    text = "Gisvi (born 1982 in Windhoek) played for Benfica, Porto, Braga and Sporting in Lisbon."
    followed = []
    for seed in range(4):
        episode = HeuristicEpisode(question, seed=seed)
        hop1 = episode.act([], ALL_TOOLS)
        hop2 = episode.act(_tool_results(hop1, {0: [("Gisvi", text)]}), ALL_TOOLS)
        followed.append(tuple(call.arguments["query"].split()[0] for call in hop2.tool_calls if call.name == "search_corpus"))
    assert len(set(followed)) == 4 and all(len(bridges) == 3 for bridges in followed)


def test_a_name_repeated_in_one_document_does_not_outweigh_the_sentence_that_links_it():
    """A bridge's strength counts each anchor document once, at its best sentence: the name in
    the sentence that shares the question's words (`Tomas Verlan issued the Gisvi Manifesto`)
    is followed before a name a weaker neighbour repeats in sentence after sentence."""
    episode = HeuristicEpisode("Who was the father of the person who issued the Gisvi Manifesto?")
    hop1 = episode.act([], ALL_TOOLS)
    results = {0: [
        ("Reform movement", "The old party broke up in 1830. Tomas Verlan issued the Gisvi Manifesto in 1834."),
        ("Kaspar Wayne", "Kaspar Wayne is a person raised by his father, Ravel Dorn. Ravel Dorn was a father to the League. "
                         "His father Ravel Dorn trained him. Ravel Dorn, the father, returned in 1990."),
    ]}
    hop2 = episode.act(_tool_results(hop1, results), ALL_TOOLS)
    queries = [call.arguments["query"] for call in hop2.tool_calls if call.name == "search_corpus"]
    assert queries and queries[0].startswith("Tomas Verlan") and "father" in queries[0]
