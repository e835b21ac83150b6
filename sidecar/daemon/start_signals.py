"""SIGTERM to `sidecar stdio --standalone` (starting or serving) stops it cleanly.

The signal's default action would end the process at once, maybe in the middle of opening the
Location: upstream servers that were still starting would be orphaned (SIGINT was fine:
asyncio turns it into a cancellation). `sigterm_cancels()` turns SIGTERM into a cancellation of
the daemon's main task, so the Location's exit stack stops everything started so far, and the
command then returns normally (exit status 0). Only that cancellation is absorbed, at the top
of the daemon command: any other one propagates. (`serve` has its own handler, which hands the
signal to uvicorn's graceful shutdown once serving.)
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

log = logging.getLogger("sidecar.daemon.daemon")


@asynccontextmanager
async def sigterm_cancels() -> AsyncIterator[None]:
    """While the block runs, SIGTERM cancels the current task and the block ends quietly; a
    handler installed later for SIGTERM (uvicorn's) takes over until it is removed."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    terminated = False

    def on_sigterm() -> None:
        nonlocal terminated
        terminated = True
        if task is not None:
            task.cancel()

    try:
        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, Windows
        yield
        return
    try:
        yield
    except asyncio.CancelledError:
        if not terminated or task is None or task.cancelling() > 1:
            raise
        task.uncancel()
        log.info("stopped by SIGTERM; everything started so far was stopped")
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
