"""Connections per caller: one upstream connection per (server, user) for credentials per user
(`oauth.per_user`), each authorized with that user's own grant, and per set of forwarded
header values (`forward_headers`). Imports the rest of `bridges`, `sidecar.model` and
`sidecar.stores`; exports `UserConnections`, `forwarded`.

A supervisor of such a server holds one `UserConnections` and runs it (`run`) for as long as
its own connection (the one that lists the tools) is up. A call names its user by
`ToolContext.owner` (`user:<name>`): the user's connection is opened on their first call with
the grant stored under `user_grant_key(server, name)`, kept while used, closed after `idle`
seconds without a call, and at most `cap` are open (the least recently used idle one makes
room). A caller without a user, or a user without a grant (or whose grant the server refused),
fails at once, `needs_auth`, naming the command that logs them in; nothing is sent upstream.
With `oauth.grant = "token_exchange"` a user's connection carries instead the token the
identity provider exchanged the call's own bearer token for (renewed when it nears its expiry
or the caller's token changed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

import anyio
import anyio.abc

from bridges.manifest.loading import ServerConfig
from bridges.mcp.connection import Connection
from bridges.mcp.listening import describe
from bridges.mcp.oauth.exchange import BearerAuth, ExchangeRefused
from bridges.mcp.oauth.providers import SidecarAuth, build_auth
from bridges.mcp.oauth.records import (
    LoginStatus,
    RecordStorage,
    canonical_resource,
    login_command,
    user_grant_key,
)
from sidecar.model.errors import ErrorKind, ToolFailure
from sidecar.stores.grants import GrantStore

log = logging.getLogger("bridges.mcp")

IDLE = 300.0
"""Seconds without a call after which a user's connection is closed."""
CAP = 64
"""At most this many users' connections are open per server."""
SWEEP = 1.0
T = TypeVar("T")

Headers = tuple[tuple[str, str], ...]
Exchange = Callable[[str], Awaitable[tuple[str, float | None]]]
"""Exchanges a caller's token for one of the server: (token, absolute expiry or None)."""
Opener = Callable[[str, SidecarAuth | BearerAuth | None, Headers],
                  AbstractAsyncContextManager[Connection]]
"""Opens one connection of the server (a name for the log, its auth, headers to add)."""


def forwarded(names: list[str], caller: object) -> Headers:
    """The `(name, value)` pairs of `names` in the caller's request headers (ASGI pairs)."""
    if not names or not caller:
        return ()
    wanted = {name.lower(): name for name in names}
    found: list[tuple[str, str]] = []
    for raw, value in caller:  # type: ignore[attr-defined]
        name = raw.decode("latin-1").lower()
        if name in wanted:
            found.append((wanted[name], value.decode("latin-1")))
    return tuple(sorted(found))


def caller_bearer(caller: object) -> str | None:
    """The caller's identity-provider access token: the bearer token of its request (ASGI
    header pairs) if it is a JWT (the daemon verified it against the provider before the call
    ran); never the daemon's own or a local token, which must not leave the daemon."""
    for raw, value in caller or ():  # type: ignore[attr-defined]
        if raw.lower() == b"authorization" and value[:7].lower() == b"bearer ":
            token: str = value[7:].decode("latin-1").strip()
            return token if token.count(".") == 2 and not token.startswith("sct_") else None
    return None


class _Entry:
    __slots__ = ("auth", "close", "connection", "failure", "inflight", "key", "last_used",
                 "ready", "status")

    def __init__(self, key: str, auth: SidecarAuth | BearerAuth | None,
                 status: LoginStatus) -> None:
        self.key = key
        self.auth = auth
        self.status = status
        self.connection: Connection | None = None
        self.failure: str | None = None
        self.ready = anyio.Event()
        self.close = anyio.Event()
        self.inflight = 0
        self.last_used = time.monotonic()


