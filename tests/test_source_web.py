"""The web crawler against a real HTTP site on 127.0.0.1: scope, robots.txt, sitemaps, redirects,
failures, limits, conditional GET change detection, and what a sync makes of it all."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.config import WebSource
from corpus.sources import web
from corpus.sources.base import Failed, Fetched, PreviousItem, SourceError, Unchanged
from corpus.sources.web import HostRateLimiter, Scope, WebConnector, extract_links, normalize_url, parse_sitemap
from corpus.sync import sync_sources
from tests.support.website import Website

PAGE_PATHS = ["/", "/about.html", "/guide/intro.html", "/guide/setup.html", "/moved.html", "/hidden.html"]
FAILING_PATHS = ["/broken.html", "/data.bin"]


def page(title: str, *links: str, text: str | None = None) -> str:
    items = "".join(f'<li><a href="{href}">{href}</a></li>' for href in links)
    body = text or f"{title} explains one part of the Searchsmith documentation in a full sentence or two of prose."
    return (
        f"<!doctype html><html><head><title>{title}</title></head><body><main>"
        f"<h1>{title}</h1><p>{body}</p><ul>{items}</ul></main></body></html>"
    )


def sitemap(site: Website, *paths: str) -> str:
    urls = "".join(f"<url><loc>{site.url(path)}</loc></url>" for path in paths)
    return f'<?xml version="1.0" encoding="UTF-8"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>'


def build_docs_site(site: Website) -> None:
    """Six crawlable pages (one only in the sitemap, one behind a redirect), a robots-disallowed page,
    a 500, a binary file, and a link off-site."""
    site.write("robots.txt", "User-agent: *\nDisallow: /private/\n")
    site.write(
        "index.html",
        page(
            "Home",
            "about.html",
            "guide/intro.html",
            "private/secret.html",
            "moved.html",
            "broken.html",
            "data.bin",
            "http://example.com/x",
            "about.html#team",
            "mailto:team@example.com",
            "#top",
        ),
    )
    site.write("about.html", page("About"))
    site.write("guide/intro.html", page("Introduction", "../about.html", "setup.html"))
    site.write("guide/setup.html", page("Setup"))
    site.write("guide/new-home.html", page("New home"))
    site.write("private/secret.html", page("Secret"))
    site.write("hidden.html", page("Hidden"))
    site.write("data.bin", bytes(range(256)) * 4)
    site.write("sitemap.xml", sitemap(site, "/", "/hidden.html"))
    site.redirects["/moved.html"] = "/guide/new-home.html"
    site.statuses["/broken.html"] = 500


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Website]:
    with Website(tmp_path / "site") as served:
        build_docs_site(served)
        yield served


def connector_for(site: Website, *, max_bytes: int = 1_000_000, timeout_s: float = 5.0, transport=None, **fields) -> WebConnector:
    settings = {
        "type": "web",
        "seeds": [site.url("/")],
        "allow_hosts": ["127.0.0.1"],
        "allow_private": True,
        "rate_limit_per_s": 1000.0,
        **fields,
    }
    return WebConnector(WebSource(**settings), "web:test", max_bytes, timeout_s=timeout_s, transport=transport)


def by_path(site: Website, events) -> dict[str, object]:
    return {event.uri.removeprefix(site.base_url): event for event in events}


def previous_from(events) -> dict[str, PreviousItem]:
    return {e.uri: PreviousItem(e.version, dict(e.validators)) for e in events if isinstance(e, (Fetched, Unchanged))}


class RecordingTransport(httpx.BaseTransport):
    """Passes requests to the real transport and remembers every URL the crawler asked for."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.urls: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.urls.append(str(request.url))
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


# --- a first crawl -----------------------------------------------------------------------------------


def test_first_crawl_covers_the_site_within_scope(site: Website, monkeypatch: pytest.MonkeyPatch) -> None:
    resolved: list[str] = []
    real_getaddrinfo = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: resolved.append(host) or real_getaddrinfo(host, *a, **k))
    transport = RecordingTransport()
    connector = connector_for(site, transport=transport)

    events = by_path(site, connector.scan({}))

    assert sorted(events) == sorted(PAGE_PATHS + FAILING_PATHS)
    assert all(isinstance(events[path], Fetched) for path in PAGE_PATHS)
    assert "HTTP 500" in events["/broken.html"].reason
    assert "application/octet-stream" in events["/data.bin"].reason
    # robots.txt: the disallowed page is never requested, and the refusal says why.
    assert site.hits["/private/secret.html"] == 0
    assert connector.refused[site.url("/private/secret.html")] == "disallowed by robots.txt"
    # Off-site: refused on the allow-list, never resolved, never requested.
    assert "not in allow_hosts" in connector.refused["http://example.com/x"]
    assert "example.com" not in resolved
    assert not [url for url in transport.urls if "example.com" in url]
    # Fragments are dropped, so about.html#team did not make a second request.
    assert site.hits["/about.html"] == 1
    assert site.hits["/robots.txt"] == 1 and site.hits["/sitemap.xml"] == 1


