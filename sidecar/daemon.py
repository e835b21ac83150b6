"""The composition root: the only module that wires frontends, bridges and stores together.

It supplies the core `Location` (`sidecar.location`) with its wiring (`DEFAULT_WIRING`: the
sources the manifests declare) and exports the wired class as `sidecar.Location`; it runs the
daemon commands (`serve`: native API + MCP over HTTP; `stdio`: MCP over stdin/stdout) from
startup to graceful shutdown. Nothing imports it but the CLI entry point (`sidecar.cli`) and
the lazy `sidecar.Location` re-export (checked by `tests/test_architecture.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import os
import socket
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from uvicorn import Server as uvicorn_Server

from bridges.manifest_sources import ManifestSources
from bridges.prestart import PRESTARTED
from sidecar.location import (
    DEFAULT_RETENTION_SECONDS,
    DEFAULT_STORE_QUOTA_BYTES,
    Wiring,
    default_state_dir,
)
from sidecar.location import Location as CoreLocation
from sidecar.state_dir import prepare_state_dir, write_private_file
from sidecar.store_pressure import store_quota_from_env

__all__ = [
    "DEFAULT_RETENTION_SECONDS",
    "DEFAULT_STORE_QUOTA_BYTES",
    "DEFAULT_WIRING",
    "AddressInUse",
    "Location",
    "default_state_dir",
    "freeze_startup_heap",
    "parse_duration",
    "retention_from_env",
    "serve",
    "stdio",
]

log = logging.getLogger("sidecar.daemon")


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


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds from "604800", "90s", "30m", "12h" or "7d"; ValueError otherwise."""
    value = text.strip().lower()
    scale = _UNITS.get(value[-1:], None)
    number = value[:-1] if scale is not None else value
    try:
        seconds = float(number) * (scale or 1)
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (use seconds, or 90s, 30m, 12h, 7d)") from None
    if not 0 < seconds < float("inf"):
        raise ValueError(f"a duration must be positive and finite, got {text!r}")
    return seconds


