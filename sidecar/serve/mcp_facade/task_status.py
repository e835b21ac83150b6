"""Task status notifications (SEP-2663 "Task Status Notifications"): `notifications/tasks` on
the client's `subscriptions/listen` streams (`TaskStatusStreams`).

A client that declared the tasks extension lists task ids in its listen request's filter
(`params.notifications.taskIds`; without the extension: -32021). The acknowledgement names the
ids the facade holds (`honored`), then the stream carries each one's complete `DetailedTask`,
what `tasks/get` would return: once at once, then at each status change. A change is sent
as the task stands when it is written, so a stream never carries an older state after a newer
one. The same on stdio and streamable HTTP: the listen request's own response stream; the rest
of the stream (list changes, resource updates) stays the listen handler's it wraps.

May import the MCP SDK only. Exports `TaskStatusStreams`, `NOTIFICATION` and `task_ids`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, Literal, cast

import anyio
import anyio.abc
import mcp_types as types
from anyio.streams.memory import MemoryObjectSendStream
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import SUBSCRIPTION_ID_META_KEY
from pydantic import BaseModel

log = logging.getLogger("sidecar.mcp")
NOTIFICATION = "notifications/tasks"
BACKLOG = 256
"""Changes a stream may have unsent before it skips to the latest state (never blocking)."""
Listen = Callable[[ServerRequestContext[Any, Any], types.SubscriptionsListenRequestParams],
                  Awaitable[types.SubscriptionsListenResult]]
Detailed = Callable[[str], dict[str, Any] | None]
"""A held task's `DetailedTask` by id (None: no longer held)."""


class TaskStatusNotification(BaseModel):
    method: Literal["notifications/tasks"] = "notifications/tasks"
    params: dict[str, Any]


def task_ids(params: types.SubscriptionsListenRequestParams) -> list[str]:
    """The task ids a listen request's filter asks about (`taskIds`, an extension field)."""
    wanted = (params.notifications.model_extra or {}).get("taskIds")
    if not isinstance(wanted, list):
        return []
    return list(dict.fromkeys(t for t in wanted if isinstance(t, str)))


class TaskStatusStreams:
    """The open listen streams by task id; `changed(task_id)` wakes those that follow it."""

    def __init__(self) -> None:
        self._streams: dict[str, set[MemoryObjectSendStream[str]]] = {}

    def changed(self, task_id: str) -> None:
        for send in list(self._streams.get(task_id, ())):
            try:
                send.send_nowait(task_id)
            except anyio.WouldBlock:
                pass  # a wake-up is already queued: the latest state goes out with it
            except anyio.ClosedResourceError:
                self._streams[task_id].discard(send)

    async def listen(
        self, ctx: ServerRequestContext[Any, Any],
        params: types.SubscriptionsListenRequestParams, honored: Sequence[str],
        detailed: Detailed, inner: Listen,
    ) -> types.SubscriptionsListenResult:
        """Serve the listen stream with `inner`, with `notifications/tasks` for `honored` (the
        requested ids this facade holds) added to its acknowledgement and its stream."""
        send, recv = anyio.create_memory_object_stream[str](BACKLOG)
        for task_id in honored:
            self._streams.setdefault(task_id, set()).add(send)
        acked = anyio.Event()
        session = _Acknowledging(ctx.session, list(honored), acked)
        subscription: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: ctx.request_id}
        sent: dict[str, tuple[Any, Any]] = {}

        async def push(task_id: str) -> None:
            state = detailed(task_id)
            if state is None:
                return
            mark = (state.get("status"), state.get("lastUpdatedAt"))
            if sent.get(task_id) == mark:
                return
            sent[task_id] = mark
            notification = TaskStatusNotification(params={**state, "_meta": subscription})
            await ctx.session.send_notification(cast("Any", notification),
                                                related_request_id=ctx.request_id)

        async def forward() -> None:
            await acked.wait()
            try:
                for task_id in honored:  # the state now, then every change
                    await push(task_id)
                async for task_id in recv:
                    await push(task_id)
            except Exception as exc:  # the client is gone: the listen handler ends too
                log.debug("task status notifications stopped: %r", exc)

        failure: Exception | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(forward)
                try:
                    result = await inner(replace(ctx, session=cast("Any", session)), params)
                except Exception as exc:  # raised as it is, not in the task group's group
                    failure = exc
                finally:
                    tg.cancel_scope.cancel()
            if failure is not None:
                raise failure
            return result
        finally:
            for task_id in honored:
                followers = self._streams.get(task_id, set())
                followers.discard(send)
                if not followers:
                    self._streams.pop(task_id, None)
            send.close()
            recv.close()


class _Acknowledging:
    """The listen request's session, whose acknowledgement also names the honored task ids
    (SEP-2663); `acked` is set once it is written (task notifications come after it)."""

    def __init__(self, session: Any, honored: list[str], acked: anyio.Event) -> None:
        self._session = session
        self._honored = honored
        self._acked = acked

    async def send_notification(
        self, notification: Any, related_request_id: types.RequestId | None = None
    ) -> None:
        is_ack = isinstance(notification, types.SubscriptionsAcknowledgedNotification)
        if is_ack and self._honored:
            agreed = notification.params.notifications.model_copy(
                update={"taskIds": self._honored})
            notification = notification.model_copy(update={"params": notification.params
                                                   .model_copy(update={"notifications": agreed})})
        await self._session.send_notification(notification, related_request_id=related_request_id)
        if is_ack:
            self._acked.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)
