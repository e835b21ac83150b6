"""What a Location's manifests declare, applied as one: MCP servers (a `ServerPool`),
manifest tools, permission rules, plugins and bounds; and live reload (`ManifestSources`,
whose docstring says what an open and a reload do). The composition root passes it to
`Location.open` as its `Wiring.attach_sources`; the core never imports it and sees it as
`sidecar.location.sources.Sources`.

Imports the core, `bridges.manifest`, `bridges.manifest_tools`, `bridges.mcp` and
`bridges.openapi`. Exports
`ManifestSources` and the manifest-to-core translations (`profile_of`, `overrides_of`,
`override_problems`, `location_bounds`, `limit_of`, `override_of`, `tool_names`,
`guardrails_of`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import watchfiles

from bridges.manifest.globs import ToolNames, unmatched_globs
from bridges.manifest.loading import (
    MANIFEST_SUFFIXES,
    ManifestProblem,
    ManifestSet,
    load_manifests,
)
from bridges.manifest.loading import manifest_files as manifest_files_of
from bridges.manifest.overrides import OverrideConfig
from bridges.manifest.profiles import ProfileConfig, RateLimitConfig
from bridges.manifest_tools import ManifestTools, manifest_tool_validator
from bridges.mcp import ServerPool
from bridges.openapi import OpenApiTools, Prepared
from bridges.sandbox import PREPARED, PROTECTED
from sidecar.daemon.stores import apply_store_quotas
from sidecar.model.codemode import CodeModeSetting, ExposeSetting
from sidecar.model.errors import RegistrationError, SchemaDefinitionError
from sidecar.model.events import ManifestsReloaded, ServerHealthChanged
from sidecar.model.permissions import PermissionRule
from sidecar.model.tool import Bounds
from sidecar.policy.pins import PinPolicy
from sidecar.policy.ratelimit import RateLimit
from sidecar.registry.overrides import Override, OverrideError, reshape_all
from sidecar.registry.plugins import entry_point_refs
from sidecar.registry.profiles import Profile
from sidecar.registry.registry import Entry
from sidecar.stores.call_history import AuditSettings

if TYPE_CHECKING:
    from sidecar.location.location import Location

log = logging.getLogger("sidecar.manifests")


def location_bounds(loaded: ManifestSet, base: Bounds) -> Bounds:
    configured = loaded.bounds
    if configured.max_bytes is None and configured.max_lines is None:
        return base
    return Bounds(configured.max_bytes, configured.max_lines).over(base)


def profile_of(name: str, config: ProfileConfig) -> Profile:
    """A manifest's `[profiles.NAME]` table as the core's `Profile`."""
    bounds = config.bounds
    return Profile(
        name=name,
        description=config.description,
        include=tuple(config.include) if config.include is not None else None,
        exclude=tuple(config.exclude),
        servers=tuple(config.servers) if config.servers is not None else None,
        hints=config.hints(),
        codemode=config.codemode,
        expose=config.expose,
        always=tuple(config.always),
        bounds=(
            Bounds(bounds.max_bytes, bounds.max_lines)
            if bounds.max_bytes is not None or bounds.max_lines is not None else None
        ),
        rules=tuple(
            PermissionRule(r.action, r.decision, r.resource) for r in config.permissions.rules
        ),
        resources=config.resources if isinstance(config.resources, bool)
        else tuple(config.resources),
        prompts=config.prompts if isinstance(config.prompts, bool) else tuple(config.prompts),
    )


def guardrails_of(loaded: ManifestSet) -> tuple[
        dict[str, Any], dict[str, dict[str, Any]], dict[str, dict[str, Any]],
        dict[str, dict[str, Any]]]:
    """The `[guardrails]` levels (top, profiles, servers, manifest tools) as the keys each
    sets (`sidecar.policy.guardrails.Guardrails.set`)."""
    top = loaded.guardrails.layer() if loaded.guardrails is not None else {}
    profiles = {key: s.value.guardrails.layer() for key, s in loaded.profiles.items()
                if s.value.guardrails is not None}
    servers = {key: s.value.guardrails.layer() for key, s in loaded.servers.items()
               if s.value.guardrails is not None}
    tools = {key: s.value.guardrails.layer() for key, s in loaded.tools.items()
             if getattr(s.value, "guardrails", None) is not None}
    return top, profiles, servers, tools


def limit_of(config: RateLimitConfig) -> RateLimit:
    return RateLimit(config.calls_per_minute, config.burst, config.concurrency)


def override_of(glob: str, server: str | None, config: OverrideConfig) -> Override:
    annotations = config.annotations.model_dump(exclude_none=True) if config.annotations else {}
    return Override(
        match=glob, server=server, name=config.name, title=config.title,
        description=config.description, description_append=config.description_append,
        annotations=annotations, hidden=dict(config.hidden), defaults=dict(config.defaults),
        enabled=config.enabled,
    )


def overrides_of(loaded: ManifestSet) -> tuple[list[Override], dict[str, list[Override]]]:
    """(Location-wide overrides, overrides by profile) of the manifests."""
    common = [override_of(s.key, *s.value) for s in loaded.overrides]
    by_profile = {
        key: [override_of(glob, None, c) for glob, c in sourced.value.overrides.items()]
        for key, sourced in loaded.profiles.items()
    }
    return common, by_profile


def override_problems(loaded: ManifestSet, effective: Mapping[str, Entry]) -> list[
        ManifestProblem]:
    """Collisions and bad names the manifests' overrides make among the tools registered now
    (each profile's tools, and every tool for the default view)."""
    common, by_profile = overrides_of(loaded)
    try:
        reshaped = reshape_all(common, effective)
    except (OverrideError, SchemaDefinitionError, ValueError) as exc:
        return [ManifestProblem("(tool overrides)", "$.tools.overrides", str(exc))]
    problems = []
    for key, sourced in loaded.profiles.items():
        if not by_profile[key]:
            continue
        profile = profile_of(key, sourced.value)
        picked = {n: e for n, e in reshaped.items() if profile.picks(n, e)}
        try:
            reshape_all(by_profile[key], picked)
        except (OverrideError, SchemaDefinitionError, ValueError) as exc:
            problems.append(ManifestProblem(
                "(tool overrides)", f"$.profiles.{key}.overrides", f"profile {key}: {exc}"))
    return problems


def tool_names(location: Location) -> ToolNames:
    """What the manifests' globs may match in `location` now (`bridges.manifest.globs`)."""
    effective = location.registry.effective()
    names = set(effective)
    names.update(location.profiles.entries(None, effective))  # after overrides
    upstream: dict[str, set[str]] = {}
    for entry in effective.values():
        if entry.tool.permission_action:
            names.add(entry.tool.permission_action)
        if entry.origin.startswith("mcp:"):
            upstream.setdefault(entry.origin[4:], set()).add(entry.key)
    return ToolNames(frozenset(names), {k: frozenset(v) for k, v in upstream.items()})


async def _sweep_prepared(loaded: ManifestSet) -> None:
    """The prepared npx/uvx caches of entries the manifests no longer have are deleted."""
    keep = [*loaded.servers, *(f"tool:{name}" for name in loaded.tools)]
    for removed in await asyncio.to_thread(PREPARED.sweep, keep):
        log.info("sandbox: deleted the prepared cache of a removed entry (%s)", removed.name)


def _report(problems: Sequence[ManifestProblem]) -> list[dict[str, Any]]:
    return [
        {"file": p.file, "path": p.path, "message": p.message, "hint": p.hint,
         "severity": p.severity}
        for p in problems
    ]


class ManifestSources:
    """A Location's manifests, applied as one. The Location reads `manifests`, `audit`,
    `codemode` and `upstreams` from it; nothing is assigned on the Location.

    At open, every valid entry loads and each invalid one is reported (log, health). On a
    reload (a file changed, or `reload()`), everything is parsed and validated first; if
    anything is invalid the last good configuration keeps running and the problems are
    reported (log, `GET /v1/health` `reload_problems`, a `manifests.reloaded` event with
    `ok: false`). A valid reload applies only the difference: new servers start, removed ones
    stop, changed ones restart, unchanged ones are not touched; manifest tools are replaced
    in place (precedence kept); plugins are synced; rules and bounds are swapped. Calls
    already running keep the tool they captured."""

    def __init__(
        self,
        location: Location,
        entries: Sequence[str | os.PathLike[str]],
        *,
        base_bounds: Bounds,
        plugins: Sequence[str] = (),
        entry_point_plugins: bool = True,
        servers_in_background: bool = False,
    ) -> None:
        """`servers_in_background`: entering does not wait for the MCP servers' first attempts
        (the daemon commands: they answer at once, and tools appear as servers get ready)."""
        self._location = location
        self._background = servers_in_background
        self._entries = [Path(e) for e in entries]
        self._base_bounds = base_bounds
        self._plugins = list(plugins)
        self._entry_point_plugins = entry_point_plugins
        self.pool: ServerPool | None = None
        self.manifests: ManifestSet
        """The manifests applied now (set on entering, replaced by each valid reload)."""
        self.audit = AuditSettings()
        """What the call history keeps of inputs (manifest `[audit]`)."""
        self.codemode: CodeModeSetting | None = None
        """The manifests' Code Mode setting; None: the Location's own."""
        self.expose: ExposeSetting | None = None
        """The manifests' top-level `expose`; None: the Location's own."""
        self.manifest_tools: ManifestTools | None = None
        self.openapi: OpenApiTools | None = None
        self.reload_problems: list[ManifestProblem] = []
        self._lock = asyncio.Lock()
        self._fingerprint: tuple[tuple[str, int, int], ...] = ()
        self._unmatched: tuple[object, int, list[ManifestProblem]] | None = None
        self._unmatched_report: asyncio.Task[None] | None = None
        self._matching: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] = lambda: None

    def _fingerprint_now(self) -> tuple[tuple[str, int, int], ...]:
        """(path, mtime_ns, size) of every manifest file: what a reload would read."""
        found: list[tuple[str, int, int]] = []
        for path in manifest_files_of(self._entries):
            try:
                st = path.stat()
            except OSError:
                continue
            found.append((str(path), st.st_mtime_ns, st.st_size))
        return tuple(found)

    def _changed(self) -> bool:
        """Whether a manifest file, or a spec file the OpenAPI services last read, changed."""
        stamps = self.openapi.stamps if self.openapi is not None else ()
        return self._fingerprint_now() != self._fingerprint or any(
            _stamp(Path(path)) != (mtime, size) for path, mtime, size in stamps)

    async def load(self) -> ManifestSet:
        validator = manifest_tool_validator(self._location.root)

        def read() -> tuple[ManifestSet, tuple[tuple[str, int, int], ...]]:
            fingerprint = self._fingerprint_now()  # before reading: a later change is seen
            return load_manifests(self._entries, tool_validator=validator), fingerprint

        loaded, self._fingerprint = await asyncio.to_thread(read)
        return loaded

    async def __aenter__(self) -> ManifestSources:
        location = self._location
        PROTECTED.protect(location.state_dir)  # masked in every sandbox (`bridges.sandbox`)
        PREPARED.use(location.state_dir / "sandbox")  # npx/uvx caches (`bridges.sandbox`)
        loaded = await self.load()
        for problem in loaded.problems:
            level = logging.ERROR if problem.severity == "error" else logging.INFO
            log.log(level, "manifest: %s", problem)
        self.manifest_tools = ManifestTools(
            location.tools, location.seam.store, location.root, location.permissions,
            store_namespace=location.name,
        )
        try:
            await self._apply_tools(loaded)
        except RegistrationError as exc:  # invalid manifest tools never stop the daemon
            loaded.problems.append(ManifestProblem("(manifest tools)", "$.tools", str(exc)))
            log.error("manifest tools: %s", exc)
        self.openapi = OpenApiTools(location.tools, location.seam.store, location.permissions,
                                    store_namespace=location.name)
        for problem in await self.openapi.apply(loaded.openapi):
            log.log(logging.ERROR if problem.severity == "error" else logging.WARNING,
                    "manifest: %s", problem)
            loaded.problems.append(problem)
        for problem in override_problems(loaded, location.registry.effective()):
            log.error("manifest: %s", problem)
            loaded.problems.append(problem)
        self._apply_policy(loaded)
        await self._sync_plugins(loaded)
        events = location.events
        self.pool = ServerPool(
            self._servers(loaded), location.tools, permissions=location.permissions,
            on_health=lambda key, health: events.publish(
                ServerHealthChanged(key, health.to_json())
            ),
            grants=location.grant_store(), wait=not self._background,
            login_callbacks=location.stores.login_callbacks,
        )
        await self.pool.__aenter__()
        self.manifests = loaded
        await _sweep_prepared(loaded)
        self._unsubscribe = location.registry.on_change(self._tools_changed)
        self._report_unmatched_when_settled()
        return self

    @property
    def upstreams(self) -> ServerPool | None:
        """The upstream MCP servers (`Location.upstreams`)."""
        return self.pool

    def unmatched_globs(self) -> list[ManifestProblem]:
        """The globs of the applied manifests that match none of the tools registered
        (`bridges.manifest.globs`); none while a server is on its first attempt (its tools are
        not known yet). Matched in a worker thread once the registry's new definitions are
        checked against their pins, never per call: while the tools or manifests change, this
        is the last result and a new one is under way."""
        if self.pool is None or self.pool.starting():
            return []
        if not self._unmatched_current():
            self._match_soon()
        return self._unmatched[2] if self._unmatched is not None else []

    def _unmatched_current(self) -> bool:
        cached, location = self._unmatched, self._location
        return (cached is not None and cached[0] is self.manifests
                and cached[1] == location.registry.version)

    def _tools_changed(self) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # changed outside the loop: matched at the next health request
            return
        if self.pool is not None and not self.pool.starting():
            self._match_soon()

    def _match_soon(self) -> asyncio.Task[None]:
        if self._matching is None or self._matching.done():
            self._matching = asyncio.get_running_loop().create_task(
                self._match_globs(), name="match-globs")
        return self._matching

    async def _match_globs(self) -> None:
        """Match until the result is current: a listing of thousands of tools changes the
        registry a few times, each matched once it settles, not at every health request."""
        location = self._location
        while not self._unmatched_current():
            await location.definitions_checked()  # then `tool_names` reuses their entries
            loaded, version = self.manifests, location.registry.version
            try:
                names = tool_names(location)
                problems = await asyncio.to_thread(unmatched_globs, loaded, names)
            except Exception:  # a report, never a reason for the daemon to fail
                log.exception("matching the manifests' globs against the tools failed")
                problems = []
            self._unmatched = (loaded, version, problems)

    def _report_unmatched_when_settled(self) -> None:
        """One log line naming the globs that match no tool, once every server has settled
        its first attempt (at start, and after each reload)."""
        if self._unmatched_report is not None:
            self._unmatched_report.cancel()
        self._unmatched_report = asyncio.get_running_loop().create_task(
            self._log_unmatched(), name="unmatched-globs")

    async def _log_unmatched(self) -> None:
        assert self.pool is not None
        await self.pool.settled()
        while not self._unmatched_current():  # (not cancelled with this report: it is shared)
            await asyncio.wait([self._match_soon()])
        problems = self.unmatched_globs()
        if problems:
            log.warning("manifest globs that match no tool (they apply to nothing): %s",
                        "; ".join(str(p) for p in problems))

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self._unsubscribe()
            for task in (self._unmatched_report, self._matching):
                if task is not None:
                    task.cancel()
                    await asyncio.wait([task])
            if self.pool is not None:
                await self.pool.__aexit__(t, e, tb)
        finally:
            PROTECTED.release(self._location.state_dir)
            if self.manifest_tools is not None:
                await self.manifest_tools.aclose()
            if self.openapi is not None:
                await self.openapi.aclose()

    @staticmethod
    def _servers(loaded: ManifestSet) -> dict[str, Any]:
        return {key: sourced.value for key, sourced in loaded.servers.items()}

    async def _apply_tools(self, loaded: ManifestSet) -> None:
        assert self.manifest_tools is not None
        await self.manifest_tools.apply(loaded.tools)

    def _apply_policy(self, loaded: ManifestSet) -> None:
        location = self._location
        location.permissions.set_location_rules(
            PermissionRule(r.action, r.decision, r.resource) for r in loaded.rules
        )
        if loaded.ask_timeout is not None:
            location.permissions.ask_timeout = loaded.ask_timeout
        location.seam.bounds = location_bounds(loaded, self._base_bounds)
        apply_store_quotas(location.seam.store, loaded.auth)
        audit = loaded.audit
        self.audit = AuditSettings() if audit is None else AuditSettings(
            audit.inputs, frozenset(m.lower() for m in audit.mask))
        self.codemode = loaded.codemode
        self.expose = loaded.expose
        location.overrides.set(*overrides_of(loaded))
        location.rate_limits.set(
            {glob: limit_of(s.value) for glob, s in loaded.rate_limits.items()},
            {key: limit_of(s.value.rate_limit) for key, s in loaded.profiles.items()
             if s.value.rate_limit is not None},
            {key: {glob: limit_of(c) for glob, c in s.value.tool_rate_limits.items()}
             for key, s in loaded.profiles.items()},
        )
        servers = {key: sourced.value for key, sourced in loaded.servers.items()}

        def policy(server: str) -> PinPolicy | None:
            config = servers.get(server)
            if config is None:
                return None
            pin: PinPolicy | None = config.pin
            return pin or ("warn" if config.transport == "stdio" else "hold")

        location.pins.policy = policy
        location.guardrails.set(*guardrails_of(loaded))  # applied by `profiles.set` below
        default = loaded.default_profile
        location.profiles.set(
            {key: profile_of(key, sourced.value) for key, sourced in loaded.profiles.items()},
            default.value if default is not None and default.value in loaded.profiles else None,
        )

    async def _sync_plugins(self, loaded: ManifestSet) -> None:
        refs = [*self._plugins, *(p.value for p in loaded.plugins)]
        if self._entry_point_plugins:
            refs.extend(await asyncio.to_thread(entry_point_refs))
        await self._location.plugins.sync(refs)

    async def reload(self) -> bool:
        """Re-read the manifests; apply them when all are valid. True when applied."""
        async with self._lock:
            loaded = await self.load()
            problems = loaded.errors
            openapi = Prepared()
            if not problems and self.openapi is not None:
                openapi = await self.openapi.prepare(loaded.openapi)
                problems = [p for p in openapi.problems if p.severity == "error"]
            if not problems:
                problems = override_problems(loaded, self._location.registry.effective())
            if not problems:
                try:
                    await self._apply_tools(loaded)
                except RegistrationError as exc:
                    problems = [ManifestProblem("(manifest tools)", "$.tools", str(exc))]
            if problems:
                for problem in problems:
                    log.error("manifest reload rejected, keeping the last good one: %s", problem)
                self.reload_problems = list(problems)
                self._location.events.publish(ManifestsReloaded(False, _report(problems)))
                return False
            if self.openapi is not None:
                self.openapi.commit(openapi)
                loaded.problems.extend(openapi.problems)
            assert self.pool is not None
            await self.pool.update(self._servers(loaded))
            self._apply_policy(loaded)
            await self._sync_plugins(loaded)
            self.manifests = loaded
            self.reload_problems = []
            await _sweep_prepared(loaded)
            self._report_unmatched_when_settled()
            self._location.events.publish(ManifestsReloaded(True, _report(loaded.problems)))
            log.info("manifests reloaded: %d server(s), %d tool(s)", len(loaded.servers),
                     len(loaded.tools))
            return True

    def _watch_targets(self) -> tuple[list[Path], set[Path], set[Path]]:
        """(directories to watch, manifest directories, manifest files), resolved."""
        manifest_dirs = {e.resolve() for e in self._entries if e.is_dir()}
        manifest_files = {e.resolve() for e in self._entries if not e.is_dir()}
        watched = manifest_dirs | {f.parent for f in manifest_files if f.parent.is_dir()}
        return sorted(watched), manifest_dirs, manifest_files

    async def watch(self, *, debounce_ms: int = 200, check_every_ms: int = 500) -> None:
        """Reload on every change to a manifest file, until cancelled.

        File events come from `watchfiles`; besides, every `check_every_ms` the manifest files'
        (path, mtime, size) are compared with what the last load read, which catches a change
        made before the watch was in place and events a filesystem does not deliver. The local
        spec files of `[openapi.NAME]` entries are checked the same way (by that poll only).

        The watcher's thread looks for events every `debounce_ms` (watchfiles' `step`): its
        default of 50 ms woke an idle daemon's thread and took the GIL 20 times a second. One
        loop takes both the events and the check, one at a time.
        """
        watched, manifest_dirs, manifest_files = await asyncio.to_thread(self._watch_targets)
        if not watched:
            return

        def relevant(change: watchfiles.Change, path: str) -> bool:
            p = Path(path)
            return p in manifest_files or (
                p.suffix in MANIFEST_SUFFIXES and p.parent in manifest_dirs
            )

        async for changes in watchfiles.awatch(
            *watched, watch_filter=relevant, debounce=debounce_ms, step=debounce_ms,
            recursive=False, rust_timeout=check_every_ms, yield_on_timeout=True,
        ):
            changed: bool = bool(changes) or await asyncio.to_thread(self._changed)
            if changed:
                await self.reload()


def _stamp(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except OSError:
        return (-1, -1)
    return (st.st_mtime_ns, st.st_size)
