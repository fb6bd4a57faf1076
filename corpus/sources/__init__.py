"""Connectors per source type, built from the customer file's source entries."""

from __future__ import annotations

from core.config import CustomerConfig, GitHubSource, LocalSource, S3Source, WebSource
from corpus.sources.base import Connector


def source_key(source: LocalSource | S3Source | GitHubSource | WebSource) -> str:
    """A stable name for a source; document ids derive from it, so it must not depend on the machine."""
    if source.name:
        return source.name
    if isinstance(source, LocalSource):
        return f"local:{source.path}"
    if isinstance(source, S3Source):
        return f"s3:{source.bucket}/{source.prefix}"
    if isinstance(source, GitHubSource):
        return f"github:{source.url}@{source.branch}"
    return f"web:{source.seeds[0]}"


def build_connector(source, customer: CustomerConfig, work_dir) -> Connector:
    """`work_dir` is a persistent folder for connectors that keep local state (git clones)."""
    key = source_key(source)
    max_bytes = customer.limits.max_document_bytes
    if isinstance(source, LocalSource):
        from corpus.sources.local import LocalConnector

        return LocalConnector(customer.resolve(source.path), source.include, source.exclude, key, max_bytes)
    if isinstance(source, S3Source):
        from corpus.sources.s3 import S3Connector

        return S3Connector(source, key, max_bytes)
    if isinstance(source, GitHubSource):
        from corpus.sources.github import GitHubConnector

        url = source.url
        if url.startswith("file://") and not url.startswith("file:///"):
            # `file://..` in a customer file: relative to the customer file's folder.
            url = customer.resolve(url[len("file://") :]).as_uri()
        return GitHubConnector(source.model_copy(update={"url": url}), key, max_bytes, work_dir)
    if isinstance(source, WebSource):
        from corpus.sources.web import WebConnector

        return WebConnector(source, key, max_bytes)
    raise TypeError(f"unknown source type: {source!r}")
