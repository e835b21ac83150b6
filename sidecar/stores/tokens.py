"""Scoped bearer tokens: each reaches only the profiles it was made for.

    tokens = await SqliteTokenStore.open(state / "tokens.sqlite")
    secret, record = await create_token(tokens, profiles=("coding",), label="ci")
    await verify_token(tokens, secret)      # -> the record, or None (unknown or revoked)

A secret is `sct_` + 43 URL-safe characters (256 random bits). Only its SHA-256 digest is
stored: a random 256-bit secret needs no slow hash, and the digest cannot be turned back
into a token. The secret is shown once, when it is made. Revoking deletes the row, so the
token stops working at its next request (the daemon looks a scoped token up on each request;
`sidecar token ...` and a running daemon share the SQLite file).

`TokenStore` is the small interface the daemon needs; `SqliteTokenStore` (a file in the state
directory) is the embedded default. The single generated token of `sidecar serve` is not in
this store: it keeps reaching everything.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import secrets
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from sidecar.model.errors import SidecarError
from sidecar.stores.state_dir import PRIVATE_DIR_MODE, create_private_file

T = TypeVar("T")
SECRET_PREFIX = "sct_"
_PROFILE = re.compile(r"[A-Za-z0-9_-]{1,64}")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tokens (
    id         TEXT PRIMARY KEY,
    digest     TEXT NOT NULL UNIQUE,
    profiles   TEXT NOT NULL,      -- space-separated profile names
    label      TEXT NOT NULL,
    created_at REAL NOT NULL
);
"""


class TokenError(SidecarError):
    """A token request that cannot be done (no profile, a bad name, an unknown id)."""


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """What is stored about one scoped token (never its secret)."""

    id: str
    profiles: tuple[str, ...]
    label: str
    created_at: float

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "profiles": list(self.profiles), "label": self.label,
                "created_at": self.created_at}


class TokenStore(Protocol):
    """Where scoped tokens live, by the digest of their secret."""

    async def add(self, record: TokenRecord, digest: str) -> None: ...

    async def find(self, digest: str) -> TokenRecord | None: ...

    async def list(self) -> list[TokenRecord]: ...

    async def revoke(self, token_id: str) -> bool:
        """Remove the token; False when no token has that id."""
        ...

    async def aclose(self) -> None: ...


def digest_of(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


async def create_token(
    store: TokenStore, *, profiles: Sequence[str], label: str = ""
) -> tuple[str, TokenRecord]:
    """Make a token that reaches `profiles`; returns (secret, record). The secret is not
    stored anywhere: show it to the user now."""
    if not profiles:
        raise TokenError("a scoped token needs at least one profile")
    for name in profiles:
        if not _PROFILE.fullmatch(name):
            raise TokenError(f"{name!r} is not a profile name (1-64 letters, digits, _ or -)")
    record = TokenRecord(
        id="tok_" + secrets.token_hex(6), profiles=tuple(dict.fromkeys(profiles)),
        label=label, created_at=time.time(),
    )
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    await store.add(record, digest_of(secret))
    return secret, record


async def verify_token(store: TokenStore, secret: str) -> TokenRecord | None:
    """The record of a scoped token's secret, or None (not a scoped token, or revoked)."""
    if not secret.startswith(SECRET_PREFIX):
        return None
    return await store.find(digest_of(secret))


class SqliteTokenStore:
    """`TokenStore` in one SQLite file (WAL), used from one worker thread."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokens")
        self._conn: sqlite3.Connection | None = None

    @classmethod
    async def open(cls, path: Path) -> SqliteTokenStore:
        store = cls(path)
        try:
            await store._run(store._connect)
        except BaseException:
            await store.aclose()
            raise
        return store

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def _connect(self) -> None:
        self._path.parent.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        create_private_file(self._path)  # 0600 from the start; SQLite's -wal/-shm follow it
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False,
                               timeout=10)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(_SCHEMA)
        self._conn = conn

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise TokenError("the token store is closed")
        return self._conn

    async def add(self, record: TokenRecord, digest: str) -> None:
        row = (record.id, digest, " ".join(record.profiles), record.label, record.created_at)
        await self._run(lambda: self._db().execute(
            "INSERT INTO tokens VALUES (?,?,?,?,?)", row))

    async def find(self, digest: str) -> TokenRecord | None:
        rows = await self._run(lambda: self._db().execute(
            "SELECT id, profiles, label, created_at FROM tokens WHERE digest=?", (digest,)
        ).fetchall())
        return _record(rows[0]) if rows else None

    async def list(self) -> list[TokenRecord]:
        rows = await self._run(lambda: self._db().execute(
            "SELECT id, profiles, label, created_at FROM tokens ORDER BY created_at"
        ).fetchall())
        return [_record(row) for row in rows]

    async def revoke(self, token_id: str) -> bool:
        cursor = await self._run(lambda: self._db().execute(
            "DELETE FROM tokens WHERE id=?", (token_id,)))
        return cursor.rowcount > 0

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._run(conn.close)
        self._executor.shutdown(wait=False)


def _record(row: tuple[Any, ...]) -> TokenRecord:
    token_id, profiles, label, created_at = row
    return TokenRecord(token_id, tuple(profiles.split()), label, created_at)
