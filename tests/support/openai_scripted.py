"""A scripted OpenAI chat-completions server on loopback, for tests of the teacher path.

No real LLM runs in CI, but the client, its retries, timeouts and cache must be exercised over
real HTTP: this is `http.server` in a thread speaking `POST /v1/chat/completions` (and the text
`POST /v1/completions`, for prompts sent as token ids). A test gives
it a responder, `(request_json, request_number) -> Reply`, which can answer with a completion,
an HTTP error, a malformed body, or a delay longer than the client's timeout. Every request is
recorded, so a test can count what a rerun asked for.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


@dataclass
class Reply:
    status: int = 200
    body: dict[str, Any] | str | None = None
    delay_s: float = 0.0


def completion(content: str | None = None, tool_calls: list[dict[str, Any]] | None = None,
               prompt_tokens: int = 11, completion_tokens: int = 7, model: str = "scripted") -> dict[str, Any]:
    """A chat.completion body; `tool_calls` as `[{"name": ..., "arguments": {...}}]`."""
    calls = [
        {"id": f"call_{i}", "type": "function",
         "function": {"name": call["name"], "arguments": json.dumps(call.get("arguments", {}))}}
        for i, call in enumerate(tool_calls or [])
    ]
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


Responder = Callable[[dict[str, Any], int], Reply]


@dataclass
class ScriptedOpenAI:
    responder: Responder
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)  # names lower-cased
    in_flight: int = 0
    max_in_flight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def _record(self, request: dict[str, Any], headers: dict[str, str]) -> int:
        with self._lock:
            self.requests.append(request)
            self.headers.append(headers)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            return len(self.requests)

    def _done(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def start(self) -> "ScriptedOpenAI":
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    request = json.loads(raw or b"{}")
                except ValueError:
                    request = {"_raw": raw.decode("utf-8", "replace")}
                number = scripted._record(request, {k.lower(): v for k, v in self.headers.items()})
                try:
                    if not self.path.rstrip("/").endswith(("/chat/completions", "/v1/completions")):
                        reply = Reply(404, {"error": {"message": f"no route {self.path}"}})
                    else:
                        try:
                            reply = scripted.responder(request, number)
                        except Exception as error:  # a broken script is a 500 the test will see
                            reply = Reply(500, {"error": {"message": f"responder crashed: {error!r}"}})
                    if reply.delay_s:
                        time.sleep(reply.delay_s)
                finally:
                    scripted._done()
                body = reply.body if isinstance(reply.body, str) else json.dumps(reply.body or {})
                data = body.encode("utf-8")
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="scripted-openai", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "ScriptedOpenAI":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
