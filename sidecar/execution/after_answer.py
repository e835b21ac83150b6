"""Work a call's answer does not wait for: the seam's observers (metrics, the console's plots),
its `CallSettled` event and the history row. A transport that answers a call itself opens
`answer_first()` around the call and its answer; the seam then hands that work to `later`,
and it runs once the answer is written (in the same task, before anything else this task
does: a client that reads the history after its answer finds the row). Without it, as for the
Python API and `/v1`, the work runs where it always did. What makes it worth it: the client
reads its answer while the daemon does the bookkeeping, on another core (2026-12-06: the
history row alone was ~37 us of each sequential call's latency).

Imports nothing of the project. Exports `later` and `answer_first`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

log = logging.getLogger("sidecar.execution")

_AFTER: ContextVar[list[Callable[[], None]] | None] = ContextVar("after_answer", default=None)


def later(work: Callable[[], None]) -> None:
    """Run `work` once the answer is written (`answer_first`), else now."""
    pending = _AFTER.get()
    if pending is None:
        work()
    else:
        pending.append(work)


@contextmanager
def answer_first() -> Iterator[None]:
    """Around one call and the writing of its answer: what `later` was given runs on the way
    out, whatever happened (an answer that could not be written included). A failing piece is
    logged and the others still run."""
    pending: list[Callable[[], None]] = []
    token = _AFTER.set(pending)
    try:
        yield
    finally:
        _AFTER.reset(token)
        for work in pending:
            try:
                work()
            except Exception:
                log.exception("bookkeeping after a call's answer failed")
