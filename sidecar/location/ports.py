"""The store interfaces: every piece of state the core and the frontends keep, as a `Protocol`.

    OutcomeLog       durable terminal outcomes, one per call id (`sidecar.stores.outcome_log`)
    PermissionStore  `always` permission replies, kept across restarts
    SharedAsks       pending permission asks every replica of a fleet lists and answers
    EventLog         a Location's events, numbered, for `/v1/events` (Server-Sent Events)
    TokenStore       scoped bearer tokens, by digest (`sidecar.stores.tokens`)
    PinStore         pinned tool definitions (`sidecar.registry.pins`)
    CallHistory      every settled call, for audit (`sidecar.stores.call_history`)
    TextStore        the managed store: retained texts, ranged reads, grep, quota and
                     eviction (`managed_store.protocol`)
    SnapshotRecords  kept snapshots' recipes, so any replica serves any snapshot id
                     (`sidecar.stores.snapshot_records`; fleet only)
    GrantStore       OAuth grants of upstream servers (`sidecar.stores.grants`; embedded:
                     `open_grant_store(state_dir)`, fleet: the database's)
    SharedCancels    cancel requests for calls running on another replica (fleet only)
    DatabaseCheck    whether the fleet database answers now (fleet only)
    SharedRounds     paused 2026-07-28 `/mcp` calls, resumable on any replica
                     (`sidecar.stores.shared_rounds`; fleet only)
    PendingLogins    OAuth logins waiting for the browser's redirect to the public URL
                     (`sidecar.stores.pending_logins`; `SIDECAR_PUBLIC_URL` only)

Code outside the composition root names only these. The embedded implementations (SQLite files
and a directory in the state dir: `SqliteOutcomeLog`, `SqlitePermissionStore`,
`SqliteTokenStore`, `SqlitePinStore`, `ManagedStore`, and the in-memory `MemoryEventLog`) are
chosen in `sidecar/daemon/daemon.py`, which hands them to `Location.open` as `Stores` through its
`Wiring`
(`OpenStores` + `EventLogFactory`). A fleet backend (PostgreSQL, S3-compatible storage)
implements the same Protocols and passes the shared contract suites in `tests/stores/`.
Each Protocol is exactly what its callers use; the contract suites say what each method
promises.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from managed_store import TextStore
from sidecar.model.events import EventBus
from sidecar.model.permissions import PendingAsk, PermissionRule, Reply
from sidecar.registry.pins import PinStore
from sidecar.stores.call_history import CallHistory
from sidecar.stores.grants import GrantStore
from sidecar.stores.outcome_log import OutcomeLog
from sidecar.stores.pending_logins import LoginCallbacks
from sidecar.stores.shared_rounds import SharedRounds
from sidecar.stores.snapshot_records import SnapshotRecords
from sidecar.stores.tokens import TokenStore

__all__ = [
    "CallHistory",
    "DatabaseCheck",
    "EventLog",
    "EventLogFactory",
    "GrantStore",
    "NumberedEvent",
    "OpenStores",
    "OutcomeLog",
    "PermissionStore",
    "PinStore",
    "SharedAnswer",
    "SharedAsks",
    "SharedCancels",
    "SnapshotRecords",
    "StoreOptions",
    "StoredRule",
    "Stores",
    "TextStore",
    "TokenStore",
]


# --- permissions -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredRule:
    """One persisted `always` reply: a session rule, or a Location rule (`session_id` "")."""

    session_id: str
    rule: PermissionRule


class PermissionStore(Protocol):
    """Where `always` replies outlive the process, per Location."""

    async def rules(self, location: str) -> list[StoredRule]:
        """Every rule stored for `location`, oldest first."""
        ...

    async def add(self, location: str, session_id: str, rule: PermissionRule) -> None:
        """Store one rule; it is returned by every later `rules(location)`, after the older
        ones."""
        ...

    async def aclose(self) -> None: ...


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


class DatabaseCheck(Protocol):
    """Whether the fleet database answers, for health."""

    async def unreachable(self) -> str | None:
        """None when a trivial query succeeds now (within a few seconds); else why not, in
        one line naming the database (never its credentials)."""
        ...


# --- events ----------------------------------------------------------------------------------


class NumberedEvent(Protocol):
    """One event of an `EventLog`, ready for Server-Sent Events."""

    @property
    def id(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def data(self) -> str:
        """JSON."""
        ...

    def sse(self) -> str:
        """The event as one Server-Sent Events message (`id`, `event`, `data`)."""
        ...


class EventLog(Protocol):
    """A Location's events, each with an increasing id, for readers that resume by id."""

    async def start(self) -> None:
        """Begin logging the bus's events; every event published after this returns is kept."""
        ...

    async def aclose(self) -> None: ...

    @property
    def last_id(self) -> int:
        """The id of the newest event (0: none yet)."""
        ...

    def after(self, last_id: int) -> tuple[Sequence[NumberedEvent], int]:
        """The kept events after `last_id`, oldest first, and how many events after it are
        no longer kept."""
        ...

    def follow(self, last_id: int | None) -> AsyncIterator[NumberedEvent]:
        """Events after `last_id` (None: only new ones), forever; a `stream.reset` event
        first when some after `last_id` are no longer kept."""
        ...


EventLogFactory = Callable[[EventBus], EventLog]
"""Builds a Location's event log over its bus (not started: a frontend starts it)."""


# --- what the composition root opens for a Location -----------------------------------------


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """What a Location asks of its stores (from `Location.open`'s arguments)."""

    state_dir: Path
    location: str
    durable: bool
    """False: no outcome log and no permission store (benchmarks, throw-away Locations)."""
    retention_seconds: float
    store_quota_bytes: int
    wal_cap_bytes: int


@dataclass(frozen=True, slots=True)
class Stores:
    """A Location's open stores. `OpenStores` closes them when its context exits."""

    managed: TextStore
    outcomes: OutcomeLog | None
    permissions: PermissionStore | None
    tokens: TokenStore
    pins: PinStore | None
    """None when not `durable`: pins are then kept in memory."""
    history: CallHistory | None = None
    """The call history; None when not `durable` (no audit trail is kept)."""
    events: EventLogFactory | None = None
    """The Location's event log when the stores choose it (fleet: on the shared database);
    None: the `Wiring`'s."""
    asks: SharedAsks | None = None
    """Pending asks shared by a fleet's replicas; None: kept by the process that raised
    them."""
    snapshots: SnapshotRecords | None = None
    """Kept snapshots shared by the replicas of a fleet; None: in this process's memory."""
    grants: GrantStore | None = None
    """OAuth grants shared by the replicas of a fleet; None: the state directory's
    (`open_grant_store`)."""
    cancels: SharedCancels | None = None
    """Cancel requests between the replicas of a fleet; None: calls are cancelled only by
    the process running them."""
    database: DatabaseCheck | None = None
    """The fleet database's reachability, reported by health; None: no fleet database."""
    rounds: SharedRounds | None = None
    """Paused 2026-07-28 `/mcp` calls listed for a fleet's replicas; None: a paused call
    resumes only in the process that paused it."""
    login_callbacks: LoginCallbacks | None = None
    """OAuth logins redirect to the daemon's public URL (`SIDECAR_PUBLIC_URL`) and wait in
    these pending logins (fleet: the database) for any replica to finish them; None: they
    redirect to a loopback listener on the replica that started them."""


class OpenStores(Protocol):
    """Open every store a Location needs, and close them on exit."""

    def __call__(self, options: StoreOptions) -> AbstractAsyncContextManager[Stores]: ...
