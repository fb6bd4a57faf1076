"""S3 connector against a real SeaweedFS S3 server (integration) and moto's server (pagination).

GETs and listing calls are counted with botocore `before-call` hooks on the connector's own
client, so "unchanged costs no GET" is checked on the wire, not inferred from the events.
"""

from __future__ import annotations

import hashlib
import socket
import threading
import uuid
from types import SimpleNamespace

import pytest

from core.config import S3Source
from corpus.sources import s3 as s3_module
from corpus.sources.base import Failed, Fetched, PreviousItem, SourceError, Unchanged
from corpus.sources.s3 import S3Connector
from corpus.sync import sync_sources
from tests.support.seaweed import SeaweedS3, free_ports, seaweed_s3

MAX_BYTES = 4096
KEY_ENV, SECRET_ENV = "SEARCHSMITH_TEST_S3_KEY", "SEARCHSMITH_TEST_S3_SECRET"


@pytest.fixture(scope="session")
def seaweed():
    with seaweed_s3() as server:
        yield server


@pytest.fixture(autouse=True)
def isolated_aws_env(monkeypatch, tmp_path):
    """No test may pick up the machine's AWS credentials or probe the EC2 metadata service."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def _source(server_url: str, bucket: str, **overrides) -> S3Source:
    fields = {"type": "s3", "bucket": bucket, "endpoint_url": server_url, "access_key_env": KEY_ENV, "secret_key_env": SECRET_ENV}
    return S3Source(**{**fields, **overrides})


@pytest.fixture
def creds(monkeypatch, seaweed: SeaweedS3) -> None:
    monkeypatch.setenv(KEY_ENV, seaweed.access_key)
    monkeypatch.setenv(SECRET_ENV, seaweed.secret_key)


@pytest.fixture(scope="session")
def admin(seaweed: SeaweedS3):
    """One shared setup client: building a boto3 client costs ~0.3 s."""
    return seaweed.client()


@pytest.fixture
def bucket(admin) -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    admin.create_bucket(Bucket=name)
    return name


def _put(admin, bucket: str, objects: dict[str, bytes | str], content_type: str = "text/plain") -> None:
    for key, body in objects.items():
        data = body.encode() if isinstance(body, str) else body
        admin.put_object(Bucket=bucket, Key=key, Body=data, ContentType=content_type)


def _count_calls(connector: S3Connector, operation: str) -> list[str]:
    """Records the URL path of every `operation` request the connector's client makes."""
    calls: list[str] = []
    connector.client.meta.events.register(f"before-call.s3.{operation}", lambda params, **_: calls.append(params["url_path"]))
    return calls


def _previous(events) -> dict[str, PreviousItem]:
    return {e.uri: PreviousItem(e.version, dict(e.validators)) for e in events if not isinstance(e, Failed)}


def _by_uri(events) -> dict[str, object]:
    return {e.uri: e for e in events}


DOCS = {
    "docs/a.md": "# Alpha\n\nFirst document.",
    "docs/notes/b.txt": "Beta notes.",
    "docs/notes/c.txt": "Gamma notes.",
    "docs/d.md": "# Delta\n\nFourth document.",
}


@pytest.mark.integration
def test_first_scan_fetches_all_second_scan_gets_nothing(admin, seaweed, creds, bucket):
    _put(admin, bucket, DOCS)
    _put(admin, bucket, {"docs/notes/": b""})  # a folder placeholder, not a document
    connector = S3Connector(_source(seaweed.endpoint_url, bucket, prefix="docs/"), "s3-test", MAX_BYTES)
    gets = _count_calls(connector, "GetObject")

    first = list(connector.scan({}))
    assert all(isinstance(e, Fetched) for e in first)
    assert sorted(e.uri for e in first) == sorted(f"s3://{bucket}/{key}" for key in DOCS)
    assert len(gets) == len(DOCS)
    event = _by_uri(first)[f"s3://{bucket}/docs/notes/b.txt"]
    assert event.data == b"Beta notes."
    assert event.name == "notes/b.txt"
    assert event.media_type == "text/plain"
    assert event.metadata == {"bucket": bucket, "key": "docs/notes/b.txt"}
    assert event.version and '"' not in event.version
    assert set(event.validators) == {"etag", "last_modified"}

    gets.clear()
    second = list(connector.scan(_previous(first)))
    assert all(isinstance(e, Unchanged) for e in second)
    assert {e.uri: e.version for e in second} == {e.uri: e.version for e in first}
    assert gets == []


