"""The HTTP search service: `POST /v1/search` over the same `run_search` the CLI uses.

Dependencies (key store, customer registry, index opener, served-policy lookup) are injected
by `create_app`, so the app is testable with a small real index and knows nothing of Dagster;
`searchsmith api` wires the real ones.

Checks run cheapest first, and nothing expensive is paid for a request that is turned away:
the Authorization header and the key's shape (401), the body size (413), the body itself (422),
then admission to the bounded queue (503 with `Retry-After`, only when every worker is busy and
the queue is full). An admitted request then pays, on a search worker, for the key's scrypt hash
(401), whether the key's customer is the one asked for (403, so a key never learns which other
customers exist, which is why this comes before the next check), whether that customer exists
(404), and the search itself. Each request has a deadline (504); one still waiting in the queue
at its deadline is dropped, one already running cannot be killed and keeps its worker until it
ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic.json_schema import models_json_schema
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agent.policy_spec import PolicySpec
from search.index import HybridIndex
from search.reranker import Reranker
from serving.api_keys import ApiKeyStore
from serving.search import PolicyFailed, run_search

logger = logging.getLogger("searchsmith.api")


@dataclass(frozen=True)
class ApiLimits:
    max_body_bytes: int = 16_384
    max_query_chars: int = 2_000
    max_k: int = 50
    search_timeout_s: float = 60.0  # from admission to answer: queueing and opening the index count too
    max_concurrent_searches: int = 4  # search workers (`searchsmith api --workers`)
    max_queued_searches: int = 64  # admitted requests waiting for a worker (`--queue`); beyond: 503
    index_ttl_s: float | None = 600.0  # reopen after this long, so a resync is picked up; None: never
    retry_after_s: int = 1  # what a 503 for a full queue tells the client to wait

    def __post_init__(self) -> None:
        bad = [f"{name} {value} must be positive" for name, value in (
            ("max_body_bytes", self.max_body_bytes), ("max_query_chars", self.max_query_chars), ("max_k", self.max_k),
            ("max_concurrent_searches", self.max_concurrent_searches), ("retry_after_s", self.retry_after_s),
            ("search_timeout_s", self.search_timeout_s)) if value <= 0]
        if self.max_queued_searches < 0:
            bad.append(f"max_queued_searches {self.max_queued_searches} cannot be negative")
        if bad:
            raise ValueError("; ".join(bad))


class IndexUnavailable(LookupError):
    """The customer exists but has no built index yet (raise it, or LookupError, from `open_index`)."""


# -- wire models (also the OpenAPI schemas) ---------------------------------------------------


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, title="SearchRequest")

    customer: str = Field(pattern=r"^[a-z0-9-]+$", max_length=128, description="the customer whose corpus to search")
    query: str = Field(min_length=1, description="the question, in natural language")
    k: int = Field(10, ge=1, description="how many documents to return at most")
    trajectory: bool = Field(False, description="also return the whole trajectory: every turn, tool call and result, "
                             "what was pruned and the token usage (the viewer at GET / shows it)")

    @field_validator("query")
    @classmethod
    def _query(cls, value: str, info: ValidationInfo) -> str:
        if not value.strip():
            raise ValueError("the query is empty")
        limit = (info.context or {}).get("max_query_chars")
        if limit is not None and len(value) > limit:
            raise ValueError(f"the query is longer than {limit} characters")
        return value

    @field_validator("k", mode="before")
    @classmethod
    def _integral_k(cls, value: Any) -> Any:
        # JSON Schema's "integer" is any number with a zero fraction, so `"k": 3.0` is valid by the
        # published document, and strict mode alone answered it 422 (found by the fuzz test). Strings,
        # booleans and fractions stay errors.
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value

    @field_validator("k")
    @classmethod
    def _k(cls, value: int, info: ValidationInfo) -> int:
        limit = (info.context or {}).get("max_k")
        if limit is not None and value > limit:
            raise ValueError(f"k must be at most {limit}")
        return value


class Document(BaseModel):
    doc_id: str
    chunk_id: str | None
    title: str
    justification: str


class Summary(BaseModel):
    turns: int
    tool_calls: int
    peak_tokens: int
    pruned: int


class SearchResult(BaseModel):
    customer: str
    policy: str = Field(description="the policy that answered: the customer's served model, or heuristic")
    documents: list[Document] = Field(description="ranked, best first")
    summary: Summary
    trajectory: dict[str, Any] | None = Field(None, description="only when the request asked for it: the trajectory record "
                                              "(the schema `searchsmith search --save` and benchmark trajectory files use)")


class FieldError(BaseModel):
    field: str
    message: str


class ErrorBody(BaseModel):
    error: str = Field(description="a stable machine-readable code")
    message: str
    fields: list[FieldError] | None = None


class _ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, fields: list[FieldError] | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.fields, self.headers = status, code, message, fields, headers

    def response(self) -> JSONResponse:
        return JSONResponse(ErrorBody(error=self.code, message=self.message, fields=self.fields).model_dump(exclude_none=True), self.status, headers=self.headers)


# -- shared state: opened indexes and search slots ---------------------------------------------


class IndexCache:
    """Opened indexes per customer; a customer's first requests open it once, not once each."""

    def __init__(self, open_index: Callable[[str], HybridIndex], ttl_s: float | None, clock: Callable[[], float] = time.monotonic):
        self._open, self._ttl, self._clock = open_index, ttl_s, clock
        self._entries: dict[str, tuple[float, HybridIndex]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _fresh(self, customer: str) -> HybridIndex | None:
        entry = self._entries.get(customer)
        if entry is None or (self._ttl is not None and self._clock() - entry[0] > self._ttl):
            return None
        return entry[1]

    def get(self, customer: str) -> HybridIndex:
        with self._guard:
            index = self._fresh(customer)
            if index is not None:
                return index
            lock = self._locks.setdefault(customer, threading.Lock())
        with lock:
            with self._guard:
                index = self._fresh(customer)
            if index is None:
                index = self._open(customer)  # failures are not cached: a later sync fixes them
                with self._guard:
                    self._entries[customer] = (self._clock(), index)
            return index

    def invalidate(self, customer: str | None = None) -> None:
        with self._guard:
            if customer is None:
                self._entries.clear()
            else:
                self._entries.pop(customer, None)


class SearchSlots:
    """Counts admitted searches (queued or running, timed-out ones included) against the
    workers plus the queue."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._active = 0
        self._changed = threading.Condition()

    @property
    def active(self) -> int:
        return self._active

    def try_acquire(self) -> bool:
        with self._changed:
            if self._active >= self.capacity:
                return False
            self._active += 1
            return True

    def release(self, *_: Any) -> None:
        with self._changed:
            self._active -= 1
            self._changed.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self._active == 0, timeout)


# -- the app -----------------------------------------------------------------------------------


def _invalid_key(message: str = "the API key is not valid") -> _ApiError:
    return _ApiError(401, "invalid_key", message, headers={"WWW-Authenticate": "Bearer"})


def _bearer(request: Request) -> str:
    """The key from the header, if it has a key's shape (a cheap check: no hashing here)."""
    header = request.headers.get("authorization")
    if not header:
        raise _ApiError(401, "missing_key", "send the API key as `Authorization: Bearer <key>`", headers={"WWW-Authenticate": "Bearer"})
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _invalid_key("the Authorization header must be `Bearer <key>`")
    if not ApiKeyStore.well_formed(token.strip()):
        raise _invalid_key()
    return token.strip()


async def _read_body(request: Request, limit: int) -> bytes:
    too_large = _ApiError(413, "body_too_large", f"the request body is larger than {limit} bytes")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():  # a missing or understated length is caught here
        body += chunk
        if len(body) > limit:
            raise too_large
    return bytes(body)


def _parse(body: bytes, limits: ApiLimits) -> SearchRequest:
    try:
        return SearchRequest.model_validate_json(body or b"null", context={"max_k": limits.max_k, "max_query_chars": limits.max_query_chars})
    except ValidationError as error:
        fields = [FieldError(field=".".join(str(p) for p in e["loc"]) or "body", message=e["msg"]) for e in error.errors(include_url=False)]
        text = "; ".join(f"{f.field}: {f.message}" for f in fields)
        raise _ApiError(422, "invalid_request", f"invalid request: {text}", fields) from None


def _log_fields(request: Request) -> dict[str, Any]:
    state = request.scope.setdefault("state", {})
    return state.setdefault("log", {})


def create_app(
    keys: ApiKeyStore,
    known_customers: Callable[[], set[str]],
    open_index: Callable[[str], HybridIndex],
    policy_for: Callable[[str], str | PolicySpec] = lambda customer: "heuristic",
    limits: ApiLimits = ApiLimits(),
    profile_for: Callable[[str], str | PolicySpec | None] = lambda customer: None,
    reranker_for: Callable[[str], Reranker | None] = lambda customer: None,
) -> Starlette:
    """`profile_for(customer)`: the served checkpoint's spec, whose harness profile a policy reached
    through an endpoint (vLLM) runs under; None when the policy spec carries its own.
    `reranker_for(customer)`: the customer's trained reranker, asked only when the served policy
    selects with one (`POLICY+rerank`)."""
    indexes = IndexCache(open_index, limits.index_ttl_s)
    slots = SearchSlots(limits.max_concurrent_searches + limits.max_queued_searches)
    workers = ThreadPoolExecutor(max_workers=limits.max_concurrent_searches, thread_name_prefix="searchsmith-search")

    def answer(key: str, customer: str, query: str, k: int, with_trajectory: bool = False) -> SearchResult:
        """Everything that costs more than parsing, on a search worker: the key's hash, the
        customer registry, the index and the search."""
        owner = keys.verify(key)
        if owner is None:
            raise _invalid_key()
        if customer != owner:
            raise _ApiError(403, "forbidden", f"this key may not search customer {customer!r}")
        if customer not in known_customers():
            raise _ApiError(404, "unknown_customer", f"no customer named {customer!r}")
        policy = PolicySpec.of(policy_for(customer))
        try:
            index = indexes.get(customer)
        except (LookupError, FileNotFoundError) as error:
            raise IndexUnavailable(str(error)) from error
        try:
            reranker = reranker_for(customer) if policy.rerank else None
            response = run_search(index, query, policy, k, profile_spec=profile_for(customer), reranker=reranker)
        except PolicyFailed as error:
            raise _ApiError(502, "policy_failed", "the customer's search policy failed; see the service log") from error
        trajectory = trajectory_payload(response.trajectories[0]) if with_trajectory and response.trajectories else None
        return SearchResult(customer=customer, policy=policy.name, documents=response.documents, summary=response.summary, trajectory=trajectory)

    async def search(request: Request) -> JSONResponse:
        log = _log_fields(request)
        try:
            key = _bearer(request)
            parsed = _parse(await _read_body(request, limits.max_body_bytes), limits)
            log.update(customer=parsed.customer, k=parsed.k)
            if not slots.try_acquire():
                raise _ApiError(503, "busy", "every search worker is busy and the queue is full; retry shortly",
                                headers={"Retry-After": str(limits.retry_after_s)})
            future = workers.submit(answer, key, parsed.customer, parsed.query, parsed.k, parsed.trajectory)
            future.add_done_callback(slots.release)
            try:
                result = await asyncio.wait_for(asyncio.wrap_future(future), limits.search_timeout_s)
            except asyncio.TimeoutError:
                future.cancel()  # still queued: dropped, and its slot comes back; running: it runs to its end
                raise _ApiError(504, "timeout", f"the search took longer than {limits.search_timeout_s:g} s") from None
            except IndexUnavailable:
                raise _ApiError(503, "index_not_built", f"the index of {parsed.customer!r} is not built yet; run `searchsmith sync {parsed.customer}`") from None
            log.update(policy=result.policy, turns=result.summary.turns, documents=len(result.documents))
            return JSONResponse(result.model_dump(exclude=None if parsed.trajectory else {"trajectory"}))
        except _ApiError as error:
            log.update(error=error.code)
            if error.__cause__ is not None:
                log.update(cause=str(error.__cause__)[:300])
            return error.response()
        except Exception as error:  # a bug or a failing dependency: say so, log the type, hide the details
            log.update(error="internal", cause=type(error).__name__, traceback=traceback.format_exc(limit=8))
            return _ApiError(500, "internal", "the search failed inside the service; see its log").response()

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "searches_in_flight": slots.active, "workers": limits.max_concurrent_searches,
                             "queue": limits.max_queued_searches})

    async def openapi(request: Request) -> JSONResponse:
        return JSONResponse(openapi_document(limits))

    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code, "http_error")
        return _ApiError(error.status_code, code, str(error.detail), headers=error.headers).response()

    @asynccontextmanager
    async def lifespan(app: Starlette):
        nonlocal workers
        yield
        # A fresh (threadless until used) pool replaces the one shut down, so the same app can be
        # started again: a shut-down pool refused every later search with a 500 (found by the
        # schemathesis fuzz test, whose runner ends an ASGI app's lifespan after each test; two
        # `with TestClient(app)` blocks or a server restarted in-process did the same).
        stopped, workers = workers, ThreadPoolExecutor(max_workers=limits.max_concurrent_searches, thread_name_prefix="searchsmith-search")
        stopped.shutdown(wait=False, cancel_futures=True)

    viewer = viewer_routes()
    app = Starlette(
        routes=[
            *viewer,
            Route("/v1/search", search, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/openapi.json", openapi, methods=["GET"]),
        ],
        middleware=[Middleware(_RequestLog)],
        exception_handlers={HTTPException: http_error},
        lifespan=lifespan,
    )
    app.state.indexes, app.state.slots, app.state.limits = indexes, slots, limits
    return app


def trajectory_payload(trajectory: Any) -> dict[str, Any]:
    """The trajectory record as JSON, less the per-token ids and logprobs (training data, large)."""
    payload = json.loads(trajectory.model_dump_json())
    for turn in payload.get("turns", []):
        turn["completion_token_ids"] = turn["completion_logprobs"] = None
    return payload


# The viewer is three static files served by the service itself: no CDN, no build step. The
# policy lets the page reach nothing but this origin.
VIEWER_FILES = {"index.html": "text/html; charset=utf-8", "viewer.js": "text/javascript; charset=utf-8", "viewer.css": "text/css; charset=utf-8"}
VIEWER_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
                 "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")


