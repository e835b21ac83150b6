"""The composition root's store choices: which implementation keeps each piece of a
Location's state (`Backends`, `open_local_stores`) and the stores the CLI opens without a
daemon (`open_token_store`, `open_call_history`, `grant_store_of`). Embedded by default
(SQLite files and a directory in the state dir); with `SIDECAR_DATABASE_URL` / `--store`
(PostgreSQL) and `SIDECAR_OBJECT_STORE` (S3-compatible storage) the fleet's shared backends
(docs/fleet.md). Each store is chosen by its own opener.

Imports the core, every backend, `managed_store` (with `managed_store.s3`) and
`sidecar.serve.local_door`. Only
`sidecar.daemon.daemon` and the CLI import it (checked by `tests/test_architecture.py`).
Exports the names of `__all__`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from managed_store import ManagedStore, TextStore
from sidecar.backends.local.grants import open_grant_store
from sidecar.backends.local.pending_logins import MemoryPendingLogins
from sidecar.backends.sqlite.call_history import SqliteCallHistory
from sidecar.backends.sqlite.outcome_log import SqliteOutcomeLog
from sidecar.backends.sqlite.permissions import SqlitePermissionStore
from sidecar.backends.sqlite.pins import SqlitePinStore
from sidecar.backends.sqlite.tokens import SqliteTokenStore
from sidecar.location.ports import StoreOptions, Stores
from sidecar.location.store_pressure import owner_share_from_env
from sidecar.stores.asks import SharedAsks
from sidecar.stores.call_history import CallHistory
from sidecar.stores.cancels import SharedCancels
from sidecar.stores.database_check import DatabaseCheck
from sidecar.stores.errors import DatabaseError
from sidecar.stores.event_log import EventLogFactory
from sidecar.stores.grants import GrantStore
from sidecar.stores.outcome_log import OutcomeLog
from sidecar.stores.pending_logins import (
    LoginCallbacks,
    exchange_timeout_from_env,
    public_url_from_env,
)
from sidecar.stores.permissions import PermissionStore
from sidecar.stores.pins import PinStore
from sidecar.stores.shared_rounds import SharedRounds
from sidecar.stores.snapshot_records import SnapshotRecords
from sidecar.stores.tokens import TokenStore

if TYPE_CHECKING:
    from bridges.manifest.auth import AuthConfig
    from sidecar.backends.postgres.pool import Pool

__all__ = ["Backends", "apply_store_quotas", "grant_store_of", "open_call_history",
           "open_local_stores", "open_token_store"]

USER_OWNER = "user:"
"""How calls of a signed-in user name their owner in the managed store (`user:NAME`)."""


def apply_store_quotas(store: TextStore, auth: AuthConfig | None) -> None:
    """The managed store's per-owner limits from `[auth.quotas]` `store_bytes` (each manifest
    load): a user's own value for `user:NAME`, the table's for every other `user:` owner;
    none (the per-owner share) without it. Sessions and tokens of nobody keep the share."""
    quotas = auth.quotas if auth is not None else None
    own, default = quotas.store_bytes_limits() if quotas is not None else ({}, None)
    store.owner_limits.set({USER_OWNER + user: limit for user, limit in own.items()},
                           {USER_OWNER: default} if default is not None else {})

async def open_token_store(state: Path) -> TokenStore:
    """The token store `sidecar token ...` opens without a daemon: the fleet database's when
    `SIDECAR_DATABASE_URL` (or `--store`) names one, else the state directory's."""
    database_url = Backends.from_env().database_url
    if database_url:
        from sidecar.backends.postgres.tokens import PostgresTokenStore

        return await PostgresTokenStore.open(database_url)
    return await SqliteTokenStore.open(state / "tokens.sqlite")


async def open_call_history(state: Path) -> CallHistory | None:
    """The call history `sidecar calls --embedded` reads without a daemon: the fleet
    database's when `SIDECAR_DATABASE_URL` (or `--store`) names one, else the state
    directory's `history.sqlite` (None when there is none yet)."""
    database_url = Backends.from_env().database_url
    if database_url:
        from sidecar.backends.postgres.call_history import PostgresCallHistory

        return await PostgresCallHistory.open(database_url)
    path = state / "history.sqlite"
    if not await asyncio.to_thread(path.exists):
        return None
    return await SqliteCallHistory.open(path)


