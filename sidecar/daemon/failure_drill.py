"""A failure drill for `sidecar serve`: make a task of the running Location fail on purpose,
so the daemon's failure path (stop serving, close the Location, exit 7:
`sidecar.daemon.daemon.LocationFailed`) can be seen working for real; nothing in the daemon
is known to fail that way.

    SIDECAR_DRILL_LOCATION_FAILURE=1 sidecar serve &
    kill -USR2 $!    # -> "sidecar: stopped: a task of the Location failed: LocationDrill: ..."
    wait $!; echo $? # -> 7

Without the variable (or with any other value than `1`) nothing is installed: SIGUSR2 keeps
its default action. Tests use it (`tests/hardening/test_location_failed_exit.py`); operators
can use it to check that their supervisor restarts a replica that exits 7.

Imports nothing of ours. Exports `failure_drill`, `LocationDrill` and `DRILL_ENV`.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

DRILL_ENV = "SIDECAR_DRILL_LOCATION_FAILURE"


class LocationDrill(Exception):
    """The failure a drill asked for (`SIDECAR_DRILL_LOCATION_FAILURE=1`, then SIGUSR2)."""


@asynccontextmanager
async def failure_drill() -> AsyncIterator[None]:
    """Around serving: with `SIDECAR_DRILL_LOCATION_FAILURE=1`, a task that fails on SIGUSR2
    (its task group cancels the serving task, as a failing supervisor's would); else
    nothing. The handler is removed on the way out. `sidecar serve` (and `sidecar daemon`)
    run it beside the Location's tasks, in a task group of the serving task exactly like the
    upstream servers' supervisors, so the drill takes the same path as a real failure."""
    if os.environ.get(DRILL_ENV, "").strip() != "1":
        yield
        return
    asked = anyio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR2, asked.set)
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_fail_when_asked, asked, name="location failure drill")
            yield
            tasks.cancel_scope.cancel()
    finally:
        loop.remove_signal_handler(signal.SIGUSR2)


async def _fail_when_asked(asked: anyio.Event) -> None:
    await asked.wait()
    raise LocationDrill(f"{DRILL_ENV}=1 and the daemon received SIGUSR2")
