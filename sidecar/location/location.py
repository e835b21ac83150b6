"""`Location`: one workspace the daemon serves, the central object of the Python API: a root
directory, its registry (over the process-wide application registry), hooks, permission
policy, plugins, the seam, its stores and its sources. `Location.open(...)` is an async context
manager that owns every resource it opens and closes them in reverse order. What a Location is
attached to comes in through a `Wiring` (its docstring says how `sidecar.Location` supplies
one); where its state lives is `default_state_dir`'s docstring.

Imports the whole core (the bridges' value types for type checking only); never a bridge, a
frontend or the composition root. Exports `Location`, `Wiring`, `AttachSources`, `NotWired`,
`CallListeners`, `default_state_dir` and `DEFAULT_STORE_QUOTA_BYTES`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Self, cast

from sidecar.codemode import (
    DEFAULT_LIMITS,
    CodeModeLimits,
    CodeModeSetting,
    Sandbox,
    codemode_snapshot,
)
from sidecar.codemode.tool_index import ToolIndexes
from sidecar.codemode.tool_search import search_snapshot
from sidecar.execution.hooks import Hooks
from sidecar.execution.managed_read import managed_read_tool
from sidecar.execution.seam import Seam
from sidecar.execution.snapshot import Snapshot, SnapshotExpired, SnapshotStore, select
from sidecar.execution.snapshot_sharing import SnapshotSharing
from sidecar.location.health import health_report
from sidecar.location.ports import OpenStores, StoreOptions, Stores
from sidecar.location.sources import Sources, UpstreamPool
from sidecar.location.store_pressure import StorePressure
from sidecar.model import tracing
from sidecar.model.codemode import ExposeSetting
from sidecar.model.errors import SidecarError
from sidecar.model.events import EventBus, RegistryChanged
from sidecar.model.metadata import DEFAULT_MAX_METADATA_BYTES
from sidecar.model.outcome import Outcome
from sidecar.model.permissions import PermissionRule
from sidecar.model.retention import DEFAULT_RETENTION_SECONDS
from sidecar.model.tool import DEFAULT_BOUNDS, Bounds
from sidecar.policy.guardrails import Guardrails
from sidecar.policy.permission_service import PermissionService
from sidecar.policy.pins import Pins
from sidecar.policy.ratelimit import RateLimits
from sidecar.registry.overrides import Overrides
from sidecar.registry.plugins import PluginHost
from sidecar.registry.profiles import Profiles, UnknownProfile
from sidecar.registry.registry import Entry, Registry, ToolDefinition, Tools, application_registry
from sidecar.stores.call_history import AuditSettings, CallRecord, SettledCall, record_of
from sidecar.stores.event_log import EventLog, EventLogFactory
from sidecar.stores.grants import GrantStore, GrantStoreUnavailable
from sidecar.stores.outcome_log import DEFAULT_WAL_CAP_BYTES
from sidecar.stores.snapshot_records import SnapshotRecipe
from sidecar.stores.state_dir import prepare_state_dir

if TYPE_CHECKING:  # types only: the core never imports a bridge at run time
    from bridges.manifest.loading import ManifestSet
    from bridges.mcp import ServerHealth

log = logging.getLogger("sidecar.location")

DEFAULT_STORE_QUOTA_BYTES = 2 * 1024**3


def default_state_dir() -> Path:
    """`$SIDECAR_STATE_DIR`, else `$XDG_STATE_HOME/mcp-sidecar`, else
    `~/.local/state/mcp-sidecar`. The embedded stores keep there `outcomes.sqlite`,
    `permissions.sqlite`, `tokens.sqlite` (scoped bearer tokens, hashed), `pins.sqlite`
    (pinned tool definitions) and `managed/` (retained text). It is private: created 0700
    with every file in it 0600, and refused when others can write it
    (`sidecar.stores.state_dir`)."""
    explicit = os.environ.get("SIDECAR_STATE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "mcp-sidecar"


class AttachSources(Protocol):
    """Attach the sources a Location's manifests declare; entering applies them and the
    result becomes `location.sources`."""

    def __call__(
        self,
        location: Location,
        entries: Sequence[str | os.PathLike[str]],
        *,
        base_bounds: Bounds,
        plugins: Sequence[str] = (),
        entry_point_plugins: bool = True,
    ) -> AbstractAsyncContextManager[Sources]: ...


@dataclass(frozen=True, slots=True)
class Wiring:
    """What the composition root supplies to `Location.open`: the store implementations and
    the sources. Code below the root sees only the interfaces (`sidecar.location.ports`): the
    stores arrive as one `Stores` value (`location.stores`), and `attach_sources` attaches
    what the manifests declare (MCP servers, manifest tools, plugins, policy, live reload) as
    `Sources` (`location.upstreams` is the upstream MCP servers).

    `Location.open(wiring=...)` takes it explicitly. Without one it asks `default_wiring()`,
    which the core class does not have: `sidecar.Location` (the public name) is the
    composition root's subclass whose `default_wiring()` returns the daemon's defaults, so
    `from sidecar import Location; Location.open(..., manifests=[...])` attaches bridges,
    and code in the core and the frontends types against the core class only."""

    open_stores: OpenStores
    event_log: EventLogFactory
    attach_sources: AttachSources


class NotWired(SidecarError):
    """`Location.open` was called on the core class without a `Wiring`."""



class CallListeners:
    """`Location.call_listeners`: callables told of every settled call's history row. Adding
    the first or removing the last re-wires the seam's audit hook."""

    __slots__ = ("_changed", "_items")

    def __init__(self, changed: Callable[[], None]) -> None:
        self._items: list[Callable[[CallRecord], None]] = []
        self._changed = changed

    def append(self, listener: Callable[[CallRecord], None]) -> None:
        self._items.append(listener)
        self._changed()

    def remove(self, listener: Callable[[CallRecord], None]) -> None:
        self._items.remove(listener)
        self._changed()

    def __iter__(self) -> Iterator[Callable[[CallRecord], None]]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


