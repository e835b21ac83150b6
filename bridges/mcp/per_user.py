"""Credentials per user (`oauth.per_user`): one upstream connection per (server, user), each
authorized with that user's own grant. Imports the rest of `bridges`, `sidecar.model` and
`sidecar.stores`; exports `UserConnections`.

A supervisor of a per-user server holds one `UserConnections` and runs it (`run`) for as long
as its own connection (the one that lists the tools) is up. A call names its user by
`ToolContext.owner` (`user:<name>`): the user's connection is opened on their first call with
the grant stored under `user_grant_key(server, name)`, kept while used, closed after `idle`
seconds without a call, and at most `cap` are open (the least recently used idle one makes
room). A caller without a user, or a user without a grant (or whose grant the server refused),
fails at once, `needs_auth`, naming the command that logs them in; nothing is sent upstream.
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

Opener = Callable[[str, SidecarAuth], AbstractAsyncContextManager[Connection]]
"""Opens one connection of the server (key of the grant, its auth)."""


class _Entry:
    __slots__ = ("auth", "close", "connection", "failure", "inflight", "key", "last_used",
                 "ready", "status")

    def __init__(self, key: str, auth: SidecarAuth, status: LoginStatus) -> None:
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
    def __init__(self, server: str, store: GrantStore, opener: Opener, *,
                 on_secret: Callable[[str], None] | None = None,
                 idle: float = IDLE, cap: int = CAP) -> None:
        self.server = server
        self._store = store
        self._opener = opener
        self._on_secret = on_secret
        self.idle = idle
        self.cap = cap
        self._entries: dict[str, _Entry] = {}
        self._tg: anyio.abc.TaskGroup | None = None

    def open_users(self) -> list[str]:
        """The users whose connection is open (or opening), oldest use first."""
        entries = sorted(self._entries.items(), key=lambda item: item[1].last_used)
        return [user for user, _ in entries]

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

    async def call_with(self, owner: str | None, tool: str, config: ServerConfig,
                        send: Callable[[Connection], Awaitable[T]]) -> T:
        """Run `send` on the connection of `owner`'s user (opened if needed)."""
        entry = await self._entry(owner, tool, config)
        entry.inflight += 1
        try:
            assert entry.connection is not None
            return await send(entry.connection)
        finally:
            entry.inflight -= 1
            entry.last_used = time.monotonic()
            if entry.status.needs_login:  # refused: the next call reads the grant afresh
                self._drop(owner, entry)

    def hint(self, owner: str | None) -> str | None:
        """The login sentence of `owner`'s user while their grant needs a login."""
        user = _user(owner)
        entry = self._entries.get(user) if user is not None else None
        return entry.status.hint() if entry is not None and entry.status.needs_login else None

    async def _entry(self, owner: str | None, tool: str, config: ServerConfig) -> _Entry:
        user = _user(owner)
        if user is None:
            raise self._needs_auth(
                tool, "this call has no user (the server's credentials are per user: sign "
                "in, or use a token made with `sidecar token create --user`)", None)
        key = user_grant_key(self.server, user)
        entry = self._entries.get(user)
        if entry is not None and (entry.close.is_set() or (
                entry.connection is not None and entry.connection.lost.is_set())):
            self._entries.pop(user, None)
            entry = None
        if entry is None:
            assert config.url is not None
            storage = RecordStorage(self._store, key, canonical_resource(config.url))
            if await storage.current() is None:
                raise self._needs_auth(tool, f"user {user!r} has not logged in", key)
            self._make_room()
            status = LoginStatus(key)
            entry = _Entry(key, build_auth(key, config, self._store, status,
                                           on_secret=self._on_secret), status)
            self._entries[user] = entry
            if self._tg is None:
                self._entries.pop(user, None)
                raise ToolFailure(f"MCP server {self.server!r} is not connected; tool "
                                  f"{tool!r} was not called",
                                  {"server": self.server, "tool": tool},
                                  kind=ErrorKind.UPSTREAM)
            self._tg.start_soon(self._hold, user, entry, name=f"mcp {self.server} {key}")
        entry.last_used = time.monotonic()
        with anyio.move_on_after(config.timeouts.startup):
            await entry.ready.wait()
        if entry.connection is not None and not entry.connection.lost.is_set():
            return entry
        self._drop(owner, entry)
        if entry.status.needs_login:
            raise self._needs_auth(tool, entry.status.reason or "a login is needed", key)
        reason = entry.failure or (f"did not connect within {config.timeouts.startup:g} s "
                                   "(timeouts.startup)")
        raise ToolFailure(
            f"MCP server {self.server!r} (user {user!r}): {reason}; tool {tool!r} was not "
            "called", {"server": self.server, "tool": tool}, kind=ErrorKind.UPSTREAM)

    def _drop(self, owner: str | None, entry: _Entry) -> None:
        user = _user(owner)
        if user is not None and self._entries.get(user) is entry:
            del self._entries[user]
        entry.close.set()

    def _make_room(self) -> None:
        if len(self._entries) < self.cap:
            return
        idle = [(e.last_used, u) for u, e in self._entries.items() if e.inflight == 0]
        if not idle:
            raise ToolFailure(
                f"MCP server {self.server!r}: {self.cap} users' connections are busy; try "
                "again", {"server": self.server}, kind=ErrorKind.UNAVAILABLE)
        _, user = min(idle)
        self._entries.pop(user).close.set()

    def _needs_auth(self, tool: str, reason: str, key: str | None) -> ToolFailure:
        how = f"; run `{login_command(key)}`" if key is not None else ""
        return ToolFailure(
            f"MCP server {self.server!r}, tool {tool!r}: needs_auth: {reason}{how}",
            {"server": self.server, "tool": tool, "state": "needs_auth",
             **({"command": login_command(key)} if key is not None else {})},
            kind=ErrorKind.UPSTREAM)

    async def _hold(self, user: str, entry: _Entry) -> None:
        try:
            async with self._opener(entry.key, entry.auth) as connection:
                entry.connection = connection
                entry.ready.set()
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
                log.warning("[%s] user %r: %s", self.server, user, entry.failure)
        finally:
            entry.close.set()
            entry.ready.set()
            if self._entries.get(user) is entry:
                del self._entries[user]


def _user(owner: str | None) -> str | None:
    if owner is None or not owner.startswith("user:") or len(owner) == 5:
        return None
    return owner[5:]
