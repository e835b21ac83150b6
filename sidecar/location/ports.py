"""What a Location receives from the composition root: its open stores (`Stores`), what it
asks of them (`StoreOptions`) and how they are opened (`OpenStores`). Each store is named by
its port in `sidecar.stores` (one Protocol per kind of state); the composition root
(`sidecar.daemon.stores`) picks the implementations (`sidecar.backends.*`), which pass the
shared contract suites in `tests/stores/`.

Imports `sidecar.stores` and `managed_store`. Exports `Stores`, `StoreOptions` and
`OpenStores`.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from managed_store import TextStore
from sidecar.stores.asks import SharedAsks
from sidecar.stores.call_history import CallHistory
from sidecar.stores.cancels import SharedCancels
from sidecar.stores.database_check import DatabaseCheck
from sidecar.stores.event_log import EventLogFactory
from sidecar.stores.grants import GrantStore
from sidecar.stores.outcome_log import OutcomeLog
from sidecar.stores.pending_logins import LoginCallbacks
from sidecar.stores.permissions import PermissionStore
from sidecar.stores.pins import PinStore
from sidecar.stores.shared_rounds import SharedRounds
from sidecar.stores.snapshot_records import SnapshotRecords
from sidecar.stores.tokens import TokenStore

__all__ = ["OpenStores", "StoreOptions", "Stores"]


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
    """The Location's OAuth grants: the fleet's (shared by its replicas), else the state
    directory's (`SIDECAR_OAUTH_STORE`: file or keyring); None: none were opened."""
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
