"""In-process events: call progress and outcomes, permission asks, registry and health changes.

The seam publishes; frontends (SSE, MCP progress relays) subscribe. A subscriber that falls
behind loses its oldest events rather than slowing calls down: `dropped` counts them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from sidecar.model.frozen import quick_init


@dataclass(frozen=True, slots=True)
class CallProgress:
    call_id: str
    tool: str
    snapshot: dict[str, Any]


@quick_init  # built for every call
@dataclass(frozen=True, slots=True)
class CallSettled:
    call_id: str
    tool: str
    status: str
    error_kind: str | None


@dataclass(frozen=True, slots=True)
class PermissionAsked:
    ask: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PermissionReplied:
    ask_id: str
    session_id: str
    reply: str


@dataclass(frozen=True, slots=True)
class DefinitionChanged:
    """An upstream tool's definition differs from its pin (`sidecar.policy.pins`)."""

    key: str
    tool: str
    policy: str
    action: str
    diff: list[str]


@dataclass(frozen=True, slots=True)
class RegistryChanged:
    version: int


@dataclass(frozen=True, slots=True)
class ManifestsReloaded:
    ok: bool
    problems: list[dict[str, Any]]
    """With `ok` false the last good configuration keeps running; these say why."""


@dataclass(frozen=True, slots=True)
class ServerHealthChanged:
    server: str
    health: dict[str, Any]


Event = (
    CallProgress
    | CallSettled
    | PermissionAsked
    | PermissionReplied
    | RegistryChanged
    | ServerHealthChanged
    | ManifestsReloaded
    | DefinitionChanged
)


class EventSink(Protocol):
    @property
    def active(self) -> bool:
        """False when nobody listens: publishers may skip building events."""
        ...

    def publish(self, event: Event) -> None: ...


class Subscription:
    __slots__ = ("dropped", "queue")

    def __init__(self, maxsize: int) -> None:
        self.queue: asyncio.Queue[Event] = asyncio.Queue(maxsize)
        self.dropped = 0

    def offer(self, event: Event) -> None:
        if self.queue.full():
            self.queue.get_nowait()
            self.dropped += 1
        self.queue.put_nowait(event)

    async def next(self) -> Event:
        return await self.queue.get()


class EventBus:
    """Fan-out of events to subscribers; publishing never blocks."""

    def __init__(self) -> None:
        self._subscribers: set[Subscription] = set()
        self._listeners: list[Callable[[Event], None]] = []

    @property
    def active(self) -> bool:
        return bool(self._subscribers or self._listeners)

    def publish(self, event: Event) -> None:
        for listener in self._listeners:
            listener(event)
        for sub in self._subscribers:
            sub.offer(event)

    def listen(self, listener: Callable[[Event], None]) -> Callable[[], None]:
        """Call `listener` with every event, inside `publish` (on the publisher's thread, the
        event loop's): for a consumer that only files events away and must never block, it
        saves the task wake-up a subscription costs per event. Returns what removes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    @asynccontextmanager
    async def subscribe(self, maxsize: int = 1024) -> AsyncIterator[Subscription]:
        sub = Subscription(maxsize)
        self._subscribers.add(sub)
        try:
            yield sub
        finally:
            self._subscribers.discard(sub)
