"""The vLLM server's admin calls: which models it serves, and LoRA adapters loaded and unloaded
while it runs.

Why its own client: these are not chat completions (no retries that could load an adapter
twice, no token accounting), and three callers need them: RL rollouts on vLLM swap the adapter
after every update, the serving stage loads a promoted customer's adapter and unloads the one it
replaces, and the managed `VLLMServer` does both for the servers it starts. The server must run
with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` and `--enable-lora`; a refusal is raised with the
server's own message.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


class VLLMAdminError(RuntimeError):
    """An admin call the server refused or could not answer; the message quotes the server."""


class VLLMAdmin:
    """Admin calls against one server at `base_url` (with or without the trailing `/v1`)."""

    def __init__(self, base_url: str, *, api_key_env: str | None = None, timeout: float = 300.0):
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.api_key_env = api_key_env
        self.timeout = timeout
        self._http: Any = None

    def _client(self) -> Any:
        if self._http is None:
            import httpx

            key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
            self._http = httpx.Client(timeout=self.timeout, headers={"Authorization": f"Bearer {key}"} if key else {})
        return self._http

    def _post(self, path: str, body: dict[str, Any]) -> None:
        response = self._client().post(f"{self.base_url}/{path}", json=body)
        if response.status_code >= 400:
            raise VLLMAdminError(f"vLLM {path} failed ({response.status_code}): {response.text[:500]}")

    def models(self) -> list[str]:
        """What the server serves now: the base model and every loaded adapter."""
        response = self._client().get(f"{self.base_url}/models")
        if response.status_code != 200:
            raise VLLMAdminError(f"GET /v1/models failed ({response.status_code}): {response.text[:500]}")
        return [model["id"] for model in response.json().get("data", [])]

    def load_adapter(self, name: str, path: str | Path) -> float:
        """Load the adapter folder `path` under `name`; returns the seconds the server took."""
        start = time.perf_counter()
        self._post("load_lora_adapter", {"lora_name": name, "lora_path": str(Path(path).resolve())})
        return time.perf_counter() - start

    def unload_adapter(self, name: str) -> float:
        start = time.perf_counter()
        self._post("unload_lora_adapter", {"lora_name": name})
        return time.perf_counter() - start

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