@asynccontextmanager
async def grant_store_of(state: Path) -> AsyncIterator[GrantStore]:
    """The OAuth grants `sidecar auth ...` works on: the fleet database's when
    `SIDECAR_DATABASE_URL` (or `--store`) names one (so a login done once serves every
    replica), else the state directory's (`SIDECAR_OAUTH_STORE`: file or keyring)."""
    database_url = Backends.from_env().database_url
    if not database_url:
        yield open_grant_store(state)
        return
    from sidecar.backends.postgres.grants import PostgresGrantStore
    from sidecar.backends.postgres.pending_logins import PostgresPendingLogins

    grants = await PostgresGrantStore.open(database_url)
    grants.waiting_logins = functools.partial(PostgresPendingLogins.if_kept, database_url)
    try:
        yield grants
    finally:
        await grants.aclose()


@dataclasses.dataclass(frozen=True, slots=True)
class Backends:
    """Where a Location's durable state lives: the state directory alone (the default), or
    the fleet's shared backends (docs/fleet.md)."""

    database_url: str = ""
    """`SIDECAR_DATABASE_URL` (or `--store`): a `postgresql://` URL for the fleet's state."""
    object_store: str = ""
    """`SIDECAR_OBJECT_STORE`: an `s3://bucket/prefix` URL for managed objects."""

    @classmethod
    def from_env(cls) -> Backends:
        return cls(database_url=os.environ.get("SIDECAR_DATABASE_URL", "").strip(),
                   object_store=os.environ.get("SIDECAR_OBJECT_STORE", "").strip())


@dataclasses.dataclass(slots=True)
class _Opening:
    """What the per-store openers share while `open_local_stores` runs."""

    options: StoreOptions
    backends: Backends
    stack: AsyncExitStack
    pool: Pool | None = None
    """The replica's one pool on the fleet database (None: embedded stores only)."""


async def _open_pool(o: _Opening) -> None:
    if not (o.options.durable and o.backends.database_url):
        return
    from sidecar.backends.postgres.pool import open_pool

    o.pool = await open_pool(o.backends.database_url)
    o.stack.push_async_callback(o.pool.close)


async def _open_managed(o: _Opening) -> TextStore:
    retention = o.options.retention_seconds
    cleanup_interval = min(3600.0, max(1.0, retention / 10))
    managed: TextStore
    if o.backends.object_store and o.pool is None and not o.backends.database_url:
        raise DatabaseError("SIDECAR_OBJECT_STORE needs SIDECAR_DATABASE_URL: the index of "
                            "the managed objects is kept in the fleet database")
    if o.backends.object_store and o.pool is not None:
        # managed texts in the bucket, indexed in the fleet database: any replica reads them
        from managed_store import ManagedStoreError
        from managed_store.s3 import S3Settings, S3TextStore, WriteSettings
        from sidecar.model.replica import replica_id

        try:
            # write-behind (default): a commit returns once the object is staged in the state
            # directory and indexed; the upload ends in the background (docs/fleet.md)
            writes = WriteSettings.from_environ(os.environ)
            managed = await S3TextStore.open(
                o.pool, S3Settings.from_url(o.backends.object_store, os.environ),
                ttl_seconds=retention, quota_bytes=o.options.store_quota_bytes,
                cleanup_interval=cleanup_interval, owner_share=owner_share_from_env(),
                staging_dir=o.options.state_dir / "managed-s3" if writes.behind else None,
                replica=replica_id(), staging_bytes=writes.staging_bytes,
                read_wait_seconds=writes.read_wait, close_wait_seconds=writes.close_wait)
        except (ManagedStoreError, ValueError) as exc:
            # a fleet backend the replica cannot use: one line from the CLI (exit 6)
            raise DatabaseError(f"SIDECAR_OBJECT_STORE: {exc}") from exc
    else:
        managed = await ManagedStore.open(
            o.options.state_dir / "managed", ttl_seconds=retention,
            quota_bytes=o.options.store_quota_bytes, cleanup_interval=cleanup_interval,
            owner_share=owner_share_from_env(),
        )
    o.stack.push_async_callback(managed.aclose)
    return managed


