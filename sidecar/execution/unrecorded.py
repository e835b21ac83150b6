"""Outcomes a durable call produced while the fleet database did not answer: kept in memory
and recorded as soon as the database is back, so the caller's retry with the same call id
replays the outcome instead of running the tool again (docs/fleet.md, "When the database is
down").

Imports `sidecar.model` and `sidecar.stores`. Exports `Unrecorded`, `OutcomeKept` and
`RETRY_SECONDS`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from sidecar.stores.errors import DatabaseUnavailable, database_failure

if TYPE_CHECKING:
    from sidecar.model.outcome import Outcome
    from sidecar.model.tool import ToolContext
    from sidecar.stores.outcome_log import OutcomeLog

__all__ = ["RETRY_SECONDS", "OutcomeKept", "Unrecorded"]

log = logging.getLogger("sidecar.execution.seam")

RETRY_SECONDS = 1.0
"""Pause between two attempts to record a kept outcome."""
KEPT_SECONDS = 3600.0
"""How long an outcome is kept for recording at most (then given up, with a warning)."""


class OutcomeKept(DatabaseUnavailable):
    """A call ran but its outcome could not be recorded: kept (`Unrecorded`), and what the
    caller is told."""

    def __init__(self, outcome: Outcome, call_id: str) -> None:
        super().__init__(
            f"{outcome.tool} ran as call {call_id!r}, but its outcome could not be recorded; "
            "this replica records it once the database is back: retry with the same call id "
            "then (it replays the outcome)")
        self.outcome = outcome


class Unrecorded:
    """The outcomes waiting for the database, one background task each (retrying every
    `RETRY_SECONDS`, given up with a warning after `KEPT_SECONDS`).

    The call's claim stays held meanwhile (it is not released: a duplicate on another replica
    waits for it, and it expires after `SIDECAR_CLAIM_TTL` if this replica dies). A replica
    that stops before the database is back loses the kept outcome: the retry then runs the
    call again."""

    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def __len__(self) -> int:
        return len(self._tasks)

    def keep(self, outcomes: OutcomeLog, location: str, outcome: Outcome,
             context: ToolContext, fingerprint: str) -> None:
        if context.call_id in self._tasks:
            return
        task = asyncio.get_running_loop().create_task(
            self._record(outcomes, location, outcome, context, fingerprint),
            name=f"record:{context.call_id}")
        self._tasks[context.call_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(context.call_id, None))

    async def _record(self, outcomes: OutcomeLog, location: str, outcome: Outcome,
                      context: ToolContext, fingerprint: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + KEPT_SECONDS
        while loop.time() < deadline:
            await asyncio.sleep(RETRY_SECONDS)
            try:
                await outcomes.record(location, outcome, context, fingerprint)
            except Exception as exc:
                if database_failure(exc) is None:
                    log.error("recording the kept outcome of call %s failed; given up",
                              outcome.call_id, exc_info=exc)
                    return
                continue
            log.info("recorded the kept outcome of call %s (the database is back)",
                     outcome.call_id)
            return
        log.warning("the outcome of call %s could not be recorded within %g s; given up",
                    outcome.call_id, KEPT_SECONDS)

    async def aclose(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