@pytest.mark.integration
def test_sync_reflects_exactly_the_changed_deleted_and_added_objects(admin, seaweed, creds, bucket):
    _put(admin, bucket, DOCS)
    connector = S3Connector(_source(seaweed.endpoint_url, bucket, prefix="docs/"), "s3-test", MAX_BYTES)
    gets = _count_calls(connector, "GetObject")

    first = sync_sources([connector], None, "web")
    assert first.counts.as_dict() == {"added": 4, "changed": 0, "deleted": 0, "unchanged": 0, "quarantined": 0, "fetched": 4}

    gets.clear()
    again = sync_sources([connector], first.documents, "web")
    assert again.counts.as_dict() == {"added": 0, "changed": 0, "deleted": 0, "unchanged": 4, "quarantined": 0, "fetched": 0}
    assert gets == []

    _put(admin, bucket, {"docs/a.md": "# Alpha\n\nFirst document, revised.", "docs/e.md": "# Epsilon\n\nNew."})
    admin.delete_object(Bucket=bucket, Key="docs/notes/c.txt")
    third = sync_sources([connector], again.documents, "web")
    assert third.counts.as_dict() == {"added": 1, "changed": 1, "deleted": 1, "unchanged": 2, "quarantined": 0, "fetched": 2}
    assert sorted(p.rsplit("/", 1)[-1] for p in gets) == ["a.md", "e.md"]
    live = third.documents.filter(~third.documents["deleted"])
    assert sorted(live["uri"].to_list()) == sorted(f"s3://{bucket}/docs/{k}" for k in ("a.md", "d.md", "e.md", "notes/b.txt"))


@pytest.mark.integration
def test_include_exclude_globs_apply_to_the_key_below_the_prefix(admin, seaweed, creds, bucket):
    _put(admin, bucket, {**DOCS, "docs/skip/x.md": "# skipped", "docs/logo.png": b"\x89PNG", "other/y.md": "# outside prefix"})
    source = _source(seaweed.endpoint_url, bucket, prefix="docs", include=["**/*.md", "notes/*"], exclude=["skip/**", "notes/c.txt"])
    events = list(S3Connector(source, "s3-test", MAX_BYTES).scan({}))
    assert sorted(e.name for e in events) == ["a.md", "d.md", "notes/b.txt"]


@pytest.mark.integration
def test_media_type_passed_on_unless_generic(admin, seaweed, creds, bucket):
    _put(admin, bucket, {"page": "<html><title>T</title><body>Hi</body></html>"}, content_type="text/html")
    _put(admin, bucket, {"blob.md": "# Blob"}, content_type="binary/octet-stream")
    events = _by_uri(S3Connector(_source(seaweed.endpoint_url, bucket), "s3-test", MAX_BYTES).scan({}))
    assert events[f"s3://{bucket}/page"].media_type == "text/html"
    assert events[f"s3://{bucket}/blob.md"].media_type is None


@pytest.mark.integration
def test_oversize_object_fails_without_download(admin, seaweed, creds, bucket):
    _put(admin, bucket, {"small.txt": "ok", "big.txt": b"x" * (MAX_BYTES + 1)})
    connector = S3Connector(_source(seaweed.endpoint_url, bucket), "s3-test", MAX_BYTES)
    gets = _count_calls(connector, "GetObject")
    events = _by_uri(connector.scan({}))
    big = events[f"s3://{bucket}/big.txt"]
    assert isinstance(big, Failed)
    assert str(MAX_BYTES + 1) in big.reason and "size limit" in big.reason
    assert isinstance(events[f"s3://{bucket}/small.txt"], Fetched)
    assert [p for p in gets if p.endswith("big.txt")] == []


