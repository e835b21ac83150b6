"""SIGTERM to `sidecar stdio --standalone` (starting or serving) stops it cleanly
(`sigterm_cancels`): the Location's exit stack stops everything started so far, and the
command then returns normally (exit status 0). `serve` has its own handler, which hands the
signal to uvicorn's graceful shutdown once serving.

The signal's default action would end the process at once, maybe in the middle of opening the
Location: upstream servers that were still starting would be orphaned (SIGINT was fine:
asyncio turns it into a cancellation).

Imports nothing of ours. Exports `sigterm_cancels`.
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
    handler installed later for SIGTERM (uvicorn's) takes over until it is removed. Only that
    cancellation is absorbed, at the top of the daemon command: any other one propagates."""
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
