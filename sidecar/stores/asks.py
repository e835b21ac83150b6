"""The shared asks' port: the pending permission asks of one Location, shared by the replicas
of a fleet (an ask raised on one is listed and answered on any). Without it (the embedded
default) asks live in the process that raised them.

Imports `sidecar.model`. Exports `SharedAsks` and `SharedAnswer` (implementation:
`sidecar.backends.postgres.asks`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sidecar.model.permissions import PendingAsk, Reply

__all__ = ["SharedAnswer", "SharedAsks"]


@dataclass(frozen=True, slots=True)
class SharedAnswer:
    """A reply to a shared ask, as one replica stored it for the fleet."""

    ask_id: str
    session_id: str
    action: str
    reply: Reply
    scope: str
    """"session" or "location": where an `always` rule applies."""
    feedback: str | None
    mine: bool
    """The ask was raised by this replica (it resolves the waiting call)."""


class SharedAsks(Protocol):
    """The pending permission asks of one Location, shared by the replicas of a fleet: an ask
    raised on one is listed and answered on any, and the answer reaches the one waiting.
    Without it (the embedded default) asks live in the process that raised them."""

    async def start(self, answered: Callable[[SharedAnswer], None]) -> None:
        """Begin handing every answer to the Location's asks (any replica's, given on any
        replica) to `answered`; an answer may be handed over more than once."""
        ...

    async def raised(self, ask: PendingAsk, expires_in: float | None) -> None:
        """List `ask` for the fleet until `finished`, or `expires_in` seconds (None: no limit),
        or until this replica stops keeping it alive."""
        ...

    async def finished(self, ask_id: str) -> None:
        """The ask raised here no longer waits (answered, timed out, cancelled)."""
        ...

    async def pending(self, session_id: str | None = None) -> list[PendingAsk]:
        """Every replica's unanswered asks (of `session_id`, when given), oldest first."""
        ...

    async def answer(self, ask_id: str, reply: Reply, *, scope: str,
                     feedback: str | None) -> SharedAnswer | None:
        """Store the first answer to a listed, unanswered ask and tell the replicas; None when
        the ask is not listed or already answered."""
        ...

    async def aclose(self) -> None: ...
