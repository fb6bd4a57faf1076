"""Website source: a polite, scoped crawler with HTTP change detection.

Scope is the safety boundary. Only hosts on the allow-list (the seeds' hosts by default), on a
seed's scheme and port, are ever requested, every redirect hop is re-checked before it is
followed, and hosts that resolve to private, loopback, link-local or reserved addresses are
refused unless the source opts in, so a customer file cannot turn the sync into a probe of the
internal network. Each host is resolved once per scan and connections go to the addresses that
were checked (no second lookup for a rebinding name to answer differently). robots.txt is honoured
with the source's user agent, and requests to one host are spaced by `rate_limit_per_s`.

Change detection reuses the previous sync's validators: a conditional GET (If-None-Match /
If-Modified-Since) lets the server answer 304, and a 200 whose body hashes to the old version is
still `Unchanged`. A page's outgoing links are kept in its validators (JSON under "links"), so an
unchanged page, which is never downloaded again, still feeds the crawl frontier.

Deletions follow the connector contract: a page the crawl no longer reaches, or that answers
404/410, is simply not yielded, so the sync tombstones it. Any other failure yields `Failed`, so
the sync keeps the old copy; a known page that fails still passes on its previous links, so one
broken page does not make its whole subtree look deleted. When the site as a whole is down (a seed
host's robots.txt cannot be fetched, or no seed answers) the scan raises `SourceError` instead of
letting the sync infer that everything was deleted.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import ssl
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import PurePosixPath
from typing import Callable, Iterable, Iterator, Mapping
from urllib.parse import quote, urljoin, urlsplit, urlunsplit
from urllib.robotparser import RobotFileParser

import httpcore
import httpx

from core.config import WebSource
from corpus.sources.base import Failed, Fetched, PreviousItem, ScanEvent, SourceError, Unchanged, content_version

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
MAX_REDIRECTS = 5
MAX_SITEMAPS = 20  # sitemap files fetched per scan, nested indexes included
MAX_CRAWL_DELAY_S = 30.0  # a robots.txt Crawl-delay above this would stall the sync for hours
GONE_STATUSES = frozenset({404, 410})
DEFAULT_PORTS = {"http": 80, "https": 443}
HTML_MEDIA_TYPES = frozenset({"text/html", "application/xhtml+xml"})
HTML_SUFFIXES = frozenset({".html", ".htm", ".xhtml"})
# Non-text/* types that still carry text a parser can use; everything else is treated as binary.
TEXTUAL_MEDIA_TYPES = frozenset(
    {
        "application/pdf",
        "application/xhtml+xml",
        "application/xml",
        "application/json",
        "application/javascript",
        "application/x-javascript",
        "application/yaml",
        "application/x-yaml",
        "application/toml",
        "application/x-sh",
        "application/mbox",
        "message/rfc822",
    }
)
ACCEPT = "text/html,application/xhtml+xml,application/pdf;q=0.9,text/*;q=0.8,*/*;q=0.1"
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"
_QUERY_SAFE = _PATH_SAFE + "?"


# --- URLs, links, sitemaps, media types: pure functions -------------------------------------------


def normalize_url(url: str, base: str | None = None) -> str | None:
    """The single spelling of a URL used for identity and dedupe, or None if it is not crawlable.

    Relative links resolve against `base`; the fragment, user info and default port are dropped,
    scheme and host are lowercased and dot segments removed, so `./a.html#x` and `/a.html` found on
    different pages are one page, not two.
    """
    try:
        parts = urlsplit(urljoin(base, url.strip()) if base else url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = host if port in (None, DEFAULT_PORTS[scheme]) else f"{host}:{port}"
    path = urlsplit(urljoin("http://h/", parts.path)).path if parts.path else "/"
    return urlunsplit((scheme, netloc, quote(path, safe=_PATH_SAFE), quote(parts.query, safe=_QUERY_SAFE), ""))


def extract_links(html: bytes, page_url: str) -> list[str]:
    """Normalised targets of the page's <a>/<area> links, in page order, without duplicates.

    Honours <base href> and a robots meta tag saying nofollow. Resources (images, scripts, styles)
    are not pages and are not followed.
    """
    import lxml.etree
    import lxml.html

    try:
        root = lxml.html.document_fromstring(html)
    except (lxml.etree.LxmlError, ValueError):
        return []
    robots_meta = " ".join(root.xpath("//meta[translate(@name, 'ROBTS', 'robts')='robots']/@content")).lower()
    if {"nofollow", "none"} & set(robots_meta.replace(",", " ").split()):
        return []
    base = normalize_url(str(root.xpath("string(//base/@href)")), page_url) or page_url
    links: list[str] = []
    for href in root.xpath("//a/@href | //area/@href"):
        url = normalize_url(str(href), base)
        if url and url not in links:
            links.append(url)
    return links


def parse_sitemap(data: bytes) -> tuple[list[str], list[str]]:
    """(page URLs, nested sitemap URLs) of a sitemap or sitemap index; nothing if malformed.

    Entities and network access are disabled in the parser: the XML comes from the site.
    """
    from lxml import etree

    parser = etree.XMLParser(resolve_entities=False, no_network=True, recover=True, huge_tree=False)
    try:
        root = etree.fromstring(data, parser)
    except etree.XMLSyntaxError:
        return [], []
    if root is None or not isinstance(root.tag, str):
        return [], []
    locations = [str(text).strip() for text in root.xpath("//*[local-name()='loc']/text()") if str(text).strip()]
    if etree.QName(root).localname == "sitemapindex":
        return [], locations
    return locations, []


def media_type_of(headers: Mapping[str, str]) -> str:
    return headers.get("content-type", "").split(";")[0].strip().lower()


def binary_refusal(media_type: str) -> str | None:
    """Why a body of this type is not worth downloading (None: text a parser can use).

    A missing type is let through: the parser decides from the bytes and the URL suffix.
    """
    if not media_type or media_type.startswith("text/") or media_type in TEXTUAL_MEDIA_TYPES:
        return None
    if media_type.endswith(("+xml", "+json")):
        return None
    return f"binary content type {media_type}"


def _is_html(media_type: str, url: str) -> bool:
    if media_type:
        return media_type in HTML_MEDIA_TYPES
    return PurePosixPath(urlsplit(url).path).suffix.lower() in HTML_SUFFIXES


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _host(url: str) -> str:
    return urlsplit(url).hostname or ""


# --- Scope: which hosts may be contacted at all ----------------------------------------------------


def non_public_kind(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """The kind of non-public address this is ("loopback", "private", ...), None when public."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is loopback too
    for kind in ("loopback", "link_local", "unspecified", "multicast", "reserved", "private"):  # most specific first
        if getattr(address, f"is_{kind}"):
            return kind.replace("_", "-")
    return None if address.is_global else "non-global"


