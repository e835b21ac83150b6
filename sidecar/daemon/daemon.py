"""The composition root's daemon: where frontends, bridges and stores are wired together.

It supplies the core `Location` (`sidecar.location.location`) with its wiring (`DEFAULT_WIRING`:
the sources the manifests declare) and exports the wired class as `sidecar.Location`; it runs
the daemon commands (`serve`: native API + MCP over HTTP; `stdio`: MCP over stdin/stdout) from
startup to graceful shutdown. Which implementation keeps each store is chosen in
`sidecar.daemon.stores`, the manifests' sources in `sidecar.daemon.sources`.

Imports everything but the CLI. Nothing imports it but the CLI entry point
(`sidecar.cli.commands`) and the lazy `sidecar.Location` re-export (checked by
`tests/test_architecture.py`). Exports the names of `__all__`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import gc
import logging
import os
import socket
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from bridges.child_groups import CHILD_GROUPS, reap_leftovers
from bridges.prestart import PRESTARTED
from sidecar.backends.local.event_log import MemoryEventLog
from sidecar.daemon.failure_drill import failure_drill
from sidecar.daemon.http_server import HttpServer
from sidecar.daemon.sources import ManifestSources
from sidecar.daemon.start_signals import sigterm_cancels
from sidecar.daemon.stores import (
    Backends,
    grant_store_of,
    open_call_history,
    open_local_stores,
    open_token_store,
)
from sidecar.location.location import (
    DEFAULT_STORE_QUOTA_BYTES,
    Wiring,
    default_state_dir,
)
from sidecar.location.location import Location as CoreLocation
from sidecar.location.store_pressure import owner_share_from_env, store_quota_from_env
from sidecar.model.retention import DEFAULT_RETENTION_SECONDS, parse_duration, retention_from_env
from sidecar.model.tool import Bounds
from sidecar.serve.local_door import OwnerLock
from sidecar.stores.state_dir import prepare_state_dir, write_private_file

if TYPE_CHECKING:

    from sidecar.serve.door import Activity, StdioDoor

SHUTDOWN_GRACE = 10
"""Seconds in-flight requests get when `serve` stops (a signal, or the Location failing)."""

__all__ = [
    "DEFAULT_RETENTION_SECONDS",
    "DEFAULT_STORE_QUOTA_BYTES",
    "DEFAULT_WIRING",
    "AddressInUse",
    "Location",
    "LocationFailed",
    "default_state_dir",
    "freeze_startup_heap",
    "grant_store_of",
    "open_call_history",
    "open_local_stores",
    "open_token_store",
    "parse_duration",
    "retention_from_env",
    "serve",
    "stdio",
]

log = logging.getLogger("sidecar.daemon.daemon")

STARTUP_SETTLE_LIMIT = 600.0
"""How long unclaimed prestarted servers may wait for the others' first attempts to settle."""


def freeze_startup_heap() -> None:
    """Take every object alive now out of the cyclic garbage collector's view (`gc.freeze()`).

    For the daemon commands, called once the imports are done and before the Location opens:
    modules, classes, functions and the SDK's pydantic validators, about 100,000 objects that
    live as long as the process. Until then every full collection walked all of them: 38-60 ms
    on this kind of machine, 130 ms while 20 upstreams started on 2 cores, and the first full
    collection came during that start (`bench/RESULTS.md`, history, 2026-12-04). Frozen objects
    are still freed by reference counting; objects made later are collected as before. A
    library that embeds `Location.open` decides this for its own process, so only the CLI
    calls it.
    """
    gc.freeze()


class Location(CoreLocation):
    """`sidecar.Location`: the core `Location` (`sidecar.location.location`) with the daemon's
    wiring
    as its default, so `Location.open(..., manifests=[...])` attaches the manifests' sources."""

    @classmethod
    def default_wiring(cls) -> Wiring:
        return DEFAULT_WIRING


# Store implementations are chosen in `sidecar.daemon.stores` (one opener per store).
DEFAULT_WIRING = Wiring(
    open_stores=open_local_stores, event_log=MemoryEventLog, attach_sources=ManifestSources
)


def _sources_in_background(
    location: CoreLocation, entries: Sequence[str | os.PathLike[str]], *, base_bounds: Bounds,
    plugins: Sequence[str] = (), entry_point_plugins: bool = True,
) -> ManifestSources:
    return ManifestSources(location, entries, base_bounds=base_bounds, plugins=plugins,
                           entry_point_plugins=entry_point_plugins, servers_in_background=True)