async def _open_outcomes(o: _Opening) -> OutcomeLog | None:
    if not o.options.durable:
        return None
    retention = o.options.retention_seconds
    outcomes: OutcomeLog
    if o.pool is not None:
        # one outcome per call id for every replica on the database
        from sidecar.backends.postgres.outcome_log import PostgresOutcomeLog

        outcomes = await PostgresOutcomeLog.on_pool(o.pool, retention_seconds=retention)
    else:
        outcomes = await SqliteOutcomeLog.open(
            o.options.state_dir / "outcomes.sqlite", retention_seconds=retention,
            wal_cap_bytes=o.options.wal_cap_bytes,
        )
    o.stack.push_async_callback(outcomes.aclose)
    return outcomes


async def _open_permissions(o: _Opening) -> PermissionStore | None:
    if not o.options.durable:
        return None
    permissions: PermissionStore
    if o.pool is not None:
        # an `always` reply given through one replica applies on every replica
        from sidecar.backends.postgres.permissions import PostgresPermissionStore

        permissions = await PostgresPermissionStore.on_pool(o.pool)
    else:
        permissions = await SqlitePermissionStore.open(
            o.options.state_dir / "permissions.sqlite")
    o.stack.push_async_callback(permissions.aclose)
    return permissions


async def _open_tokens(o: _Opening) -> TokenStore:
    tokens: TokenStore
    if o.pool is not None:
        # a token made or revoked anywhere (any replica, the CLI) counts on every replica
        from sidecar.backends.postgres.tokens import PostgresTokenStore

        tokens = await PostgresTokenStore.on_pool(o.pool)
    else:
        tokens = await SqliteTokenStore.open(o.options.state_dir / "tokens.sqlite")
    o.stack.push_async_callback(tokens.aclose)
    return tokens


async def _open_pins(o: _Opening) -> PinStore | None:
    if not o.options.durable:
        return None
    pins: PinStore
    if o.pool is not None:
        # a replica holds changed definitions against the pins any replica made
        from sidecar.backends.postgres.pins import PostgresPinStore

        pins = await PostgresPinStore.on_pool(o.pool, location=o.options.location)
    else:
        pins = await SqlitePinStore.open(o.options.state_dir / "pins.sqlite")
    o.stack.push_async_callback(pins.aclose)  # idempotent: `Pins.aclose` closes it too
    return pins


async def _open_history(o: _Opening) -> CallHistory | None:
    if not o.options.durable:
        return None
    history: CallHistory
    if o.pool is not None:
        # `GET /v1/calls` on any replica lists the calls of every replica
        from sidecar.backends.postgres.call_history import PostgresCallHistory

        history = await PostgresCallHistory.on_pool(
            o.pool, location=o.options.location,
            retention_seconds=o.options.retention_seconds)
    else:
        history = await SqliteCallHistory.open(o.options.state_dir / "history.sqlite",
                                               retention_seconds=o.options.retention_seconds)
    o.stack.push_async_callback(history.aclose)
    return history


async def _open_snapshots(o: _Opening) -> SnapshotRecords | None:
    if o.pool is None:
        return None  # embedded: kept snapshots live in this process's memory
    from sidecar.backends.postgres.snapshots import PostgresSnapshotRecords

    return await PostgresSnapshotRecords.on_pool(o.pool)  # any replica serves any snapshot id


async def _open_events(o: _Opening) -> EventLogFactory | None:
    if o.pool is None:
        return None  # the wiring's (in memory, per process)
    # one numbering of a Location's events for every replica on the database
    from sidecar.backends.postgres.event_log import PostgresEventLog

    await PostgresEventLog.prepare(o.pool)
    return functools.partial(PostgresEventLog, pool=o.pool, location=o.options.location)


async def _open_asks(o: _Opening) -> SharedAsks | None:
    if o.pool is None:
        return None  # asks wait in the process that raised them
    # an ask raised on one replica is listed and answered on any
    from sidecar.backends.postgres.asks import PostgresAsks

    asks = await PostgresAsks.on_pool(o.pool, o.options.location)
    o.stack.push_async_callback(asks.aclose)
    return asks


