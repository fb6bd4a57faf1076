"""A real HTTP site on 127.0.0.1, served from a folder in a background thread, for crawler tests.

Files are served with an ETag (content hash) and Last-Modified (mtime) and conditional GETs are
answered with 304, so change detection is tested against genuine HTTP semantics rather than a
mock. Tests can add redirects, force a status on a path (500), delay a path (timeouts), omit
Content-Length (streamed size limits), and read `hits` to assert exactly what was requested.
"""

from __future__ import annotations

import hashlib
import mimetypes
import threading
import time
from collections import Counter
from dataclasses import dataclass
from email.utils import formatdate, parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a handler still sleeping for a timeout test must not block teardown

    def handle_error(self, request, client_address) -> None:  # noqa: ANN001 - stdlib signature
        """Clients that time out close the socket mid-response; that is expected, not a test failure."""


class Website:
    """Serves `root` on a free loopback port (or the given loopback address and port); use as a context manager."""

    def __init__(self, root: Path, host: str = "127.0.0.1", port: int = 0):
        self.root, self.host, self.port = root, host, port  # another loopback address (127.0.0.2) or a fixed port when asked
        self.redirects: dict[str, str] = {}  # path -> Location (answered with 301)
        self.statuses: dict[str, int] = {}  # path -> status answered instead of the file
        self.delays: dict[str, float] = {}  # path -> seconds to wait before answering
        self.content_types: dict[str, str] = {}  # path -> Content-Type override
        self.no_length: set[str] = set()  # paths answered without Content-Length
        self.validators = True  # send ETag/Last-Modified and honour conditional requests
        self.hits: Counter[str] = Counter()  # path -> number of requests
        self.responses: list[tuple[str, int]] = []  # (path, status) in request order
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # lifecycle

    def __enter__(self) -> "Website":
        self._server = _QuietServer((self.host, self.port), _handler_for(self))
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="test-website", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    @property
    def base_url(self) -> str:
        assert self._server is not None, "start the site first (with Website(root) as site)"
        return f"http://{self.host}:{self._server.server_address[1]}"

    def url(self, path: str = "/") -> str:
        return self.base_url + path

    # content

    def write(self, path: str, content: str | bytes) -> Path:
        target = self.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            target.write_text(content, encoding="utf-8")
        else:
            target.write_bytes(content)
        return target

    def remove(self, path: str) -> None:
        (self.root / path.lstrip("/")).unlink()

    def statuses_for(self, path: str) -> list[int]:
        with self._lock:
            return [status for hit, status in self.responses if hit == path]

    def reset_counts(self) -> None:
        with self._lock:
            self.hits.clear()
            self.responses.clear()

    # serving

    def _file_for(self, path: str) -> Path | None:
        relative = unquote(path).lstrip("/")
        candidate = (self.root / relative).resolve()
        root = self.root.resolve()
        if candidate != root and root not in candidate.parents:
            return None  # no path traversal out of the site folder
        if candidate.is_dir():
            candidate = candidate / "index.html"
        return candidate if candidate.is_file() else None

    def _content_type(self, path: str, file: Path) -> str:
        if path in self.content_types:
            return self.content_types[path]
        guessed = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
        return f"{guessed}; charset=utf-8" if guessed.startswith("text/") else guessed

    def respond(self, handler: BaseHTTPRequestHandler) -> None:
        path = urlsplit(handler.path).path
        with self._lock:
            self.hits[path] += 1
        if path in self.delays:
            time.sleep(self.delays[path])
        answer = self._answer(handler, path)
        with self._lock:  # recorded before sending, so a test never reads the log behind the client
            self.responses.append((path, answer.status))
        answer.send(handler)

    def _answer(self, handler: BaseHTTPRequestHandler, path: str) -> "_Answer":
        if path in self.statuses:
            return _Answer(self.statuses[path], b"forced status\n", {"Content-Type": "text/plain"})
        if path in self.redirects:
            return _Answer(301, b"", {"Location": self.redirects[path]})
        file = self._file_for(path)
        if file is None:
            return _Answer(404, b"not found\n", {"Content-Type": "text/plain"})
        data = file.read_bytes()
        mtime = file.stat().st_mtime
        headers = {"Content-Type": self._content_type(path, file)}
        if self.validators:
            headers["ETag"] = '"' + hashlib.sha256(data).hexdigest()[:16] + '"'
            headers["Last-Modified"] = formatdate(mtime, usegmt=True)
            if _not_modified(handler, headers["ETag"], mtime):
                return _Answer(304, b"", {k: v for k, v in headers.items() if k != "Content-Type"})
        return _Answer(200, data, headers, with_length=path not in self.no_length)


@dataclass(frozen=True)
class _Answer:
    status: int
    body: bytes
    headers: dict[str, str]
    with_length: bool = True

    def send(self, handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(self.status)
        for name, value in self.headers.items():
            handler.send_header(name, value)
        if self.with_length and self.status != 304:
            handler.send_header("Content-Length", str(len(self.body)))
        handler.end_headers()
        if self.body and self.status != 304:
            handler.wfile.write(self.body)


def _not_modified(handler: BaseHTTPRequestHandler, etag: str, mtime: float) -> bool:
    """RFC 9110: If-None-Match decides when present; If-Modified-Since only otherwise."""
    if_none_match = handler.headers.get("If-None-Match")
    if if_none_match is not None:
        tags = [tag.strip() for tag in if_none_match.split(",")]
        return "*" in tags or etag in tags
    if_modified_since = handler.headers.get("If-Modified-Since")
    if if_modified_since:
        try:
            return int(mtime) <= parsedate_to_datetime(if_modified_since).timestamp()
        except (TypeError, ValueError):
            return False
    return False


def _handler_for(site: Website) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.0: the connection closes after each answer, so a body without Content-Length ends cleanly.
        protocol_version = "HTTP/1.0"
        server_version = "SearchsmithTestSite/1.0"
        disable_nagle_algorithm = True  # headers and body go out as two writes; Nagle would add ~40 ms each

        def do_GET(self) -> None:  # noqa: N802 - stdlib naming
            site.respond(self)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
            """Silence per-request logging."""

    return Handler
