"""Retry what a retry can fix, and nothing else.

Dagster's `RetryPolicy` retries every exception of the asset body, and also the run's own
interrupt (Ctrl-C, a terminate request from the UI): the first SIGINT becomes "retry in 10 s"
and the run can still end in success. A deterministic error (an unknown customer, a bug, a
value no table can store) fails the same way on every attempt, so retrying it only repeats
its stack trace and delays the failure.

So the corpus and index assets carry no `RetryPolicy`. Their bodies run inside
`retry_transient`, which asks Dagster for a retry (`dg.RetryRequested`) only when the error,
or an error it was raised from, is a network failure that may heal: a refused or dropped
connection, a timeout, a throttled or failing (5xx) service. Interrupts are BaseExceptions
that never reach the handler, so Dagster stops the run at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache

import dagster as dg

_RETRYABLE_STATUS = {408, 425, 429, 500, 502, 503, 504}
_RETRYABLE_S3_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError", "ServiceUnavailable"}
_MAX_CAUSES = 8


@dataclass(frozen=True)
class TransientRetry:
    """How often and how patiently a transient failure is retried (exponential backoff)."""

    max_retries: int = 2
    delay_s: float = 10.0

    def delay_for(self, attempt: int) -> float:
        return self.delay_s * 2**attempt


@lru_cache(maxsize=1)
def _transient_types() -> tuple[type[BaseException], ...]:
    """Network errors of the clients the assets use (imported lazily: nothing at import time)."""
    import botocore.exceptions
    import httpx
    import openai

    return (
        ConnectionError,
        TimeoutError,
        httpx.TransportError,
        botocore.exceptions.ConnectionError,
        botocore.exceptions.HTTPClientError,
        openai.APIConnectionError,
        openai.RateLimitError,
        openai.InternalServerError,
    )


def _is_transient_one(error: BaseException) -> bool:
    if isinstance(error, _transient_types()):
        return True
    response = getattr(error, "response", None)
    if isinstance(response, dict):  # botocore ClientError: the service answered with an error code
        code = str(response.get("Error", {}).get("Code", ""))
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return code in _RETRYABLE_S3_CODES or status in _RETRYABLE_STATUS
    status = getattr(response, "status_code", None)  # httpx.HTTPStatusError and friends
    return isinstance(status, int) and status in _RETRYABLE_STATUS


def is_transient(error: BaseException) -> bool:
    """Is this error, or one it was raised from, a network failure that a later attempt may not meet?"""
    seen = 0
    current: BaseException | None = error
    while current is not None and seen < _MAX_CAUSES:
        if _is_transient_one(current):
            return True
        current = current.__cause__ or current.__context__
        seen += 1
    return False


@contextmanager
def retry_transient(context: dg.AssetExecutionContext, policy: TransientRetry) -> Iterator[None]:
    """Run an asset body; a transient failure asks Dagster for a retry, anything else fails now."""
    try:
        yield
    except Exception as error:
        if not is_transient(error):
            raise
        attempt = context.retry_number
        context.log.warning(f"transient failure (attempt {attempt + 1} of {policy.max_retries + 1}): {type(error).__name__}: {error}")
        raise dg.RetryRequested(max_retries=policy.max_retries, seconds_to_wait=policy.delay_for(attempt)) from error