@pytest.mark.integration
def test_object_get_error_becomes_failed_event(admin, seaweed, creds, bucket):
    _put(admin, bucket, {"good.txt": "fine", "broken.txt": "denied"})
    connector = S3Connector(_source(seaweed.endpoint_url, bucket), "s3-test", MAX_BYTES)

    def deny_broken(params, **_):
        if params["url_path"].endswith("/broken.txt"):
            return SimpleNamespace(status_code=403, headers={}), {"Error": {"Code": "AccessDenied", "Message": "no"}}
        return None

    connector.client.meta.events.register("before-call.s3.GetObject", deny_broken)
    events = _by_uri(connector.scan({}))
    assert isinstance(events[f"s3://{bucket}/good.txt"], Fetched)
    broken = events[f"s3://{bucket}/broken.txt"]
    assert isinstance(broken, Failed) and "AccessDenied" in broken.reason


@pytest.mark.integration
def test_missing_bucket_raises_source_error_naming_bucket_and_endpoint(seaweed, creds):
    connector = S3Connector(_source(seaweed.endpoint_url, "no-such-bucket-here"), "s3-test", MAX_BYTES)
    with pytest.raises(SourceError) as raised:
        list(connector.scan({}))
    assert "no-such-bucket-here" in str(raised.value)
    assert seaweed.endpoint_url in str(raised.value)
    assert "NoSuchBucket" in str(raised.value)


@pytest.mark.integration
def test_unknown_access_key_raises_source_error_without_leaking_secret(seaweed, bucket, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "not-a-known-key")
    monkeypatch.setenv(SECRET_ENV, "very-secret-value")
    with pytest.raises(SourceError) as raised:
        list(S3Connector(_source(seaweed.endpoint_url, bucket), "s3-test", MAX_BYTES).scan({}))
    assert "InvalidAccessKeyId" in str(raised.value)
    assert "very-secret-value" not in str(raised.value)


@pytest.mark.integration
def test_credentials_from_named_env_vars_and_from_standard_chain(admin, seaweed, bucket, monkeypatch):
    _put(admin, bucket, {"a.txt": "hello"})
    monkeypatch.setenv("CUSTOM_KEY_NAME", seaweed.access_key)
    monkeypatch.setenv("CUSTOM_SECRET_NAME", seaweed.secret_key)
    named = _source(seaweed.endpoint_url, bucket, access_key_env="CUSTOM_KEY_NAME", secret_key_env="CUSTOM_SECRET_NAME")
    assert [e.name for e in S3Connector(named, "s3-test", MAX_BYTES).scan({})] == ["a.txt"]

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    chain = _source(seaweed.endpoint_url, bucket, access_key_env=None, secret_key_env=None)
    assert [e.name for e in S3Connector(chain, "s3-test", MAX_BYTES).scan({})] == ["a.txt"]


