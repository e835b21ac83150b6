"""A per-server budget for the lines an upstream may put into the daemon log.

An upstream writing 100,000 log notifications or megabytes of stderr grew the daemon log
without bound (69 MB in one attack). Each server gets, per source (`stderr`, `log`), a token
bucket: a burst of `BURST` lines, refilled at `RATE` lines per second. Lines past the budget
are counted, not logged; one summary line says how many lines and bytes were dropped, when
the budget allows a line again, at least once a minute while a flood lasts, and when the
source ends. What the daemon keeps for error messages (the stderr tail) is unaffected.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

RATE = 20.0
"""Lines per second a server may log, per source, once its burst is spent."""
BURST = 200
SUMMARY_EVERY = 60.0
"""While lines are being dropped, a summary at least this often (seconds)."""


class LogBudget:
    """`allow(size)` before logging one line of `size` bytes; `flush()` when the source ends."""

    __slots__ = ("_clock", "_dropped", "_dropped_bytes", "_first_drop", "_logger", "_server",
                 "_source", "_tokens", "_updated", "dropped_total")

    def __init__(
        self, server: str, source: str, logger: logging.Logger,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._server = server
        self._source = source
        self._logger = logger
        self._clock = clock
        self._tokens = float(BURST)
        self._updated = clock()
        self._dropped = 0
        self._dropped_bytes = 0
        self._first_drop = 0.0
        self.dropped_total = 0
        """Lines dropped since the budget was made."""

    def allow(self, size: int) -> bool:
        now = self._clock()
        self._tokens = min(float(BURST), self._tokens + (now - self._updated) * RATE)
        self._updated = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            self.flush()
            return True
        if not self._dropped:
            self._first_drop = now
        self._dropped += 1
        self._dropped_bytes += size
        self.dropped_total += 1
        if now - self._first_drop >= SUMMARY_EVERY:
            self.flush()
        return False

    def flush(self) -> None:
        """Log the summary of what was dropped, if anything was."""
        if not self._dropped:
            return
        seconds = max(self._clock() - self._first_drop, 0.0)
        self._logger.warning(
            "[%s] %s: %s lines (%s bytes) not logged in the last %.0f s: over %g lines/s",
            self._server, self._source, f"{self._dropped:,}", f"{self._dropped_bytes:,}",
            seconds, RATE,
        )
        self._dropped = 0
        self._dropped_bytes = 0
