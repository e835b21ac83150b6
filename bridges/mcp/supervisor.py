"""One supervisor per server: connect, list, register, watch, reconnect (the loop is drawn in
`Supervisor`'s docstring, the states are `bridges.mcp.health`'s). Imports the rest of
`bridges`, `sidecar.model`, `sidecar.registry` and `sidecar.stores`; exports `Supervisor`.

The server's tools live in one registration scope for the supervisor's whole life: the first
listing registers it, every later listing (after a reconnect, a list_changed, a configuration
change) replaces it in place, so its precedence among registrations never changes. Stopping the
supervisor closes the scope. While the server is down its tools stay registered and calls fail
`upstream` with the reason. Nothing here raises into the pool: a failing server only changes
its own health.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
from mcp.client.session import ClientRequestContext, IncomingMessage
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY

from bridges.manifest.loading import ServerConfig
from bridges.manifest.sandbox import describe_sandbox
from bridges.mcp.backoff import Backoff
from bridges.mcp.calls import Caller, log_text
from bridges.mcp.catalog import build_catalog, offered
from bridges.mcp.connection import (
    ConfigProblem,
    Connection,
    Era,
    configured_mode,
    open_connection,
)
from bridges.mcp.health import ServerHealth
from bridges.mcp.listening import ResourceWatch, describe, listen_for_changes, resubscribe
from bridges.mcp.listing import ToolLimit
from bridges.mcp.log_budget import LogBudget
from bridges.mcp.oauth.exchange import exchange_token
from bridges.mcp.oauth.records import canonical_resource
from bridges.mcp.oauth.upstream import UpstreamAuth
from bridges.mcp.passthrough import InflightCall, Relay
from bridges.mcp.per_user import UserConnections
from bridges.mcp.redact import Redactor
from bridges.mcp.results import is_transport_loss
from bridges.mcp.stdio import StderrTail
from bridges.mcp.transport_state import TransportState
from bridges.sandbox import PreparationFailed, pending, prepare
from sidecar.model.errors import RegistrationError
from sidecar.model.permissions import PermissionGate
from sidecar.registry.registry import Scope, Tools
from sidecar.stores.grants import GrantStore

log = logging.getLogger("bridges.mcp")

SAME_FAILURE_LIMIT = 5
"""Start-up failures alike in a row after which a server is `failed` instead of retried."""

RELIST_DEBOUNCE = 0.1
LISTEN_ACK_WAIT = 5.0
"""How long a 2026-07-28 connection waits for its listen stream before it is reported ready."""
STDERR_SETTLE = 1.0
"""Seconds a crash message waits for the server's stderr to end, to quote its last words."""
_LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "notice": logging.INFO,
    "warning": logging.WARNING,
}

_RELAYED_NOTIFICATIONS = (
    types.ResourceUpdatedNotification,
    types.ResourceListChangedNotification,
    types.PromptListChangedNotification,
)

HealthListener = Callable[[str, ServerHealth], None]
ToolsListener = Callable[[str], None]


def _on_listen_stream(notification: Any) -> bool:
    meta = getattr(notification.params, "meta", None)
    return isinstance(meta, dict) and SUBSCRIPTION_ID_META_KEY in meta


class _Permanent(Exception):
    """An attempt failed in a way that retrying cannot fix."""


