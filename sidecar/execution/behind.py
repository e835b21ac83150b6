"""Work a settled call owes that its answer need not wait for: its history row and its metrics
(`Seam`'s `audit` and `observers`). By default the seam does that work before `execute`
returns. A frontend that writes the answer itself right after (the MCP facade's fast routes)
runs the call inside `answer_first()`: the seam then queues that work, and it runs when the
block ends, after the answer was written (or failed to be, or the call was cancelled: it runs
in every case, so no row is lost). The values it records are taken when the call settles, so
only when the work runs changes, not what it records.

Why: on a sequential client the answer's way out is the latency; the history row and the
metrics cost a call ~60 µs of the daemon's CPU (`bench/RESULTS.md`, per-step table) that the
client now no longer waits for.

Imports nothing of `sidecar`. Exports `answer_first`, `after_answer` and `later`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

log = logging.getLogger("sidecar.execution")


class _Queue(list[Callable[[], None]]):
    """The jobs of one `answer_first` block; `closed` once it ended (a task started inside
    the block keeps this queue in its context: its calls then run their work at once)."""

    __slots__ = ("closed",)

    def __init__(self) -> None:
        super().__init__()
        self.closed = False


_QUEUED: ContextVar[_Queue | None] = ContextVar("sidecar_behind", default=None)


def later() -> list[Callable[[], None]] | None:
    """The queue of the `answer_first` block the current task is in, or None (run the work
    now)."""
    queue = _QUEUED.get()
    return None if queue is None or queue.closed else queue


def after_answer(job: Callable[..., None], *args: Any) -> None:
    """`job(*args)` now, or, inside an `answer_first` block, as the block ends."""
    queue = later()
    if queue is None:
        job(*args)
    else:
        queue.append(functools.partial(job, *args))


class answer_first:  # lower case: used as `with answer_first():`, as it was a function
    """Within this block, the calls this task settles queue their history row and metrics;
    they run, in order, as the block ends (however it ends). A job that raises is logged, and
    the rest still run. (A class, not a `@contextmanager` generator: a block costs a call
    ~1 µs less.)"""

    __slots__ = ("_queue", "_token")

    def __enter__(self) -> None:
        self._queue = queue = _Queue()
        self._token = _QUEUED.set(queue)

    def __exit__(self, *exc_info: object) -> None:
        _QUEUED.reset(self._token)
        queue = self._queue
        queue.closed = True
        for job in queue:
            try:
                job()
            except Exception:
                log.exception("recording a settled call's history row or metrics failed")
