"""`StderrTail`: what an upstream stdio server writes to stderr, logged line by line (redacted),
with its last 64 KiB kept for health and error messages. Fed by the stdio transport's stderr
pump (`bridges.mcp.stdio`).
"""

from __future__ import annotations

import logging
from typing import Any

import anyio

from bridges.mcp.log_budget import LogBudget
from bridges.mcp.redact import Redactor

log = logging.getLogger("bridges.mcp.stdio")

STDERR_TAIL_BYTES = 64 * 1024
_STDERR_LINE_LIMIT = 4096


class StderrTail:
    """Keeps the last `limit` bytes a child wrote to stderr and logs each line (redacted)."""

    __slots__ = (
        "_budget",
        "_buffer",
        "_ended",
        "_fed",
        "_limit",
        "_partial",
        "_redact",
        "_server",
    )

    def __init__(self, server: str, redact: Redactor, limit: int = STDERR_TAIL_BYTES) -> None:
        self._server = server
        self._redact = redact
        self._limit = limit
        self._buffer = bytearray()
        self._partial = bytearray()
        self._fed = 0
        self._ended: anyio.Event | None = None
        self._budget = LogBudget(server, "stderr", log)

    def mark(self) -> int:
        """How many bytes were fed so far: `since(mark)` later quotes what came after."""
        return self._fed

    def started(self) -> None:
        """A new child writes to this tail (`wait_ended` waits for its stderr to end)."""
        self._ended = anyio.Event()

    def ended(self) -> None:
        """The child's stderr reached its end (it exited or closed it)."""
        self._budget.flush()
        if self._ended is not None:
            self._ended.set()

    async def wait_ended(self, seconds: float) -> None:
        """Wait up to `seconds` for the current child's stderr to end: a crashing server
        writes its last words to stderr while its stdout is already closed."""
        if self._ended is not None:
            with anyio.move_on_after(seconds):
                await self._ended.wait()

    def since(self, mark: int, count: int = 8, max_chars: int = 800) -> str:
        """The last non-empty lines written after `mark` (see `last_lines`); empty if none."""
        new = self._fed - mark
        if new <= 0:
            return ""
        data = bytes(self._buffer[-new:]) if new < len(self._buffer) else bytes(self._buffer)
        return _last_lines(self._redact(data.decode("utf-8", "replace")), count, max_chars)

    def feed(self, chunk: bytes) -> None:
        self._fed += len(chunk)
        self._buffer += chunk
        if len(self._buffer) > self._limit:
            del self._buffer[: len(self._buffer) - self._limit]
        self._partial += chunk
        *lines, rest = self._partial.split(b"\n")
        for line in lines:
            self._log(line)
        if len(rest) > _STDERR_LINE_LIMIT:
            self._log(rest)
            rest = bytearray()
        self._partial = bytearray(rest)

    def flush(self) -> None:
        if self._partial:
            self._log(self._partial)
            self._partial = bytearray()

    def _log(self, line: bytes | bytearray) -> None:
        head = bytes(line[:_STDERR_LINE_LIMIT])
        if not head.strip() or not self._budget.allow(len(line)):
            return  # blank, or over the server's log budget (counted, summarised later)
        text = head.decode("utf-8", "replace").rstrip()
        log.info("[%s] %s", self._server, self._redact(text))

    def text(self) -> str:
        """Everything kept (at most `limit` bytes), decoded and redacted."""
        return self._redact(bytes(self._buffer).decode("utf-8", "replace"))

    def read(self, after: int = 0) -> tuple[int, str]:
        """(mark, text): the text fed after mark `after` (all that is kept when more was fed
        since, or when `after` is past the end), decoded and redacted, and the mark now."""
        new = self._fed - after
        if new == 0:
            return self._fed, ""
        data = bytes(self._buffer[-new:]) if 0 < new < len(self._buffer) else bytes(self._buffer)
        return self._fed, self._redact(data.decode("utf-8", "replace"))

    def last_lines(self, count: int = 5, max_chars: int = 600) -> str:
        """The last few non-empty lines, for an error message; empty if there are none."""
        return _last_lines(self.text(), count, max_chars)


def _last_lines(text: str, count: int, max_chars: int) -> str:
    """The last `count` distinct runs of non-empty lines, a line repeated in a row shown once
    with its count (`line (x12)`), joined with " | " and cut to `max_chars` from the end."""
    runs: list[list[Any]] = []  # [line, times]
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if runs and runs[-1][0] == line:
            runs[-1][1] += 1
        else:
            runs.append([line, 1])
    joined = " | ".join(line if times == 1 else f"{line} (x{times})"
                        for line, times in runs[-count:])
    return joined if len(joined) <= max_chars else "..." + joined[-max_chars:]
