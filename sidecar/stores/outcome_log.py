"""The outcome log's port: durable terminal outcomes (step 10 of the seam), one per `call_id`
and Location, with the value types every implementation shares.

A call id answers only the call it was first used for: `record`, `get` and `claim` take the
call's fingerprint (`call_fingerprint`) and raise `CallIdConflict` when a stored outcome has
another one. What is stored is the outcome's model representation without its output, so a
replayed outcome has none. A pruned call id replays as `expired_outcome`; a call that started
and never settled durably as `interrupted_outcome`.

Imports `sidecar.model` only. Exports `OutcomeLog`, `OutcomeLogError`, `OutcomeLogStats`,
`DEFAULT_WAL_CAP_BYTES`, `call_fingerprint`, `call_principal`, `expired_outcome`,
`interrupted_outcome` and `replayed_outcome` (implementations:
`sidecar.backends.sqlite.outcome_log`, `sidecar.backends.postgres.outcome_log`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from sidecar.model import json_depth
from sidecar.model.errors import CallError, CallIdConflict, ErrorKind, SidecarError
from sidecar.model.outcome import Outcome
from sidecar.model.tool import ToolContext

__all__ = ["DEFAULT_WAL_CAP_BYTES", "OutcomeLog", "OutcomeLogError", "OutcomeLogStats",
           "call_fingerprint", "call_principal", "expired_outcome", "interrupted_outcome",
           "replayed_outcome"]

DEFAULT_WAL_CAP_BYTES = 64 * 1024 * 1024
"""The bytes an embedded outcome log's write-ahead log is kept under by default
(`Location.open(wal_cap_bytes=...)`, `StoreOptions.wal_cap_bytes`)."""


class OutcomeLogError(SidecarError):
    """The durable log could not be read or written."""


def call_principal(owner: str | None, profile: str | None) -> str | None:
    """Who a call runs as, for `call_fingerprint`: its scoped token (`ToolContext.owner`) and
    the profile its snapshot serves; None for the all-access token on the default profile."""
    if owner is None and profile is None:
        return None
    return f"{owner or ''}|{profile or ''}"


def call_fingerprint(tool: str, raw_input: Any, session_id: str, agent: str,
                     principal: str | None = None) -> str:
    """What makes two calls under one id the same call: the tool name as called, the input
    as canonical JSON (sorted keys; a JSON string is parsed first), the session, the agent
    and the principal (`call_principal`: a call id never replays or joins across tokens or
    profiles). A hex digest; without a principal, the digest outcomes stored before the
    principal counted still match."""
    if isinstance(raw_input, str | bytes):
        try:
            raw_input = json_depth.loads(raw_input)
        except ValueError:  # too deep included: the seam then refuses it as invalid_input
            raw_input = raw_input.decode("utf-8", "replace") if isinstance(raw_input, bytes) \
                else raw_input
    parts = [tool, raw_input, session_id, agent]
    if principal is not None:
        parts.append(principal)
    canonical = _CANONICAL.encode(parts)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:32]


_CANONICAL = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"),
                              default=repr)  # built once: `json.dumps(..., **options)` per call


@dataclass(frozen=True, slots=True)
class OutcomeLogStats:
    """What the log holds and what its upkeep did since it opened."""

    outcomes: int
    expired: int
    """Tombstones: call ids whose outcome was pruned (they replay as `expired`)."""
    pruned: int
    """Outcomes pruned since the log opened."""
    disk_bytes: dict[str, int]
    """Bytes on disk by part: `outcomes` (the database file) and `outcomes_wal`."""
    wal_checkpoints: int = 0
    wal_truncations: int = 0


class OutcomeLog(Protocol):
    async def record(
        self, location: str, outcome: Outcome, context: ToolContext, fingerprint: str = ""
    ) -> Outcome:
        """Store `outcome` unless one is already stored for its call; return the stored one.
        `CallIdConflict` when the stored one has another non-empty `fingerprint`."""
        ...

    async def get(self, location: str, call_id: str, fingerprint: str = "") -> Outcome | None:
        """The stored outcome of `call_id`; `CallIdConflict` as for `record`; an `expired`
        error outcome (replayed) for a call whose outcome was pruned; None if it never
        settled."""
        ...

    async def claim(self, location: str, call_id: str, fingerprint: str = "",
                    tool: str = "") -> Outcome | None:
        """Before a call runs (`tool`: its name): its stored outcome (as `get`), or None once
        this process holds the call's in-flight claim and must run it, then `record` (which
        drops the claim) or `release`. While another replica holds a live claim on the same
        call, wait (cancellable) for its outcome, or take the claim over when it expires; a
        live claim or an outcome of another call under `call_id` raises `CallIdConflict`. A
        log one process owns keeps its claims as started rows (a call it was killed under is
        `interrupted` at the next open); the seam's in-flight map makes local duplicates
        wait."""
        ...

    async def release(self, location: str, call_id: str) -> None:
        """Drop this process's claim on `call_id` without an outcome (the call was cancelled
        before it settled), so a waiting duplicate runs it. Logs store errors, never raises."""
        ...

    async def holder(self, location: str, call_id: str) -> str | None:
        """The replica running `call_id` now (its live claim), or None (also: no claims)."""
        ...

    async def prune(self, cutoff: float) -> int:
        """Prune outcomes settled before `cutoff` (epoch seconds), keeping tombstones."""
        ...

    async def stats(self) -> OutcomeLogStats: ...

    async def aclose(self) -> None: ...


def interrupted_outcome(call_id: str, tool: str, started_at: float, reason: str) -> Outcome:
    """What a retry of a call that started and never settled durably gets: `interrupted`,
    naming what is known; the tool is not run again."""
    when = datetime.fromtimestamp(started_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    name = f" ({tool})" if tool else ""
    message = (f"call id {call_id!r}{name} started by {when} but never settled: {reason}. "
               "Whether the tool finished is unknown; it was not run again. Check its "
               "effects, then use a new call id to run it again.")
    return Outcome(call_id=call_id, tool=tool or "unknown", status="error",
                   error=CallError(ErrorKind.INTERRUPTED, message), replayed=True)


def expired_outcome(
    call_id: str, tool: str, settled_at: float, retention_seconds: float | None
) -> Outcome:
    """What a replay of a pruned call id gets: an `expired` error, and nothing runs."""
    when = datetime.fromtimestamp(settled_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    period = "" if retention_seconds is None else f" ({_duration(retention_seconds)})"
    message = (f"call id {call_id!r} settled at {when}; its outcome was pruned after the "
               f"retention period{period}, so it cannot be replayed. The call was not run "
               f"again: use a new call id to run it again.")
    return Outcome(call_id=call_id, tool=tool, status="error",
                   error=CallError(ErrorKind.EXPIRED, message), replayed=True)


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)} {unit}"
    return f"{seconds:g} s"


def replayed_outcome(call_id: str, stored: tuple[str, str], fingerprint: str) -> Outcome:
    """The stored outcome (its JSON body and fingerprint), replayed; `CallIdConflict` when it
    was stored for another call (both fingerprints set and different)."""
    body, stored_fingerprint = stored
    if fingerprint and stored_fingerprint and fingerprint != stored_fingerprint:
        raise CallIdConflict(call_id)
    return Outcome.from_json(json.loads(body), replayed=True)