def resolve_addresses(host: str) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Every address `host` resolves to (a literal address is itself); raises OSError/UnicodeError."""
    try:
        return {ipaddress.ip_address(host.strip("[]"))}
    except ValueError:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        return {ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos}


def judge_addresses(host: str, addresses: Iterable[ipaddress.IPv4Address | ipaddress.IPv6Address]) -> str | None:
    """Why these addresses of `host` must not be contacted (None: all public).

    Every address counts, not just the first: a name with one public and one internal address
    could otherwise be steered to the internal one.
    """
    for address in sorted(addresses, key=str):
        kind = non_public_kind(address)
        if kind:
            return f"host {host} resolves to {kind} address {address}"
    return None


def _scheme_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, parts.port or DEFAULT_PORTS.get(scheme, 0)


class AddressRefused(Exception):
    """Raised at connect time: the host's pinned addresses are not public (and the source does not allow them)."""


class Scope:
    """Where a crawl may go: an allow-listed host (exact name, or `*.example.com` for subdomains)
    on a seed's scheme and port, at public addresses.

    The origin is scheme + host + port, so a link or redirect to another service on the same host
    (`127.0.0.1:OTHER`, an admin port) is out of scope even when the host is allowed. The one
    widening is the usual upgrade: an http seed on port 80 also admits https on port 443. With no
    seeds, the default ports (80 and 443) are in scope.

    Each host is resolved once per scan and its addresses are pinned: the private-address verdict
    is made on those addresses, and the crawler's connections go to exactly those addresses
    (`connect_addresses`), never through a second DNS lookup that a rebinding name could answer
    differently.
    """

    def __init__(self, allow_hosts: Iterable[str], allow_private: bool, seeds: Iterable[str] = ()):
        self.allow_hosts = {host.strip().lower().rstrip(".") for host in allow_hosts if host.strip()}
        self.allow_private = allow_private
        self.ports = {_scheme_port(seed) for seed in seeds} or {("http", 80), ("https", 443)}
        if ("http", 80) in self.ports:
            self.ports.add(("https", 443))
        self._addresses: dict[str, tuple[list[str], str | None]] = {}  # host -> (addresses, why unresolvable)
        self._lock = threading.Lock()

    def host_allowed(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        if host in self.allow_hosts:
            return True
        return any(entry.startswith("*.") and host.endswith(entry[1:]) for entry in self.allow_hosts)

    def _pinned(self, host: str) -> tuple[list[str], str | None]:
        with self._lock:
            if host not in self._addresses:
                try:
                    self._addresses[host] = ([str(a) for a in sorted(resolve_addresses(host), key=str)], None)
                except (OSError, UnicodeError) as error:
                    self._addresses[host] = ([], f"host {host} cannot be resolved ({error})")
            return self._addresses[host]

    def _address_refusal(self, host: str) -> str | None:
        addresses, unresolvable = self._pinned(host)
        return unresolvable or judge_addresses(host, map(ipaddress.ip_address, addresses))

    def refusal(self, url: str) -> str | None:
        """Why `url` is out of scope; the allow-list and port are checked first so off-site names are never resolved."""
        host = _host(url)
        if not self.host_allowed(host):
            return f"host {host} is not in allow_hosts"
        scheme, port = _scheme_port(url)
        if (scheme, port) not in self.ports:
            allowed = ", ".join(f"{s}:{p}" for s, p in sorted(self.ports))
            return f"{scheme} port {port} of {host} is not a seed's scheme and port ({allowed})"
        if self.allow_private:
            return None
        return self._address_refusal(host)

    def connect_addresses(self, host: str) -> list[str]:
        """The pinned addresses to connect to for `host`, judged exactly as `refusal` judged them."""
        addresses, unresolvable = self._pinned(host)
        if unresolvable:
            raise OSError(unresolvable)
        if not self.allow_private:
            reason = judge_addresses(host, map(ipaddress.ip_address, addresses))
            if reason:
                raise AddressRefused(reason)
        return addresses


class _PinnedBackend(httpcore.NetworkBackend):
    """httpcore's synchronous network backend, connecting to the scope's pinned addresses of a
    host instead of resolving it again. TLS still verifies and sends SNI for the host name
    (httpcore passes the URL's host to `start_tls`), and the Host header is the URL's."""

    def __init__(self, scope: Scope):
        self.scope, self.inner = scope, httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None, socket_options=None) -> httpcore.NetworkStream:
        try:
            addresses = self.scope.connect_addresses(host)
        except OSError as error:
            raise httpcore.ConnectError(str(error)) from None
        last: Exception | None = None
        for address in addresses:
            try:
                return self.inner.connect_tcp(address, port, timeout=timeout, local_address=local_address, socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as error:
                last = error
        raise last or httpcore.ConnectError(f"host {host} has no address")

    def connect_unix_socket(self, *args, **kwargs) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("the crawler never connects to unix sockets")

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


def pinned_transport(scope: Scope) -> httpx.HTTPTransport:
    """An httpx transport whose connections go to the scope's pinned addresses.

    httpx does not take a network backend, so its connection pool is rebuilt with one (the same
    settings httpx uses by default). Proxies from the environment are not used: a proxy would
    resolve names itself, out of reach of the private-address check.
    """
    transport = httpx.HTTPTransport(verify=_tls_context())
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=5.0)
    transport._pool = httpcore.ConnectionPool(
        ssl_context=_tls_context(), max_connections=limits.max_connections, max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry, network_backend=_PinnedBackend(scope),
    )
    return transport


