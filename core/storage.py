"""Artifact storage: a local folder or an S3 prefix, with atomic writes.

Every artifact is addressed by a relative key such as `acme/raw_documents.parquet`; the
partition (customer) is always the first path segment. A crash never leaves a half-written
artifact that a later run trusts: locally we write a temp file, fsync and rename it; on S3 a
single PUT lands whole or not at all, so readers never see a partial object.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar
from urllib.parse import urlparse

import polars as pl

T = TypeVar("T")


class ArtifactNotFound(KeyError):
    pass


class ArtifactStore(ABC):
    @abstractmethod
    def read_bytes(self, key: str) -> bytes: ...

    @abstractmethod
    def write_bytes(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def delete(self, key: str) -> None: ...

    @abstractmethod
    def list(self, prefix: str) -> Iterator[str]: ...

    @abstractmethod
    def uri(self, key: str) -> str: ...

    def local_path(self, key: str) -> Path | None:
        """A filesystem path for the key when the store is local (lets big tools read in place)."""
        return None

    def read_text(self, key: str) -> str:
        return self.read_bytes(key).decode("utf-8")

    def write_text(self, key: str, text: str) -> None:
        self.write_bytes(key, text.encode("utf-8"))

    def read_record(self, key: str, parse: Callable[[Any], T]) -> T:
        """The JSON record at `key`, parsed by `parse` (a model's `model_validate`, a `from_dict`).

        Records are what stages hand each other (manifests, the served record); one torn by a
        crash or edited by hand is an error that names the record and what is wrong with it,
        not a bare traceback from deep inside a stage that read it."""
        text = self.read_text(key)
        try:
            return parse(json.loads(text))
        except (ValueError, TypeError, KeyError) as error:  # JSONDecodeError and pydantic's ValidationError are ValueErrors
            raise ValueError(f"{self.uri(key)} is not a valid record: {error}") from None

    def read_parquet(self, key: str) -> pl.DataFrame:
        return pl.read_parquet(io.BytesIO(self.read_bytes(key)))

    def write_parquet(self, key: str, frame: pl.DataFrame) -> None:
        buffer = io.BytesIO()
        frame.write_parquet(buffer, compression="zstd")
        self.write_bytes(key, buffer.getvalue())

    def read_parquet_or_none(self, key: str) -> pl.DataFrame | None:
        return self.read_parquet(key) if self.exists(key) else None


def _check_key(key: str) -> str:
    if not key or key.startswith("/") or ".." in Path(key).parts:
        raise ValueError(f"artifact key must be a relative path without '..': {key!r}")
    return key


class LocalArtifactStore(ArtifactStore):
    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser().resolve()

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def read_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise ArtifactNotFound(self.uri(key)) from None

    def write_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def exists(self, key: str) -> bool:
        return self._path(key).exists()

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def list(self, prefix: str) -> Iterator[str]:
        base = self.root / prefix
        folder = base if base.is_dir() else base.parent
        if not folder.exists():
            return
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not path.name.endswith(".tmp"):
                key = path.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    yield key

    def uri(self, key: str) -> str:
        return self._path(key).as_uri()

    def local_path(self, key: str) -> Path:
        return self._path(key)


class S3ArtifactStore(ArtifactStore):
    def __init__(self, bucket: str, prefix: str = "", client=None, endpoint_url: str | None = None):
        import boto3

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client or boto3.client("s3", endpoint_url=endpoint_url)

    def _key(self, key: str) -> str:
        _check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def read_bytes(self, key: str) -> bytes:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except self.client.exceptions.NoSuchKey:
            raise ArtifactNotFound(self.uri(key)) from None

    def write_bytes(self, key: str, data: bytes) -> None:
        # One PUT either lands whole or not at all; readers never see a partial object.
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}:
                return False
            raise

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def list(self, prefix: str) -> Iterator[str]:
        full = self._key(prefix) if prefix else (self.prefix + "/" if self.prefix else "")
        strip = len(self.prefix) + 1 if self.prefix else 0
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full):
            for item in page.get("Contents", []):
                yield item["Key"][strip:]

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"


def default_store_location() -> str:
    """`$SEARCHSMITH_ARTIFACTS` (a folder or `s3://bucket/prefix`), else `$SEARCHSMITH_HOME/artifacts`."""
    from core.registry import searchsmith_home

    return os.environ.get("SEARCHSMITH_ARTIFACTS", "").strip() or str(searchsmith_home() / "artifacts")


def open_store(location: str, endpoint_url: str | None = None) -> ArtifactStore:
    """`s3://bucket/prefix` or a local folder."""
    if location.startswith("s3://"):
        parsed = urlparse(location)
        return S3ArtifactStore(parsed.netloc, parsed.path.lstrip("/"), endpoint_url=endpoint_url)
    return LocalArtifactStore(location)


def push_folder(store: ArtifactStore, folder: Path, prefix: str) -> int:
    """Copy every file under `folder` to `prefix` (adapters, BM25 indexes: folders the store keeps whole)."""
    count = 0
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            store.write_bytes(prefix + path.relative_to(folder).as_posix(), path.read_bytes())
            count += 1
    return count


def pull_folder(store: ArtifactStore, prefix: str, folder: Path) -> int:
    """Replace `folder` with the store's copy (if any); returns how many files came down."""
    keys = list(store.list(prefix))
    if not keys:
        return 0
    staging = folder.with_name(folder.name + ".pull")
    shutil.rmtree(staging, ignore_errors=True)
    for key in keys:
        target = staging / key[len(prefix) :]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(store.read_bytes(key))
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return len(keys)