def viewer_routes() -> list[Route]:
    """`GET /` (the trajectory viewer) and `GET /viewer/{viewer.js,viewer.css}`, read once per app."""
    from pathlib import Path

    folder = Path(__file__).with_name("viewer")
    bodies = {name: (folder / name).read_bytes() for name in VIEWER_FILES}
    headers = {"Content-Security-Policy": VIEWER_POLICY, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}

    def page(name: str):
        async def endpoint(request: Request) -> Response:
            return Response(bodies[name], media_type=VIEWER_FILES[name], headers=headers)
        return endpoint

    return [Route("/", page("index.html"), methods=["GET"]),
            *(Route(f"/viewer/{name}", page(name), methods=["GET"]) for name in VIEWER_FILES if name != "index.html")]


class _RequestLog:
    """One JSON log line per request: method, path, status, latency and what the handler added.

    Headers are never logged, so neither the key nor anything derived from it is.
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), [500]
        scope.setdefault("state", {})

        async def send_status(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            record = {"event": "request", "ts": datetime.now(timezone.utc).isoformat(timespec="milliseconds"), "method": scope["method"], "path": scope["path"], "status": status[0],
                      "latency_ms": round((time.perf_counter() - started) * 1000, 1), **scope["state"].get("log", {})}
            logger.log(logging.WARNING if status[0] >= 500 else logging.INFO, json.dumps(record, sort_keys=True), extra={"searchsmith": record})


# -- OpenAPI -----------------------------------------------------------------------------------


def openapi_document(limits: ApiLimits = ApiLimits()) -> dict[str, Any]:
    """OpenAPI 3.1 for the service; schemas come from the wire models, limits from `limits`."""
    ref = "#/components/schemas/{model}"
    pairs = [(SearchRequest, "validation"), (SearchResult, "serialization"), (ErrorBody, "serialization")]
    _, top = models_json_schema(pairs, ref_template=ref)
    schemas = top["$defs"]
    request_schema = schemas["SearchRequest"]["properties"]
    request_schema["k"]["maximum"] = limits.max_k
    request_schema["query"]["maxLength"] = limits.max_query_chars

    def error(description: str) -> dict[str, Any]:
        return {"description": description, "content": {"application/json": {"schema": {"$ref": ref.format(model="ErrorBody")}}}}

    search = {
        "summary": "Search a customer's corpus with its served search agent",
        "description": "Runs the agent harness with the customer's served policy (or the heuristic one when no model is served) "
        "and returns ranked documents with justifications and a trajectory summary.",
        "operationId": "search",
        "security": [{"bearerAuth": []}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": ref.format(model="SearchRequest")}}}},
        "responses": {
            "200": {"description": "ranked documents", "content": {"application/json": {"schema": {"$ref": ref.format(model="SearchResult")}}}},
            "401": error("missing or invalid API key"),
            "403": error("the key belongs to another customer"),
            "404": error("unknown customer"),
            "413": error(f"the body is larger than {limits.max_body_bytes} bytes"),
            "422": error("malformed body: invalid JSON, wrong types, missing fields, empty query or k out of range"),
            "500": error("internal error"),
            "502": error("the customer's policy (model endpoint) failed"),
            "503": error("the customer's index is not built yet, or every search worker is busy and the queue is full (with Retry-After)"),
            "504": error(f"the search took longer than {limits.search_timeout_s:g} s"),
        },
    }
    health = {"summary": "Liveness", "operationId": "healthz", "security": [],
              "responses": {"200": {"description": "the service is up", "content": {"application/json": {"schema": {"type": "object"}}}}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Searchsmith search service", "version": "1"},
        "paths": {"/v1/search": {"post": search}, "/healthz": {"get": health}},
        "components": {"schemas": schemas, "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer", "description": "ssk_<keyid>_<secret> from `searchsmith keys create CUSTOMER`"}}},
    }


# -- running it --------------------------------------------------------------------------------


def serve_api(
    host: str,
    port: int,
    *,
    known_customers: Callable[[], set[str]],
    open_index: Callable[[str], HybridIndex],
    policy_for: Callable[[str], str | PolicySpec] = lambda customer: "heuristic",
    keys: ApiKeyStore | None = None,
    limits: ApiLimits = ApiLimits(),
    log_level: str = "info",
    profile_for: Callable[[str], str | PolicySpec | None] = lambda customer: None,
    reranker_for: Callable[[str], Reranker | None] = lambda customer: None,
) -> None:
    """Serve until interrupted (`searchsmith api --host H --port P`); request logs go to stderr as JSON lines."""
    import sys

    import uvicorn

    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(log_level.upper())
        logger.propagate = False
    app = create_app(keys or ApiKeyStore(), known_customers, open_index, policy_for, limits, profile_for, reranker_for)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False, server_header=False, timeout_graceful_shutdown=5)
