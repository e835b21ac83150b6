"""A connection's `list_changed` listening in the 2026-07-28 era, and `describe` (one line for
an exception), for the supervisor (`bridges.mcp.supervisor`)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp_types as types
from mcp.client.subscriptions import (
    ListenNotSupportedError,
    PromptsListChanged,
    ResourcesListChanged,
    SubscriptionLost,
    ToolsListChanged,
)
from mcp.shared.exceptions import MCPError

from bridges.mcp.connection import Connection

log = logging.getLogger("bridges.mcp.supervisor")

LISTEN_RETRY = 1.0
"""Seconds before a lost `subscriptions/listen` stream is opened again."""

_AS_NOTIFICATION: dict[type, Callable[[], Any]] = {
    ToolsListChanged: types.ToolListChangedNotification,
    PromptsListChanged: types.PromptListChangedNotification,
    ResourcesListChanged: types.ResourceListChangedNotification,
}


async def listen_for_changes(
    connection: Connection, relist: Callable[[], None], listening: anyio.Event, key: str,
    notify: Callable[[Any], Awaitable[None]] | None = None,
) -> None:
    """2026-07-28: list_changed only arrives while a `subscriptions/listen` is open.

    `listening` is set once the stream is acknowledged (or refused). There is no replay, so
    every acknowledgement (the first one too: the initial listing came before it) is followed
    by one re-list (`relist()`) that catches what changed in between. The stream also asks for
    prompts and resources list changes (a server honors the subset it has); every change (tools too,
    even when a re-list finds the same tools) is handed to `notify` as the 2025 notification,
    so subscribed clients hear what the server said."""
    try:
        while not connection.lost.is_set():
            try:
                async with connection.client.listen(
                    tools_list_changed=True, prompts_list_changed=True,
                    resources_list_changed=True,
                ) as subscription:
                    listening.set()
                    relist()
                    async for event in subscription:
                        if isinstance(event, ToolsListChanged):
                            relist()
                        notification = _AS_NOTIFICATION.get(type(event))
                        if notify is not None and notification is not None:
                            await notify(notification())
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
        listening.set()


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
