"""A failure drill for `sidecar serve`: make a task of the running Location fail on purpose.

A daemon whose Location fails while it serves stops serving, closes the Location and exits
with status 7 (`sidecar.daemon.daemon.LocationFailed`, `EXIT_LOCATION_FAILED`), for its supervisor
(systemd's `Restart=`, Kubernetes) to start it again. Nothing in the daemon is known to fail
that way (its tasks contain their own errors), so this path is hard to see working. The
drill makes it happen for real: with `SIDECAR_DRILL_LOCATION_FAILURE=1` in its environment,
`sidecar serve` (and `sidecar daemon`) runs one more task beside the Location's, in a task
group of the serving task exactly like the upstream servers' supervisors; on SIGUSR2 that
task raises `LocationDrill`, and the daemon goes through its failure path:

    SIDECAR_DRILL_LOCATION_FAILURE=1 sidecar serve &
    kill -USR2 $!    # -> "sidecar: stopped: a task of the Location failed: LocationDrill: ..."
    wait $!; echo $? # -> 7

Without the variable (or with any other value than `1`) nothing is installed: SIGUSR2 keeps
its default action. Tests use it (`tests/hardening/test_location_failed_exit.py`); operators
can use it to check that their supervisor restarts a replica that exits 7.
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
    nothing. The handler is removed on the way out."""
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