def test_fetched_page_fields(site: Website) -> None:
    events = by_path(site, connector_for(site).scan({}))
    about = events["/about.html"]
    assert about.uri == site.url("/about.html")
    assert about.name == "/about.html"
    assert about.media_type == "text/html"
    assert about.data == (site.root / "about.html").read_bytes()
    assert set(about.validators) == {"etag", "last_modified", "links"}
    assert about.metadata == {"url": about.uri, "status": "200", "content_type": "text/html; charset=utf-8"}
    home = events["/"]
    assert site.url("/guide/intro.html") in home.validators["links"]


def test_sitemap_page_is_crawled_and_can_be_turned_off(site: Website) -> None:
    assert "/hidden.html" in by_path(site, connector_for(site).scan({}))
    site.reset_counts()
    assert "/hidden.html" not in by_path(site, connector_for(site, use_sitemap=False).scan({}))
    assert site.hits["/sitemap.xml"] == 0


def test_redirect_within_the_site_keeps_the_requested_url_as_identity(site: Website) -> None:
    moved = by_path(site, connector_for(site).scan({}))["/moved.html"]
    assert moved.uri == site.url("/moved.html")
    assert moved.metadata["url"] == site.url("/guide/new-home.html")
    assert moved.name == "/guide/new-home.html"
    assert b"New home" in moved.data


def test_redirect_target_also_linked_directly_is_fetched_once(tmp_path: Path) -> None:
    with Website(tmp_path / "site") as site:
        site.write("index.html", page("Home", "old.html", "target.html"))
        site.write("target.html", page("Target"))
        site.redirects["/old.html"] = "/target.html"
        events = list(connector_for(site).scan({}))
    assert [e.uri.removeprefix(site.base_url) for e in events] == ["/", "/old.html"]
    assert site.hits["/target.html"] == 1


def test_redirect_off_site_is_refused_without_a_request(tmp_path: Path) -> None:
    transport = RecordingTransport()
    with Website(tmp_path / "site") as site:
        site.write("index.html", page("Home", "away.html"))
        site.redirects["/away.html"] = "http://example.com/elsewhere"
        site.redirects["/robots.txt"] = "http://example.com/robots.txt"  # no readable rules: crawl on
        events = by_path(site, connector_for(site, transport=transport).scan({}))
    assert isinstance(events["/"], Fetched)
    assert isinstance(events["/away.html"], Failed)
    assert "example.com" in events["/away.html"].reason and "not in allow_hosts" in events["/away.html"].reason
    assert not [url for url in transport.urls if "example.com" in url]


# --- limits ----------------------------------------------------------------------------------------


def test_max_pages_caps_the_page_requests(site: Website) -> None:
    events = list(connector_for(site, max_pages=3).scan({}))
    # Breadth first: the seed, the sitemap-only page (also depth 0), then the first link.
    assert [e.uri.removeprefix(site.base_url) for e in events] == ["/", "/hidden.html", "/about.html"]
    page_hits = {path: n for path, n in site.hits.items() if path not in ("/robots.txt", "/sitemap.xml")}
    assert sum(page_hits.values()) == 3


def test_max_depth_zero_fetches_only_seeds_and_sitemap(site: Website) -> None:
    events = by_path(site, connector_for(site, max_depth=0).scan({}))
    assert sorted(events) == ["/", "/hidden.html"]


def test_timeouts_and_size_limits_fail_the_page_only(tmp_path: Path) -> None:
    with Website(tmp_path / "site") as site:
        site.write("index.html", page("Home", "slow.html", "big.html", "streamed.html", "manual.pdf"))
        site.write("slow.html", page("Slow"))
        site.write("big.html", "x" * 5000)
        site.write("streamed.html", "y" * 5000)
        site.write("manual.pdf", b"%PDF-1.4\n1 0 obj <<>> endobj\n%%EOF\n")
        site.delays["/slow.html"] = 1.0
        site.no_length.add("/streamed.html")
        events = by_path(site, connector_for(site, max_bytes=2000, timeout_s=0.3).scan({}))
    assert isinstance(events["/"], Fetched)
    assert "timed out" in events["/slow.html"].reason
    assert "size limit" in events["/big.html"].reason  # refused from Content-Length
    assert "size limit" in events["/streamed.html"].reason  # refused while streaming
    assert isinstance(events["/manual.pdf"], Fetched) and events["/manual.pdf"].media_type == "application/pdf"


