"""`MemoryEventLog`: the embedded `EventLog` (`sidecar.stores.event_log`), a bounded ring of a
Location's newest events in memory.

It listens on the Location's event bus (`EventBus.listen`: each event is filed as it is
published, without a task of its own to wake); every event gets an increasing id. A reader
resumes after `Last-Event-ID` while that id is still kept; when it is older, the reader first
gets a `stream.reset` event saying how many events it missed.

Imports `sidecar.stores` and `sidecar.model`. Exports `MemoryEventLog`.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator, Callable

from sidecar.model.events import CallSettled, Event, EventBus
from sidecar.stores.event_log import LoggedEvent, encode_event

__all__ = ["MemoryEventLog"]


class MemoryEventLog:
    """Implements `EventLog` (`sidecar.stores.event_log`) in memory: the newest `capacity`
    events."""

    def __init__(self, bus: EventBus, *, capacity: int = 2048) -> None:
        self._bus = bus
        self._buffer: deque[LoggedEvent] = deque(maxlen=capacity)
        self._next_id = 1
        self._waiter: asyncio.Event | None = None
        """Set (and dropped) at the next event; made only while a reader waits."""
        self._stop: Callable[[], None] | None = None

    async def start(self) -> None:
        self._stop = self._bus.listen(self._take)

    async def aclose(self) -> None:
        stop, self._stop = self._stop, None
        if stop is not None:
            stop()

    def _take(self, event: Event) -> None:
        # A call's outcome (plain strings) is encoded when read; an event holding a dict now,
        # in case its producer changes that dict later.
        logged = (LoggedEvent(self._next_id, event) if type(event) is CallSettled
                  else LoggedEvent(self._next_id, None, encode_event(event)))
        self._buffer.append(logged)
        self._next_id += 1
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.set()

    @property
    def last_id(self) -> int:
        return self._next_id - 1

    def after(self, last_id: int) -> tuple[list[LoggedEvent], int]:
        """Buffered events after `last_id`, and how many after it were already dropped."""
        events = [e for e in self._buffer if e.id > last_id]
        first_kept = self._buffer[0].id if self._buffer else self._next_id
        missed = max(0, first_kept - last_id - 1) if last_id < first_kept - 1 else 0
        return events, missed

    async def follow(self, last_id: int | None) -> AsyncIterator[LoggedEvent]:
        """Events after `last_id` (None: only new ones), forever."""
        cursor = self.last_id if last_id is None else last_id
        if last_id is not None:
            events, missed = self.after(cursor)
            if missed:
                data = json.dumps({"missed": missed, "oldest_available": events[0].id
                                   if events else self._next_id})
                yield LoggedEvent(cursor, None, ("stream.reset", data))
            for event in events:
                yield event
                cursor = event.id
        while True:
            if self.last_id <= cursor:
                if self._waiter is None:
                    self._waiter = asyncio.Event()
                await self._waiter.wait()
                continue
            events, _ = self.after(cursor)
            for event in events:
                yield event
                cursor = event.id