# --- Politeness --------------------------------------------------------------------------------------


class HostRateLimiter:
    """Spaces request starts to one host by 1/rate seconds, or the robots.txt Crawl-delay if longer."""

    def __init__(
        self,
        rate_per_s: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.interval = 1.0 / rate_per_s
        self._clock, self._sleep = clock, sleep
        self._next_start: dict[str, float] = {}
        self._crawl_delays: dict[str, float] = {}

    def set_crawl_delay(self, host: str, seconds: float) -> None:
        self._crawl_delays[host] = min(max(seconds, 0.0), MAX_CRAWL_DELAY_S)

    def wait(self, host: str) -> None:
        now = self._clock()
        ready = self._next_start.get(host, now)
        if ready > now:
            self._sleep(ready - now)
            now = ready
        self._next_start[host] = now + max(self.interval, self._crawl_delays.get(host, 0.0))


# --- The crawl ---------------------------------------------------------------------------------------


class _FetchError(Exception):
    """A request that produced no usable HTTP response.

    `transient` separates a server that did not answer (timeout, connection error) from one that
    answered with something we will not follow (a refused redirect, a redirect loop).
    """

    def __init__(self, reason: str, transient: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.transient = transient


@dataclass(frozen=True)
class _Response:
    status: int
    final_url: str
    headers: httpx.Headers
    body: bytes | None = None  # read only for a 200 that passed the type and size checks
    refusal: str | None = None  # why a 200 body was not read


@dataclass(frozen=True)
class _Visit:
    event: ScanEvent | None  # None: gone (404/410) or a duplicate reached through a redirect
    links: list[str] = field(default_factory=list)
    answered: bool = True  # the server is up (anything but a transport error or a 5xx)


def _header_validators(headers: httpx.Headers) -> dict[str, str]:
    validators = {}
    if headers.get("etag"):
        validators["etag"] = headers["etag"]
    if headers.get("last-modified"):
        validators["last_modified"] = headers["last-modified"]
    return validators


def _conditional_headers(known: PreviousItem | None) -> dict[str, str]:
    if known is None:
        return {}
    headers = {}
    if known.validators.get("etag"):
        headers["If-None-Match"] = known.validators["etag"]
    if known.validators.get("last_modified"):
        headers["If-Modified-Since"] = known.validators["last_modified"]
    return headers


def _stored_links(known: PreviousItem | None) -> list[str]:
    """The links recorded for a page last time, so a page not downloaded now still extends the crawl."""
    if known is None:
        return []
    try:
        links = json.loads(known.validators.get("links", "[]"))
    except (TypeError, ValueError):
        return []
    return [link for link in links if isinstance(link, str)] if isinstance(links, list) else []


class _Crawl:
    """One scan's state: frontier, visited URLs, robots.txt per origin, refusals.

    Breadth first, so `max_pages` (page requests; robots.txt and sitemaps are not counted) keeps
    the pages closest to the seeds. Seeds and sitemap entries are depth 0.
    """

    def __init__(self, source: WebSource, client: httpx.Client, scope: Scope, max_bytes: int, previous: Mapping[str, PreviousItem]):
        self.source, self.client, self.scope, self.max_bytes, self.previous = source, client, scope, max_bytes, previous
        self.limiter = HostRateLimiter(source.rate_limit_per_s)
        self.robots: dict[str, RobotFileParser | str] = {}  # origin -> rules, or why they are unavailable
        self.offered: set[str] = set()  # ever put on the frontier (or refused)
        self.done: set[str] = set()  # requested, or reached as a redirect target
        self.refused: dict[str, str] = {}  # url -> why it was not followed
        self.frontier: deque[tuple[str, int]] = deque()

    # HTTP

    def get(self, url: str, headers: Mapping[str, str] | None = None, check_robots: bool = True) -> _Response:
        """GET with redirects followed by hand, so every hop is re-checked against scope and robots.txt."""
        current = url
        for _ in range(MAX_REDIRECTS + 1):
            self.limiter.wait(_host(current))
            try:
                with self.client.stream("GET", current, headers=headers) as response:
                    if not response.has_redirect_location:
                        return self._read(current, response)
                    location = response.headers["location"]
            except AddressRefused as error:
                raise _FetchError(f"{current} refused: {error}") from None
            except httpx.TimeoutException:
                raise _FetchError(f"timed out fetching {current}", transient=True) from None
            except (httpx.HTTPError, httpx.InvalidURL) as error:
                raise _FetchError(f"{type(error).__name__} fetching {current}: {error}", transient=True) from None
            current = self._redirect_target(current, location, check_robots)
        raise _FetchError(f"more than {MAX_REDIRECTS} redirects from {url}")

    def _redirect_target(self, current: str, location: str, check_robots: bool) -> str:
        target = normalize_url(location, current)
        if target is None:
            raise _FetchError(f"redirect from {current} to an unsupported URL {location!r}")
        reason = self.scope.refusal(target)
        if reason is None and check_robots:
            reason = self.robots_refusal(target, unavailable_refuses=True)
        if reason:
            raise _FetchError(f"redirect to {target} refused: {reason}")
        return target

    def _read(self, url: str, response: httpx.Response) -> _Response:
        if response.status_code != 200:
            return _Response(response.status_code, url, response.headers)
        refusal = binary_refusal(media_type_of(response.headers))
        length = response.headers.get("content-length", "")
        if refusal is None and length.isdigit() and int(length) > self.max_bytes:
            refusal = f"over the size limit ({length} > {self.max_bytes} bytes)"
        if refusal:
            return _Response(200, url, response.headers, refusal=refusal)
        body = bytearray()
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) > self.max_bytes:  # Content-Length may be absent or wrong
                return _Response(200, url, response.headers, refusal=f"over the size limit (more than {self.max_bytes} bytes)")
        return _Response(200, url, response.headers, bytes(body))

    # robots.txt

    def robots_for(self, url: str) -> RobotFileParser | str:
        origin = _origin(url)
        if origin not in self.robots:
            self.robots[origin] = self._load_robots(origin)
        return self.robots[origin]

    def _load_robots(self, origin: str) -> RobotFileParser | str:
        """Rules for one origin, following urllib's convention: 401/403 forbid all, other 4xx allow all
        (as does a robots.txt that redirects out of scope: there is no file we may read).

        A 5xx or an unreachable server is neither: it is returned as a reason, so the pages of that
        origin fail (and are kept) instead of being crawled without rules or treated as deleted.
        """
        robots_url = f"{origin}/robots.txt"
        parser = RobotFileParser(robots_url)
        try:
            response = self.get(robots_url, check_robots=False)
        except _FetchError as error:
            if error.transient:
                return f"robots.txt unavailable: {error.reason}"
            parser.allow_all = True
            return parser
        if response.status >= 500:
            return f"robots.txt unavailable: HTTP {response.status}"
        if response.status in (401, 403):
            parser.disallow_all = True
        elif response.status == 200 and response.body is not None:
            parser.parse(response.body.decode("utf-8", errors="replace").splitlines())
        else:
            parser.allow_all = True
        delay = parser.crawl_delay(self.source.user_agent)
        if delay:
            self.limiter.set_crawl_delay(_host(origin), float(delay))
        return parser

    def robots_refusal(self, url: str, unavailable_refuses: bool = False) -> str | None:
        robots = self.robots_for(url)
        if isinstance(robots, str):
            return robots if unavailable_refuses else None
        if not robots.can_fetch(self.source.user_agent, url):
            return "disallowed by robots.txt"
        return None

    # Frontier

    def offer(self, url: str, depth: int) -> None:
        """Queue `url` unless already seen, too deep, out of scope or disallowed (refusals are recorded)."""
        if url in self.offered or depth > self.source.max_depth:
            return
        self.offered.add(url)
        reason = self.scope.refusal(url) or self.robots_refusal(url)
        if reason:
            self.refused[url] = reason
            return
        self.frontier.append((url, depth))

    def sitemap_pages(self, seeds: list[str]) -> Iterator[str]:
        """Page URLs from /sitemap.xml of each seed origin and the sitemaps robots.txt names.

        A sitemap that fails (not merely missing) makes the previously known pages of its origin
        candidates again, so pages only the sitemap lists are not taken for deleted.
        """
        candidates = [f"{origin}/sitemap.xml" for origin in dict.fromkeys(_origin(seed) for seed in seeds)]
        for seed in seeds:
            robots = self.robots_for(seed)
            if isinstance(robots, RobotFileParser):
                candidates.extend(robots.site_maps() or [])
        queue = deque(dict.fromkeys(url for url in map(normalize_url, candidates) if url))
        fetched: set[str] = set()
        while queue and len(fetched) < MAX_SITEMAPS:
            sitemap = queue.popleft()
            if sitemap in fetched:
                continue
            reason = self.scope.refusal(sitemap) or self.robots_refusal(sitemap)
            if reason:
                self.refused[sitemap] = reason
                continue
            fetched.add(sitemap)
            try:
                response = self.get(sitemap)
            except _FetchError as error:
                yield from self._sitemap_failed(sitemap, error.reason)
                continue
            if response.status >= 500:
                yield from self._sitemap_failed(sitemap, f"HTTP {response.status}")
                continue
            if response.status != 200 or response.body is None:
                continue
            pages, nested = parse_sitemap(response.body)
            queue.extend(url for url in (normalize_url(n) for n in nested) if url)
            yield from (url for url in (normalize_url(p) for p in pages) if url)

    def _sitemap_failed(self, sitemap: str, reason: str) -> Iterator[str]:
        log.warning("sitemap %s failed (%s); re-checking known pages of %s", sitemap, reason, _origin(sitemap))
        origin = _origin(sitemap)
        return (url for url in self.previous if _origin(url) == origin)

    # Pages

    def visit(self, url: str) -> _Visit:
        """Fetch one page (conditionally when it is known) and turn the answer into a scan event."""
        known = self.previous.get(url)
        robots = self.robots_for(url)
        if isinstance(robots, str):
            return self._failed(url, known, robots, answered=False)
        try:
            response = self.get(url, _conditional_headers(known))
        except _FetchError as error:
            return self._failed(url, known, error.reason, answered=not error.transient)
        if response.final_url != url:
            if response.final_url in self.done:
                return _Visit(None)  # the target was already crawled under its own URL
            self.done.add(response.final_url)
        if response.status == 304:
            return self._not_modified(url, known, response)
        if response.status in GONE_STATUSES:
            return _Visit(None)
        if response.status != 200:
            return self._failed(url, known, f"HTTP {response.status}", answered=response.status < 500)
        if response.refusal or response.body is None:
            return self._failed(url, known, response.refusal or "no body")
        return self._page(url, known, response, response.body)

    def _failed(self, url: str, known: PreviousItem | None, reason: str, answered: bool = True) -> _Visit:
        return _Visit(Failed(url, reason), _stored_links(known), answered)

    def _not_modified(self, url: str, known: PreviousItem | None, response: _Response) -> _Visit:
        if known is None:
            return self._failed(url, None, "HTTP 304 to an unconditional request")
        validators = {**known.validators, **_header_validators(response.headers)}
        return _Visit(Unchanged(url, known.version, validators), _stored_links(known))

    def _page(self, url: str, known: PreviousItem | None, response: _Response, body: bytes) -> _Visit:
        media_type = media_type_of(response.headers)
        validators = _header_validators(response.headers)
        links: list[str] = []
        if _is_html(media_type, response.final_url):
            links = extract_links(body, response.final_url)
            validators["links"] = json.dumps(links)
        version = content_version(body)
        if known is not None and known.version == version:
            return _Visit(Unchanged(url, version, validators), links)
        event = Fetched(
            uri=url,  # the requested URL, so identity survives a redirect moving
            version=version,
            data=body,
            name=urlsplit(response.final_url).path or "/",  # lets the parser pick by suffix
            media_type=media_type or None,
            validators=validators,
            metadata={
                "url": response.final_url,
                "status": str(response.status),
                "content_type": response.headers.get("content-type", ""),
            },
        )
        return _Visit(event, links)

    # The loop

    def run(self, seeds: list[str]) -> Iterator[ScanEvent]:
        for origin in dict.fromkeys(_origin(seed) for seed in seeds):
            robots = self.robots_for(origin)
            if isinstance(robots, str):
                raise SourceError(f"{origin}: {robots}")
        for seed in seeds:
            self.offer(seed, 0)
        pending_seeds = {url for url, _ in self.frontier}
        seed_answered = not pending_seeds  # all seeds disallowed by robots.txt is an answer too
        if self.source.use_sitemap:
            for url in self.sitemap_pages(seeds):
                self.offer(url, 0)
        pages = 0
        while self.frontier and pages < self.source.max_pages:
            url, depth = self.frontier.popleft()
            if url in self.done:  # reached earlier as a redirect target
                pending_seeds.discard(url)
                continue
            self.done.add(url)
            pages += 1
            visit = self.visit(url)
            if visit.event is not None:
                yield visit.event
            for link in visit.links:
                self.offer(link, depth + 1)
            if url in pending_seeds:
                pending_seeds.discard(url)
                seed_answered = seed_answered or visit.answered
                if not pending_seeds and not seed_answered:
                    raise SourceError(f"none of the seeds ({', '.join(seeds)}) could be fetched; the site looks down")
        log.info("crawled %d pages from %s; %d links refused", pages, ", ".join(seeds), len(self.refused))


@lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    """One verifying TLS context per process: loading the CA bundle costs ~0.2 s per client."""
    return httpx.create_ssl_context()


class WebConnector:
    """Crawls a website from its seeds (and sitemaps) within the allowed hosts.

    `timeout_s` and `transport` are keyword-only so tests can shorten timeouts and observe every
    request; `refused` holds, after a scan, each URL that was not followed and why.
    """

    def __init__(
        self,
        source: WebSource,
        source_key: str,
        max_bytes: int,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ):
        self.source = source
        self.source_key = source_key
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.transport = transport
        self.refused: dict[str, str] = {}

    def _seeds_and_scope(self) -> tuple[list[str], Scope]:
        """Normalised seeds and the scope they define; a seed outside it is a configuration error."""
        seeds = []
        for raw in self.source.seeds:
            url = normalize_url(raw)
            if url is None:
                raise SourceError(f"seed {raw!r} is not an http(s) URL")
            seeds.append(url)
        scope = Scope(self.source.allow_hosts or [_host(seed) for seed in seeds], self.source.allow_private, seeds)
        for seed in seeds:
            reason = scope.refusal(seed)
            if reason:
                raise SourceError(f"seed {seed} refused: {reason}")
        return list(dict.fromkeys(seeds)), scope

    def _client(self, scope: Scope) -> httpx.Client:
        return httpx.Client(
            headers={"User-Agent": self.source.user_agent, "Accept": ACCEPT},
            timeout=httpx.Timeout(self.timeout_s),
            verify=_tls_context(),
            follow_redirects=False,  # followed by hand, each hop re-checked
            transport=self.transport or pinned_transport(scope),
        )

    def scan(self, previous: Mapping[str, PreviousItem]) -> Iterator[ScanEvent]:
        seeds, scope = self._seeds_and_scope()
        with self._client(scope) as client:
            crawl = _Crawl(self.source, client, scope, self.max_bytes, previous)
            self.refused = crawl.refused
            yield from crawl.run(seeds)
