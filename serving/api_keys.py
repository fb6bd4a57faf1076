"""Per-customer API keys for the search service, hashed at rest.

A key reads `ssk_<keyid>_<secret>`: the key id finds the record in O(1) (and is safe to show
in listings), the secret is 256 random bits that only its holder ever sees. The store keeps a
salted scrypt hash per key. The secrets are random, not chosen by people, so a brute force is
hopeless whatever the KDF cost; scrypt (with its parameters stored per record, so they can
be raised later) is defence in depth for a leaked file, kept cheap enough to run on every
request.

The file (`$SEARCHSMITH_HOME/api_keys.json`, mode 0600) is shared by `searchsmith keys ...`
and a running `searchsmith api`: writers take an advisory lock and replace the file
atomically, and readers reload it when it changed, so new keys and revocations take effect
without a restart.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from core.file_lock import exclusive_file_lock

KEY_PREFIX = "ssk"
CUSTOMER_NAME = re.compile(r"^[a-z0-9-]+$")
_KEY = re.compile(r"^ssk_([0-9a-f]{12})_([A-Za-z0-9_-]{20,128})$")
_SCRYPT = {"n": 2**12, "r": 8, "p": 1}
_DKLEN = 32


@dataclass(frozen=True)
class ApiKeyRecord:
    """What is stored per key; everything here is safe to list (the hash is not the key)."""

    key_id: str
    customer: str
    salt: str  # hex
    hash: str  # hex scrypt(secret, salt)
    kdf: dict[str, int]
    created_at: str

    def public(self) -> "ApiKeyInfo":
        return ApiKeyInfo(key_id=self.key_id, customer=self.customer, created_at=self.created_at)


@dataclass(frozen=True)
class ApiKeyInfo:
    key_id: str
    customer: str
    created_at: str


@dataclass(frozen=True)
class IssuedKey:
    """A freshly created key: `key` is shown once and never stored."""

    key: str
    key_id: str
    customer: str
    created_at: str


def default_keys_path() -> Path:
    # The same rule as core.registry.searchsmith_home, without importing a lower stage for one line.
    return Path(os.environ.get("SEARCHSMITH_HOME", "./.searchsmith")).expanduser().resolve() / "api_keys.json"


def _derive(secret: str, salt: bytes, kdf: dict[str, int]) -> bytes:
    return hashlib.scrypt(secret.encode(), salt=salt, n=kdf["n"], r=kdf["r"], p=kdf["p"], dklen=_DKLEN, maxmem=64 * 2**20)


class ApiKeyStore:
    """Create, verify, list and revoke keys kept in one JSON file."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else default_keys_path()
        self._lock = threading.Lock()
        self._cache: tuple[tuple[int, int, int], dict[str, ApiKeyRecord]] | None = None
        # Unknown key ids still pay for one derivation, so timing does not tell ids apart.
        self._decoy = ApiKeyRecord("0" * 12, "", secrets.token_hex(16), "00" * _DKLEN, dict(_SCRYPT), "")

    # -- file ----------------------------------------------------------------------------------

    def _read(self) -> dict[str, ApiKeyRecord]:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return {}
        signature = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        with self._lock:
            if self._cache is not None and self._cache[0] == signature:
                return self._cache[1]
            payload = json.loads(self.path.read_text() or "{}")
            records = {key_id: ApiKeyRecord(key_id=key_id, **fields) for key_id, fields in payload.get("keys", {}).items()}
            self._cache = (signature, records)
            return records

    def _write(self, records: dict[str, ApiKeyRecord]) -> None:
        payload = {"version": 1, "keys": {r.key_id: {k: v for k, v in asdict(r).items() if k != "key_id"} for r in records.values()}}
        descriptor, temporary = tempfile.mkstemp(prefix=".api_keys.", suffix=".tmp", dir=self.path.parent)
        try:
            os.fchmod(descriptor, 0o600)
            with os.fdopen(descriptor, "w") as handle:
                json.dump(payload, handle, indent=2, sort_keys=True)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    @contextmanager
    def _exclusive(self) -> Iterator[dict[str, ApiKeyRecord]]:
        """Read-modify-write under an advisory lock, so two `keys create` never lose a key."""
        with exclusive_file_lock(self.path.with_name(self.path.name + ".lock")):
            records = dict(self._read())
            yield records
            self._write(records)

    # -- operations ----------------------------------------------------------------------------

    def create(self, customer: str) -> IssuedKey:
        if not CUSTOMER_NAME.match(customer or ""):
            raise ValueError(f"customer names are [a-z0-9-]+, got {customer!r}")
        secret, salt = secrets.token_urlsafe(32), secrets.token_bytes(16)
        created_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        digest = _derive(secret, salt, _SCRYPT)
        with self._exclusive() as records:
            key_id = secrets.token_hex(6)
            while key_id in records:
                key_id = secrets.token_hex(6)
            records[key_id] = ApiKeyRecord(key_id, customer, salt.hex(), digest.hex(), dict(_SCRYPT), created_at)
        return IssuedKey(key=f"{KEY_PREFIX}_{key_id}_{secret}", key_id=key_id, customer=customer, created_at=created_at)

    def create_key(self, customer: str) -> str:
        return self.create(customer).key

    @staticmethod
    def well_formed(key: str) -> bool:
        """Whether `key` has a key's shape (no file read, no hashing): a cheap first filter."""
        return _KEY.match(key or "") is not None

    def verify(self, key: str) -> str | None:
        """The customer the key belongs to, or None for a malformed, unknown, revoked or wrong key."""
        match = _KEY.match(key or "")
        if match is None:
            return None
        key_id, secret = match.groups()
        record = self._read().get(key_id)
        candidate = record or self._decoy
        digest = _derive(secret, bytes.fromhex(candidate.salt), candidate.kdf)
        if hmac.compare_digest(digest, bytes.fromhex(candidate.hash)) and record is not None:
            return record.customer
        return None

    def revoke(self, key_id: str) -> bool:
        """Remove a key; True if it existed. Takes the key id or the whole key."""
        return self.remove(key_id) is not None

    def remove(self, key_id: str) -> ApiKeyInfo | None:
        """Remove a key and say whose it was (None if there was no such key). Takes the key id
        or the whole key; a running service stops accepting it on its next request."""
        match = _KEY.match(key_id or "")
        key_id = match.group(1) if match else key_id
        with self._exclusive() as records:
            removed = records.pop(key_id, None)
        return removed.public() if removed is not None else None

    def list(self, customer: str | None = None) -> list[ApiKeyInfo]:
        records = self._read().values()
        return sorted((r.public() for r in records if customer in (None, r.customer)), key=lambda info: (info.customer, info.created_at, info.key_id))


def create_key(customer: str, path: str | Path | None = None) -> str:
    """A new key for `customer`, shown once (`searchsmith keys create CUSTOMER`)."""
    return ApiKeyStore(path).create_key(customer)