class Location:
    """One workspace: registry, hooks, permissions, plugins, seam services.

    Build it with `Location.open`.
    """

    def __init__(
        self, *, name: str, root: Path, state_dir: Path, seam: Seam, registry: Registry,
        events: EventBus, permissions: PermissionService, plugins: PluginHost, stores: Stores,
        wiring: Wiring | None = None, codemode: CodeModeSetting = "direct",
        codemode_limits: CodeModeLimits = DEFAULT_LIMITS,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        store_quota_bytes: int = DEFAULT_STORE_QUOTA_BYTES,
    ) -> None:
        self.name = name
        self.root = root
        self.state_dir = state_dir
        self.seam = seam
        self.registry = registry
        self.events = events
        self.permissions = permissions
        self.plugins = plugins
        self.stores = stores
        """The open stores (`sidecar.location.ports.Stores`): history, tokens, grants, and in
        a fleet the shared asks, cancels, rounds and the database check."""
        self.wiring = wiring
        """What `Location.open` was wired with (the root's store and source choices)."""
        self.tools = Tools(registry)
        self.snapshots = SnapshotStore()
        self.sharing = SnapshotSharing(self.snapshots, stores.snapshots, name, self._remade)
        """Kept snapshots by id across replicas (`sidecar.stores.snapshot_records`)."""
        self.store_pressure = StorePressure()
        self.sources: Sources | None = None
        """What the manifests attached (`sidecar.location.sources`); None until then."""
        self.sandbox: Sandbox | None = None
        self._codemode = codemode
        self._expose: ExposeSetting = "all"
        self.tool_indexes = ToolIndexes()
        """The search indexes of `expose = "search"` snapshots (`sidecar.codemode.tool_index`)."""
        self.codemode_limits = codemode_limits
        self.retention_seconds = retention_seconds
        self.store_quota_bytes = store_quota_bytes
        self.profiles = Profiles()
        self.overrides = Overrides()
        self.pins = Pins(stores.pins, events)
        """Definition pinning (`sidecar.policy.pins`), in `<state>/pins.sqlite`."""
        self._checks: set[asyncio.Task[None]] = set()  # `check_definitions_soon` in flight
        self.pins.on_approve = self.profiles.changed
        seam.admission.append(self.pins.refusal)
        seam.unserved.append(self.pins.withdrawn)
        self.profiles.common.append(self.pins.reshape)
        self.profiles.common.append(self.overrides.reshape_common)
        self.profiles.wrappers.append(self.overrides.reshape_profile)
        self.rate_limits = RateLimits()
        """Calls per minute and at once, per profile and tool (`sidecar.policy.ratelimit`)."""
        self.profiles.wrappers.append(self.rate_limits.reshape_profile)
        self.guardrails = Guardrails()
        """Secrets and an external guard on inputs and outputs (`sidecar.policy.guardrails`):
        wraps only the tools a manifest `[guardrails]` applies to."""
        self.profiles.wrappers.append(self.guardrails.reshape_profile)
        self.call_listeners = CallListeners(self._wire_audit)
        """Told of every settled call with its history row (the HTTP app's metrics)."""
        self.cancellers: list[Callable[[str], Awaitable[str]]] = []
        """Cancel a call running in this process by id ("cancelling" or "not_running"; the
        HTTP app's calls): how another replica's cancel request reaches it."""
        self._wire_audit()

    @property
    def manifests(self) -> ManifestSet:
        """The manifests applied now (invalid entries in `manifests.problems`)."""
        if self.sources is None:
            raise AttributeError("no sources are attached to this Location yet")
        return self.sources.manifests

    @property
    def upstreams(self) -> UpstreamPool | None:
        """The upstream MCP servers (`sidecar.location.sources.UpstreamPool`); None: none
        attached."""
        return self.sources.upstreams if self.sources is not None else None

    @property
    def audit(self) -> AuditSettings:
        """What the history keeps of inputs (manifest `[audit]`)."""
        return self.sources.audit if self.sources is not None else _NO_AUDIT_SETTINGS

    @property
    def codemode(self) -> CodeModeSetting:
        """How snapshots that name no setting advertise tools: the manifests' `codemode`,
        else `Location.open`'s."""
        chosen = self.sources.codemode if self.sources is not None else None
        return chosen or self._codemode

    @codemode.setter
    def codemode(self, value: CodeModeSetting) -> None:
        self._codemode = value

    @property
    def expose(self) -> ExposeSetting:
        """Which tools snapshots that name no setting list (`all`, or `search`: the search
        built-ins; docs/tool-search.md): the manifests' top-level `expose`, else this one's."""
        chosen = self.sources.expose if self.sources is not None else None
        return chosen or self._expose

    @expose.setter
    def expose(self, value: ExposeSetting) -> None:
        self._expose = value

    def record_call(self, call: SettledCall) -> None:
        """The seam's audit hook: one history row for a settled or replayed call, also handed
        to `call_listeners` (metrics)."""
        record = record_of(call, self.audit, self._server_of)
        if self.guardrails.configured:
            record = self.guardrails.attach(record, self.audit)
        history = self.stores.history
        if history is not None:
            history.add(record)
        for listener in self.call_listeners:
            listener(record)

    def _wire_audit(self) -> None:
        """The seam tells `record_call` of its calls only while a history or a listener wants
        the rows (not durable and no HTTP app: the seam builds nothing per call for them)."""
        wanted = self.stores.history is not None or bool(self.call_listeners)
        self.seam.audit = self.record_call if wanted else None

    def _server_of(self, name: str) -> str | None:
        label = self.registry.source_of(name)
        if label is None or label == "builtin":
            return None
        return label.removeprefix("mcp:")

    @classmethod
    def default_wiring(cls) -> Wiring:
        """The wiring `open` uses when it is given none; `sidecar.Location` supplies it."""
        raise NotWired(
            "sidecar.location.location.Location has no default wiring: use `from sidecar import "
            "Location`, or pass `wiring=`"
        )

    def grant_store(self) -> GrantStore:
        """This Location's OAuth grants: the fleet's, else the state directory's
        (`SIDECAR_OAUTH_STORE`; `GrantStoreUnavailable` when that names nothing usable)."""
        grants = self.stores.grants
        if grants is None:  # (the composition root opens the state directory's)
            raise GrantStoreUnavailable("this Location was opened without a grant store")
        return grants

    def new_event_log(self) -> EventLog:
        """An event log over this Location's events, not started (`/v1/events` starts it):
        the stores' when they chose one (fleet mode), else the wiring's."""
        if self.stores.events is not None:
            return self.stores.events(self.events)
        if self.wiring is None:
            raise NotWired("this Location was not opened with `Location.open`")
        return self.wiring.event_log(self.events)

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
        wiring: Wiring | None = None,
    ) -> AsyncIterator[Self]:
        """Open a Location.

        Invalid manifest entries are logged and kept in `location.manifests.problems`; the
        valid ones still load. `watch=True` reloads the manifests when their files change
        (see `sidecar.daemon.sources`). `durable=False` keeps no outcome log (benchmarks).
        `retention_seconds` applies to retained texts and to stored outcomes alike (a call
        id replayed after its outcome was pruned gets an `expired` error);
        `wal_cap_bytes` caps the outcome log's write-ahead log (see `sidecar.backends.sqlite.wal`).
        `wiring` defaults to `default_wiring()`.
        """
        wired = wiring if wiring is not None else cls.default_wiring()
        tracing.refresh()  # an embedder's provider installed since the last Location opened
        root_dir = await asyncio.to_thread(Path(root).resolve)
        state = Path(state_dir) if state_dir is not None else default_state_dir()
        loosened = await asyncio.to_thread(prepare_state_dir, state)  # or UnsafeStateDir
        if loosened is not None:
            log.warning("%s", loosened)
        async with AsyncExitStack() as stack:
            stores = await stack.enter_async_context(wired.open_stores(StoreOptions(
                state_dir=state, location=name, durable=durable,
                retention_seconds=retention_seconds, store_quota_bytes=store_quota_bytes,
                wal_cap_bytes=wal_cap_bytes,
            )))
            store, outcomes = stores.managed, stores.outcomes
            events = EventBus()
            permissions = await PermissionService.open(
                stores.permissions,
                location=name,
                defaults=tuple(permission_defaults),
                ask_timeout=ask_timeout,
                events=events,
                shared=stores.asks,
            )
            stack.push_async_callback(permissions.aclose)
            seam = Seam(
                store=store, outcomes=outcomes, location=name, bounds=bounds,
                metadata_max_bytes=metadata_max_bytes, events=events,
            )
            stack.push_async_callback(seam.unrecorded.aclose)  # before its outcome log
            registry = Registry(parent=application_registry)
            stack.callback(registry.detach)
            registry.on_change(lambda: events.publish(RegistryChanged(registry.version)))
            host = PluginHost(registry)
            stack.callback(host.close)
            location = cls(
                name=name, root=root_dir, state_dir=state, seam=seam, registry=registry,
                events=events, permissions=permissions, plugins=host, stores=stores,
                wiring=wired, codemode=codemode, codemode_limits=codemode_limits,
                retention_seconds=retention_seconds, store_quota_bytes=store_quota_bytes,
            )
            if stores.cancels is not None:
                await stores.cancels.start(location.cancel_here)
            stack.push_async_callback(location.pins.aclose)
            stack.push_async_callback(location.guardrails.aclose)
            stack.push_async_callback(location._stop_checks)
            await location.pins.load()
            loop = asyncio.get_running_loop()
            # pins are checked as soon as an upstream's tools change, not at the next snapshot
            registry.on_change(lambda: _call_soon(loop, location.check_definitions_soon))
            location.sandbox = await stack.enter_async_context(Sandbox())  # workers start lazily
            registry.register(
                {"managed_read": managed_read_tool(store, bounds)}, label="builtin", builtin=True
            )
            sources = await stack.enter_async_context(wired.attach_sources(
                location, manifests, base_bounds=bounds, plugins=list(plugins),
                entry_point_plugins=entry_point_plugins,
            ))
            location.sources = sources
            if watch:
                watcher = asyncio.create_task(sources.watch(), name="manifest-watch")
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
        strict: bool = False,
        owner: str | None = None,
        expose: ExposeSetting | None = None,
    ) -> Snapshot:
        """Capture the effective tools for one model request and keep it addressable by id.

        `allow`/`deny` are globs over effective names; `hide_denied` leaves out tools the
        permission policy denies outright for `session_id` (visibility, not authorization:
        tools still ask for permission when called). `codemode` ("direct", "codemode",
        "both"; default the Location's setting) chooses direct tools, the Code Mode
        `execute`/`search_tools`/`describe_tools` built-ins, or both. `keep=False` returns a
        snapshot that is not kept by id (`location.snapshots`): for a listing, or a holder that
        keeps the snapshot itself, so that it never evicts one a caller will look up.
        `profile` names a profile (`sidecar.registry.profiles`; None: the default one): only its
        tools
        are captured, served its way; an undeclared name raises `UnknownProfile`. `strict`
        records that its definitions are advertised in OpenAI strict mode. A kept snapshot
        reaches the other replicas of a fleet with `share_snapshot`. `owner` names the client
        the snapshot counts against (`SnapshotStore.max_per_owner`). `expose` ("all",
        "search"; default the profile's, else the Location's) lists every tool, or only the
        tool-search built-ins and the profile's `always` tools (`sidecar.codemode.tool_search`;
        with Code Mode's `execute` advertised it is ignored).
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
        recipe = SnapshotRecipe(
            session_id=session_id,
            profile=chosen.name if chosen is not None else self.profiles.default_name,
            mode=mode, final_step=final_step, strict=strict, names=tuple(captured),
            removed=tuple(sorted(removed)), owner=owner,
            definitions=tuple(e.definition for e in captured.values()),
            expose=expose or (chosen.expose if chosen is not None else None) or self.expose,
            always=chosen.always if chosen is not None else (),
        )
        snapshot = self._made(recipe, captured)
        return self.snapshots.add(snapshot) if keep else snapshot

    def _made(self, recipe: SnapshotRecipe, captured: Mapping[str, Entry]) -> Snapshot:
        snapshot = search_snapshot(
            self.seam, captured, indexes=self.tool_indexes, always=recipe.always,
            session_id=recipe.session_id, final_step=recipe.final_step, removed=recipe.removed,
        ) if recipe.expose == "search" and recipe.mode == "direct" else codemode_snapshot(
            self.seam, captured, mode=cast(CodeModeSetting, recipe.mode),
            sandbox=self.sandbox, limits=self.codemode_limits, session_id=recipe.session_id,
            final_step=recipe.final_step, removed=recipe.removed,
        )
        snapshot.profile = recipe.profile
        snapshot.owner = recipe.owner
        snapshot.recipe = recipe
        return snapshot

    def _remade(self, recipe: SnapshotRecipe) -> tuple[Snapshot, tuple[ToolDefinition, ...]]:
        """A snapshot made on another replica, made again from its recipe with this
        replica's tools (`SnapshotSharing.find` checks the definitions)."""
        try:
            chosen = self.profiles.resolve(recipe.profile)
        except UnknownProfile as exc:
            raise SnapshotExpired(f"this snapshot's profile is gone here: {exc}") from None
        effective = self.profiles.entries(chosen, self.registry.effective())
        missing = [n for n in recipe.names if n not in effective]
        if missing:
            raise SnapshotExpired(
                f"this snapshot's tools {', '.join(missing[:5])}"
                f"{' ...' if len(missing) > 5 else ''} are not served on this replica; "
                "create a new snapshot")
        captured = {n: effective[n] for n in recipe.names}
        return self._made(recipe, captured), tuple(e.definition for e in captured.values())

    async def share_snapshot(self, snapshot: Snapshot) -> None:
        """Keep a snapshot's recipe where every replica on the fleet's backend finds it (no-op
        for the embedded stores)."""
        await self.sharing.share(snapshot)

    async def find_snapshot(self, snapshot_id: str) -> Snapshot:
        """A kept snapshot by id, made by this process or (in a fleet) by another replica;
        `SnapshotExpired` when it is unknown, expired or evicted."""
        return await self.sharing.find(snapshot_id)

    def check_definitions(self) -> None:
        """Compare every MCP tool with its pin now (`sidecar.policy.pins`); changes become
        events."""
        self.profiles.entries(None, self.registry.effective())

    def check_definitions_soon(self) -> None:
        """`check_definitions` once new definitions are fingerprinted off the event loop."""
        task = asyncio.get_running_loop().create_task(self._check_definitions())
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def definitions_checked(self) -> None:
        """Return once the definitions of the last registry change are checked against their
        pins (`check_definitions_soon`): a snapshot taken then does not fingerprint them on
        the event loop."""
        while self._checks:
            await asyncio.wait(list(self._checks))

    async def _stop_checks(self) -> None:
        for task in list(self._checks):
            await _cancel_and_wait(task)

    async def _check_definitions(self) -> None:
        try:
            await self.pins.fingerprint_new(self.registry.effective())
        except Exception:  # `check_definitions` fingerprints on the loop instead
            log.exception("fingerprinting tool definitions failed")
        self.check_definitions()

    async def health(self) -> dict[str, Any]:
        """The truth about this Location: servers, plugins, manifest problems, store usage,
        the state directory's size by part and what pruning and eviction removed (`state`,
        see `sidecar.location.state_usage`); `status` "ok", "degraded" or, with a fleet database
        that
        does not answer, "unavailable" (`sidecar.location.health` says when and what)."""
        return await health_report(self)

    def server_health(self) -> dict[str, ServerHealth]:
        """Health of the upstream MCP servers, by manifest key."""
        pool = self.upstreams
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

    async def cancel_here(self, call_id: str) -> str:
        """Cancel `call_id` if it runs in this process, for another replica's request:
        "cancelling" (as a local cancel does), else "not_running"."""
        for cancel in list(self.cancellers):
            if await cancel(call_id) == "cancelling":
                return "cancelling"
        return "not_running"

    async def running_on(self, call_id: str) -> str | None:
        """The replica of a fleet running `call_id` now (None: none, or no fleet)."""
        if self.seam.outcomes is None:
            return None
        return await self.seam.outcomes.holder(self.name, call_id)


_NO_AUDIT_SETTINGS = AuditSettings()
"""The history's audit settings before any manifest sets them (the default `[audit]`)."""


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> None:
    loop.call_soon(fn)


async def _cancel_and_wait(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.wait([task])
