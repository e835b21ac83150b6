"""The embedded grant stores (`sidecar.stores.grants.GrantStore`): `FileGrantStore`, one 0600
JSON file in the state directory (the default), and `KeyringGrantStore`, the OS keyring
(`SIDECAR_OAUTH_STORE=keyring`); `open_grant_store` picks one.

`FileGrantStore` is safe across processes on one machine (`sidecar auth login` writes while a
daemon reads and refreshes): every change is a read-modify-write under an advisory lock
(`fcntl.flock` on a sibling `.lock` file), and the file is replaced atomically (temp file,
fsync, rename), created 0600. All file work runs in a thread, never on the loop.

Imports `sidecar.stores` (and `keyring` when chosen). Exports `FileGrantStore`,
`KeyringGrantStore`, `open_grant_store`, `TOKENS_FILE` and `REFRESH_LOCK_FILE`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from sidecar.stores.grants import LOCK_POLL, GrantRecord, GrantStore, GrantStoreUnavailable

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory lock, single writer assumed
    fcntl = None  # type: ignore[assignment]

__all__ = ["REFRESH_LOCK_FILE", "TOKENS_FILE", "FileGrantStore", "KeyringGrantStore",
           "open_grant_store"]

TOKENS_FILE = "oauth-tokens.json"
REFRESH_LOCK_FILE = "oauth-tokens.refresh.lock"


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

    def exclusive(self, server: str) -> AbstractAsyncContextManager[None]:
        return _held(self.path.with_name(REFRESH_LOCK_FILE))

    # --- in the worker thread --------------------------------------------------------

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
        with _locked(self._lock_path):
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
        _write_private(self.path, json.dumps(records, indent=1, sort_keys=True).encode())


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """An exclusive advisory lock across processes (released when the fd closes)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.asynccontextmanager
async def _held(lock_path: Path) -> AsyncIterator[None]:
    """An exclusive advisory lock across processes and tasks, tried without blocking every
    `LOCK_POLL` seconds (so a cancelled wait leaves nothing behind). One lock for every server
    of a state directory: refreshes are rare and short."""
    fd = await asyncio.to_thread(_open_lock, lock_path)
    try:
        while True:
            if _try_lock(fd):  # LOCK_NB: never blocks the loop
                break
            await asyncio.sleep(LOCK_POLL)
        yield
    finally:
        os.close(fd)  # releases the lock


def _open_lock(lock_path: Path) -> int:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)


def _try_lock(fd: int) -> bool:
    if fcntl is None:  # pragma: no cover - Windows: one process at a time assumed
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _write_private(path: Path, data: bytes) -> None:
    """Replace `path` atomically with `data`, mode 0600 (temp file, fsync, rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


class KeyringGrantStore:
    """`GrantStore` in the OS keyring (the `keyring` package): one secret per server, under the
    service `mcp-sidecar:<state dir>`. The names of the servers with a grant (no secrets) are
    kept in `oauth-grants.index` in the state directory, since keyrings cannot list entries.
    Updates are serialized across processes by the same lock file as `FileGrantStore`'s."""

    __slots__ = ("_index", "_lock_path", "service")

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        state = Path(state_dir)
        self.service = f"mcp-sidecar:{state.resolve()}"
        self._index = state / "oauth-grants.index"
        self._lock_path = state / "oauth-tokens.lock"

    def __repr__(self) -> str:
        return f"KeyringGrantStore({self.service!r})"

    async def get(self, server: str) -> GrantRecord | None:
        return await asyncio.to_thread(self._get, server)

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
        return sorted(await asyncio.to_thread(self._names))

    def exclusive(self, server: str) -> AbstractAsyncContextManager[None]:
        return _held(self._lock_path.with_name(REFRESH_LOCK_FILE))

    # --- in the worker thread --------------------------------------------------------

    def _keyring(self) -> Any:
        try:
            import keyring
        except ImportError:
            raise GrantStoreUnavailable(
                "SIDECAR_OAUTH_STORE=keyring needs the `keyring` package (pip install keyring)"
            ) from None
        backend = keyring.get_keyring()
        if type(backend).__module__.startswith("keyring.backends.fail"):
            raise GrantStoreUnavailable(
                "no OS keyring is available on this machine (headless?): unset "
                "SIDECAR_OAUTH_STORE to keep OAuth tokens in the state directory (mode 0600)"
            )
        return keyring

    def _get(self, server: str) -> GrantRecord | None:
        raw = self._keyring().get_password(self.service, server)
        if raw is None:
            return None
        try:
            record = json.loads(raw)
        except ValueError:
            return None
        return record if isinstance(record, dict) else None

    def _names(self) -> set[str]:
        try:
            names = json.loads(self._index.read_text())
        except (OSError, ValueError):
            return set()
        return {n for n in names if isinstance(n, str)} if isinstance(names, list) else set()

    def _update(
        self, server: str, change: Callable[[GrantRecord | None], GrantRecord | None]
    ) -> GrantRecord | None:
        ring = self._keyring()
        with _locked(self._lock_path):
            new = change(self._get(server))
            names = self._names()
            if new is None:
                if self._get(server) is not None:
                    ring.delete_password(self.service, server)
                names.discard(server)
            else:
                ring.set_password(self.service, server, json.dumps(new, sort_keys=True))
                names.add(server)
            _write_private(self._index, json.dumps(sorted(names)).encode())
            return new


def open_grant_store(state_dir: str | os.PathLike[str]) -> GrantStore:
    """The embedded grant store `SIDECAR_OAUTH_STORE` names: `file` (default) or `keyring`."""
    kind = os.environ.get("SIDECAR_OAUTH_STORE", "file").strip().lower() or "file"
    if kind == "keyring":
        return KeyringGrantStore(state_dir)
    if kind != "file":
        raise GrantStoreUnavailable(f"SIDECAR_OAUTH_STORE={kind!r}: use 'file' or 'keyring'")
    return FileGrantStore(state_dir)