# --- scope and safety --------------------------------------------------------------------------------


def test_loopback_seed_is_refused_unless_private_addresses_are_allowed(site: Website) -> None:
    connector = connector_for(site, allow_private=False)
    with pytest.raises(SourceError, match=r"127\.0\.0\.1.*loopback"):
        list(connector.scan({}))
    assert sum(site.hits.values()) == 0


def test_seed_outside_allow_hosts_is_refused(site: Website) -> None:
    with pytest.raises(SourceError, match="not in allow_hosts"):
        list(connector_for(site, allow_hosts=["docs.example.com"]).scan({}))


def test_allow_hosts_defaults_to_the_seed_hosts(site: Website) -> None:
    connector = connector_for(site, allow_hosts=[])
    assert sorted(by_path(site, connector.scan({}))) == sorted(PAGE_PATHS + FAILING_PATHS)
    assert "not in allow_hosts" in connector.refused["http://example.com/x"]


def test_scope_is_scheme_host_and_port_another_service_on_the_host_is_never_reached(tmp_path: Path) -> None:
    """With private addresses allowed (any intranet site), a link and a redirect to another port of
    the same host must not reach the service there."""
    with Website(tmp_path / "site") as site, Website(tmp_path / "internal") as internal:
        internal.write("internal-secret.html", page("Internal", text="INTERNAL-SECRET admin credentials that must never be indexed."))
        internal.write("robots.txt", "User-agent: *\nAllow: /\n")
        secret = internal.url("/internal-secret.html")
        site.write("index.html", page("Home", "about.html", secret, "go.html", "https://127.0.0.1/", site.url("/about.html")))
        site.write("about.html", page("About"))
        site.redirects["/go.html"] = secret
        connector = connector_for(site, allow_hosts=[])  # the seed's host, 127.0.0.1, is allowed
        events = list(connector.scan({}))
    assert sum(internal.hits.values()) == 0, internal.hits
    assert sorted(by_path(site, events)) == ["/", "/about.html", "/go.html"]
    assert isinstance(by_path(site, events)["/go.html"], Failed) and "port" in by_path(site, events)["/go.html"].reason
    assert not [e for e in events if isinstance(e, Fetched) and b"INTERNAL-SECRET" in e.data]
    assert "port" in connector.refused[secret] and "port 443" in connector.refused["https://127.0.0.1/"]


def test_an_http_seed_on_port_80_admits_the_https_upgrade_only() -> None:
    scope = Scope(["docs.example.com"], allow_private=True, seeds=["http://docs.example.com/"])
    assert scope.refusal("https://docs.example.com/a") is None
    assert scope.refusal("http://docs.example.com:8080/a") is not None
    strict = Scope(["docs.example.com"], allow_private=True, seeds=["https://docs.example.com/"])
    assert strict.refusal("http://docs.example.com/a") is not None and strict.refusal("https://docs.example.com:8443/") is not None


