"""A connection's `subscriptions/listen` stream in the 2026-07-28 era (`listen_for_changes`:
list changes and the resource updates clients subscribed to), the counted set of those
resources (`ResourceWatch`), and `describe` (one line for an exception), for the supervisor
(`bridges.mcp.supervisor`). Imports `bridges.mcp.connection` (types only). Exports
`listen_for_changes`, `resubscribe`, `ResourceWatch`, `describe`, `LISTEN_RETRY` and
`OLD_STREAM_GRACE`."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import mcp_types as types
from mcp.client.subscriptions import (
    ListenNotSupportedError,
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    SubscriptionLost,
    ToolsListChanged,
)
from mcp.shared.exceptions import MCPError

if TYPE_CHECKING:
    from bridges.mcp.connection import Connection

log = logging.getLogger("bridges.mcp.supervisor")

LISTEN_RETRY = 1.0
"""Seconds before a lost `subscriptions/listen` stream is opened again."""
OLD_STREAM_GRACE = 5.0
"""How long the event a replaced stream is handing on may take before that stream closes."""

_AS_NOTIFICATION: dict[type, Callable[[], Any]] = {
    ToolsListChanged: types.ToolListChangedNotification,
    PromptsListChanged: types.PromptListChangedNotification,
    ResourcesListChanged: types.ResourceListChangedNotification,
}

Notify = Callable[[Any], Awaitable[None]]


class ResourceWatch:
    """The resource URIs of one upstream server that clients subscribed to, counted: each
    holder (a facade with sessions subscribed to the URI, a client's own listen stream) holds
    it once and releases it once, so one holder leaving keeps it for the others. The server's
    supervisor owns it (it outlives a reconnect) and hands it to each connection
    (`Connection.watched`); the connection's listen stream asks for exactly these URIs.

    `version` grows with every change of the set; `caught_up` waits until the open stream was
    acknowledged with the current set."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self.version = 0
        self._applied = -1  # the version the open stream was acknowledged with
        self._listening = False  # a stream is open or being (re)opened
        self._wake: anyio.Event | None = None

    def uris(self) -> list[str]:
        return sorted(self._counts)

    def hold(self, uri: str) -> None:
        count = self._counts.get(uri, 0)
        self._counts[uri] = count + 1
        if not count:
            self.version += 1
            self._woken()

    def release(self, uri: str) -> None:
        count = self._counts.get(uri, 0)
        if count > 1:
            self._counts[uri] = count - 1
        elif count == 1:
            del self._counts[uri]
            self.version += 1
            self._woken()

    async def caught_up(self, patience: float) -> None:
        """Until the open listen stream asks for the current set (at once when no stream is
        open or being opened: a handshake-era server, or one that refused to listen); at most
        `patience` seconds."""
        with anyio.move_on_after(patience):
            while self._listening and self._applied < self.version:
                await self._changed()

    async def changed_since(self, version: int) -> None:
        while self.version == version:
            await self._changed()

    def listening(self, on: bool, version: int = -1) -> None:
        """The stream side: a stream was acknowledged with the set of `version` (`on`), or no
        stream is open any more."""
        self._listening = on
        self._applied = version
        self._woken()

    async def _changed(self) -> None:
        if self._wake is None:
            self._wake = anyio.Event()
        await self._wake.wait()

    def _woken(self) -> None:
        if self._wake is not None:
            self._wake.set()
            self._wake = None


async def resubscribe(connection: Connection, key: str) -> None:
    """A handshake-era server forgets its subscriptions with its session: on a new connection
    the URIs clients still hold (`connection.watched`, which outlives a reconnect) are sent
    `resources/subscribe` again. A refusal is one log line; the others are still sent."""
    session = connection.client.session  # `Client.subscribe_resource` warns it is 2025-only
    for uri in connection.watched.uris():
        try:
            await session.send_request(types.SubscribeRequest(
                params=types.SubscribeRequestParams(uri=uri)), types.EmptyResult)
        except MCPError as exc:
            log.info("[%s] resources/subscribe %s again after a reconnect: %s", key, uri,
                     describe(exc))


async def listen_for_changes(
    connection: Connection, relist: Callable[[], None], listening: anyio.Event, key: str,
    notify: Notify | None = None,
) -> None:
    """2026-07-28: list_changed and resources/updated only arrive while a `subscriptions/listen`
    is open.

    `listening` is set once the stream is acknowledged (or refused). There is no replay, so
    every acknowledgement of a new stream (the first one too: the initial listing came before
    it) is followed by one re-list (`relist()`) that catches what changed in between. The stream
    asks for tools, prompts and resources list changes (a server honors the subset it has) and
    for updates of the URIs in `connection.watched`. Every change (tools too, even when a
    re-list finds the same tools) is handed to `notify` as the 2025 notification (an update:
    `notifications/resources/updated` with the server's own URI), so subscribed clients hear
    what the server said.

    When the watched URIs change, a stream asking for the new set is opened first and the old
    one closed once the new one is acknowledged: every change comes on one of the two (one in
    that overlap may come twice, which is harmless: each is a "read it again"), so no re-list
    is needed. An update an upstream sends for a URI before its stream asks for it is not
    delivered (the protocol has no replay); `ResourceWatch.caught_up` lets a subscriber wait."""
    watched = connection.watched
    try:
        while not connection.lost.is_set():
            watched.listening(True)
            try:
                await _follow(connection, watched, relist, listening, key, notify)
                return
            except ListenNotSupportedError:
                return
            except MCPError as exc:
                if exc.code != types.CONNECTION_CLOSED:
                    log.info("[%s] subscriptions/listen refused: %s", key, exc.message)
                return
            except SubscriptionLost:
                await anyio.sleep(LISTEN_RETRY)
    finally:
        watched.listening(False)
        listening.set()


async def _follow(
    connection: Connection, watched: ResourceWatch, relist: Callable[[], None],
    listening: anyio.Event, key: str, notify: Notify | None,
) -> None:
    """Streams one after another (overlapping) until one ends; raises `SubscriptionLost` when
    it was lost."""
    async def on_event(event: ServerEvent) -> None:
        if isinstance(event, ToolsListChanged):
            relist()
        notification = _as_notification(event)
        if notify is not None and notification is not None:
            await notify(notification)

    current: _Stream | None = None
    failure: BaseException | None = None
    async with anyio.create_task_group() as tg:
        while True:
            version = watched.version
            try:
                stream = await _open(tg, on_event, connection, watched.uris(), key)
            except Exception as exc:
                if current is None or isinstance(exc, SubscriptionLost) or _closed(exc):
                    failure = exc  # raised from here once the old streams are closed
                    tg.cancel_scope.cancel()
                    break
                log.info("[%s] subscriptions/listen for the changed resources failed: %s; "
                         "the open stream stays", key, describe(exc))
                stream = current
            watched.listening(True, version)
            if current is None:
                listening.set()
                relist()
            elif stream is not current:
                current.close()
            current = stream
            async with anyio.create_task_group() as either:
                either.start_soon(_then_cancel, either, current.ended.wait)
                either.start_soon(_then_cancel, either, partial(watched.changed_since, version))
            if current.ended.is_set():
                tg.cancel_scope.cancel()
                break
    if failure is not None:
        raise failure
    if current is not None and current.lost is not None:
        raise current.lost


async def _open(
    tg: anyio.abc.TaskGroup, on_event: Callable[[ServerEvent], Awaitable[None]],
    connection: Connection, uris: list[str], key: str,
) -> _Stream:
    """A stream asking for `uris`, acknowledged. A server that refuses a stream asking for
    resource subscriptions gets one without them (its list changes still count)."""
    stream = _Stream(on_event)
    try:
        await tg.start(stream.run, connection, uris)
    except MCPError as exc:
        if not uris or _closed(exc):
            raise
        log.info("[%s] subscriptions/listen for %d resources refused: %s; listening "
                 "without them", key, len(uris), exc.message)
        stream = _Stream(on_event)
        await tg.start(stream.run, connection, [])
    return stream


def _closed(exc: Exception) -> bool:
    return isinstance(exc, MCPError) and exc.code == types.CONNECTION_CLOSED


async def _then_cancel(
    group: anyio.abc.TaskGroup, wait: Callable[[], Awaitable[None]]
) -> None:
    await wait()
    group.cancel_scope.cancel()


class _Stream:
    """One listen stream, run in its own task: acknowledged when `run` has started; `ended`
    is set when the server ends it (`lost`: the `SubscriptionLost`, when it dropped)."""

    def __init__(self, on_event: Callable[[ServerEvent], Awaitable[None]]) -> None:
        self._on_event = on_event
        self._scope = anyio.CancelScope()
        self.ended = anyio.Event()
        self.lost: SubscriptionLost | None = None

    async def run(
        self, connection: Connection, uris: list[str],
        *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        acknowledged = False
        with self._scope:
            try:
                async with connection.client.listen(
                    tools_list_changed=True, prompts_list_changed=True,
                    resources_list_changed=True, resource_subscriptions=uris,
                ) as subscription:
                    acknowledged = True
                    task_status.started()
                    async for event in subscription:
                        # a replaced stream closes between events, never while handing one on
                        with anyio.move_on_after(OLD_STREAM_GRACE, shield=True):
                            await self._on_event(event)
            except SubscriptionLost as exc:
                if not acknowledged:
                    raise
                self.lost = exc
            self.ended.set()

    def close(self) -> None:
        self._scope.cancel()


def _as_notification(event: ServerEvent) -> Any:
    if isinstance(event, ResourceUpdated):
        return types.ResourceUpdatedNotification(
            params=types.ResourceUpdatedNotificationParams(uri=event.uri))
    make = _AS_NOTIFICATION.get(type(event))
    return make() if make is not None else None


def describe(exc: BaseException) -> str:
    """A one-line description of an exception (the first leaf of an exception group)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return f"{exc.message} (JSON-RPC code {exc.code})"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__}: {exc.strerror}"
    text = str(exc).strip().splitlines()
    detail = text[0] if text else ""
    detail = detail if len(detail) <= 300 else detail[:300] + "..."
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
