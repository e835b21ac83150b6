"""Why a server's start-up or call failed, and when retrying stops: `Permanent` (retrying cannot
help), `NeedsLogin` (the server wants an OAuth login), `SameFailures` (the same start-up
failure `SAME_FAILURE_LIMIT` times in a row is `Permanent`), `attempt_error` (an attempt's
error: the transport's reason, the exit code, this attempt's stderr) and `call_failure_detail`
(why a call's connection ended). Imports `bridges.mcp.stderr_tail`,
`bridges.mcp.transport_state`; exports those and `STDERR_SETTLE`.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from bridges.mcp.stderr_tail import StderrTail
from bridges.mcp.transport_state import TransportState

SAME_FAILURE_LIMIT = 5
"""Start-up failures alike in a row after which a server is `failed` instead of retried."""
STDERR_SETTLE = 1.0
"""Seconds a crash message waits for the server's stderr to end, to quote its last words."""


class Permanent(Exception):
    """An attempt failed in a way that retrying cannot fix."""


class NeedsLogin(Exception):
    """An attempt failed because the server wants an OAuth login."""


class SameFailures:
    """The start-up failures alike in a row (their shape: numbers do not count)."""

    __slots__ = ("_last", "_same")

    def __init__(self) -> None:
        self._last: str | None = None
        self._same = 0

    def reset(self) -> None:
        self._last, self._same = None, 0

    def count(self, error: str | None) -> None:
        """A server that fails to start the same way `SAME_FAILURE_LIMIT` times in a row will
        not start by retrying: `Permanent`, with the reason. A different failure, or a server
        that came up (None), is transient: backoff goes on. Numbers (pids, ports, times) do
        not make a failure different."""
        shape = re.sub(r"\d+", "#", error) if error is not None else None
        if shape is None or shape != self._last:
            self._last, self._same = shape, (0 if shape is None else 1)
            return
        self._same += 1
        if self._same >= SAME_FAILURE_LIMIT:
            self._last, self._same = None, 0
            raise Permanent(
                f"{error} (the same failure {SAME_FAILURE_LIMIT} times in a row: not retried "
                "until its manifest entry changes or the daemon restarts)")


async def call_failure_detail(stderr: StderrTail, transport: TransportState, mark: int) -> str:
    """Why a call's connection ended: the transport's reason and what the server wrote to
    stderr during the call (its last words come after its stdout closed: waited for,
    briefly), else its last stderr lines."""
    await stderr.wait_ended(STDERR_SETTLE)
    parts = []
    if transport.closing_reason:
        parts.append(transport.closing_reason)
    code = transport.returncode
    if code is not None:
        parts.append(f"the server process was killed by signal {-code}" if code < 0
                     else f"the server process exited with code {code}")
    during = stderr.since(mark)
    if during:
        parts.append(f"its stderr during the call: {during}")
    elif earlier := stderr.last_lines(count=2, max_chars=300):
        parts.append(f"it wrote nothing to stderr during the call (earlier: {earlier})")
    else:
        parts.append("it wrote nothing to stderr")
    return "; ".join(parts)


def attempt_error(what: str, transport: TransportState, stderr: StderrTail, mark: int,
                  redact: Callable[[str], str]) -> str:
    """`what` ended an attempt, with the transport's reason, the exit code and what the server
    wrote to stderr since `mark` (the attempt's start), redacted."""
    parts = [what]
    if transport.closing_reason:
        parts.append(transport.closing_reason)
    if transport.returncode is not None:
        parts.append(f"the server process exited with code {transport.returncode}")
    tail = stderr.since(mark, count=5, max_chars=600)
    if tail:
        parts.append(f"last stderr: {tail}")
    return redact("; ".join(parts))