async def _open_grants(o: _Opening) -> GrantStore:
    if o.pool is None:  # the state directory's: `SIDECAR_OAUTH_STORE` (file or keyring)
        return open_grant_store(o.options.state_dir)
    # a login done once (any replica, `sidecar auth login`) serves every replica
    from sidecar.backends.postgres.grants import PostgresGrantStore
    from sidecar.stores.grants import GrantStoreUnavailable

    try:
        return await PostgresGrantStore.on_pool(o.pool)
    except GrantStoreUnavailable as exc:  # a malformed SIDECAR_GRANT_KEY: one line, exit 6
        raise DatabaseError(str(exc)) from exc


async def _open_cancels(o: _Opening) -> SharedCancels | None:
    if o.pool is None:
        return None  # a call is cancelled by the process running it
    # DELETE /v1/calls/{id} on any replica reaches the replica running the call
    from sidecar.backends.postgres.cancels import PostgresCancels

    cancels = await PostgresCancels.on_pool(o.pool, o.options.location)
    o.stack.push_async_callback(cancels.aclose)
    return cancels


def _open_database_check(o: _Opening) -> DatabaseCheck | None:
    if o.pool is None:
        return None
    from sidecar.backends.postgres.health import PoolCheck
    from sidecar.serve.local_door import database_of

    return PoolCheck(o.pool, database_of(o.backends.database_url))  # health: reachable?


async def _open_rounds(o: _Opening) -> SharedRounds | None:
    if o.pool is None:
        return None  # a paused /mcp call resumes only in the process that paused it
    # a paused 2026-07-28 /mcp call resumes on any replica; its holder is gone after as long
    # as an in-flight claim lives without renewal
    from sidecar.backends.postgres.claims import claim_ttl_from_env
    from sidecar.backends.postgres.rounds import PostgresRounds

    rounds = await PostgresRounds.on_pool(o.pool, o.options.location,
                                          silent_after=claim_ttl_from_env())
    o.stack.push_async_callback(rounds.aclose)
    return rounds


async def _open_login_callbacks(o: _Opening) -> LoginCallbacks | None:
    try:
        public_url = public_url_from_env()
        exchange_timeout = exchange_timeout_from_env()
    except ValueError as exc:  # one line, exit 6, like the other backend settings
        raise DatabaseError(str(exc)) from exc
    if public_url is None:
        return None  # logins redirect to a loopback listener, as `sidecar auth login` does
    if o.pool is None:
        return LoginCallbacks(public_url, MemoryPendingLogins(), exchange_timeout)  # one process
    # a login started on one replica is finished by the replica the browser's redirect reaches
    from sidecar.backends.postgres.pending_logins import PostgresPendingLogins

    return LoginCallbacks(public_url, await PostgresPendingLogins.on_pool(o.pool),
                          exchange_timeout)


@asynccontextmanager
async def open_local_stores(options: StoreOptions) -> AsyncIterator[Stores]:
    """A Location's stores. Embedded by default, in the state directory: `managed/`
    (retained texts), `outcomes.sqlite`, `permissions.sqlite`, `pins.sqlite`, `history.sqlite`
    (only when `durable`) and `tokens.sqlite`. With `SIDECAR_DATABASE_URL` (fleet mode) the
    stores that have a PostgreSQL implementation keep their state there instead (docs/fleet.md).
    Each store is chosen by its own opener below. Closed in reverse order on exit."""
    async with AsyncExitStack() as stack:
        o = _Opening(options, Backends.from_env(), stack)
        await _open_pool(o)
        managed = await _open_managed(o)
        outcomes = await _open_outcomes(o)
        permissions = await _open_permissions(o)
        tokens = await _open_tokens(o)
        pins = await _open_pins(o)
        history = await _open_history(o)
        events = await _open_events(o)
        asks = await _open_asks(o)
        snapshots = await _open_snapshots(o)
        cancels = await _open_cancels(o)
        rounds = await _open_rounds(o)
        grants = await _open_grants(o)
        login_callbacks = await _open_login_callbacks(o)
        yield Stores(managed=managed, outcomes=outcomes, permissions=permissions, tokens=tokens,
                     pins=pins, history=history, events=events, asks=asks,
                     snapshots=snapshots, cancels=cancels, database=_open_database_check(o),
                     rounds=rounds, grants=grants, login_callbacks=login_callbacks)
