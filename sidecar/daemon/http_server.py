"""`HttpServer`: the uvicorn server the daemon's doors run on.

uvicorn's own loop wakes every 0.1 s to look at `should_exit` and refreshes its `date` header
on every tenth wake-up: an idle daemon woke ten times a second for it. Here the loop wakes once
a second (the header's resolution), and at once when `should_exit` is set. Signals are not
captured: `serve()` would install handlers that only start a graceful shutdown, and the daemon
closes its Location (children stopped) before it exits.

Imports nothing of ours. Exports `HttpServer`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from uvicorn import Server

__all__ = ["HttpServer"]

TICKS_PER_SECOND = 10
"""uvicorn's `on_tick` counts tenths of a second (its header refresh: every tenth tick)."""
TICK_SECONDS = 1.0


class HttpServer(Server):
    """`uvicorn.Server` with the loop above and no signal capture."""

    tick_seconds = TICK_SECONDS
    _exit_asked: asyncio.Event | None = None
    _exiting = False

    @property
    def should_exit(self) -> bool:
        return self._exiting

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._exiting = value
        if value and self._exit_asked is not None:
            self._exit_asked.set()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def main_loop(self) -> None:
        self._exit_asked = asyncio.Event()
        if self._exiting:
            self._exit_asked.set()
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + round(TICKS_PER_SECOND * self.tick_seconds)) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit_asked.wait(), self.tick_seconds)