class UserConnections:
    def __init__(self, server: str, store: GrantStore | None, opener: Opener, *,
                 per_user: bool, shared: Callable[[], SidecarAuth | None],
                 exchange: Exchange | None = None,
                 on_secret: Callable[[str], None] | None = None,
                 idle: float = IDLE, cap: int = CAP) -> None:
        self.server = server
        self.per_user = per_user or exchange is not None
        self._exchange = exchange
        """Each user's own grant; else every connection carries `shared()` (the server's)."""
        self._shared = shared
        self._store = store
        self._opener = opener
        self._on_secret = on_secret
        self.idle = idle
        self.cap = cap
        self._entries: dict[tuple[str | None, Headers], _Entry] = {}
        self._tg: anyio.abc.TaskGroup | None = None

    def open_users(self) -> list[str | None]:
        """The users whose connection is open (or opening), oldest use first."""
        entries = sorted(self._entries.items(), key=lambda item: item[1].last_used)
        return [user for (user, _), _ in entries]

    async def run(self) -> None:
        """Hold the users' connections until cancelled (they all close then)."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                while True:
                    await anyio.sleep(min(SWEEP, self.idle))
                    now = time.monotonic()
                    for entry in list(self._entries.values()):
                        if entry.inflight == 0 and now - entry.last_used >= self.idle:
                            entry.close.set()
        finally:
            self._tg = None
            self._entries.clear()

    async def call_with(self, owner: str | None, headers: Headers, tool: str,
                        config: ServerConfig,
                        send: Callable[[Connection, Callable[[], str | None]], Awaitable[T]],
                        subject: str | None = None) -> T:
        """Run `send(connection, login hint)` on the connection of `owner`'s user (per user)
        and these forwarded `headers`, opened if needed; `subject`: the caller's bearer
        token (token_exchange)."""
        slot = (_user(owner) if self.per_user else None, headers)
        entry = await self._entry(slot, tool, config, subject)
        entry.inflight += 1
        try:
            assert entry.connection is not None
            return await send(entry.connection, lambda: self._hint(entry))
        finally:
            entry.inflight -= 1
            entry.last_used = time.monotonic()
            if entry.status.needs_login:  # refused: the next call reads the grant afresh
                self._drop(slot, entry)

    def _hint(self, entry: _Entry) -> str | None:
        if entry.status.needs_login:
            return entry.status.hint()
        shared = self._shared() if not self.per_user else None
        status = getattr(shared, "status", None)
        return status.hint() if status is not None and status.needs_login else None

    async def _entry(self, slot: tuple[str | None, Headers], tool: str,
                     config: ServerConfig, subject: str | None = None) -> _Entry:
        user = slot[0]
        if self.per_user and user is None:
            raise self._needs_auth(
                tool, "this call has no user (the server's credentials are per user: sign "
                "in, or use a token made with `sidecar token create --user`)", None)
        entry = self._entries.get(slot)
        if entry is not None and (entry.close.is_set() or (
                entry.connection is not None and entry.connection.lost.is_set())):
            self._entries.pop(slot, None)
            entry = None
        if entry is not None:
            await self._exchanged(entry, subject, tool)
        if entry is None:
            entry = await self._new_entry(user, tool, config)
            await self._exchanged(entry, subject, tool)
            self._entries[slot] = entry
            if self._tg is None:
                self._entries.pop(slot, None)
                raise ToolFailure(f"MCP server {self.server!r} is not connected; tool "
                                  f"{tool!r} was not called",
                                  {"server": self.server, "tool": tool},
                                  kind=ErrorKind.UPSTREAM)
            self._tg.start_soon(self._hold, slot, entry, name=f"mcp {self.server} {entry.key}")
        entry.last_used = time.monotonic()
        with anyio.move_on_after(config.timeouts.startup):
            await entry.ready.wait()
        if entry.connection is not None and not entry.connection.lost.is_set():
            return entry
        self._drop(slot, entry)
        if entry.status.needs_login:
            raise self._needs_auth(tool, entry.status.reason or "a login is needed", entry.key)
        reason = entry.failure or (f"did not connect within {config.timeouts.startup:g} s "
                                   "(timeouts.startup)")
        who = f" (user {user!r})" if user is not None else ""
        raise ToolFailure(
            f"MCP server {self.server!r}{who}: {reason}; tool {tool!r} was not called",
            {"server": self.server, "tool": tool}, kind=ErrorKind.UPSTREAM)

    async def _exchanged(self, entry: _Entry, subject: str | None, tool: str) -> None:
        """Give a token_exchange entry a token for `subject` unless it has a fresh one."""
        auth = entry.auth
        if self._exchange is None or not isinstance(auth, BearerAuth):
            return
        if subject is None:
            raise self._needs_auth(
                tool, "this call carries no access token of the identity provider to "
                "exchange (oauth.grant token_exchange)", None)
        if auth.fresh(subject):
            return
        try:
            token, expires_at = await self._exchange(subject)
        except ExchangeRefused as exc:
            raise self._needs_auth(tool, str(exc), None) from None
        if self._on_secret is not None:
            self._on_secret(token)
        auth.token, auth.expires_at, auth.subject = token, expires_at, subject

    async def _new_entry(self, user: str | None, tool: str, config: ServerConfig) -> _Entry:
        if user is not None and self._exchange is not None:
            key = user_grant_key(self.server, user)
            self._make_room()
            return _Entry(key, BearerAuth(), LoginStatus(key))
        if user is None or self._store is None:
            shared = self._shared()
            status = getattr(shared, "status", None)
            self._make_room()
            return _Entry(self.server, shared,
                          status if isinstance(status, LoginStatus) else LoginStatus(self.server))
        key = user_grant_key(self.server, user)
        assert config.url is not None
        storage = RecordStorage(self._store, key, canonical_resource(config.url))
        if await storage.current() is None:
            raise self._needs_auth(tool, f"user {user!r} has not logged in", key)
        self._make_room()
        status = LoginStatus(key)
        return _Entry(key, build_auth(key, config, self._store, status,
                                      on_secret=self._on_secret), status)

    def _drop(self, slot: tuple[str | None, Headers], entry: _Entry) -> None:
        if self._entries.get(slot) is entry:
            del self._entries[slot]
        entry.close.set()

    def _make_room(self) -> None:
        if len(self._entries) < self.cap:
            return
        idle = [(e.last_used, slot) for slot, e in self._entries.items() if e.inflight == 0]
        if not idle:
            raise ToolFailure(
                f"MCP server {self.server!r}: {self.cap} callers' connections are busy; try "
                "again", {"server": self.server}, kind=ErrorKind.UNAVAILABLE)
        _, slot = min(idle, key=lambda item: item[0])
        self._entries.pop(slot).close.set()

    def _needs_auth(self, tool: str, reason: str, key: str | None) -> ToolFailure:
        how = f"; run `{login_command(key)}`" if key is not None else ""
        return ToolFailure(
            f"MCP server {self.server!r}, tool {tool!r}: needs_auth: {reason}{how}",
            {"server": self.server, "tool": tool, "state": "needs_auth",
             **({"command": login_command(key)} if key is not None else {})},
            kind=ErrorKind.UPSTREAM)

    async def _hold(self, slot: tuple[str | None, Headers], entry: _Entry) -> None:
        user, headers = slot
        try:
            async with self._opener(entry.key, entry.auth, headers) as connection:
                entry.connection = connection
                entry.ready.set()
                if user is not None:
                    log.info("[%s] connected for user %r", self.server, user)
                async with anyio.create_task_group() as tg:
                    async def lost() -> None:
                        await connection.lost.wait()
                        tg.cancel_scope.cancel()

                    tg.start_soon(lost)
                    await entry.close.wait()
                    tg.cancel_scope.cancel()
        except Exception as exc:
            entry.failure = describe(exc)
            if not entry.status.needs_login:
                log.warning("[%s] %s: %s", self.server, entry.key, entry.failure)
        finally:
            entry.close.set()
            entry.ready.set()
            if self._entries.get(slot) is entry:
                del self._entries[slot]


def _user(owner: str | None) -> str | None:
    if owner is None or not owner.startswith("user:") or len(owner) == 5:
        return None
    return owner[5:]
