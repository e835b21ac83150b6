"""Stored OAuth grants for upstream servers: the `GrantStore` interface and its embedded
implementation, `FileGrantStore` (one 0600 JSON file in the state directory). Not to be
confused with `sidecar.tokens.TokenStore`, the daemon's own scoped bearer tokens.

A record is an opaque JSON object per server key; the bridge that authorizes the server
decides what it holds (tokens, the registered client, discovered metadata, the resource the
tokens are bound to). The core only keeps it: `get`, `put`, `delete`, `servers`. Nothing here
logs a record or puts one in an exception message.

`FileGrantStore` is safe across processes on one machine (`sidecar auth login` writes while a
daemon reads and refreshes): every change is a read-modify-write under an advisory lock
(`fcntl.flock` on a sibling `.lock` file), and the file is replaced atomically (temp file,
fsync, rename), created with mode 0600. All file work runs in a thread, never on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory lock, single writer assumed
    fcntl = None  # type: ignore[assignment]

GrantRecord = dict[str, Any]
TOKENS_FILE = "oauth-tokens.json"


class GrantStore(Protocol):
    """Where OAuth grants for upstream servers live (embedded file; fleet: a database)."""

    async def get(self, server: str) -> GrantRecord | None:
        """The record of `server`, or None."""
        ...

    async def put(self, server: str, record: GrantRecord) -> None:
        """Replace the record of `server`."""
        ...

    async def update(
        self, server: str, change: Callable[[GrantRecord | None], GrantRecord | None]
    ) -> GrantRecord | None:
        """Apply `change` to the record of `server` atomically (None deletes it); returns the
        new record."""
        ...

    async def delete(self, server: str) -> bool:
        """Forget `server`'s record; whether there was one."""
        ...

    async def servers(self) -> list[str]:
        """The servers that have a record."""
        ...


class FileGrantStore:
    """`GrantStore` in one JSON file (mode 0600) in the state directory."""

    __slots__ = ("_lock_path", "path")

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.path = Path(state_dir) / TOKENS_FILE
        self._lock_path = self.path.with_suffix(".lock")

    def __repr__(self) -> str:
        return f"FileGrantStore({str(self.path)!r})"

    async def get(self, server: str) -> GrantRecord | None:
        return (await asyncio.to_thread(self._read_all)).get(server)

    async def put(self, server: str, record: GrantRecord) -> None:
        await self.update(server, lambda _old: record)

    async def update(
        self, server: str, change: Callable[[GrantRecord | None], GrantRecord | None]
    ) -> GrantRecord | None:
        return await asyncio.to_thread(self._update, server, change)

    async def delete(self, server: str) -> bool:
        existed = await self.get(server) is not None
        await self.update(server, lambda _old: None)
        return existed

    async def servers(self) -> list[str]:
        return sorted(await asyncio.to_thread(self._read_all))

    # --- in the worker thread --------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _read_all(self) -> dict[str, GrantRecord]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            data = json.loads(raw)
        except ValueError:
            # Never echo the content: it holds tokens.
            raise ValueError(f"{self.path} is not valid JSON; remove it and log in again") from None
        return data if isinstance(data, dict) else {}

    def _update(
        self, server: str, change: Callable[[GrantRecord | None], GrantRecord | None]
    ) -> GrantRecord | None:
        with self._locked():
            records = self._read_all()
            new = change(records.get(server))
            if new is None:
                if server not in records:
                    return None
                records.pop(server)
            else:
                records[server] = new
            self._write_all(records)
            return new

    def _write_all(self, records: dict[str, GrantRecord]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(json.dumps(records, indent=1, sort_keys=True).encode())
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
