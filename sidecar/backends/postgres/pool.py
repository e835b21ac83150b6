"""PostgreSQL plumbing the fleet stores share: one connection pool per replica (`open_pool`),
versioned schemas (`migrate`, `PostgresStore`), the advisory lock keys the replicas coordinate
with (`LOCK_*`), a LISTENing connection (`Listening`), work carried past cancellation
(`Carried`) and what a database failure looks like (`failures`, `connection_lost`).

Imports `sidecar.model`, `sidecar.stores` and `asyncpg` (only when a pool opens: importing this
module needs no driver). Importing it registers how to recognise asyncpg's connection failures
with `sidecar.stores.errors` (`register_failure_kind`). Exports the names of `__all__`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

from sidecar.model.replica import replica_id
from sidecar.stores.errors import DatabaseError, SchemaTooNew, register_failure_kind

if TYPE_CHECKING:  # asyncpg is the `fleet` extra: importing this module must not need it
    import asyncpg

    Pool = asyncpg.Pool
    """The replica's pool, for the composition root's annotations."""

T = TypeVar("T")

__all__ = [
    "LOCK_GRANT_REFRESH",
    "LOCK_GRANT_UPDATE",
    "LOCK_MIGRATE",
    "LOCK_PRUNE_ASKS",
    "LOCK_PRUNE_CALLS",
    "LOCK_PRUNE_EVENTS",
    "LOCK_PRUNE_OUTCOMES",
    "LOCK_SNAPSHOTS",
    "Carried",
    "Listening",
    "PostgresStore",
    "connection_lost",
    "database_timeout_from_env",
    "failures",
    "migrate",
    "open_pool",
]

LOCK_MIGRATE = 0x51DECA2_0000
"""Held (per transaction) while a replica migrates any component: replicas starting together
migrate once."""
LOCK_PRUNE_OUTCOMES = 0x51DECA2_0001
"""Held by the one replica pruning the outcome log."""
LOCK_PRUNE_CALLS = 0x51DECA2_0002
"""Held by the one replica pruning the call history."""
# 0x51DECA2_0003 (LOCK_MANAGED_QUOTA) and 0x51DECA2_0004 (LOCK_MANAGED_CLEANUP) belong to the
# managed objects on S3, defined in managed_store/s3/index.py (a library: it imports nothing
# of the daemon). Further keys: 0x51DECA2_0005 and up, one per job that must run on one
# replica at a time (0x51DECA2_0010, 0x51DECA2_0011 and 0x51DECA2_0020 are taken below).
LOCK_PRUNE_EVENTS = 0x51DECA2_0010
"""Held by the one replica deleting events older than the kept ones (`sidecar_events`)."""
LOCK_PRUNE_ASKS = 0x51DECA2_0011
"""Held by the one replica deleting asks whose replica stopped refreshing them."""
LOCK_SNAPSHOTS = 0x51DECA2_0020
"""Held (per transaction) while a replica adds a snapshot and applies the fleet's caps."""
# Two-key locks (`pg_advisory_xact_lock(int4, int4)`, a key space apart from the one-key
# locks above): the first key names the job, the second is `hashtext(server)`.
LOCK_GRANT_UPDATE = 0x51DE0A01
"""With one server's hash: held while a replica changes that server's OAuth grant."""
LOCK_GRANT_REFRESH = 0x51DE0A02
"""With one server's hash: held while a replica refreshes that server's OAuth tokens."""

CONNECT_TIMEOUT = 10.0
"""Seconds a replica waits for each connection to the database (asyncpg's default is 60), and
for each statement (asyncpg's `command_timeout`, default none): `SIDECAR_DATABASE_TIMEOUT`.
A database that stops answering (a hung server, a cut network) then fails a request within
about twice this bound instead of hanging it (docs/fleet.md, "When the database is down")."""

_VERSIONS = """
CREATE TABLE IF NOT EXISTS sidecar_schema (
    component TEXT PRIMARY KEY,
    version   INTEGER NOT NULL
)
"""


def _unreachable(exc: BaseException) -> bool:
    """asyncpg's lost or refused connection (its connection errors, a server shutting down or
    refusing new connections, too many connections, see `failures`), or an `OSError` /
    `TimeoutError` raised inside asyncpg (the connection refused, or no answer within
    `SIDECAR_DATABASE_TIMEOUT`)."""
    asyncpg = sys.modules.get("asyncpg")  # not imported: none of its errors can exist (and
    if asyncpg is None:  # an install without the fleet extra has no asyncpg to import)
        return False
    unreachable = (asyncpg.InterfaceError, asyncpg.PostgresConnectionError,
                   asyncpg.exceptions.OperatorInterventionError,
                   asyncpg.exceptions.InsufficientResourcesError,
                   asyncpg.exceptions.InternalClientError)
    return isinstance(exc, unreachable) or (
        isinstance(exc, OSError | TimeoutError) and _raised_in_asyncpg(exc))


def _from_asyncpg(exc: BaseException) -> bool:
    """An error of asyncpg's, or a refused, reset or timed out connection inside asyncpg."""
    return type(exc).__module__.startswith("asyncpg") or (
        isinstance(exc, OSError | TimeoutError) and _raised_in_asyncpg(exc))