def test_missing_named_env_var_raises_source_error_naming_it(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.setenv(SECRET_ENV, "x")
    connector = S3Connector(_source("http://127.0.0.1:9", "some-bucket"), "s3-test", MAX_BYTES)
    with pytest.raises(SourceError, match=KEY_ENV):
        list(connector.scan({}))


def test_half_configured_credentials_raise_source_error():
    source = _source("http://127.0.0.1:9", "some-bucket", secret_key_env=None)
    with pytest.raises(SourceError, match="access_key_env and secret_key_env"):
        list(S3Connector(source, "s3-test", MAX_BYTES).scan({}))


def test_unreachable_endpoint_raises_source_error(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "k")
    monkeypatch.setenv(SECRET_ENV, "s")
    (port,) = free_ports(1)  # nothing listens there once the probe socket is closed
    endpoint = f"http://127.0.0.1:{port}"
    with pytest.raises(SourceError) as raised:
        list(S3Connector(_source(endpoint, "some-bucket", max_attempts=1, connect_timeout_s=2), "s3-test", MAX_BYTES).scan({}))
    assert endpoint in str(raised.value) and "some-bucket" in str(raised.value)


class SilentEndpoint:
    """A TCP server on 127.0.0.1 that accepts every connection and never answers (a hung store)."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:  # closed: the test is over
                return
            self.accepted.append(connection)  # held open, never read from, never answered

    def __enter__(self) -> str:
        self.thread.start()
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def __exit__(self, *exc_info) -> None:
        self.listener.close()
        for connection in self.accepted:
            connection.close()
        self.thread.join(5)


def test_an_endpoint_that_never_answers_fails_the_source_after_its_timeouts_and_attempts(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "k")
    monkeypatch.setenv(SECRET_ENV, "s")
    silent = SilentEndpoint()
    with silent as endpoint:
        source = _source(endpoint, "some-bucket", connect_timeout_s=1, read_timeout_s=1, max_attempts=2)
        with pytest.raises(SourceError) as raised:
            list(S3Connector(source, "s3-test", MAX_BYTES).scan({}))
        attempts = len(silent.accepted)
    assert "timeout" in str(raised.value).lower() and endpoint in str(raised.value)
    assert attempts == 2  # the configured attempts, each ended by the read timeout
    assert S3Source(type="s3", bucket="b").read_timeout_s <= 30 and S3Source(type="s3", bucket="b").max_attempts <= 3  # bounded by default


def test_s3_source_timeouts_must_be_positive():
    with pytest.raises(ValueError):
        S3Source(type="s3", bucket="b", read_timeout_s=0)


@pytest.fixture(scope="module")
def moto_endpoint():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def test_listing_paginates_past_one_thousand_objects(moto_endpoint, monkeypatch):
    """Seeded through moto's in-process backend: 1005 PUTs over HTTP would take ~10 s.

    All but five objects are already known (ETag = MD5 of the body for single-part uploads),
    so the scan walks two listing pages but GETs only the five new ones.
    """
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    monkeypatch.setenv(KEY_ENV, "testing")
    monkeypatch.setenv(SECRET_ENV, "testing")
    bucket = f"page-{uuid.uuid4().hex[:12]}"
    backend = s3_backends[DEFAULT_ACCOUNT_ID]["global"]
    backend.create_bucket(bucket, "us-east-1")
    bodies = {f"p/{i:05d}.txt": f"object {i}".encode() for i in range(1005)}
    for key, body in bodies.items():
        backend.put_object(bucket, key, body)
    known = {f"s3://{bucket}/{key}": PreviousItem(hashlib.md5(body).hexdigest()) for key, body in list(bodies.items())[5:]}

    connector = S3Connector(_source(moto_endpoint, bucket, prefix="p/"), "s3-moto", MAX_BYTES)
    listings = _count_calls(connector, "ListObjectsV2")
    gets = _count_calls(connector, "GetObject")
    events = list(connector.scan(known))
    assert len(listings) == 2
    assert sorted(e.uri for e in events) == sorted(f"s3://{bucket}/{key}" for key in bodies)
    fetched = [e for e in events if isinstance(e, Fetched)]
    assert sorted(e.name for e in fetched) == [f"{i:05d}.txt" for i in range(5)]
    assert all(e.data == bodies[f"p/{e.name}"] for e in fetched)
    assert sum(isinstance(e, Unchanged) for e in events) == 1000
    assert len(gets) == 5


def test_fetch_window_bounds_in_flight_downloads(moto_endpoint, monkeypatch):
    """More changed objects than the window: every one still arrives, none is lost or repeated."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    monkeypatch.setattr(s3_module, "FETCH_WINDOW", 3)
    monkeypatch.setenv(KEY_ENV, "testing")
    monkeypatch.setenv(SECRET_ENV, "testing")
    bucket = f"win-{uuid.uuid4().hex[:12]}"
    backend = s3_backends[DEFAULT_ACCOUNT_ID]["global"]
    backend.create_bucket(bucket, "us-east-1")
    for i in range(20):
        backend.put_object(bucket, f"{i:02d}.txt", f"body {i}".encode())
    events = list(S3Connector(_source(moto_endpoint, bucket), "s3-moto", MAX_BYTES).scan({}))
    assert sorted(e.name for e in events) == [f"{i:02d}.txt" for i in range(20)]
    assert all(isinstance(e, Fetched) and e.data == f"body {int(e.name[:2])}".encode() for e in events)
