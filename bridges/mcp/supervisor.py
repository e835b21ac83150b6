"""One supervisor per server: connect, list, register, watch, reconnect (the loop is drawn in
`Supervisor`'s docstring, the states are `bridges.mcp.health`'s). Imports the rest of
`bridges`, `sidecar.model`, `sidecar.registry` and `sidecar.stores`; exports `Supervisor`.

The server's tools live in one registration scope for the supervisor's whole life
(`bridges.mcp.registration`); stopping the supervisor closes it. While the server is down its
tools stay registered and calls fail `upstream` with the reason. Nothing here raises into the
pool: a failing server only changes its own health (`bridges.mcp.health_book`; why it failed
and when retrying stops: `bridges.mcp.failures`). What the server sends on its own (logs,
notifications, requests) is `bridges.mcp.server_messages`'.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio

from bridges.manifest.loading import ServerConfig
from bridges.manifest.sandbox import describe_sandbox
from bridges.mcp.backoff import Backoff
from bridges.mcp.calls import Caller
from bridges.mcp.connection import (
    ConfigProblem,
    Connection,
    Era,
    configured_mode,
    open_connection,
)
from bridges.mcp.failures import SAME_FAILURE_LIMIT as SAME_FAILURE_LIMIT
from bridges.mcp.failures import STDERR_SETTLE as STDERR_SETTLE
from bridges.mcp.failures import (
    NeedsLogin,
    Permanent,
    SameFailures,
    attempt_error,
    call_failure_detail,
)
from bridges.mcp.health import ServerHealth
from bridges.mcp.health_book import HealthBook, HealthListener, ToolsListener
from bridges.mcp.listening import ResourceWatch, describe, listen_for_changes, resubscribe
from bridges.mcp.oauth.exchange import exchange_token
from bridges.mcp.oauth.records import canonical_resource
from bridges.mcp.oauth.upstream import UpstreamAuth
from bridges.mcp.passthrough import Relay
from bridges.mcp.per_user import UserConnections
from bridges.mcp.redact import Redactor
from bridges.mcp.registration import RELIST_DEBOUNCE as RELIST_DEBOUNCE
from bridges.mcp.registration import ToolRegistration
from bridges.mcp.server_messages import ServerMessages
from bridges.mcp.stdio import StderrTail
from bridges.mcp.transport_state import TransportState
from bridges.sandbox import PreparationFailed, pending, prepare
from sidecar.model.permissions import PermissionGate
from sidecar.registry.registry import Tools
from sidecar.stores.grants import GrantStore

log = logging.getLogger("bridges.mcp")

LISTEN_ACK_WAIT = 5.0
"""How long a 2026-07-28 connection waits for its listen stream before it is reported ready."""


class Supervisor:
    """One server's life, until stopped:

        ┌───────────────────────── run() ─────────────────────────┐
        │ disabled? -> state disabled, wait for a new config       │
        │ attempt:  starting  (spawn/connect, handshake, tools/list│
        │                      all within timeouts.startup)        │
        │           ready     (tools registered; re-list on        │
        │                      list_changed, debounced; wait until │
        │                      the connection is lost)             │
        │ failure:  backoff   (capped exponential + jitter; reset  │
        │                      after sustained uptime), or failed  │
        │                      when retrying cannot help (also:    │
        │                      the same start-up failure 5 times   │
        │                      in a row), or                       │
        │           needs_auth (OAuth: wait for `sidecar auth      │
        │                      login NAME` to store tokens)        │
        └──────────────── loop until stopped ─────────────────────┘
    """

    def __init__(
        self,
        key: str,
        config: ServerConfig,
        *,
        tools: Tools,
        permissions: PermissionGate | None,
        backoff: Backoff,
        on_health: HealthListener | None,
        on_tools_changed: ToolsListener | None,
        relay: Relay | None = None,
        grants: GrantStore | None = None,
    ) -> None:
        self.key = key
        self.relay = relay
        self.config = config
        self._grants = grants
        self._secrets: set[str] = set()
        self._oauth = UpstreamAuth.of(key, config, grants, self._add_secret)
        self._backoff = backoff
        self._redact = self._redactor(config)
        self._stderr = StderrTail(key, self._redact)
        self._transport = TransportState()
        self._connection: Connection | None = None
        self._watched = ResourceWatch()  # what clients subscribed to, across reconnects
        self._era: Era | None = None
        self._failures = 0
        self._same_failures = SameFailures()
        self._stderr_mark = 0
        self._attempts = 0
        self._wake = anyio.Event()
        self._restart = False
        self._stopped = False
        self._run_scope: anyio.CancelScope | None = None
        self._attempt_scope: anyio.CancelScope | None = None
        self.settled = anyio.Event()
        self.done = anyio.Event()
        self._book = HealthBook(key, ServerHealth(
            server=key, state="starting", transport=config.transport,
            sandbox=describe_sandbox(config.sandbox), since=time.time(),
        ), on_health, on_tools_changed)
        self.caller = Caller(
            key,
            permissions=permissions,
            current=lambda: (self.config, self._connection),
            wait_ready=self._wait_ready,
            not_connected=self._not_connected,
            failure_detail=lambda mark: call_failure_detail(self._stderr, self._transport,
                                                            mark),
            stderr_mark=lambda: self._stderr.mark(),
            record_latency=self._book.record_latency,
            input_request=lambda call, request: self._messages.relay_input_request(call,
                                                                                 request),
            auth_hint=lambda: self._oauth.hint() if self._oauth is not None else None,
        )
        self.caller.redact = self._redact
        self.caller.users = self._per_user(config)
        self._registration = ToolRegistration(
            key, tools, self.caller, self._book,
            config=lambda: self.config, redact=lambda text: self._redact(text))
        self._messages = ServerMessages(key, relay, self.caller, redact=lambda: self._redact,
                                        ask_relist=self._registration.ask_relist)

    @property
    def connection(self) -> Connection | None:
        """The live connection, or None while the server is not ready."""
        connection = self._connection
        return connection if connection is not None and not connection.lost.is_set() else None

    # --- control (called by the pool) ---------------------------------------------------

    def reconfigure(self, config: ServerConfig) -> None:
        """Restart with a new configuration; the registration scope is kept."""
        self.config = config
        self._book.set(sandbox=describe_sandbox(config.sandbox))
        self._oauth = UpstreamAuth.of(self.key, config, self._grants, self._add_secret)
        self._redact = self._redactor(config)
        self._stderr = StderrTail(self.key, self._redact)
        self.caller.redact = self._redact
        self.caller.users = self._per_user(config)
        self.restart()

    def restart(self) -> None:
        """Stop the server's process (or connection) and start it again with the same
        configuration, as a configuration change would; its stderr tail is kept."""
        self._era = None
        self._failures = 0
        self._same_failures.reset()
        self._restart = True
        self.settled = anyio.Event()
        if self._attempt_scope is not None:
            self._attempt_scope.cancel()
        self._wake.set()

    @property
    def stderr(self) -> StderrTail:
        """What the server's process writes to stderr (stdio servers; empty otherwise)."""
        return self._stderr

    def request_stop(self) -> None:
        """Stop without waiting: the server's tools leave the registry at once (no new call is
        routed to a server on its way out; calls in flight go on), then the connection closes
        and the child is reaped in `run`."""
        self._stopped = True
        self._registration.close()
        if self._run_scope is not None:
            self._run_scope.cancel()
        self._wake.set()

    async def stop(self) -> None:
        self.request_stop()
        await self.done.wait()

    # --- the supervisor task -------------------------------------------------------------

    async def run(self) -> None:
        try:
            with anyio.CancelScope() as scope:
                self._run_scope = scope
                if not self._stopped:
                    await self._loop()
        finally:
            self._registration.close()
            self.settled.set()
            self.done.set()

    async def _loop(self) -> None:
        while True:
            self._restart = False
            config = self.config
            if config.disabled:
                self._registration.unregister()
                self._book.set(state="disabled", last_error=None, retry_at=None, pid=None)
                await self._idle()
                continue
            try:
                delay = await self._attempt(config)
            except NeedsLogin:
                try:
                    await self._wait_for_login()
                    continue
                except Exception as exc:  # e.g. the grant store's database is gone
                    delay = self._defect(exc)
            except Permanent as exc:
                self._book.set(state="failed", last_error=self._redact(str(exc)),
                               retry_at=None, pid=None)
                await self._idle()
                continue
            except Exception as exc:
                delay = self._defect(exc)
            if self._restart:
                continue
            self._book.set(state="backoff", retry_at=time.time() + delay, pid=None)
            self.settled.set()
            with anyio.move_on_after(delay):
                await self._idle()

    def _defect(self, exc: Exception) -> float:
        """A defect (or a store failing under the supervisor): report it in the log and the
        server's health, and keep supervising: nothing escapes `run`, whose failure would end
        the pool's task group and with it the daemon. The delay before the next attempt."""
        while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]  # from `_wait_for_login`'s task group
        log.error("[%s] supervisor error", self.key, exc_info=exc)
        self._failures += 1
        self._book.set(last_error=self._redact(f"internal error: {exc!r}"))
        return self._backoff.delay(self._failures)

    async def _wait_for_login(self) -> None:
        """`needs_auth` until a login stores tokens (or the configuration changes)."""
        assert self._oauth is not None
        self._book.set(state="needs_auth", last_error=self._oauth.hint(), retry_at=None, pid=None)
        self.settled.set()
        async with anyio.create_task_group() as tg:
            async def logged_in() -> None:
                await self._oauth.wait_for_login()  # type: ignore[union-attr]
                tg.cancel_scope.cancel()

            tg.start_soon(logged_in)
            await self._idle()
            tg.cancel_scope.cancel()

    async def _idle(self) -> None:
        """Wait until reconfigured (or, under move_on_after, until the backoff is over)."""
        self.settled.set()
        self._wake = anyio.Event()
        await self._wake.wait()

    async def _attempt(self, config: ServerConfig) -> float:
        """Connect and serve until the connection ends; return the backoff delay to wait."""
        try:
            mode = configured_mode(config)
        except ConfigProblem as exc:
            raise Permanent(str(exc)) from None
        era = self._era or Era(mode)
        if self._attempts:
            self._book.set(restarts=self.health.restarts + 1)
        self._attempts += 1
        self._book.set(state="starting", retry_at=None)
        self._stderr_mark = self._stderr.mark()  # errors quote this attempt's stderr only
        self._transport.reset()
        connected_at: float | None = None
        error = ""
        try:
            if not await self._prepare_sandbox(config):  # a download: not in timeouts.startup
                return 0.0  # reconfigured or restarted meanwhile
            with anyio.CancelScope(deadline=anyio.current_time() + config.timeouts.startup) as s:
                self._attempt_scope = s
                async with open_connection(
                    self.key,
                    config,
                    era=era,
                    on_message=self._messages.on_message,
                    on_log=self._messages.on_log,
                    stderr=self._stderr,
                    state=self._transport,
                    sampling=self._messages.on_sampling if self.relay is not None else None,
                    elicitation=self._messages.on_elicitation if self.relay is not None else None,
                    list_roots=self._messages.on_list_roots if self.relay is not None else None,
                    auth=self._oauth.auth if self._oauth is not None else None,
                ) as connection:
                    self._book.set(pid=self._transport.pid)
                    await self._registration.list_and_register(connection)
                    s.deadline = math.inf
                    self._transport.ready = True
                    connected_at = anyio.current_time()
                    await self._serve(connection)
                error = self._ended("the connection was closed")
            if s.cancelled_caught and not self._restart:
                error = self._ended(
                    f"did not start within {config.timeouts.startup:g} s (timeouts.startup)"
                )
        except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
            where = f" in {config.cwd!r}" if config.cwd else ""
            raise Permanent(
                f"cannot start {config.command!r}{where}: {exc.strerror or exc}"
            ) from None
        except Exception as exc:
            error = self._ended(describe(exc))
        finally:
            self._attempt_scope = None
            self._connection = None
        if connected_at is None:
            self._era = None  # a remembered era may be what failed: probe afresh next time
        if self._restart:  # a new configuration: start over, no failure to count
            return 0.0
        if self._oauth is not None and self._oauth.status.needs_login:
            log.warning("[%s] %s", self.key, self._oauth.hint())
            raise NeedsLogin
        up_for = anyio.current_time() - connected_at if connected_at is not None else 0.0
        self._failures = 1 if up_for >= self._backoff.reset_after else self._failures + 1
        log.warning("[%s] %s", self.key, error)
        self._book.set(last_error=error)
        self._same_failures.count(error if connected_at is None else None)
        return self._backoff.delay(self._failures)

    async def _prepare_sandbox(self, config: ServerConfig) -> bool:
        """Fetch a sandboxed npx/uvx server's package before its first start, saying so in
        health (`preparing`), bounded by `bridges.sandbox.PREPARE_TIMEOUT`, not by
        timeouts.startup; past that, the server counts as settled (a reload or the daemon's
        start does not wait for a download). False: a new configuration interrupted it."""
        if self.health.sandbox is None or config.command is None:
            return True
        argv = [config.command, *config.args]
        what = await anyio.to_thread.run_sync(functools.partial(
            pending, argv, name=self.key, cwd=config.cwd))
        if what is None:
            return True
        log.info("[%s] preparing its sandbox: %s", self.key, what)
        self._book.set(preparing=what)
        settled, failure = self.settled, None

        async def settle_later() -> None:
            await anyio.sleep(config.timeouts.startup)
            settled.set()

        try:
            with anyio.CancelScope() as scope:
                self._attempt_scope = scope
                async with anyio.create_task_group() as tg:
                    tg.start_soon(settle_later)
                    try:
                        await prepare(argv, name=self.key, cwd=config.cwd,
                                      environ=dict(os.environ))
                    except PreparationFailed as exc:
                        failure = exc
                    tg.cancel_scope.cancel()
        finally:
            self._attempt_scope = None
            self._book.set(preparing=None)
        if failure is not None:
            raise failure
        return not scope.cancelled_caught

    async def _serve(self, connection: Connection) -> None:
        connection.watched = self._watched
        self._connection = connection
        self._era = connection.era()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._registration.relist_loop, connection)
            if self.caller.users is not None:
                tg.start_soon(self.caller.users.run)
            if self._oauth is not None:
                tg.start_soon(self._oauth.keep_fresh)
                tg.start_soon(self._oauth.watch_login, self._on_login_change)
            if connection.modern:
                # 2026-07-28 delivers list_changed and resources/updated only to an open
                # listen stream: be ready only once it is acknowledged, or a change right
                # after startup is lost.
                listening = anyio.Event()
                tg.start_soon(listen_for_changes, connection, self._registration.ask_relist,
                              listening, self.key, self._messages.relay_change)
                with anyio.move_on_after(LISTEN_ACK_WAIT):
                    await listening.wait()
            elif self._watched.uris():  # a reconnect: what clients hold is subscribed again
                tg.start_soon(resubscribe, connection, self.key)
            self._book.set(state="ready", protocol_version=connection.protocol_version,
                           last_error=None)
            self.settled.set()
            log.info("[%s] ready (%s, %d tools)", self.key, connection.protocol_version,
                     self.health.tool_count)
            await connection.lost.wait()
            tg.cancel_scope.cancel()

    def _on_login_change(self, hint: str | None) -> None:
        """While connected: a step-up or a refused refresh (hint), or the login that fixed it."""
        if hint is not None:
            self._book.set(state="needs_auth", last_error=hint)
        elif self.connection is not None:
            self._book.set(state="ready", last_error=None)

    def _per_user(self, config: ServerConfig) -> UserConnections | None:
        """The callers' own connections of a server with credentials per user or
        `forward_headers`, else None."""
        settings = config.oauth if self._oauth is not None else None
        per_user = settings is not None and self._grants is not None and settings.per_user
        exchange = None
        if settings is not None and settings.grant == "token_exchange" and config.url:
            exchange = functools.partial(exchange_token, settings,
                                         canonical_resource(config.url))
        if not per_user and exchange is None and not config.forward_headers:
            return None
        return UserConnections(
            self.key, self._grants, self._open_for_caller, per_user=per_user,
            shared=lambda: self._oauth.auth if self._oauth is not None else None,
            exchange=exchange, on_secret=self._add_secret)

    @asynccontextmanager
    async def _open_for_caller(self, key: str, auth: Any,
                               headers: tuple[tuple[str, str], ...]) -> AsyncIterator[Connection]:
        """One caller's connection: the server's own settings and handlers, the caller's auth
        and forwarded headers."""
        config = self.config
        if headers:
            config = config.model_copy(update={"headers": {**config.headers, **dict(headers)}})
        async with open_connection(
            key, config, era=self._era or Era(configured_mode(config)),
            on_message=self._messages.on_message, on_log=self._messages.on_log,
            stderr=StderrTail(key, self._redact), state=TransportState(),
            sampling=self._messages.on_sampling if self.relay is not None else None,
            elicitation=self._messages.on_elicitation if self.relay is not None else None,
            list_roots=self._messages.on_list_roots if self.relay is not None else None,
            auth=auth,
        ) as connection:
            yield connection

    def _add_secret(self, secret: str) -> None:
        if secret not in self._secrets:
            self._secrets.add(secret)
            self._redact = self._redactor(self.config)
            self.caller.redact = self._redact

    def _redactor(self, config: ServerConfig) -> Redactor:
        oauth = config.oauth
        extra = [*self._secrets, *((oauth.client_secret, oauth.private_key) if oauth else ())]
        return Redactor.for_server(config.env, config.headers, config.url, extra)

    def _ended(self, what: str) -> str:
        return attempt_error(what, self._transport, self._stderr, self._stderr_mark,
                             self._redact)

    # --- calls ---------------------------------------------------------------------------

    async def _wait_ready(self, patience: float) -> Connection | None:
        """The live connection, waiting up to `patience` seconds for the server's next
        connection attempt to succeed; None once that attempt failed (or none is due)."""
        deadline = anyio.current_time() + patience
        saw_attempt = False
        while True:
            connection = self._connection
            if connection is not None and not connection.lost.is_set():
                return connection
            health = self.health
            remaining = deadline - anyio.current_time()
            if health.state == "starting":
                saw_attempt = True
            elif health.state == "backoff":
                if saw_attempt:
                    return None  # the attempt we waited for failed
                if health.retry_at is not None and health.retry_at - time.time() > remaining:
                    return None
            elif health.state != "ready":  # failed, disabled
                return None
            if remaining <= 0:
                return None
            changed = self._book.state_changed
            with anyio.move_on_after(remaining):
                await changed.wait()

    def _not_connected(self) -> str:
        health = self.health
        return health.state + (f": {health.last_error}" if health.last_error else "")

    # --- health --------------------------------------------------------------------------

    @property
    def health(self) -> ServerHealth:
        """The server's health; the last call's latency is folded in when it is read."""
        return self._book.health