def retention_from_env() -> float:
    """`$SIDECAR_RETENTION` (see `parse_duration`) for the CLI's Locations, else 7 days. A bad
    value ends the command with a one-line message and exit status 2 (a usage error)."""
    text = os.environ.get("SIDECAR_RETENTION", "").strip()
    try:
        return parse_duration(text) if text else DEFAULT_RETENTION_SECONDS
    except ValueError as exc:
        import sys

        print(f"sidecar: SIDECAR_RETENTION: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


class Location(CoreLocation):
    """`sidecar.Location`: the core `Location` (`sidecar.location`) with the daemon's wiring
    as its default, so `Location.open(..., manifests=[...])` attaches the manifests' sources."""

    @classmethod
    def default_wiring(cls) -> Wiring:
        return DEFAULT_WIRING


DEFAULT_WIRING = Wiring(attach_sources=ManifestSources)


class _Server(uvicorn_Server):
    """uvicorn's server without its own signal capture: `serve()` installs handlers that only
    start a graceful shutdown, so the Location closes (children stopped) before we exit."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve(
    *,
    root: str | os.PathLike[str] = ".",
    state_dir: str | os.PathLike[str] | None = None,
    manifests: Sequence[str | os.PathLike[str]] = (),
    host: str = "127.0.0.1",
    port: int = 8765,
    auth: bool = True,
    allowed_hosts: Sequence[str] = (),
    allow_weak_token: bool = False,
    allow_no_auth_on_network: bool = False,
) -> None:
    """`sidecar serve`: open the default Location, then serve HTTP until SIGINT/SIGTERM.

    Refuses (`UnsafeConfiguration`, before any server starts) a weak token unless
    `allow_weak_token`, and `auth=False` on an address that is not loopback unless
    `allow_no_auth_on_network` (`sidecar.serve.serve_policy`).

    Startup prints one line `sidecar: listening on http://HOST:PORT` to stderr (with the
    real port when `port=0`) and writes `<state>/daemon.json` ({url, pid}) for CLI clients.
    Shutdown is graceful: in-flight requests get 10 s, then what is left is cancelled and the
    Location closes (upstream servers stopped, stores closed).
    """
    import json
    import signal
    import sys

    import uvicorn

    from sidecar.serve.app import build_app
    from sidecar.serve.http_guard import ConnectionLimits, guarded_protocol
    from sidecar.serve.mcp_facade import mcp_http

    state = Path(state_dir) if state_dir is not None else default_state_dir()
    try:
        token = await asyncio.to_thread(
            _serve_token, state, host, auth=auth, allow_weak_token=allow_weak_token,
            allow_no_auth_on_network=allow_no_auth_on_network,
        )
        # Bound before the Location opens: a port in use is reported before any upstream
        # server starts, and the real port is known when port=0.
        sock = _bind(host, port)
    except BaseException:
        await _stop_unclaimed()
        raise
    async with _closing(sock), _daemon_location(root, state, manifests) as location:
        bound = sock.getsockname()
        url = f"http://{host if ':' not in host else f'[{host}]'}:{bound[1]}"
        info = state / "daemon.json"

        @asynccontextmanager
        async def announce() -> AsyncIterator[None]:
            await asyncio.to_thread(
                write_private_file, info, json.dumps({"url": url, "pid": os.getpid()})
            )
            print(f"sidecar: listening on {url}", file=sys.stderr, flush=True)
            try:
                yield
            finally:
                await asyncio.to_thread(info.unlink, missing_ok=True)

        mcp_routes, mcp_lifespan = mcp_http(location)

        @asynccontextmanager
        async def lifespans() -> AsyncIterator[None]:
            async with announce(), mcp_lifespan:
                yield

        app = build_app(
            location, token=token, allowed_hosts=allowed_hosts, extra_routes=mcp_routes,
            extra_lifespan=lifespans(),
        )
        config = uvicorn.Config(
            app, lifespan="on", log_level="warning", timeout_graceful_shutdown=10,
            access_log=False, http=guarded_protocol(ConnectionLimits.from_env()),
        )
        server = _Server(config)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            # first signal: graceful; a second one: uvicorn's force exit
            loop.add_signal_handler(sig, server.handle_exit, sig, None)
        try:
            await server.serve(sockets=[sock])
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
    # leaving the Location closed every upstream server, plugin and store before we return


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
    allow_no_auth_on_network: bool,
) -> str | None:
    """The bearer token `serve` requires (None: `--no-auth`), after the checks of
    `serve_policy`; warnings and a newly created token are printed to stderr."""
    import sys

    from sidecar.serve.security import TOKEN_FILE, load_or_create_token
    from sidecar.serve.serve_policy import (
        check_no_auth,
        check_token,
        token_file_warning,
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
        print(f"sidecar: new bearer token (also in {state / TOKEN_FILE}): {token}",
              file=sys.stderr, flush=True)
        return token
    from_env = bool(os.environ.get("SIDECAR_TOKEN"))
    check_token(token, "SIDECAR_TOKEN" if from_env else str(state / TOKEN_FILE),
                allow_weak=weak_tokens_allowed(allow_weak_token))
    loose = None if from_env else token_file_warning(state / TOKEN_FILE)
    if loose is not None:
        print(f"sidecar: {loose}", file=sys.stderr, flush=True)
    return token


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
    async with _daemon_location(root, state, manifests) as location:
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
    except ValueError as exc:
        import sys

        print(f"sidecar: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    try:
        async with Location.open(root, state_dir=state, manifests=manifests,
                                 retention_seconds=retention, store_quota_bytes=quota,
                                 watch=True) as location:
            await _stop_unclaimed()
            yield location
    finally:
        await _stop_unclaimed()


async def _stop_unclaimed() -> None:
    if PRESTARTED.waiting:
        await asyncio.to_thread(PRESTARTED.discard)
