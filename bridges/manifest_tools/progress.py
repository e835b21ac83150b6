"""Output lines of a running command, published as progress snapshots (rate-limited).

Each snapshot is `{"stream": "stdout" | "stderr", "line": <the latest complete line, at most
LINE_CHARS characters>, "lines": <complete lines seen so far on both streams>}`. At most one
snapshot per `interval` seconds is published while output flows, plus a last one when the
command ends, so a chatty command cannot flood the event bus; memory is O(LINE_CHARS) per
stream whatever the line length.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

LINE_CHARS = 500
DEFAULT_INTERVAL = 0.2


class LineProgress:
    def __init__(
        self,
        publish: Callable[[Mapping[str, Any]], None],
        *,
        interval: float = DEFAULT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._publish = publish
        self._interval = interval
        self._clock = clock
        self._carry: dict[str, bytes] = {}
        self._latest: tuple[str, bytes] | None = None
        self._lines = 0
        self._published_lines = 0
        self._last_publish: float | None = None

    @property
    def lines(self) -> int:
        return self._lines

    def feed(self, stream: str, data: bytes) -> None:
        count = data.count(b"\n")
        if count == 0:
            carry = self._carry.get(stream, b"")
            if len(carry) < LINE_CHARS * 4:
                self._carry[stream] = carry + data[: LINE_CHARS * 4 - len(carry)]
            return
        last_newline = data.rfind(b"\n")
        previous = data.rfind(b"\n", 0, last_newline)
        if previous == -1:
            line = self._carry.get(stream, b"") + data[: min(last_newline, LINE_CHARS * 4)]
        else:
            line = data[previous + 1 : min(last_newline, previous + 1 + LINE_CHARS * 4)]
        self._carry[stream] = data[last_newline + 1 : last_newline + 1 + LINE_CHARS * 4]
        self._lines += count
        self._latest = (stream, line)
        now = self._clock()
        if self._last_publish is None or now - self._last_publish >= self._interval:
            self._emit(now)

    def close(self) -> None:
        """Count unterminated last lines and publish what was not published yet."""
        for stream, carry in self._carry.items():
            if carry:
                self._lines += 1
                self._latest = (stream, carry)
        self._carry.clear()
        if self._lines != self._published_lines:
            self._emit(self._clock())

    def _emit(self, now: float) -> None:
        if self._latest is None:
            return
        stream, raw = self._latest
        line = raw.decode("utf-8", "replace").rstrip("\r")[:LINE_CHARS]
        self._publish({"stream": stream, "line": line, "lines": self._lines})
        self._published_lines = self._lines
        self._last_publish = now
