"""The shared cancels' port: cancel requests between the replicas of a fleet, so `DELETE
/v1/calls/{id}` on any replica reaches the replica running the call. Without it (the embedded
default) a call is cancelled only by the process running it.

Imports nothing of the sidecar. Exports `SharedCancels` (implementation:
`sidecar.backends.postgres.cancels`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

__all__ = ["SharedCancels"]


class SharedCancels(Protocol):
    """Cancel requests between the replicas of a fleet, for one Location: `DELETE
    /v1/calls/{id}` on any replica cancels the call on the replica that runs it."""

    async def start(self, cancel_here: Callable[[str], Awaitable[str]]) -> None:
        """Begin answering the requests addressed to this replica with
        `await cancel_here(call_id)`: "cancelling" (it ran here and was cancelled, as a local
        cancel does) or "not_running"."""
        ...

    async def request(self, call_id: str, replica: str, *, wait: float) -> str | None:
        """Ask `replica` to cancel `call_id`: its answer, or None when none came within
        `wait` seconds (that replica is down, stalled or cut off from the database; the
        request is withdrawn)."""
        ...

    async def aclose(self) -> None: ...
