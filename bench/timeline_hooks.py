"""Time stamps on a `sidecar stdio` daemon's call path, for `bench/call_timeline.py`.

`install(out)` wraps nine functions the fast path of a `tools/call` goes through (the
facade's request and answer, the upstream request, the outcome record and its writer thread);
each wrapper appends `(label, perf_counter_ns())` to a list, and the list is written to `out` as
JSON when the process exits. Each wrapper costs about a microsecond: the segments it measures
are tens to hundreds of microseconds. Bench only: nothing in the daemon imports this module.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import json
import time
from pathlib import Path
from typing import Any

EVENTS: list[tuple[str, int]] = []


def mark(label: str) -> None:
    EVENTS.append((label, time.perf_counter_ns()))


def _around(owner: Any, name: str, before: str | None, after: str | None = None) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def sync(*args: Any, **kwargs: Any) -> Any:
        if before is not None:
            mark(before)
        result = original(*args, **kwargs)
        if after is not None:
            mark(after)
        return result

    @functools.wraps(original)
    async def coro(*args: Any, **kwargs: Any) -> Any:
        if before is not None:
            mark(before)
        result = await original(*args, **kwargs)
        if after is not None:
            mark(after)
        return result

    setattr(owner, name, coro if inspect.iscoroutinefunction(original) else sync)


def install(out: Path) -> None:
    from bridges.mcp import stdio
    from sidecar import outcome_log
    from sidecar.serve.mcp_facade import fastpath

    request = fastpath.FastCalls._request

    def tools_call(self: Any, request_id: Any, method: str, params: Any) -> bool:
        if method == "tools/call":
            mark("in")
        return request(self, request_id, method, params)

    fastpath.FastCalls._request = tools_call  # type: ignore[method-assign]
    _around(stdio.DirectRequests, "_write", "write")
    _around(stdio.DirectRequests, "deliver", "answer")
    _around(stdio.DirectRequests, "request", None, "resumed")
    _around(outcome_log.SqliteOutcomeLog, "record", "record", "recorded")
    _around(outcome_log._Worker, "submit", "submit")
    _around(outcome_log._Worker, "_run", "txn", "txn done")
    _around(outcome_log, "_settle", "settle")
    _around(fastpath.FastCalls, "_send", "send", "sent")
    atexit.register(_dump, out)


def _dump(out: Path) -> None:
    out.write_text(json.dumps(EVENTS))


def calls(events: list[tuple[str, int]]) -> list[dict[str, int]]:
    """The events grouped by call (sequential calls: each group starts at `in`), the first
    time of each label in it."""
    grouped: list[dict[str, int]] = []
    for label, at in events:
        if label == "in":
            grouped.append({})
        if grouped and label not in grouped[-1]:
            grouped[-1][label] = at
    return grouped


Segment = tuple[str, str, str]
SEGMENTS: tuple[Segment, ...] = (
    ("in", "write", "request in -> upstream request written (task start, seam input side, "
     "the bridge's request)"),
    ("write", "answer", "upstream round trip (its process, two pipes)"),
    ("answer", "resumed", "answer parsed -> the call's task runs"),
    ("resumed", "record", "result side (validation, mapping, bounding, outcome)"),
    ("record", "submit", "outcome record: the row's JSON"),
    ("submit", "txn", "outcome record: queue + writer thread wake-up"),
    ("txn", "txn done", "outcome record: SQLite INSERT + commit (writer thread)"),
    ("txn done", "settle", "outcome record: writer -> loop wake-up"),
    ("settle", "recorded", "outcome record: the seam runs again"),
    ("recorded", "send", "answer: the wire result and its JSON"),
    ("send", "sent", "answer: written on stdout"),
)
"""(from, to, what): the call's path in order; `sent` -> the next `in` is the client's turn."""


def segment_times(grouped: list[dict[str, int]]) -> dict[Segment | str, list[float]]:
    """Microseconds per segment over the calls that have both ends, and `client` (the answer
    written -> the next request taken)."""
    times: dict[Segment | str, list[float]] = {segment: [] for segment in SEGMENTS}
    times["client"] = []
    for call, following in zip(grouped, [*grouped[1:], None], strict=True):
        for segment in SEGMENTS:
            start, end = call.get(segment[0]), call.get(segment[1])
            if start is not None and end is not None:
                times[segment].append((end - start) / 1000)
        if following is not None and "sent" in call and "in" in following:
            times["client"].append((following["in"] - call["sent"]) / 1000)
    return times