class _NeedsLogin(Exception):
    """An attempt failed because the server wants an OAuth login."""


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
        self._tools = tools
        self._backoff = backoff
        self._on_health = on_health
        self._on_tools_changed = on_tools_changed
        self._redact = self._redactor(config)
        self._stderr = StderrTail(key, self._redact)
        self._log_budget = LogBudget(key, "log notifications", log)
        self._transport = TransportState()
        self._scope: Scope | None = None
        self._connection: Connection | None = None
        self._watched = ResourceWatch()  # what clients subscribed to, across reconnects
        self._state_changed = anyio.Event()
        self._era: Era | None = None
        self._failures = 0
        self._last_failure: str | None = None
        self._same_failures = 0
        self._stderr_mark = 0
        self._attempts = 0
        self._relist = anyio.Event()
        self._wake = anyio.Event()
        self._restart = False
        self._stopped = False
        self._run_scope: anyio.CancelScope | None = None
        self._attempt_scope: anyio.CancelScope | None = None
        self.settled = anyio.Event()
        self.done = anyio.Event()
        self._health = ServerHealth(server=key, state="starting", transport=config.transport,
                                    sandbox=describe_sandbox(config.sandbox),
                                    since=time.time())
        self._latency_ms: float | None = None  # the last call's, until `health` folds it in
        self.caller = Caller(
            key,
            permissions=permissions,
            current=lambda: (self.config, self._connection),
            wait_ready=self._wait_ready,
            not_connected=self._not_connected,
            failure_detail=self._failure_detail,
            stderr_mark=lambda: self._stderr.mark(),
            record_latency=self._record_latency,
            input_request=self._relay_input_request,
            auth_hint=lambda: self._oauth.hint() if self._oauth is not None else None,
        )
        self.caller.redact = self._redact
        self.caller.users = self._per_user(config)

    @property
    def connection(self) -> Connection | None:
        """The live connection, or None while the server is not ready."""
        connection = self._connection
        return connection if connection is not None and not connection.lost.is_set() else None

    # --- control (called by the pool) ---------------------------------------------------

    def reconfigure(self, config: ServerConfig) -> None:
        """Restart with a new configuration; the registration scope is kept."""
        self.config = config
        self._set(sandbox=describe_sandbox(config.sandbox))
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
        self._last_failure, self._same_failures = None, 0
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
        """Stop without waiting: the connection closes and the child is reaped in `run`."""
        self._stopped = True
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
            if self._scope is not None:
                self._scope.close()
                self._scope = None
                self._tools_changed()
            self.settled.set()
            self.done.set()

    async def _loop(self) -> None:
        while True:
            self._restart = False
            config = self.config
            if config.disabled:
                self._unregister()
                self._set(state="disabled", last_error=None, retry_at=None, pid=None)
                await self._idle()
                continue
            try:
                delay = await self._attempt(config)
            except _NeedsLogin:
                try:
                    await self._wait_for_login()
                    continue
                except Exception as exc:  # e.g. the grant store's database is gone
                    delay = self._defect(exc)
            except _Permanent as exc:
                self._set(state="failed", last_error=self._redact(str(exc)), retry_at=None,
                          pid=None)
                await self._idle()
                continue
            except Exception as exc:
                delay = self._defect(exc)
            if self._restart:
                continue
            self._set(state="backoff", retry_at=time.time() + delay, pid=None)
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
        self._set(last_error=self._redact(f"internal error: {exc!r}"))
        return self._backoff.delay(self._failures)

    async def _wait_for_login(self) -> None:
        """`needs_auth` until a login stores tokens (or the configuration changes)."""
        assert self._oauth is not None
        self._set(state="needs_auth", last_error=self._oauth.hint(), retry_at=None, pid=None)
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
            raise _Permanent(str(exc)) from None
        era = self._era or Era(mode)
        if self._attempts:
            self._set(restarts=self.health.restarts + 1)
        self._attempts += 1
        self._set(state="starting", retry_at=None)
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
                    on_message=self._on_message,
                    on_log=self._on_log,
                    stderr=self._stderr,
                    state=self._transport,
                    sampling=self._on_sampling if self.relay is not None else None,
                    elicitation=self._on_elicitation if self.relay is not None else None,
                    list_roots=self._on_list_roots if self.relay is not None else None,
                    auth=self._oauth.auth if self._oauth is not None else None,
                ) as connection:
                    self._set(pid=self._transport.pid)
                    await self._list_and_register(connection)
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
            raise _Permanent(
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
            raise _NeedsLogin
        up_for = anyio.current_time() - connected_at if connected_at is not None else 0.0
        self._failures = 1 if up_for >= self._backoff.reset_after else self._failures + 1
        log.warning("[%s] %s", self.key, error)
        self._set(last_error=error)
        self._count_same_failure(error if connected_at is None else None)
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
        self._set(preparing=what)
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
            self._set(preparing=None)
        if failure is not None:
            raise failure
        return not scope.cancelled_caught

    def _count_same_failure(self, error: str | None) -> None:
        """A server that fails to start the same way `SAME_FAILURE_LIMIT` times in a row will
        not start by retrying: it goes to `failed` with the reason. A different failure, or a
        server that came up, is transient: backoff goes on. Numbers (pids, ports, times) do
        not make a failure different."""
        shape = re.sub(r"\d+", "#", error) if error is not None else None
        if shape is None or shape != self._last_failure:
            self._last_failure, self._same_failures = shape, (0 if shape is None else 1)
            return
        self._same_failures += 1
        if self._same_failures >= SAME_FAILURE_LIMIT:
            self._last_failure, self._same_failures = None, 0
            raise _Permanent(
                f"{error} (the same failure {SAME_FAILURE_LIMIT} times in a row: not retried "
                "until its manifest entry changes or the daemon restarts)")

    async def _serve(self, connection: Connection) -> None:
        connection.watched = self._watched
        self._connection = connection
        self._era = connection.era()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._relist_loop, connection)
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
                tg.start_soon(listen_for_changes, connection, self._ask_relist, listening,
                              self.key, self._relay_change)
                with anyio.move_on_after(LISTEN_ACK_WAIT):
                    await listening.wait()
            elif self._watched.uris():  # a reconnect: what clients hold is subscribed again
                tg.start_soon(resubscribe, connection, self.key)
            self._set(state="ready", protocol_version=connection.protocol_version,
                      last_error=None)
            self.settled.set()
            log.info("[%s] ready (%s, %d tools)", self.key, connection.protocol_version,
                     self.health.tool_count)
            await connection.lost.wait()
            tg.cancel_scope.cancel()

    def _on_login_change(self, hint: str | None) -> None:
        """While connected: a step-up or a refused refresh (hint), or the login that fixed it."""
        if hint is not None:
            self._set(state="needs_auth", last_error=hint)
        elif self.connection is not None:
            self._set(state="ready", last_error=None)

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
            on_message=self._on_message, on_log=self._on_log,
            stderr=StderrTail(key, self._redact), state=TransportState(),
            sampling=self._on_sampling if self.relay is not None else None,
            elicitation=self._on_elicitation if self.relay is not None else None,
            list_roots=self._on_list_roots if self.relay is not None else None,
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

    async def _failure_detail(self, mark: int) -> str:
        """Why a call's connection ended: the transport's reason and what the server wrote to
        stderr during the call (its last words come after its stdout closed: waited for,
        briefly), else its last stderr lines."""
        await self._stderr.wait_ended(STDERR_SETTLE)
        parts = []
        if self._transport.closing_reason:
            parts.append(self._transport.closing_reason)
        code = self._transport.returncode
        if code is not None:
            parts.append(f"the server process was killed by signal {-code}" if code < 0
                         else f"the server process exited with code {code}")
        during = self._stderr.since(mark)
        if during:
            parts.append(f"its stderr during the call: {during}")
        elif earlier := self._stderr.last_lines(count=2, max_chars=300):
            parts.append(f"it wrote nothing to stderr during the call (earlier: {earlier})")
        else:
            parts.append("it wrote nothing to stderr")
        return "; ".join(parts)

    def _ended(self, what: str) -> str:
        parts = [what]
        if self._transport.closing_reason:
            parts.append(self._transport.closing_reason)
        if self._transport.returncode is not None:
            parts.append(f"the server process exited with code {self._transport.returncode}")
        stderr = self._stderr.since(self._stderr_mark, count=5, max_chars=600)
        if stderr:
            parts.append(f"last stderr: {stderr}")
        return self._redact("; ".join(parts))

    # --- tools ---------------------------------------------------------------------------

    async def _list_and_register(self, connection: Connection) -> None:
        config = self.config
        listing = await connection.list_tools(config.max_listing_bytes, ToolLimit(
            config.max_tools, functools.partial(offered, config=config)))
        # Off the loop (schemas can be megabytes); a start-up timeout that fires meanwhile
        # abandons the thread instead of waiting for it.
        catalog = await anyio.to_thread.run_sync(
            build_catalog, self.key, config, listing.tools, self.caller, abandon_on_cancel=True)
        for skipped in catalog.skipped:
            log.warning("[%s] tool %r left out: %s", self.key, skipped.name, skipped.reason)
        for warning in (listing.warning, listing.cap_reason):
            if warning:
                log.warning("[%s] %s", self.key, warning)
        namespace = self.config.effective_namespace(self.key)
        try:
            if self._scope is None:
                self._scope = self._tools.register(
                    catalog.tools, namespace=namespace, label=f"mcp:{self.key}"
                )
            else:
                self._scope.replace(catalog.tools, namespace=namespace)
        except RegistrationError as exc:
            log.error("[%s] registering its tools failed: %s", self.key, exc)
            self._set(last_error=self._redact(f"registering its tools failed: {exc}"))
            return
        self._set(tool_count=len(catalog.tools), skipped=catalog.skipped,
                  filtered=catalog.filtered, over_max_tools=listing.cap_reason)
        self._tools_changed()

    def _unregister(self) -> None:
        if self._scope is not None:
            self._scope.close()
            self._scope = None
            self._set(tool_count=0, skipped=(), filtered=0, over_max_tools=None)
            self._tools_changed()

    async def _relist_loop(self, connection: Connection) -> None:
        while True:
            await self._relist.wait()
            await anyio.sleep(RELIST_DEBOUNCE)
            self._relist = anyio.Event()  # changes announced from here on list again
            try:
                with anyio.fail_after(self.config.timeouts.startup):
                    await self._list_and_register(connection)
            except Exception as exc:  # a bad listing must not end the connection
                log.warning("[%s] re-listing tools failed: %s", self.key,
                            self._redact(describe(exc)))
                if isinstance(exc, MCPError) and is_transport_loss(exc, direct=False):
                    connection.lost.set()

    def _ask_relist(self) -> None:
        self._relist.set()

    async def _relay_change(self, notification: Any) -> None:
        """A list change or resource update a 2026-07-28 server announced on its listen
        stream."""
        if self.relay is not None:
            await self.relay.notify(self.key, self.caller.calls(), notification)

    async def _on_message(self, message: IncomingMessage) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self._relist.set()
        elif (isinstance(message, _RELAYED_NOTIFICATIONS) and self.relay is not None
              and not _on_listen_stream(message)):
            # a listen stream's frames are relayed by `listen_for_changes` (the SDK tees
            # them here too: relaying both sent every change twice)
            await self.relay.notify(self.key, self.caller.calls(), message)
        elif isinstance(message, Exception):
            log.debug("[%s] transport reported: %s", self.key, self._redact(describe(message)))

    async def _on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        size = len(params.data) if isinstance(params.data, str) else 0
        if not self._log_budget.allow(size):
            return  # a flood: not logged, shown to the call or relayed (summarised instead)
        level = _LOG_LEVELS.get(params.level, logging.ERROR)
        log.log(level, "[%s] log: %s", self.key, log_text(params, self._redact))
        self.caller.on_log(params)
        if self.relay is not None:
            notification = types.LoggingMessageNotification(params=params)
            await self.relay.notify(self.key, self.caller.calls(), notification)

    # --- server-to-client requests (relayed to the client whose call is in flight) -------

    async def _on_sampling(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> Any:
        return await self._relay_request("sampling/createMessage", params)

    async def _on_elicitation(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> Any:
        return await self._relay_request("elicitation/create", params)

    async def _on_list_roots(self, context: ClientRequestContext) -> Any:
        return await self._relay_request("roots/list", None)

    async def _relay_input_request(self, call: InflightCall, request: Any) -> Any:
        relay = self.relay if self.relay is not None else Relay()
        params = getattr(request, "params", None)
        return await relay.request(self.key, [call], request.method, params)

    async def _relay_request(self, method: str, params: Any) -> Any:
        relay = self.relay if self.relay is not None else Relay()
        return await relay.request(self.key, self.caller.calls(), method, params)

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
            changed = self._state_changed
            with anyio.move_on_after(remaining):
                await changed.wait()

    def _not_connected(self) -> str:
        health = self.health
        return health.state + (f": {health.last_error}" if health.last_error else "")

    # --- health --------------------------------------------------------------------------

    @property
    def health(self) -> ServerHealth:
        """The server's health; the last call's latency is folded in when it is read."""
        if self._latency_ms is not None:
            self._health = dataclasses.replace(self._health, last_call_latency_ms=self._latency_ms)
            self._latency_ms = None
        return self._health

    def _record_latency(self, ms: float) -> None:
        # No on_health event (one per call would flood listeners) and no new ServerHealth per
        # call: `health` builds one when it is read.
        self._latency_ms = round(ms, 3)

    def _set(self, **changes: Any) -> None:
        health = self.health
        state_changed = "state" in changes and changes["state"] != health.state
        if state_changed:
            changes["since"] = time.time()
        updated = dataclasses.replace(health, **changes)
        if updated == health:
            return
        self._health = updated
        if state_changed:
            self._state_changed.set()
            self._state_changed = anyio.Event()
        if self._on_health is not None:
            try:
                self._on_health(self.key, updated)
            except Exception:
                log.exception("[%s] on_health callback raised", self.key)

    def _tools_changed(self) -> None:
        if self._on_tools_changed is not None:
            try:
                self._on_tools_changed(self.key)
            except Exception:
                log.exception("[%s] on_tools_changed callback raised", self.key)
