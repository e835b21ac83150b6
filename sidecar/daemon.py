"""The composition root: wires storage, the seam, the registry, permissions, plugins and the
sources declared in manifests into a Location.

A `Location` is one workspace the daemon serves: a root directory, its manifests, its
registry (over the process-wide application registry), hooks, permission policy, plugins, and
its namespace in the managed store and the outcome log. `Location.open(...)` is an async
context manager that owns every resource it opens and closes them in reverse order.

State lives in one directory (`state_dir`, default `$SIDECAR_STATE_DIR`, else
`$XDG_STATE_HOME/mcp-sidecar`, else `~/.local/state/mcp-sidecar`): `outcomes.sqlite`,
`permissions.sqlite`, `tokens.sqlite` (scoped bearer tokens, hashed) and `managed/`
(retained text). It is private: created 0700 with every file in it 0600, and refused when
others can write it (`sidecar.state_dir`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from uvicorn import Server as uvicorn_Server

from bridges.manifest import ManifestSet
from bridges.mcp import ServerHealth
from bridges.prestart import PRESTARTED
from managed_store import ManagedStore
from sidecar.codemode import (
    DEFAULT_LIMITS,
    CodeModeLimits,
    CodeModeSetting,
    Sandbox,
    codemode_snapshot,
)
from sidecar.events import EventBus, RegistryChanged
from sidecar.hooks import Hooks
from sidecar.managed_read import managed_read_tool
from sidecar.manifest_sources import ManifestSources
from sidecar.metadata import DEFAULT_MAX_METADATA_BYTES
from sidecar.outcome import Outcome
from sidecar.outcome_log import SqliteOutcomeLog
from sidecar.overrides import Overrides
from sidecar.permission import PermissionRule
from sidecar.permission_service import PermissionService
from sidecar.pins import Pins, SqlitePinStore
from sidecar.plugins import PluginHost
from sidecar.profiles import Profiles
from sidecar.registry import Registry, Tools, application_registry
from sidecar.seam import Seam
from sidecar.snapshot import Snapshot, SnapshotStore, select
from sidecar.sqlite_wal import DEFAULT_WAL_CAP_BYTES
from sidecar.state_dir import prepare_state_dir, write_private_file
from sidecar.state_usage import state_usage
from sidecar.tokens import SqliteTokenStore, TokenStore
from sidecar.tool import DEFAULT_BOUNDS, Bounds

DEFAULT_RETENTION_SECONDS = 7 * 86400
DEFAULT_STORE_QUOTA_BYTES = 2 * 1024**3

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


def default_state_dir() -> Path:
    explicit = os.environ.get("SIDECAR_STATE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "mcp-sidecar"


class Location:
    """One workspace: registry, hooks, permissions, plugins, seam services.

    Build it with `Location.open`.
    """

    def __init__(
        self, *, name: str, root: Path, state_dir: Path, seam: Seam, registry: Registry,
        events: EventBus, permissions: PermissionService, plugins: PluginHost,
        manifests: ManifestSet,
    ) -> None:
        self.name = name
        self.root = root
        self.state_dir = state_dir
        self.seam = seam
        self.registry = registry
        self.events = events
        self.permissions = permissions
        self.plugins = plugins
        self.manifests = manifests
        self.tools = Tools(registry)
        self.snapshots = SnapshotStore()
        self.sources: ManifestSources | None = None
        self.sandbox: Sandbox | None = None
        self.codemode: CodeModeSetting = "direct"
        self.codemode_limits: CodeModeLimits = DEFAULT_LIMITS
        self.retention_seconds: float = DEFAULT_RETENTION_SECONDS
        self.store_quota_bytes: int = DEFAULT_STORE_QUOTA_BYTES
        self.profiles = Profiles()
        self.overrides = Overrides()
        self.pins = Pins(None, events)
        self.profiles.common.append(self.pins.reshape)
        self.profiles.common.append(self.overrides.reshape_common)
        self.pins.on_approve = self.profiles.changed
        self.profiles.wrappers.append(self.overrides.reshape_profile)
        self.tokens: TokenStore | None = None
        """Scoped bearer tokens (`sidecar.tokens`), in `<state>/tokens.sqlite`."""

    @property
    def hooks(self) -> Hooks:
        return self.seam.hooks

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        root: str | os.PathLike[str] = ".",
        *,
        state_dir: str | os.PathLike[str] | None = None,
        manifests: Sequence[str | os.PathLike[str]] = (),
        name: str = "default",
        bounds: Bounds = DEFAULT_BOUNDS,
        metadata_max_bytes: int = DEFAULT_MAX_METADATA_BYTES,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        store_quota_bytes: int = DEFAULT_STORE_QUOTA_BYTES,
        wal_cap_bytes: int = DEFAULT_WAL_CAP_BYTES,
        durable: bool = True,
        plugins: Iterable[str] = (),
        entry_point_plugins: bool = True,
        permission_defaults: Iterable[PermissionRule] = (),
        ask_timeout: float | None = None,
        watch: bool = False,
        codemode: CodeModeSetting = "direct",
        codemode_limits: CodeModeLimits = DEFAULT_LIMITS,
    ) -> AsyncIterator[Location]:
        """Open a Location.

        Invalid manifest entries are logged and kept in `location.manifests.problems`; the
        valid ones still load. `watch=True` reloads the manifests when their files change
        (see `sidecar.manifest_sources`). `durable=False` keeps no outcome log (benchmarks).
        `retention_seconds` applies to retained texts and to stored outcomes alike (a call
        id replayed after its outcome was pruned gets an `expired` error);
        `wal_cap_bytes` caps the outcome log's write-ahead log (see `sidecar.sqlite_wal`).
        """
        root_dir = await asyncio.to_thread(Path(root).resolve)
        state = Path(state_dir) if state_dir is not None else default_state_dir()
        loosened = await asyncio.to_thread(prepare_state_dir, state)  # or UnsafeStateDir
        if loosened is not None:
            log.warning("%s", loosened)
        async with AsyncExitStack() as stack:
            store = await ManagedStore.open(
                state / "managed", ttl_seconds=retention_seconds, quota_bytes=store_quota_bytes,
                cleanup_interval=min(3600.0, max(1.0, retention_seconds / 10)),
            )
            stack.push_async_callback(store.aclose)
            outcomes = None
            if durable:
                outcomes = await SqliteOutcomeLog.open(
                    state / "outcomes.sqlite", retention_seconds=retention_seconds,
                    wal_cap_bytes=wal_cap_bytes,
                )
                stack.push_async_callback(outcomes.aclose)
            events = EventBus()
            permissions = await PermissionService.open(
                state / "permissions.sqlite" if durable else None,
                location=name,
                defaults=tuple(permission_defaults),
                ask_timeout=ask_timeout,
                events=events,
            )
            stack.push_async_callback(permissions.aclose)
            seam = Seam(
                store=store, outcomes=outcomes, location=name, bounds=bounds,
                metadata_max_bytes=metadata_max_bytes, events=events,
            )
            registry = Registry(parent=application_registry)
            stack.callback(registry.detach)
            registry.on_change(lambda: events.publish(RegistryChanged(registry.version)))
            host = PluginHost(registry)
            stack.callback(host.close)
            location = cls(
                name=name, root=root_dir, state_dir=state, seam=seam, registry=registry,
                events=events, permissions=permissions, plugins=host, manifests=ManifestSet(),
            )
            location.tokens = await SqliteTokenStore.open(state / "tokens.sqlite")
            stack.push_async_callback(location.tokens.aclose)
            if durable:
                location.pins.store = await SqlitePinStore.open(state / "pins.sqlite")
            stack.push_async_callback(location.pins.aclose)
            await location.pins.load()
            loop = asyncio.get_running_loop()
            # evaluate pins as soon as an upstream's tools change, not at the next snapshot
            registry.on_change(lambda: _call_soon(loop, location.check_definitions))
            location.sandbox = await stack.enter_async_context(Sandbox())  # workers start lazily
            location.codemode, location.codemode_limits = codemode, codemode_limits
            location.retention_seconds = retention_seconds
            location.store_quota_bytes = store_quota_bytes
            registry.register(
                {"managed_read": managed_read_tool(store, bounds)}, label="builtin", builtin=True
            )
            location.sources = await stack.enter_async_context(ManifestSources(
                location, manifests, base_bounds=bounds, plugins=list(plugins),
                entry_point_plugins=entry_point_plugins,
            ))
            if watch:
                watcher = asyncio.create_task(location.sources.watch(), name="manifest-watch")
                stack.push_async_callback(_cancel_and_wait, watcher)
            yield location

    def snapshot(
        self,
        *,
        session_id: str | None = None,
        allow: Iterable[str] | None = None,
        deny: Iterable[str] | None = None,
        final_step: bool = False,
        hide_denied: bool = True,
        codemode: CodeModeSetting | None = None,
        keep: bool = True,
        profile: str | None = None,
    ) -> Snapshot:
        """Capture the effective tools for one model request and keep it addressable by id.

        `allow`/`deny` are globs over effective names; `hide_denied` leaves out tools the
        permission policy denies outright for `session_id` (visibility, not authorization:
        tools still ask for permission when called). `codemode` ("direct", "codemode",
        "both"; default the Location's setting) chooses direct tools, the Code Mode
        `execute`/`search_tools`/`describe_tools` built-ins, or both. `keep=False` returns a
        snapshot that is not kept by id (`location.snapshots`): for a listing, or a holder that
        keeps the snapshot itself, so that it never evicts one a caller will look up.
        `profile` names a profile (`sidecar.profiles`; None: the default one): only its tools
        are captured, served its way; an undeclared name raises `UnknownProfile`.
        """
        chosen = self.profiles.resolve(profile)
        effective = self.profiles.entries(chosen, self.registry.effective())
        entries = select(effective, allow, deny)
        removed = set(effective) - set(entries)
        if hide_denied:
            denied = self.permissions.outright_denial(
                session_id or "", chosen.rules if chosen is not None else ()
            )
            removed.update(
                name for name, entry in entries.items()
                if denied(entry.tool.permission_action or name)
            )
        for hook in self.hooks.definitions:
            kept = tuple(e.definition for n, e in entries.items() if n not in removed)
            removed.update(hook(session_id, kept) or ())
        captured = {n: e for n, e in entries.items() if n not in removed}
        mode = codemode or (chosen.codemode if chosen is not None else None) or self.codemode
        snapshot = codemode_snapshot(
            self.seam, captured, mode=mode, sandbox=self.sandbox,
            limits=self.codemode_limits, session_id=session_id, final_step=final_step,
            removed=removed,
        )
        snapshot.profile = chosen.name if chosen is not None else self.profiles.default_name
        return self.snapshots.add(snapshot) if keep else snapshot

    def check_definitions(self) -> None:
        """Compare every MCP tool with its pin now (`sidecar.pins`); changes become events."""
        self.profiles.entries(None, self.registry.effective())

    async def health(self) -> dict[str, Any]:
        """The truth about this Location: servers, plugins, manifest problems, store usage,
        the state directory's size by part and what pruning and eviction removed
        (`state`, see `sidecar.state_usage`).

        `status` is "ok" when every enabled server is ready, no plugin failed and the
        manifests have no errors and no tool of a `pin = "hold"` server differs from its pin;
        else "degraded" (`definition_changes` lists every change, `warn` ones included).
        """
        servers = {name: h.to_json() for name, h in self.server_health().items()}
        plugins = {ref: s.to_json() for ref, s in self.plugins.status.items()}
        problems = [
            {"file": p.file, "path": p.path, "message": p.message, "severity": p.severity}
            for p in self.manifests.problems
        ]
        pending = self.sources.reload_problems if self.sources is not None else []
        reload_problems = [
            {"file": p.file, "path": p.path, "message": p.message} for p in pending
        ]
        stats = await self.seam.store.stats()
        degraded = (
            any(s["state"] not in ("ready", "disabled") for s in servers.values())
            or any(p["state"] == "failed" for p in plugins.values())
            or any(p["severity"] == "error" for p in problems)
            or bool(reload_problems)
            or any(c.policy == "hold" for c in self.pins.held.values())
        )
        return {
            "status": "degraded" if degraded else "ok",
            "location": self.name,
            "servers": servers,
            "plugins": plugins,
            "manifest_problems": problems,
            "reload_problems": reload_problems,
            "definition_changes": [c.to_json() for c in self.pins.held.values()],
            "store": {"objects": stats.count, "bytes": stats.bytes},
            "state": await state_usage(
                self.state_dir, self.seam.outcomes, stats,
                retention_seconds=self.retention_seconds, quota_bytes=self.store_quota_bytes,
            ),
            "tools": len(self.registry.effective()),
            "reserved_name_conflicts": [c.to_json() for c in self.registry.reserved_conflicts()],
        }

    def server_health(self) -> dict[str, ServerHealth]:
        """Health of the upstream MCP servers, by manifest key."""
        pool = self.sources.pool if self.sources is not None else None
        return pool.health() if pool is not None else {}

    async def reload_manifests(self) -> bool:
        """Re-read and apply the manifests (all valid) or keep the last good ones (False)."""
        if self.sources is None:
            return False
        return await self.sources.reload()

    async def outcome(self, call_id: str) -> Outcome | None:
        """The durable outcome of a settled call, if any."""
        if self.seam.outcomes is None:
            return None
        return await self.seam.outcomes.get(self.name, call_id)



def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> None:
    loop.call_soon(fn)


async def _cancel_and_wait(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.wait([task])

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
    from sidecar.serve.http_protocol import TargetKeepingHttpToolsProtocol
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
            access_log=False, http=TargetKeepingHttpToolsProtocol,
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
        async with Location.open(root, state_dir=state, manifests=manifests,
                                 retention_seconds=retention, watch=True) as location:
            await _stop_unclaimed()
            yield location
    finally:
        await _stop_unclaimed()


async def _stop_unclaimed() -> None:
    if PRESTARTED.waiting:
        await asyncio.to_thread(PRESTARTED.discard)
