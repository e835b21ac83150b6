"""The shared rounds' port: paused 2026-07-28 `/mcp` calls resumable on any replica of a fleet
(`SharedRounds`; how a round travels is its docstring). Without it (the embedded default) a
paused call resumes only where it paused.

    rounds.held(key, request, resume, ttl)   # the holder lists a paused call it holds
    rounds.dropped(key)                      # resumed by the holder itself, or expired
    answer = await rounds.resume(key, request, responses,   # on any other replica
                                 wants=..., on_note=...)

Imports nothing of the sidecar. Exports `SharedRounds`, `Relay`, `Resume`, `OnNote`,
`RoundUnknown`, `RoundHolderGone` and `RoundLost` (implementation:
`sidecar.backends.postgres.rounds`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

__all__ = ["OnNote", "Relay", "Resume", "RoundHolderGone", "RoundLost", "RoundUnknown",
           "SharedRounds"]


class Relay(Protocol):
    """The holder's line to the request that resumed a call through another replica, while
    the call continues for it. `put` never waits (notes are written in the background, in
    order, and the answer never overtakes one); what is put is the caller's to bound."""

    @property
    def wants(self) -> Any:
        """What the resuming request asked to have relayed (its `resume(wants=)`); None:
        nothing (every note is dropped)."""
        ...

    def put(self, note: Any, *, slot: str | None = None) -> None:
        """Send `note` (JSON-able) on; a note with a `slot` replaces the one of the same slot
        that has not reached the resuming replica yet (the latest progress, say)."""
        ...


Resume = Callable[[Any, Relay], Awaitable[Any]]
"""The holder's continuation of a paused call: takes the client's input responses (as the
resuming replica received them) and the relay to that replica's request, and returns the
call's next state, or None when this replica no longer holds the call (resumed here
meanwhile, or expired)."""

OnNote = Callable[[Any], Awaitable[None]]
"""The resuming replica's receiver of the notes the holder's `Relay` was given."""


class RoundUnknown(Exception):
    """No paused call is listed under that key for that request: never was, already resumed,
    expired, or resumed with other arguments."""


class RoundHolderGone(Exception):
    """The replica holding the paused call stopped (it said so as it shut down, or nothing was
    heard from it for `silent_for` seconds): `before` the responses were handed over (the call
    is lost), or after (its outcome is unknown)."""

    def __init__(self, replica: str, silent_for: float, *, before: bool) -> None:
        self.replica = replica
        self.silent_for = silent_for
        self.before = before
        if before:
            text = (f"requestState belongs to a call paused on replica {replica!r}, which "
                    f"stopped (shut down, or silent for {silent_for:g} s): the paused call "
                    "is gone; call the tool again")
        else:
            text = (f"replica {replica!r}, which held the paused call, stopped while it "
                    f"continued (shut down, or silent for {silent_for:g} s): the call's "
                    "outcome is unknown; call the tool again with the same call id to replay "
                    "it if it was recorded")
        super().__init__(text)


class RoundLost(Exception):
    """The fleet database failed for too long while a resume waited: what became of the
    continued call is unknown here."""


class SharedRounds(Protocol):
    """Paused calls of one Location, listed for every replica of a fleet: one held here is
    resumed through any other replica, and any replica resumes one held elsewhere.

    A 2026-07-28 `tools/call` that needs the client's input ends with an `input_required`
    result and a `requestState` token (`sidecar.serve.mcp_facade.rounds`); the call itself
    keeps running, paused, in the replica that answered (the holder). The client's next
    request, carrying its input responses, may reach another replica: that replica hands the
    responses to the holder (`resume`) and answers the client with the holder's next state
    (the result, or the next `input_required`).

    `key` names one paused state (a digest of its token, never the token itself), `request`
    what a resume must repeat (a digest of the tool and its arguments). The values handed
    through are JSON-able; what they mean is the caller's. While the holder continues a call
    for another replica's request, what the call emits on the way (progress, log lines) can
    follow it there: `wants` (what the resuming request asked for) reaches the holder's
    `Resume` with a `Relay`, and every note put into that relay reaches the resuming
    replica's `on_note`, in order, before the answer."""

    async def held(self, key: str, request: str, resume: Resume, ttl: float) -> None:
        """List a paused call this replica holds under `key` for `ttl` seconds: a resume on
        another replica with the same `request` runs `resume` here (once) and hands its
        value back there."""
        ...

    def dropped(self, key: str) -> None:
        """The paused call under `key` was resumed here or expired: it is no longer listed
        (done in the background: the caller never waits for the database)."""
        ...

    async def resume(self, key: str, request: str, responses: Any, *, wants: Any = None,
                     on_note: OnNote | None = None) -> Any:
        """Hand `responses` to the replica holding the paused call under `key` and wait for
        the value of its `resume` (for as long as that replica lives: the call is bounded by
        its own timeout there). The notes its relay was given (asked for with `wants`) go to
        `on_note` meanwhile, in order, all of them before this returns. Raises `RoundUnknown`
        (not listed for `request`, already resumed, expired, or the holder no longer had it),
        `RoundHolderGone` or `RoundLost`; a defect of the holder's `resume` is a
        `RuntimeError` naming it. Cancelling the wait cancels the continued call on the
        holder."""
        ...

    async def aclose(self) -> None: ...
