"""`SqlitePinStore`: the embedded `PinStore` (`sidecar.stores.pins`), one SQLite file in the
state directory (`pins.sqlite`, WAL).

Imports `sidecar.stores` and `sidecar.model`. Exports `SqlitePinStore`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from sidecar.backends.sqlite.files import private_connection
from sidecar.backends.sqlite.owner import SqliteOwner
from sidecar.model.errors import SidecarError
from sidecar.stores.pins import Pin

__all__ = ["SqlitePinStore"]

T = TypeVar("T")


class SqlitePinStore:
    """`PinStore` in one SQLite file, used from one worker thread."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._owner: SqliteOwner[None] = SqliteOwner(
            "pins", closed=lambda: SidecarError("the pin store is closed"))

    @classmethod
    async def open(cls, path: Path) -> SqlitePinStore:
        store = cls(path)
        await store._owner.open(store._connect)
        return store

    async def _run(self, fn: Callable[[], T]) -> T:
        return await self._owner.run(fn)

    def _connect(self) -> sqlite3.Connection:
        conn = private_connection(self._path)
        conn.execute("CREATE TABLE IF NOT EXISTS pins (key TEXT PRIMARY KEY, fingerprint TEXT "
                     "NOT NULL, definition TEXT NOT NULL, pinned_at REAL NOT NULL)")
        return conn

    def _db(self) -> sqlite3.Connection:
        conn = self._owner.connection
        if conn is None:
            raise SidecarError("the pin store is closed")
        return conn

    async def load(self) -> list[Pin]:
        rows = await self._run(lambda: self._db().execute(
            "SELECT key, fingerprint, definition, pinned_at FROM pins").fetchall())
        return [Pin(k, f, json.loads(d), t) for k, f, d, t in rows]

    async def put(self, pin: Pin) -> None:
        # Serialized in the store's thread: thousands of pins at a listing are megabytes.
        await self._run(lambda: self._db().execute(
            "INSERT OR REPLACE INTO pins VALUES (?,?,?,?)",
            (pin.key, pin.fingerprint, json.dumps(pin.definition), pin.pinned_at)))

    async def put_many(self, pins: Sequence[Pin]) -> None:
        pins = list(pins)  # serialized, and written in one transaction, in the store's thread
        await self._run(lambda: self._put_rows(pins))

    def _put_rows(self, pins: list[Pin]) -> None:
        db = self._db()
        db.execute("BEGIN")
        try:
            db.executemany("INSERT OR REPLACE INTO pins VALUES (?,?,?,?)", [
                (p.key, p.fingerprint, json.dumps(p.definition), p.pinned_at) for p in pins])
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    async def aclose(self) -> None:
        await self._owner.close()