def _raised_in_asyncpg(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if str(tb.tb_frame.f_globals.get("__name__", "")).startswith("asyncpg"):
            return True
        tb = tb.tb_next
    return False


register_failure_kind(_unreachable, _from_asyncpg)


def database_timeout_from_env(environ: Mapping[str, str] = os.environ) -> float:
    """`SIDECAR_DATABASE_TIMEOUT` (seconds, > 0), else `CONNECT_TIMEOUT`."""
    raw = environ.get("SIDECAR_DATABASE_TIMEOUT", "").strip()
    if not raw:
        return CONNECT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise DatabaseError(f"SIDECAR_DATABASE_TIMEOUT must be a number of seconds above 0, "
                            f"not {raw!r}")
    return value


async def open_pool(dsn: str, *, min_size: int = 1, max_size: int = 10) -> asyncpg.Pool:
    """A pool on `dsn`, its connections named `sidecar <replica id>` (`application_name`);
    `DatabaseError` naming the cause when the server cannot be reached.

    A connection going back to the pool is reset only when it may carry session state (see
    `_reset`): asyncpg's default sends a reset query (unlock all advisory locks, close
    cursors, UNLISTEN, RESET ALL) on every release, one round trip per checkout, which was a
    third of a PostgreSQL-backed durable call's round trips.

    Connecting and every statement are bounded by `database_timeout_from_env()`: with a hung
    server a statement fails with `TimeoutError` and asyncpg's cancel request (bounded by the
    same timeout) ends the connection, so neither a request nor a pool release waits
    forever."""
    import asyncpg

    timeout = database_timeout_from_env()
    try:
        return await asyncpg.create_pool(
            dsn, min_size=min_size, max_size=max_size, timeout=timeout,
            command_timeout=timeout,
            connection_class=_connection_class(), reset=_reset,
            # pg_stat_activity (and so pg_locks) name the replica holding a connection
            server_settings={"application_name": f"sidecar {replica_id()}"[:63]})
    except (OSError, TimeoutError, ValueError, asyncpg.PostgresError,
            asyncpg.InterfaceError) as exc:
        raise DatabaseError(f"cannot reach the fleet database: {exc}") from exc


async def _reset(conn: Any) -> None:
    """Run on every release, after asyncpg rolled back any open transaction (it always does,
    whatever `reset=` is). What else a session may keep: LISTEN registrations (`add_listener`
    marks the connection), session-level advisory locks (none taken on pooled connections:
    the stores take `pg_*advisory_xact_lock`; the S3 cleanup's session lock is unlocked, or
    its connection closed, before it goes back), open cursors (asyncpg opens them only
    inside transactions, closed by their end), and settings (the stores change them with
    `SET LOCAL` / `set_config(..., true)`, gone with the transaction, or with
    `set_for_session`, which marks the connection). A marked connection gets asyncpg's full
    reset query."""
    if getattr(conn, "keeps_session_state", False):
        await conn.execute(conn.get_reset_query())
        conn.keeps_session_state = False


@functools.cache
def _connection_class() -> type[asyncpg.Connection]:
    import asyncpg

    class PooledConnection(asyncpg.Connection):
        """Marks itself when it LISTENs, so its release runs the full reset."""

        keeps_session_state = False

        async def add_listener(self, channel: str, callback: Any) -> None:
            self.keeps_session_state = True
            await super().add_listener(channel, callback)

        async def set_for_session(self, setting: str, value: str) -> None:
            """`SET setting = value` for the session (not one transaction): its release then
            runs the full reset, so the next borrower gets the server's default."""
            self.keeps_session_state = True
            await self.execute("SELECT set_config($1, $2, false)", setting, value)

    return PooledConnection


async def migrate(conn: Any, component: str, migrations: dict[int, str], newest: int, *,
                  error: type[Exception] = DatabaseError) -> int:
    """Apply `migrations` above the stored version of `component`, in one transaction and
    under `LOCK_MIGRATE`. Returns the version; raises `error` (raised from a `SchemaTooNew`)
    when the database's version is newer than `newest`."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", LOCK_MIGRATE)
        await conn.execute(_VERSIONS)
        current = await conn.fetchval(
            "SELECT version FROM sidecar_schema WHERE component = $1", component) or 0
        if current > newest:
            message = (f"the database's {component} schema is version {current}, newer than "
                       f"this sidecar knows ({newest}): upgrade the sidecar, or use another "
                       "database")
            if error is DatabaseError:
                raise SchemaTooNew(message)
            if issubclass(error, DatabaseError):
                raise error(message)
            raise error(message) from SchemaTooNew(message)
        for version in range(current + 1, newest + 1):
            await conn.execute(migrations[version])
        if current < newest:
            await conn.execute(
                "INSERT INTO sidecar_schema VALUES ($1, $2) ON CONFLICT (component) "
                "DO UPDATE SET version = EXCLUDED.version", component, newest)
        return newest


class PostgresStore:
    """What every simple PostgreSQL store shares: the pool (the replica's, or its own), its
    component's migrations applied at open, and closing. A subclass names `COMPONENT`,
    `MIGRATIONS` and `SCHEMA_VERSION`; `location` is the Location a store keyed by Location
    serves (its rows carry it, so Locations on one database stay apart)."""

    COMPONENT: ClassVar[str]
    MIGRATIONS: ClassVar[dict[int, str]]
    SCHEMA_VERSION: ClassVar[int]

    def __init__(self, pool: asyncpg.Pool, *, owns_pool: bool = False,
                 location: str = "default") -> None:
        self._pool = pool
        self._owns_pool = owns_pool
        self.location = location

    @classmethod
    async def on_pool(cls, pool: asyncpg.Pool, *, owns_pool: bool = False,
                      location: str = "default") -> Self:
        """A store on the replica's shared pool (`open_pool`), which stays open when the
        store closes unless `owns_pool`. `DatabaseError` when the database's schema is newer
        than this code knows."""
        async with pool.acquire() as conn:
            await migrate(conn, cls.COMPONENT, cls.MIGRATIONS, cls.SCHEMA_VERSION)
        return cls(pool, owns_pool=owns_pool, location=location)

    @classmethod
    async def open(cls, dsn: str, *, location: str = "default", max_size: int = 2) -> Self:
        """A store on a small pool of its own, closed with it (the CLI, tests)."""
        pool = await open_pool(dsn, min_size=1, max_size=max_size)
        try:
            return await cls.on_pool(pool, owns_pool=True, location=location)
        except BaseException:
            await pool.close()
            raise

    async def aclose(self) -> None:
        if self._owns_pool:
            self._owns_pool = False
            await self._pool.close()


class Carried:
    """Database operations of background tasks, carried to their end when such a task is
    cancelled (the task itself still ends with `CancelledError` at once). Cancelling an asyncpg
    query mid-flight resets its connection, and when the pool closes at that moment the
    query's waiter fails with a `ConnectionError` that nobody reads. A store's `aclose`
    cancels its tasks, then awaits `drain()`."""

    def __init__(self) -> None:
        self._running: set[asyncio.Future[Any]] = set()

    async def run(self, operation: Awaitable[T]) -> T:
        task = asyncio.ensure_future(operation)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return await asyncio.shield(task)

    async def drain(self) -> None:
        running = list(self._running)
        if running:
            await asyncio.wait(running)
        for task in running:  # read, so a failure after its task was cancelled is not logged
            if not task.cancelled():
                task.exception()


def failures() -> tuple[type[BaseException], ...]:
    """What a database operation of a fleet store may raise when the database fails (the
    server gone, a connection lost): a store logs these and retries or polls.

    `InternalClientError` too: a pooled connection whose server process was ended (the
    server stopped or restarted, `pg_terminate_backend`) has read the server's last error
    but not yet its end for about a millisecond, and a statement sent on it then fails with
    "cannot switch to state ...; another operation ... is in progress" (asyncpg 0.32). A
    poll that let it through stopped for good, silently."""
    import asyncpg
    from asyncpg.exceptions import InternalClientError

    return (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, InternalClientError)


class Listening:
    """One connection of the pool held LISTENing on `channel` until `stop`: `callback` is
    asyncpg's listener callback. When no connection can be had (or it is lost), a warning
    names `what` and the owner polls every `poll_interval` seconds; `lost` says so until
    `restart` succeeds."""

    def __init__(self, pool: asyncpg.Pool, channel: str, callback: Any, *, what: str,
                 poll_interval: float, log: logging.Logger) -> None:
        self._pool = pool
        self._channel = channel
        self._callback = callback
        self._what = what
        self._poll_interval = poll_interval
        self._log = log
        self._conn: Any = None
        self._restarting = asyncio.Lock()

    @property
    def lost(self) -> bool:
        return self._conn is None or connection_lost(self._conn)

    async def start(self) -> None:
        try:
            conn = await self._pool.acquire()
        except failures() as exc:
            self._polling(exc)
            return
        try:
            await conn.add_listener(self._channel, self._callback)
        except failures() as exc:
            await self._pool.release(conn)
            self._polling(exc)
            return
        self._conn = conn

    async def stop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            if not connection_lost(conn):
                await conn.remove_listener(self._channel, self._callback)
        except failures():
            pass
        finally:
            await self._pool.release(conn)

    async def restart(self) -> None:
        """Listen on a new connection if the connection is lost. Callers racing here (a
        store's poll and a request) restart once: two restarts at once used to hold two
        connections, one of them never given back to the pool."""
        async with self._restarting:
            if not self.lost:
                return
            await self.stop()
            await self.start()

    def _polling(self, exc: BaseException) -> None:
        self._log.warning("cannot listen for %s (polling every %gs): %s", self._what,
                          self._poll_interval, exc)


def connection_lost(conn: Any) -> bool:
    """Whether a pooled connection is gone. When its server connection is lost, asyncpg
    releases it back to the pool at once, and every method of what the holder keeps (a
    proxy) then raises `InterfaceError`: that is lost too, and `restart` must listen anew."""
    try:
        return bool(conn.is_closed())
    except failures():
        return True
