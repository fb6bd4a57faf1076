"""Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`):
navigate, type, click, pick files and read the DOM as a person's browser would, with nothing but
the standard library (no websocket client, no browser driver). Chromium reads commands on fd 3
and writes replies on fd 4, each a JSON object ended by a NUL byte.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class ChromiumError(RuntimeError):
    pass


class Browser:
    """One headless Chromium with one page. Use as a context manager; it is stopped on exit."""

    def __init__(self, profile: Path, window: tuple[int, int] = (1400, 1800)):
        binary = chromium_path()
        if binary is None:
            raise ChromiumError("Chromium is not on PATH")
        args = [
            binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync", "--remote-debugging-pipe",
            f"--window-size={window[0]},{window[1]}", f"--user-data-dir={profile}", "about:blank",
        ]
        # The shell puts our pipes on the descriptors Chromium expects: stdin as fd 3, stdout as fd 4.
        self.process = subprocess.Popen(
            ["sh", "-c", 'exec "$0" "$@" 3<&0 4>&1 0</dev/null 1>/dev/null', *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env={**os.environ, "HOME": str(profile)}, start_new_session=True,
        )
        self._next_id = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self._changed = threading.Condition()
        self._closed = False
        self._reader = threading.Thread(target=self._read, name="chromium-cdp", daemon=True)
        self._reader.start()
        self.session = self._open_page()

    # -- protocol --
    def _read(self) -> None:
        buffer = b""
        stream = self.process.stdout
        while True:
            chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
            if not chunk:
                break
            buffer += chunk
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                message = json.loads(raw)
                with self._changed:
                    if "id" in message:
                        self._replies[message["id"]] = message
                    else:
                        self.events.append(message)
                    self._changed.notify_all()
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60) -> dict[str, Any]:
        with self._changed:
            self._next_id += 1
            ident = self._next_id
        message = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self.process.stdin.write(json.dumps(message).encode() + b"\0")
        self.process.stdin.flush()
        with self._changed:
            if not self._changed.wait_for(lambda: ident in self._replies or self._closed, timeout):
                raise ChromiumError(f"no reply to {method} within {timeout:.0f} s")
            if ident not in self._replies:
                raise ChromiumError(f"Chromium exited before answering {method}")
            reply = self._replies.pop(ident)
        if "error" in reply:
            raise ChromiumError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def _open_page(self) -> str:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "DOM"):
            self.send(f"{domain}.enable", session=session)
        return session

    # -- what a test does with the page --
    def navigate(self, url: str, timeout: float = 60) -> None:
        seen = len(self.events)
        self.send("Page.navigate", {"url": url}, self.session)
        with self._changed:
            loaded = self._changed.wait_for(
                lambda: any(e.get("method") == "Page.loadEventFired" and e.get("sessionId") == self.session for e in self.events[seen:]),
                timeout)
        if not loaded:
            raise ChromiumError(f"{url} did not load within {timeout:.0f} s")

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}, self.session)
        if "exceptionDetails" in result:
            raise ChromiumError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def type_into(self, selector: str, text: str) -> None:
        """Focus the field and insert the text as keyboard input would."""
        assert self.evaluate(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return false; e.focus(); e.select && e.select(); return true; }})()"), selector
        self.send("Input.insertText", {"text": text}, self.session)

    def click(self, selector: str) -> None:
        """A real mouse press and release at the element's centre."""
        box = self.evaluate(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null; e.scrollIntoView(); "
                            f"const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }})()")
        assert box is not None, f"nothing matches {selector}"
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1}, self.session)

    def set_files(self, selector: str, paths: list[Path]) -> None:
        root = self.send("DOM.getDocument", {"depth": 0}, self.session)["root"]["nodeId"]
        node = self.send("DOM.querySelector", {"nodeId": root, "selector": selector}, self.session)["nodeId"]
        assert node, f"nothing matches {selector}"
        self.send("DOM.setFileInputFiles", {"nodeId": node, "files": [str(p) for p in paths]}, self.session)

    def wait_for(self, expression: str, timeout: float = 120) -> Any:
        """Poll a JavaScript expression until it is truthy (bounded); returns its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                body = self.evaluate("document.body ? document.body.innerText.slice(0, 2000) : ''")
                raise ChromiumError(f"{expression} stayed falsy for {timeout:.0f} s; the page shows: {body}")
            time.sleep(0.2)

    def console_errors(self) -> list[str]:
        return [json.dumps(e["params"])[:500] for e in self.events
                if e.get("method") == "Runtime.exceptionThrown"
                or (e.get("method") == "Runtime.consoleAPICalled" and e["params"].get("type") == "error")]

    # -- lifecycle --
    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.send("Browser.close", timeout=10)
            except (ChromiumError, BrokenPipeError, OSError):
                pass
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        try:  # helpers of our Chromium (its own process group) that outlived it
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
