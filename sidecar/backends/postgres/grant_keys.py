"""The key that encrypts OAuth grants kept in the fleet database, `SIDECAR_GRANT_KEY`: its
keys (`GrantKeys`: format, sealing, rotation), the stores sealed with it (`SealedGrantStore`,
`SealedPostgresStore`, `WaitingLogins`), re-sealing (`resealing`, `Resealed`) and its errors
(`GrantKeyMissing`, `GrantKeyInvalid`, `GrantSealError`). No key, and nothing here, is ever
logged or put in an exception message.

Imports `sidecar.stores`, `cryptography` (when sealing), `asyncpg` (types only) and this
package. Exports the names above, `key_id`, `why_unopenable` and `GRANT_KEY_ENV`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from sidecar.backends.postgres.pool import PostgresStore
from sidecar.stores.grants import GrantRecord, GrantStore, GrantStoreUnavailable

if TYPE_CHECKING:
    from collections import Counter

    import asyncpg

GRANT_KEY_ENV = "SIDECAR_GRANT_KEY"
KEY_BYTES = 32
NONCE_BYTES = 12
_KEY_ID_LABEL = b"mcp-sidecar grant key id"
_AAD_PREFIX = b"mcp-sidecar grant v1\x00"


class GrantKeyMissing(GrantStoreUnavailable):
    """The grants are in the fleet database and `SIDECAR_GRANT_KEY` is not set."""

    def __init__(self) -> None:
        super().__init__(
            f"OAuth grants are kept in the fleet database, encrypted with {GRANT_KEY_ENV}, "
            f"which is not set: give every replica (and `sidecar auth`) the same "
            f"{GRANT_KEY_ENV} (32 random bytes in base64: `openssl rand -base64 32`)")


class GrantKeyInvalid(GrantStoreUnavailable):
    """`SIDECAR_GRANT_KEY` is set but is not a list of base64 32-byte keys."""


class GrantSealError(GrantStoreUnavailable):
    """A stored grant cannot be opened with the keys this process has."""


def _decode_key(text: str, position: int) -> bytes:
    cleaned = text.strip().rstrip("=").replace("-", "+").replace("_", "/")  # either alphabet
    raw: bytes | None
    try:
        raw = base64.b64decode(cleaned + "=" * (-len(cleaned) % 4), validate=True)
    except (binascii.Error, ValueError):
        raw = None
    if raw is None or len(raw) != KEY_BYTES:
        where = f"key {position}" if position > 1 else "the key"
        got = "not base64" if raw is None else f"{len(raw)} bytes"
        raise GrantKeyInvalid(
            f"{GRANT_KEY_ENV}: {where} is {got}, not base64 of {KEY_BYTES} random bytes "
            "(make one with `openssl rand -base64 32`)")
    return raw


def key_id(key: bytes) -> str:
    """The public name of `key` (reveals nothing of it)."""
    return hmac.new(key, _KEY_ID_LABEL, hashlib.sha256).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class GrantKeys:
    """The keys of `SIDECAR_GRANT_KEY`: the first seals, all open. Never printed.

    Format: one or more keys separated by commas, each 32 random bytes in base64 (standard
    or URL-safe alphabet, padding optional; `openssl rand -base64 32`). Every replica, and
    every machine that runs `sidecar auth login` against the database, needs the same key.
    To rotate: put the new key first and keep the old one after it until every record was
    sealed again (each login and each refresh rewrites its record; `sidecar auth rekey`
    re-seals every record at once, `SealedGrantStore.reseal`).

    `seal` uses AES-256-GCM with a fresh 96-bit nonce per write and the server key as
    associated data (a sealed record copied onto another server's row does not open). Each
    sealed record names its key by `key_id`, so a record sealed with a key this process does
    not have gives an error naming both ids, never a decryption failure in the dark."""

    keys: tuple[bytes, ...]

    def __repr__(self) -> str:
        return f"GrantKeys(ids={list(self.ids)!r})"

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(key_id(k) for k in self.keys)

    @classmethod
    def parse(cls, text: str) -> GrantKeys | None:
        """The keys in `text` (None when it is blank); `GrantKeyInvalid` when one is not
        base64 of 32 bytes."""
        parts = [p for p in text.split(",") if p.strip()]
        if not parts:
            return None
        return cls(tuple(_decode_key(p, i) for i, p in enumerate(parts, 1)))

    @classmethod
    def from_env(cls, environ: Any = None) -> GrantKeys | None:
        env = os.environ if environ is None else environ
        return cls.parse(env.get(GRANT_KEY_ENV, ""))

    def seal(self, server: str, record: GrantRecord) -> tuple[str, bytes]:
        """(key id, nonce + ciphertext) of `record`, bound to `server`."""
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        key = self.keys[0]
        nonce = os.urandom(NONCE_BYTES)
        plain = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
        return key_id(key), nonce + AESGCM(key).encrypt(nonce, plain, _aad(server))

    def open(self, server: str, kid: str, sealed: bytes) -> GrantRecord:
        """The record `seal` made for `server`; `GrantSealError` when no key of ours sealed
        it, or it was changed since."""
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        key = next((k for k in self.keys if key_id(k) == kid), None)
        if key is None:
            raise GrantSealError(
                f"the stored OAuth grant of {server!r} was encrypted with another "
                f"{GRANT_KEY_ENV} (key id {kid}; this process has {', '.join(self.ids)}): "
                f"give every replica the same {GRANT_KEY_ENV}, or log in again "
                f"(`sidecar auth login {server}`)")
        try:
            plain = AESGCM(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:],
                                        _aad(server))
            record = json.loads(plain)
        except (InvalidTag, ValueError):
            raise GrantSealError(
                f"the stored OAuth grant of {server!r} does not decrypt with its key (key id "
                f"{kid}): it was changed in the database; log in again "
                f"(`sidecar auth login {server}`)") from None
        if not isinstance(record, dict):
            raise GrantSealError(f"the stored OAuth grant of {server!r} is not a record")
        return record


Resealing = Literal["resealed", "current", "stale", "unopenable", "gone"]
"""What `SealedGrantStore.reseal` found: `resealed` (sealed again with the first key),
`current` (already under the first key), `stale` (under another key of ours; a check changes
nothing), `unopenable` (no key of ours opens it: left as it is), `gone` (deleted meanwhile)."""


@dataclass(frozen=True, slots=True)
class Resealed:
    """One record's `reseal`: what was found and the id of the key it was under (never a key,
    never the record)."""

    server: str
    outcome: Resealing
    key_id: str = ""
    reason: str = ""
    """Why an `unopenable` record does not open (names key ids only)."""


@runtime_checkable
class SealedGrantStore(GrantStore, Protocol):
    """A `GrantStore` whose records are sealed with `SIDECAR_GRANT_KEY` (the fleet database's)."""

    keys: GrantKeys | None

    async def reseal(self, server: str, *, check: bool = False) -> Resealed:
        """Seal `server`'s record again with the first key, under the same per-server lock
        as `update` (so a concurrent change is never lost); `check`: only say what would be
        done. A record no key opens is left as it is (`unopenable`)."""
        ...

    async def reseal_pending_logins(self, *, check: bool = False) -> Counter[str]:
        """The same for the logins waiting for their browser's redirect (sealed with the same
        keys, `WaitingLogins`): counts by outcome."""
        ...


class WaitingLogins(Protocol):
    """The fleet's logins waiting for their browser's redirect, sealed with the grants' keys
    (`sidecar.backends.postgres.pending_logins`), as `sidecar auth rekey` re-seals them."""

    keys: GrantKeys | None

    async def reseal_waiting(self, *, check: bool = False) -> Counter[str]:
        """Seal each waiting login again with the first key; counts by outcome (`resealed`,
        `current`, `unopenable`; with `check`, which writes nothing, `stale`)."""
        ...

    async def aclose(self) -> None: ...


def resealing(keys: GrantKeys, bound: str, was: str, sealed: bytes, *,
              check: bool) -> tuple[Resealing, tuple[str, bytes] | None]:
    """What `reseal` does with one record sealed under key id `was` (`bound`: what it was
    sealed with, as for `seal`): `unopenable`, `current`, `stale` (`check`), or `resealed`
    with the new (key id, sealed) to write."""
    try:
        record = keys.open(bound, was, sealed)
    except GrantSealError:
        return "unopenable", None
    if was == keys.ids[0]:
        return "current", None
    if check:
        return "stale", None
    return "resealed", keys.seal(bound, record)


def why_unopenable(keys: GrantKeys, kid: str) -> str:
    """Why a record sealed under key id `kid` that `keys` failed to open does not open."""
    if kid not in keys.ids:
        return (f"sealed with key id {kid}, which is not in {GRANT_KEY_ENV} "
                f"(key ids given: {', '.join(keys.ids)})")
    return f"does not decrypt with its key (key id {kid}): it was changed in the database"


class SealedPostgresStore(PostgresStore):
    """A fleet store whose rows are sealed with `SIDECAR_GRANT_KEY`: `keys` from the
    environment at construction (None without it; `GrantKeyInvalid` when malformed), settable
    afterwards; `_keys()` raises `GrantKeyMissing` while there are none."""

    def __init__(self, pool: asyncpg.Pool, *, owns_pool: bool = False,
                 location: str = "default") -> None:
        super().__init__(pool, owns_pool=owns_pool, location=location)
        self.keys: GrantKeys | None = GrantKeys.from_env()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(keys={self.keys!r})"

    def _keys(self) -> GrantKeys:
        if self.keys is None:
            raise GrantKeyMissing
        return self.keys


def _aad(server: str) -> bytes:
    return _AAD_PREFIX + server.encode()
