"""S3 source (AWS or any S3-compatible store): list under a prefix, GET only what changed.

The ETag from the listing is the version fingerprint: S3 changes it whenever an object is
rewritten, so an object whose ETag matches the previous sync is reported `Unchanged` without a
GET, and a re-sync of an unchanged bucket costs only the listing calls. Changed objects are
fetched concurrently, with a bounded window of in-flight downloads so memory stays at a few
objects no matter how large the bucket is.

Failures are split the way the sync needs them: if the bucket cannot be listed (missing bucket,
bad credentials, unreachable endpoint) the scan raises `SourceError`, so no document is
tombstoned on an incomplete listing; a single object that cannot be fetched becomes `Failed`
and is retried next run.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterator, Mapping

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError

from core.config import S3Source
from corpus.sources.base import Failed, Fetched, PreviousItem, ScanEvent, SourceError, Unchanged, glob_match

log = logging.getLogger(__name__)

DEFAULT_REGION = "us-east-1"
FETCH_WORKERS = 8
# In-flight GETs at most; bounds memory to this many objects (each under max_bytes).
FETCH_WINDOW = 2 * FETCH_WORKERS
# Content types that say nothing; the parser then goes by the key's suffix instead.
GENERIC_MEDIA_TYPES = {"", "binary/octet-stream", "application/octet-stream"}
LISTING_HINTS = {
    "NoSuchBucket": "the bucket does not exist",
    "AccessDenied": "access denied (check the credentials' permissions for s3:ListBucket)",
    "InvalidAccessKeyId": "the access key is not known to this endpoint",
    "SignatureDoesNotMatch": "the secret key does not match the access key",
    "InvalidBucketName": "the bucket name is not valid",
}


@dataclass(frozen=True)
class _Listed:
    """One object from the listing, with what the change check needs."""

    key: str
    relative: str
    etag: str
    size: int
    last_modified: str


def _strip_etag(etag: str | None) -> str:
    return (etag or "").strip().strip('"')


def _iso(value: datetime | None) -> str:
    return value.astimezone(timezone.utc).isoformat() if value else ""


def _error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code") or error.response.get("ResponseMetadata", {}).get("HTTPStatusCode"))


def _client_config(source: S3Source) -> Config:
    """The source's connect/read timeouts and a few standard retries, so a flaky store slows a
    sync down instead of failing it, and an endpoint that accepts connections but never answers
    fails the source in bounded time (about max_attempts x (connect + read timeout) per call)
    instead of holding the sync for minutes.

    S3-compatible stores (SeaweedFS, MinIO, Ceph) want path-style addressing, and several reject
    the newer default request/response checksums, so checksums are only used where required.
    """
    return Config(
        connect_timeout=source.connect_timeout_s,
        read_timeout=source.read_timeout_s,
        retries={"total_max_attempts": source.max_attempts, "mode": "standard"},  # the first try counts
        max_pool_connections=FETCH_WORKERS * 2,
        s3={"addressing_style": "path"} if source.endpoint_url else None,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )


class S3Connector:
    def __init__(self, source: S3Source, source_key: str, max_bytes: int):
        self.source = source
        self.source_key = source_key
        self.max_bytes = max_bytes
        self._client: Any = None

    @property
    def where(self) -> str:
        """Bucket and endpoint, for error messages (never credentials)."""
        endpoint = self.source.endpoint_url or f"AWS ({self.source.region or DEFAULT_REGION})"
        return f"s3://{self.source.bucket}/{self.source.prefix} at {endpoint}"

    def _credentials(self) -> dict[str, str]:
        """Keys from the named environment variables, or nothing (boto3's standard chain)."""
        names = (self.source.access_key_env, self.source.secret_key_env)
        if not any(names):
            return {}
        if not all(names):
            raise SourceError(f"s3 source {self.where}: set both access_key_env and secret_key_env, or neither")
        values = {}
        for field, name in zip(("aws_access_key_id", "aws_secret_access_key"), names):
            value = os.environ.get(name)
            if not value:
                raise SourceError(f"s3 source {self.where}: environment variable {name} is not set")
            values[field] = value
        return values

    @property
    def client(self) -> Any:
        """Built on first use, so a missing credential variable surfaces as a scan's SourceError."""
        if self._client is None:
            session = boto3.session.Session(**self._credentials())
            self._client = session.client(
                "s3",
                endpoint_url=self.source.endpoint_url,
                region_name=self.source.region or DEFAULT_REGION,
                config=_client_config(self.source),
            )
        return self._client

    def _listing_error(self, error: Exception) -> SourceError:
        if isinstance(error, ClientError):
            code = _error_code(error)
            hint = LISTING_HINTS.get(code, error.response.get("Error", {}).get("Message", ""))
            return SourceError(f"s3 source {self.where}: cannot list objects: {code}: {hint}")
        if isinstance(error, NoCredentialsError):
            return SourceError(f"s3 source {self.where}: no credentials found (set access_key_env/secret_key_env or AWS credentials)")
        if isinstance(error, EndpointConnectionError):
            return SourceError(f"s3 source {self.where}: cannot reach the endpoint: {error}")
        return SourceError(f"s3 source {self.where}: cannot list objects: {type(error).__name__}: {error}")

    def _relative(self, key: str) -> str:
        return key[len(self.source.prefix) :].lstrip("/")

    def _listing(self) -> Iterator[_Listed]:
        """Every object under the prefix that passes the globs; folder placeholders are skipped."""
        paginator = self.client.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=self.source.bucket, Prefix=self.source.prefix)
        try:
            for page in pages:
                for item in page.get("Contents", []):
                    key = item["Key"]
                    relative = self._relative(key)
                    if key.endswith("/") or not relative:
                        continue
                    if not glob_match(relative, self.source.include, self.source.exclude):
                        continue
                    yield _Listed(key, relative, _strip_etag(item.get("ETag")), int(item.get("Size", 0)), _iso(item.get("LastModified")))
        except (ClientError, BotoCoreError) as error:
            raise self._listing_error(error) from None

    def _uri(self, key: str) -> str:
        return f"s3://{self.source.bucket}/{key}"

    def _fetch(self, listed: _Listed) -> ScanEvent:
        """GET one object; runs in a worker thread, so every failure comes back as an event."""
        uri = self._uri(listed.key)
        try:
            response = self.client.get_object(Bucket=self.source.bucket, Key=listed.key)
            with closing(response["Body"]) as body:
                # One byte past the limit: an object that grew since the listing is still refused.
                data = body.read(self.max_bytes + 1)
        except ClientError as error:
            return Failed(uri, f"GET failed: {_error_code(error)}", listed.etag)
        except Exception as error:  # timeouts, broken streams: one object, not the whole scan
            return Failed(uri, f"GET failed: {type(error).__name__}: {error}", listed.etag)
        if len(data) > self.max_bytes:
            return Failed(uri, f"over the size limit (more than {self.max_bytes} bytes)", listed.etag)
        # The GET's own ETag, so the version always describes the bytes we hold.
        version = _strip_etag(response.get("ETag")) or listed.etag
        media_type = (response.get("ContentType") or "").strip()
        return Fetched(
            uri=uri,
            version=version,
            data=data,
            name=listed.relative,
            media_type=None if media_type.lower() in GENERIC_MEDIA_TYPES else media_type,
            validators={"etag": version, "last_modified": _iso(response.get("LastModified")) or listed.last_modified},
            metadata={"bucket": self.source.bucket, "key": listed.key},
        )

    def _without_fetch(self, listed: _Listed, previous: Mapping[str, PreviousItem]) -> ScanEvent | None:
        """The event decided from the listing alone, or None when the object must be fetched."""
        uri = self._uri(listed.key)
        known = previous.get(uri)
        if known is not None and listed.etag and known.version == listed.etag:
            return Unchanged(uri, listed.etag, {"etag": listed.etag, "last_modified": listed.last_modified})
        if listed.size > self.max_bytes:
            return Failed(uri, f"over the size limit ({listed.size} > {self.max_bytes} bytes)", listed.etag)
        return None

    def scan(self, previous: Mapping[str, PreviousItem]) -> Iterator[ScanEvent]:
        _ = self.client  # build it (and resolve credentials) before any worker thread uses it
        log.info("scanning %s", self.where)
        pending: deque[Future[ScanEvent]] = deque()
        executor = ThreadPoolExecutor(max_workers=FETCH_WORKERS, thread_name_prefix="s3-fetch")
        try:
            for listed in self._listing():
                decided = self._without_fetch(listed, previous)
                if decided is not None:
                    yield decided
                    continue
                pending.append(executor.submit(self._fetch, listed))
                while len(pending) >= FETCH_WINDOW:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            # Also runs when the consumer stops early or the listing fails: drop queued GETs.
            executor.shutdown(wait=True, cancel_futures=True)
