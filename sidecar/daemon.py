"""The composition root: wires storage, the seam, the registry, permissions, plugins and the
sources declared in manifests into a Location.

A `Location` is one workspace the daemon serves: a root directory, its manifests, its
registry (over the process-wide application registry), hooks, permission policy, plugins, and
its namespace in the managed store and the outcome log. `Location.open(...)` is an async
context manager that owns every resource it opens and closes them in reverse order.

State lives in one directory (`state_dir`, default `$SIDECAR_STATE_DIR`, else
`$XDG_STATE_HOME/mcp-sidecar`, else `~/.local/state/mcp-sidecar`): `outcomes.sqlite`,
`permissions.sqlite` and `managed/` (retained text).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

from bridges.manifest import ManifestProblem, ManifestSet, load_manifests
from managed_store import ManagedStore
from sidecar.errors import SidecarError
from sidecar.events import EventBus, RegistryChanged
from sidecar.hooks import Hooks
from sidecar.managed_read import managed_read_tool
from sidecar.metadata import DEFAULT_MAX_METADATA_BYTES
from sidecar.outcome import Outcome
from sidecar.outcome_log import SqliteOutcomeLog
from sidecar.permission import PermissionRule
from sidecar.permission_service import PermissionService
from sidecar.plugins import PluginHost, entry_point_refs
from sidecar.registry import Registry, Tools, application_registry
from sidecar.seam import Seam
from sidecar.snapshot import Snapshot, SnapshotStore, select
from sidecar.tool import DEFAULT_BOUNDS, Bounds

DEFAULT_RETENTION_SECONDS = 7 * 86400
DEFAULT_STORE_QUOTA_BYTES = 2 * 1024**3

log = logging.getLogger("sidecar.daemon")


class ManifestError(SidecarError):
    """Manifests that cannot be used; `problems` lists each with file and JSON path."""

    def __init__(self, problems: Sequence[ManifestProblem]) -> None:
        super().__init__("invalid manifests:\n" + "\n".join(f"  {p}" for p in problems))
        self.problems = list(problems)


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
        durable: bool = True,
        plugins: Iterable[str] = (),
        entry_point_plugins: bool = True,
        permission_defaults: Iterable[PermissionRule] = (),
        ask_timeout: float | None = None,
    ) -> AsyncIterator[Location]:
        """Open a Location.

        Invalid manifest entries are logged and kept in `location.manifests.problems`; the
        valid ones still load. `durable=False` keeps no outcome log (benchmarks).
        """
        root_dir = await asyncio.to_thread(Path(root).resolve)
        loaded = await asyncio.to_thread(load_manifests, manifests)
        for problem in loaded.problems:
            level = logging.ERROR if problem.severity == "error" else logging.INFO
            log.log(level, "manifest: %s", problem)
        state = Path(state_dir) if state_dir is not None else default_state_dir()
        bounds = _manifest_bounds(loaded, bounds)
        async with AsyncExitStack() as stack:
            store = await ManagedStore.open(
                state / "managed", ttl_seconds=retention_seconds, quota_bytes=store_quota_bytes
            )
            stack.push_async_callback(store.aclose)
            outcomes = None
            if durable:
                outcomes = await SqliteOutcomeLog.open(state / "outcomes.sqlite")
                stack.push_async_callback(outcomes.aclose)
            events = EventBus()
            permissions = await PermissionService.open(
                state / "permissions.sqlite" if durable else None,
                location=name,
                defaults=tuple(permission_defaults),
                ask_timeout=loaded.ask_timeout or ask_timeout,
                events=events,
            )
            stack.push_async_callback(permissions.aclose)
            permissions.set_location_rules(
                PermissionRule(r.action, r.decision, r.resource) for r in loaded.rules
            )
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
                events=events, permissions=permissions, plugins=host, manifests=loaded,
            )
            location.tools.register({"managed_read": managed_read_tool(store)}, label="builtin")
            refs = [*plugins, *(p.value for p in loaded.plugins)]
            if entry_point_plugins:
                refs.extend(await asyncio.to_thread(entry_point_refs))
            await host.sync(refs)
            yield location

    def snapshot(
        self,
        *,
        session_id: str | None = None,
        allow: Iterable[str] | None = None,
        deny: Iterable[str] | None = None,
        final_step: bool = False,
        hide_denied: bool = True,
    ) -> Snapshot:
        """Capture the effective tools for one model request and keep it addressable by id.

        `allow`/`deny` are globs over effective names; `hide_denied` leaves out tools the
        permission policy denies outright for `session_id` (visibility, not authorization:
        tools still ask for permission when called).
        """
        effective = self.registry.effective()
        entries = select(effective, allow, deny)
        removed = set(effective) - set(entries)
        if hide_denied:
            session = session_id or ""
            removed.update(
                name for name, entry in entries.items()
                if self.permissions.denies_outright(session, entry.tool.permission_action or name)
            )
        for hook in self.hooks.definitions:
            kept = tuple(e.definition for n, e in entries.items() if n not in removed)
            removed.update(hook(session_id, kept) or ())
        captured = {n: e for n, e in entries.items() if n not in removed}
        snapshot = Snapshot(
            self.seam, captured, final_step=final_step, session_id=session_id, removed=removed
        )
        return self.snapshots.add(snapshot)

    async def outcome(self, call_id: str) -> Outcome | None:
        """The durable outcome of a settled call, if any."""
        if self.seam.outcomes is None:
            return None
        return await self.seam.outcomes.get(self.name, call_id)


def _manifest_bounds(loaded: ManifestSet, bounds: Bounds) -> Bounds:
    configured = loaded.bounds
    if configured.max_bytes is None and configured.max_lines is None:
        return bounds
    return Bounds(configured.max_bytes, configured.max_lines).over(bounds)