def test_a_host_is_resolved_once_and_connections_go_to_that_address(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DNS rebinding: a name answers 127.0.0.1 once, then 127.0.0.2 (another service on the same
    port). Every request of the crawl goes to the address of the first answer."""
    real_getaddrinfo = socket.getaddrinfo
    answers: list[str] = []

    def rebinding_getaddrinfo(host, port, *args, **kwargs):
        if host != "docs.rebind.test":
            return real_getaddrinfo(host, port, *args, **kwargs)
        address = "127.0.0.1" if not answers else "127.0.0.2"
        answers.append(address)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port or 0))]

    with Website(tmp_path / "site") as site:
        with Website(tmp_path / "rebound", host="127.0.0.2", port=int(site.base_url.rsplit(":", 1)[1])) as rebound:
            build_docs_site(site)
            for path in ("index.html", "about.html", "robots.txt"):
                rebound.write(path, page("Rebound", "about.html", text="REBOUND content from the second address."))
            monkeypatch.setattr(socket, "getaddrinfo", rebinding_getaddrinfo)
            seed = site.base_url.replace("127.0.0.1", "docs.rebind.test") + "/"
            source = WebSource(type="web", seeds=[seed], allow_private=True, rate_limit_per_s=1000.0)
            events = list(WebConnector(source, "web:rebind", 1_000_000, timeout_s=5.0).scan({}))
    assert answers == ["127.0.0.1"]  # one resolution for the whole scan
    assert sum(rebound.hits.values()) == 0, rebound.hits
    # every page but the sitemap's (which names the site as 127.0.0.1, another host) came from the first address
    assert len([e for e in events if isinstance(e, Fetched)]) == 5 and sum(site.hits.values()) > 5
    assert not [e for e in events if isinstance(e, Fetched) and b"REBOUND" in e.data]


@pytest.mark.parametrize(
    ("addresses", "expected"),
    [
        (["93.184.216.34"], None),
        (["10.1.2.3"], "private address 10.1.2.3"),
        (["93.184.216.34", "169.254.169.254"], "link-local address 169.254.169.254"),
        (["::ffff:127.0.0.1"], "loopback"),
        (["240.0.0.1"], "reserved"),
    ],
)
def test_every_resolved_address_must_be_public(monkeypatch: pytest.MonkeyPatch, addresses: list[str], expected: str | None) -> None:
    def fake_getaddrinfo(host, port, *args, **kwargs):
        family = lambda a: socket.AF_INET6 if ipaddress.ip_address(a).version == 6 else socket.AF_INET  # noqa: E731
        return [(family(a), socket.SOCK_STREAM, 6, "", (a, 0)) for a in addresses]

    monkeypatch.setattr(web.socket, "getaddrinfo", fake_getaddrinfo)
    reason = Scope(["docs.example.com"], allow_private=False).refusal("https://docs.example.com/")
    if expected is None:
        assert reason is None
    else:
        assert "docs.example.com" in reason and expected in reason
    assert Scope(["docs.example.com"], allow_private=True).refusal("https://docs.example.com/") is None


def test_wildcard_allow_host_matches_subdomains_only() -> None:
    scope = Scope(["*.example.com"], allow_private=True)
    assert scope.refusal("https://docs.example.com/a") is None
    assert scope.refusal("https://evil-example.com/a") is not None


# --- change detection --------------------------------------------------------------------------------


def test_rescan_uses_conditional_get_and_still_covers_every_page(site: Website) -> None:
    first = list(connector_for(site).scan({}))
    site.reset_counts()
    second = by_path(site, connector_for(site).scan(previous_from(first)))

    assert sorted(second) == sorted(PAGE_PATHS + FAILING_PATHS)
    assert all(isinstance(second[path], Unchanged) for path in PAGE_PATHS)
    assert all(isinstance(second[path], Failed) for path in FAILING_PATHS)
    # Every known page was answered 304, yet setup.html (two links deep) was still reached.
    for path in ["/", "/about.html", "/guide/intro.html", "/guide/setup.html", "/hidden.html", "/guide/new-home.html"]:
        assert site.statuses_for(path) == [304], path
    assert second["/about.html"].validators["etag"]


def test_same_body_without_validators_is_unchanged(site: Website) -> None:
    site.validators = False
    first = list(connector_for(site).scan({}))
    second = by_path(site, connector_for(site).scan(previous_from(first)))
    assert all(isinstance(second[path], Unchanged) for path in PAGE_PATHS)
    assert site.statuses_for("/about.html") == [200, 200]


def test_failing_known_page_keeps_its_subtree_reachable(site: Website) -> None:
    first = list(connector_for(site).scan({}))
    site.statuses["/guide/intro.html"] = 503
    second = by_path(site, connector_for(site).scan(previous_from(first)))
    assert isinstance(second["/guide/intro.html"], Failed)
    assert isinstance(second["/guide/setup.html"], Unchanged)  # reached through intro's stored links


def test_gone_pages_are_not_yielded(site: Website) -> None:
    first = list(connector_for(site).scan({}))
    site.remove("guide/setup.html")
    site.statuses["/about.html"] = 410
    second = by_path(site, connector_for(site).scan(previous_from(first)))
    assert "/guide/setup.html" not in second and "/about.html" not in second
    assert site.statuses_for("/guide/setup.html")[-1] == 404


def test_site_down_raises_instead_of_looking_empty(site: Website) -> None:
    site.statuses["/robots.txt"] = 503
    with pytest.raises(SourceError, match="robots.txt unavailable"):
        list(connector_for(site).scan({}))
    del site.statuses["/robots.txt"]
    site.statuses["/"] = 502
    with pytest.raises(SourceError, match="could be fetched; the site looks down"):
        list(connector_for(site).scan({}))


def test_sync_counts_after_change_delete_and_add(site: Website) -> None:
    first = sync_sources([connector_for(site)], None, "web")
    assert first.counts.as_dict() == {"added": 6, "changed": 0, "deleted": 0, "unchanged": 0, "quarantined": 2, "fetched": 6}

    site.write("about.html", page("About", text="About now tells a different story about the team, in new words."))
    site.remove("guide/setup.html")
    site.write("news.html", page("News"))
    site.write("sitemap.xml", sitemap(site, "/", "/hidden.html", "/news.html"))
    site.reset_counts()
    second = sync_sources([connector_for(site)], first.documents, "web")

    assert second.counts.as_dict() == {"added": 1, "changed": 1, "deleted": 1, "unchanged": 4, "quarantined": 2, "fetched": 2}
    live = second.documents.filter(~second.documents["deleted"])
    assert sorted(uri.removeprefix(site.base_url) for uri in live["uri"]) == sorted(
        ["/", "/about.html", "/guide/intro.html", "/moved.html", "/hidden.html", "/news.html"]
    )
    assert site.statuses_for("/") == [304]

    third = sync_sources([connector_for(site)], second.documents, "web")
    assert third.counts.as_dict() == {"added": 0, "changed": 0, "deleted": 0, "unchanged": 6, "quarantined": 2, "fetched": 0}


def test_sync_keeps_every_document_when_the_site_is_down(site: Website) -> None:
    first = sync_sources([connector_for(site)], None, "web")
    site.statuses["/robots.txt"] = 503
    second = sync_sources([connector_for(site)], first.documents, "web")
    assert second.counts.deleted == 0 and second.counts.quarantined == 1
    assert second.documents.filter(~second.documents["deleted"]).height == 6


# --- pure helpers -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "base", "expected"),
    [
        ("HTTP://Example.COM:80/a/../b.html#frag", None, "http://example.com/b.html"),
        ("https://example.com", None, "https://example.com/"),
        ("https://user:pw@example.com:8443/x?q=1", None, "https://example.com:8443/x?q=1"),
        ("../c.html", "http://h/docs/a/b.html", "http://h/docs/c.html"),
        ("#top", "http://h/docs/a.html", "http://h/docs/a.html"),
        ("a b.html", "http://h/", "http://h/a%20b.html"),
        ("mailto:someone@example.com", "http://h/", None),
        ("javascript:void(0)", "http://h/", None),
        ("ftp://h/file", None, None),
        ("http://h:notaport/", None, None),
    ],
)
def test_normalize_url(url: str, base: str | None, expected: str | None) -> None:
    assert normalize_url(url, base) == expected


def test_extract_links_honours_base_and_nofollow() -> None:
    html = b'<html><head><base href="/docs/"></head><body><a href="a.html#x">a</a><a href="a.html">again</a><img src="i.png"><area href="/map.html"></body></html>'
    assert extract_links(html, "http://h/index.html") == ["http://h/docs/a.html", "http://h/map.html"]
    nofollow = b'<html><head><meta name="Robots" content="noindex, nofollow"></head><body><a href="a.html">a</a></body></html>'
    assert extract_links(nofollow, "http://h/") == []
    assert extract_links(b"", "http://h/") == []


def test_parse_sitemap_index_and_no_entity_expansion(tmp_path: Path) -> None:
    index = b'<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><sitemap><loc> http://h/s1.xml </loc></sitemap></sitemapindex>'
    assert parse_sitemap(index) == ([], ["http://h/s1.xml"])
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET")
    hostile = (
        f'<?xml version="1.0"?><!DOCTYPE u [<!ENTITY e SYSTEM "file://{secret}">]>'
        '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>http://h/&e;</loc></url></urlset>'
    ).encode()
    pages, _ = parse_sitemap(hostile)
    assert not any("TOPSECRET" in url for url in pages)
    assert parse_sitemap(b"not xml at all") == ([], [])


def test_rate_limiter_spaces_requests_per_host() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(round(seconds, 6))
        now[0] += seconds

    limiter = HostRateLimiter(2.0, clock=lambda: now[0], sleep=sleep)
    limiter.wait("a")
    limiter.wait("a")
    limiter.wait("b")  # another host is not held back
    limiter.set_crawl_delay("a", 3.0)
    limiter.wait("a")
    limiter.wait("a")
    assert slept == [0.5, 0.5, 3.0]