DAEMON_WIRING = dataclasses.replace(DEFAULT_WIRING, attach_sources=_sources_in_background)
"""The daemon commands' wiring: MCP servers come up in the background, so `serve` listens and
`stdio` answers `initialize` at once; their tools appear (with `list_changed`) as each server
gets ready."""


class _Server(HttpServer):
    """The doors' server (`sidecar.daemon.http_server`: no signal capture, one wake-up a
    second while idle), with the sockets it serves and the MCP facade's health."""

    sockets_to_serve: list[socket.socket]
    facade: FacadeHealth


class LocationFailed(Exception):
    """A task of the running Location, or of its MCP facade (`FacadeHealth`), failed (the
    message names it): `serve` stopped serving, closed the Location and ends, for a
    supervisor (or the next `sidecar stdio`) to start it again."""


async def _stop_serving(server: _Server) -> None:
    """uvicorn's shutdown (listeners closed, requests given the grace, lifespan ended), run
    while the failed task group keeps cancelling this task; a signal meanwhile cuts the
    grace short (uvicorn's force exit)."""
    server.should_exit = True
    with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_GRACE + 5):
        await server.shutdown(sockets=server.sockets_to_serve)


def _failure(exc: BaseException) -> str:
    """What failed, in one line: the innermost error(s) of an exception group, with the
    frame that raised them."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_failure(inner) for inner in exc.exceptions)
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "site-packages" not in f.filename and f.filename.endswith(".py")]
    where = ""
    if ours or frames:
        frame = (ours or frames)[-1]
        where = f" (in {frame.name}, {Path(frame.filename).name}:{frame.lineno})"
    return f"{type(exc).__name__}: {exc}{where}"


class DaemonRunning(Exception):
    """Another daemon owns the state directory (the message names it)."""


def own_state(state: Path) -> OwnerLock:
    """Take `<state>/daemon.lock` (blocking I/O), or raise `DaemonRunning` naming the owner."""
    from sidecar.serve.local_door import already_owned

    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock = OwnerLock.acquire(state)
    if lock is None:
        raise DaemonRunning(already_owned(state))
    return lock


async def serve(
    *,
    root: str | os.PathLike[str] = ".",
    state_dir: str | os.PathLike[str] | None = None,
    manifests: Sequence[str | os.PathLike[str]] = (),
    host: str = "127.0.0.1",
    port: int | None = 8765,
    auth: bool = True,
    allowed_hosts: Sequence[str] = (),
    idle_exit: float | None = None,
    owner: OwnerLock | None = None,
    allow_weak_token: bool = False,
    allow_no_auth_on_network: bool = False,
) -> None:
    """`sidecar serve` (and, with `port=None`, `sidecar daemon`): own the state directory,
    open the default Location, then serve until SIGINT/SIGTERM (or `idle_exit` seconds
    without any client).

    The daemon holds `<state>/daemon.lock` while it runs (a second daemon on the same state
    directory raises `DaemonRunning`), writes `<state>/daemon.json` (`sidecar.serve.local_door`) and
    listens on its local doors, `<state>/daemon.sock` (HTTP: /v1, /mcp) and `<state>/stdio.sock`
    (`sidecar stdio` clients), plus TCP on HOST:PORT unless `port` is None. Startup prints one
    line `sidecar: listening on http://HOST:PORT` (or `on <state>/daemon.sock`) to stderr.
    Upstream servers start in the background: the doors open at once. Shutdown is graceful:
    in-flight requests get 10 s, then what is left is cancelled and the Location closes
    (upstream servers stopped, stores closed). A signal during startup stops what started.
    `owner`: the state's lock, when the caller took it already (`own_state`).
    Refuses (`UnsafeConfiguration`, before any server starts) a weak token unless
    `allow_weak_token`, and `auth=False` on an address that is not loopback unless
    `allow_no_auth_on_network` (`sidecar.serve.serve_policy`).
    """
    import signal
    import sys

    from sidecar.serve.local_door import HTTP_SOCKET

    state = Path(state_dir) if state_dir is not None else default_state_dir()
    lock = owner if owner is not None else await asyncio.to_thread(own_state, state)
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    server: _Server | None = None
    stopping = False
    failing = False  # the Location failed under a running server

    def stop(sig: int) -> None:
        nonlocal stopping
        if server is not None and server.started:
            server.handle_exit(sig, None)  # a second signal: uvicorn's force exit
        elif main is not None and not stopping:
            stopping = True
            main.cancel()  # during startup: unwind what started so far

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop, sig)
    try:
        try:
            token = await asyncio.to_thread(
                _serve_token, state, host, auth=auth, allow_weak_token=allow_weak_token,
                allow_no_auth_on_network=allow_no_auth_on_network, tcp=port is not None,
            )
            # Bound before the Location opens: a port in use is reported before any upstream
            # server starts, and the real port is known when port=0.
            sock = _bind(host, port) if port is not None else None
        except BaseException:
            await _stop_unclaimed()
            raise
        async with contextlib.AsyncExitStack() as stack:
            if sock is not None:
                await stack.enter_async_context(_closing(sock))
            location = await stack.enter_async_context(
                _daemon_location(root, state, manifests))
            server = await _daemon_server(
                location, state, manifests, tcp=sock, host=host, token=token,
                allowed_hosts=allowed_hosts, idle_exit=idle_exit,
            )
            await stack.enter_async_context(failure_drill())  # nothing unless asked for
            try:
                await server.serve(sockets=server.sockets_to_serve)
                if server.facade.error is not None:
                    raise LocationFailed(f"stopped: {server.facade.error}")
            except asyncio.CancelledError:
                if stopping or not server.started:
                    raise
                # Not a signal (those only end the server's loop): a task group of the
                # Location failed and cancels us. Stop serving before its stores close.
                failing = True
                await _stop_serving(server)
                raise
        # leaving the Location closed every upstream server, plugin and store
    except asyncio.CancelledError:
        if not stopping:
            raise
        print("sidecar: stopped during startup", file=sys.stderr, flush=True)
    except Exception as exc:
        if not failing:
            raise
        log.error("a task of the Location failed while serving", exc_info=exc)
        raise LocationFailed(f"stopped: a task of the Location failed: {_failure(exc)}") \
            from exc
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await asyncio.to_thread(lock.release, state / HTTP_SOCKET)


async def _daemon_server(
    location: Location, state: Path, manifests: Sequence[str | os.PathLike[str]], *,
    tcp: socket.socket | None, host: str, token: str | None, allowed_hosts: Sequence[str],
    idle_exit: float | None,
) -> _Server:
    """The uvicorn server of a daemon, with its sockets bound and its lifespan (daemon.json,
    the MCP facade, the stdio door, the idle and door watchers) ready to run."""
    import json
    import sys

    import uvicorn

    from sidecar.serve.app import build_app
    from sidecar.serve.door import Activity, StdioDoor, bind_unix
    from sidecar.serve.http_guard import ConnectionLimits, guarded_protocol
    from sidecar.serve.local_door import (
        HTTP_SOCKET,
        INFO_FILE,
        STDIO_SOCKET,
        DaemonInfo,
        database_of,
        resolve_manifests,
    )
    from sidecar.serve.mcp_facade import mcp_http

    sockets: list[socket.socket] = []
    url: str | None = None
    if tcp is not None:
        sockets.append(tcp)
        url = f"http://{host if ':' not in host else f'[{host}]'}:{tcp.getsockname()[1]}"
    state_path, resolved = await asyncio.to_thread(
        lambda: (str(state.resolve()), tuple(resolve_manifests(manifests))))
    info = DaemonInfo(
        pid=os.getpid(), state_dir=state_path, manifests=resolved,
        started="serve" if tcp is not None else "on demand" if idle_exit else "daemon",
        idle_exit=idle_exit, url=url, database=database_of(Backends.from_env().database_url),
    )
    info_path = state / INFO_FILE
    # daemon.json before the doors: whoever gets through a door finds it
    await asyncio.to_thread(write_private_file, info_path, json.dumps(info.to_json()))
    sockets.append(await asyncio.to_thread(bind_unix, state / HTTP_SOCKET))
    door = StdioDoor(location, state / STDIO_SOCKET, daemon=info)
    mcp_routes, mcp_lifespan = mcp_http(location)
    holder: list[_Server] = []
    facade = FacadeHealth()

    def failed(what: str, exc: BaseException) -> None:
        if facade.fail(what, exc):
            holder[0].should_exit = True

    @asynccontextmanager
    async def lifespans() -> AsyncIterator[None]:
        serving = False
        try:
            async with mcp_lifespan, asyncio.TaskGroup() as tasks:
                door_task = tasks.create_task(
                    _supervised("the stdio door", door.run(), failed), name="stdio door")
                watcher = tasks.create_task(_supervised(
                    "the daemon watcher", _watch(holder[0], door, activity, state, idle_exit),
                    failed), name="daemon watcher")
                print(f"sidecar: listening on {url or state / HTTP_SOCKET}", file=sys.stderr,
                      flush=True)
                serving = True
                try:
                    yield
                finally:
                    door_task.cancel()
                    watcher.cancel()
                    with contextlib.suppress(FileNotFoundError):
                        info_path.unlink()
        except Exception as exc:
            if not serving:
                raise
            # A task of the MCP facade's own groups died: /mcp cannot serve any more (the
            # SDK's session manager runs once). The daemon exits and lets go of the state
            # directory instead of answering /v1 without a facade.
            failed("the MCP facade", exc)

    app = build_app(
        location, token=token, allowed_hosts=allowed_hosts, extra_routes=mcp_routes,
        extra_lifespan=lifespans(),
    )
    app.state.api.health_extras["daemon"] = info.to_json()
    facade.report_in(app.state.api.health_extras)
    activity = Activity(app)
    config = uvicorn.Config(
        activity, lifespan="on", log_level="warning", timeout_graceful_shutdown=SHUTDOWN_GRACE,
        access_log=False, http=guarded_protocol(ConnectionLimits.from_env()),
    )
    server = _Server(config)
    server.sockets_to_serve = sockets
    server.facade = facade
    holder.append(server)
    return server


class FacadeHealth:
    """The daemon's MCP facade (the stdio door, `/mcp`, the idle watcher) in `/v1/health`:
    `mcp_facade` is {"state": "serving"}, or {"state": "failed", "error": ...} once a task of
    it died; from then on `status` is "unavailable" (503) while the daemon stops (nothing
    restarts: the SDK's session manager of /mcp runs once, and the door's socket is the
    daemon's identity for its watcher)."""

    def __init__(self) -> None:
        self.value: dict[str, str] = {"state": "serving"}
        self._report: dict[str, object] | None = None

    def report_in(self, extras: dict[str, object]) -> None:
        self._report = extras
        extras["mcp_facade"] = self.value

    @property
    def error(self) -> str | None:
        return self.value.get("error")

    def fail(self, what: str, exc: BaseException) -> bool:
        """Record the first failure; whether it was the first. The daemon says it in one line
        when it exits (`LocationFailed`)."""
        if self.error is not None:
            return False
        self.value.update(state="failed", error=f"{what} failed: {_failure(exc)}")
        if self._report is not None:  # the health extras are merged over the report
            self._report["status"] = "unavailable"
        return True


async def _supervised(
    what: str, work: Awaitable[None], failed: Callable[[str, BaseException], None]
) -> None:
    """`work`, whose failure is reported to `failed` instead of ending its task group."""
    try:
        await work
    except Exception as exc:
        failed(what, exc)


async def _watch(
    server: _Server, door: StdioDoor, activity: Activity, state: Path, idle_exit: float | None
) -> None:
    """Stop the daemon when it has been idle `idle_exit` seconds (no stdio session, no HTTP
    request), or when its door is gone (the state directory was removed or taken over)."""
    from sidecar.serve.local_door import STDIO_SOCKET

    door_path = state / STDIO_SOCKET
    seen: int | None = None  # the door's inode, once it is open
    while True:
        await asyncio.sleep(1.0)
        try:
            inode: int | None = (await asyncio.to_thread(door_path.stat)).st_ino
        except FileNotFoundError:
            inode = None
        if seen is None:
            seen = inode
        elif inode != seen:
            log.warning("%s is gone or replaced: stopping", door_path)
            server.should_exit = True
            return
        if idle_exit is None or door.sessions or activity.inflight:
            continue
        idle = time.monotonic() - max(door.last_active, activity.last_active)
        if idle >= idle_exit:
            log.info("no client for %g s: stopping (--idle-exit)", idle_exit)
            server.should_exit = True
            return


class AddressInUse(OSError):
    """`sidecar serve`'s address is taken (another daemon, or any other program)."""


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        raise AddressInUse(exc.errno, f"{host}:{port} is already in use (by another sidecar "
                           "serve, or another program); choose another --port") from None


@asynccontextmanager
async def _closing(sock: socket.socket) -> AsyncIterator[socket.socket]:
    try:
        yield sock
    finally:
        sock.close()  # uvicorn closes it when it served; not when the Location failed to open


def _serve_token(
    state: Path, host: str, *, auth: bool, allow_weak_token: bool,
    allow_no_auth_on_network: bool, tcp: bool = True,
) -> str | None:
    """The bearer token `serve` requires (None: `--no-auth`), after the checks of
    `serve_policy`; warnings and a newly created token are printed to stderr. Without `tcp`
    (`sidecar daemon`: only the 0600 sockets in the private state directory) a weak token is
    accepted: no other user can reach those doors."""
    import sys

    from sidecar.serve.security import TOKEN_FILE, load_or_create_token
    from sidecar.serve.serve_policy import (
        check_no_auth,
        check_token,
        weak_tokens_allowed,
    )

    loosened = prepare_state_dir(state)  # before the token file is read or created
    if loosened is not None:
        print(f"sidecar: warning: {loosened}", file=sys.stderr, flush=True)
    if not auth:
        warning = check_no_auth(host, allow_on_network=allow_no_auth_on_network)
        print(f"sidecar: {warning}", file=sys.stderr, flush=True)
        return None
    token, created = load_or_create_token(state)
    if created:
        # Shown to a person at a terminal only: stderr that goes to a file (a daemon started
        # on demand writes it to daemon.log, a service manager to its journal) gets the path.
        if sys.stderr.isatty():
            print(f"sidecar: new bearer token (also in {state / TOKEN_FILE}): {token}",
                  file=sys.stderr, flush=True)
        else:
            print(f"sidecar: new bearer token in {state / TOKEN_FILE} (mode 0600)",
                  file=sys.stderr, flush=True)
        return token
    from_env = bool(os.environ.get("SIDECAR_TOKEN"))
    check_token(token, "SIDECAR_TOKEN" if from_env else str(state / TOKEN_FILE),
                allow_weak=weak_tokens_allowed(allow_weak_token) or not tcp)
    return token  # (a loose or linked token file was refused as it was read)


async def stdio(
    *,
    root: str | os.PathLike[str] = ".",
    state_dir: str | os.PathLike[str] | None = None,
    manifests: Sequence[str | os.PathLike[str]] = (),
    profile: str | None = None,
) -> None:
    """`sidecar stdio`: the same daemon speaking MCP over its own stdin/stdout until stdin
    closes. Only MCP messages go to stdout; logs go to stderr. `profile`: the profile served
    (None: the default one); an undeclared name raises `UnknownProfile` before serving."""
    from sidecar.serve.mcp_facade import serve_stdio

    state = Path(state_dir) if state_dir is not None else default_state_dir()
    async with sigterm_cancels(), _daemon_location(root, state, manifests) as location:
        location.profiles.resolve(profile)
        await serve_stdio(location, profile=profile)


@asynccontextmanager
async def _daemon_location(
    root: str | os.PathLike[str], state: Path, manifests: Sequence[str | os.PathLike[str]]
) -> AsyncIterator[Location]:
    """The daemon commands' Location, its manifests watched. No server the CLI prestarted
    (`bridges.prestart`) outlives its opening unclaimed: the pool claims what it starts, and
    the rest is stopped once the Location is open, or on the way out if it never opens."""
    retention = retention_from_env()
    try:
        quota = store_quota_from_env(DEFAULT_STORE_QUOTA_BYTES)
        owner_share_from_env()  # checked here: one line, not a traceback from the store
    except ValueError as exc:
        import sys

        print(f"sidecar: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    try:
        await asyncio.to_thread(_record_children, state)
        async with Location.open(root, state_dir=state, manifests=manifests,
                                 retention_seconds=retention, store_quota_bytes=quota,
                                 watch=True, wiring=DAEMON_WIRING) as location:
            pool = location.upstreams
            if pool is None:
                await _stop_unclaimed()
                yield location
                return
            # the servers start in the background: each claims its prestarted process on its
            # first attempt, so what is unclaimed once they all settled is nobody's
            async def stop_unclaimed_once_settled() -> None:
                with anyio.move_on_after(STARTUP_SETTLE_LIMIT):
                    await pool.settled()
                await _stop_unclaimed()

            sweeper = asyncio.create_task(stop_unclaimed_once_settled(),
                                          name="stop unclaimed prestarted servers")
            try:
                yield location
            finally:
                sweeper.cancel()
                await asyncio.wait([sweeper])
    finally:
        await _stop_unclaimed()
        CHILD_GROUPS.stop_recording()  # every child is stopped by now


def _record_children(state: Path) -> None:
    """Kill what a previous daemon of `state` left running, then record our own children's
    process groups (`bridges.child_groups`)."""
    prepare_state_dir(state)  # or UnsafeStateDir, before anything is written there
    reap_leftovers(state)
    CHILD_GROUPS.record_in(state)


async def _stop_unclaimed() -> None:
    if PRESTARTED.waiting:
        await asyncio.to_thread(PRESTARTED.discard)
