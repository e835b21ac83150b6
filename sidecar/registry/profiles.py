"""Profiles: named views of a Location's tools, one per kind of agent. Imports model and
`sidecar.registry.registry`; exports `Profile` (what a profile picks and how it serves it),
`Profiles` (the declared ones and the entries each serves), `UnknownProfile`, `DEFAULT_PROFILE`.

Order: Location-wide tool overrides (`sidecar.registry.overrides`) reshape every tool first, so
profiles pick by the names the model sees; then the profile picks; then its own overrides
and rate limits apply to its picks.

A snapshot taken through a profile captures only the profile's tools, so nothing else can be
called through it: an unknown name fails `unknown_tool` listing the profile's tools only, and
Code Mode's inner snapshot is built from the same entries. The name `default` (or the
manifests' `default_profile`) is what `/mcp`, `sidecar stdio` and a snapshot without a profile
use; when no profile of that name is declared it is every tool.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sidecar.model.codemode import CodeModeSetting, ExposeSetting
from sidecar.model.errors import SidecarError
from sidecar.model.permissions import SCOPE_RULES, PermissionRule
from sidecar.model.tool import Bounds, CallContext, Tool, tool_with
from sidecar.registry.registry import Entry

DEFAULT_PROFILE = "default"
BUILTIN_ORIGIN = "builtin"
HINT_DEFAULTS: Mapping[str, bool] = {
    "read_only": False, "destructive": True, "idempotent": False, "open_world": True,
}
"""MCP's defaults for an absent annotation hint."""

EntryWrapper = Callable[[str, Mapping[str, Entry]], Mapping[str, Entry]]
"""(profile name, entries) -> the entries as served through that profile (overrides, rate
limits, pins), by their served names."""


class UnknownProfile(SidecarError):
    """A profile name that no manifest declares."""


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _hint(entry: Entry, key: str) -> bool:
    annotations = entry.tool.annotations
    value = getattr(annotations, f"{key}_hint", None) if annotations is not None else None
    return HINT_DEFAULTS[key] if value is None else bool(value)


@dataclass(frozen=True, slots=True)
class Profile:
    """One declared profile. Immutable; a reload swaps it whole.

        which tools   `servers` (MCP server keys) and `include` (globs over effective names): a
                      tool is picked when either picks it; with neither, every tool is.
                      `exclude` (globs) then removes tools, and annotation filters (`hints`:
                      `read_only = true`, `destructive = false`, ...) keep only tools whose hint
                      has that value, an absent hint counting as MCP's default (`HINT_DEFAULTS`).
                      Built-in tools (`managed_read`, which previews point to) are kept unless
                      `exclude` names them.
        how           the Code Mode setting, `expose` ("all", or "search": list only the
                      tool-search built-ins, `managed_read` and the `always` globs' tools;
                      None: the Location's), bounds (between the tool's and the Location's),
                      permission rules (the last layer: they win over every other), whether
                      upstream resources and prompts pass through.
    """

    name: str
    description: str = ""
    include: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    servers: tuple[str, ...] | None = None
    hints: Mapping[str, bool] = field(default_factory=dict)
    codemode: CodeModeSetting | None = None
    expose: ExposeSetting | None = None
    always: tuple[str, ...] = ()
    bounds: Bounds | None = None
    rules: tuple[PermissionRule, ...] = ()
    resources: bool | tuple[str, ...] = True
    prompts: bool | tuple[str, ...] = True

    def picks(self, name: str, entry: Entry) -> bool:
        """Whether the tool `name` belongs to this profile."""
        if _matches(name, self.exclude):
            return False
        if entry.origin != BUILTIN_ORIGIN:
            if self.include is not None or self.servers is not None:
                by_server = self.servers is not None and entry.origin.startswith("mcp:") and (
                    entry.origin[4:] in self.servers
                )
                if not by_server and not _matches(name, self.include or ()):
                    return False
            if any(_hint(entry, key) != value for key, value in self.hints.items()):
                return False
        return True

    def passes(self, server: str, which: bool | tuple[str, ...]) -> bool:
        if isinstance(which, bool):
            return which and (self.servers is None or server in self.servers)
        return server in which

    def passes_resources(self, server: str) -> bool:
        """Whether the resources of MCP server `server` pass through this profile (all, when
        `resources = true` and the profile names no servers; else those servers')."""
        return self.passes(server, self.resources)

    def passes_prompts(self, server: str) -> bool:
        return self.passes(server, self.prompts)

    @property
    def wraps(self) -> bool:
        return bool(self.rules) or self.bounds is not None


def _scoped(tool: Tool, profile: Profile) -> Tool:
    """`tool` served through `profile`: its rules in force while it runs, its bounds between
    the tool's own and the Location's."""
    inner = tool.execute
    rules = profile.rules

    async def execute(value: Any, ctx: CallContext) -> Any:
        token = SCOPE_RULES.set(rules)
        try:
            return await inner(value, ctx)
        finally:
            SCOPE_RULES.reset(token)

    bounds = tool.bounds
    if profile.bounds is not None:
        bounds = bounds.over(profile.bounds) if bounds is not None else profile.bounds
    return tool_with(tool, execute=execute if rules else inner, bounds=bounds)


class Profiles:
    """The declared profiles of a Location and the entries each serves.

    `resolve(name)` gives the profile a snapshot uses (None: every tool); `entries(profile,
    effective)` the entries served through it, computed once per registry state. `wrappers`
    (overrides, rate limits) reshape entries per profile. Listeners hear every swap.
    """

    def __init__(self) -> None:
        self.declared: Mapping[str, Profile] = {}
        self.default_name = DEFAULT_PROFILE
        self.explicit_default = False
        self.wrappers: list[EntryWrapper] = []
        """Run on a profile's picks (per-profile overrides, rate limits)."""
        self.common: list[Callable[[Mapping[str, Entry]], Mapping[str, Entry]]] = []
        """Run on every tool before profiles pick (Location-wide overrides, pins)."""
        self._base: tuple[Mapping[str, Entry], int, Mapping[str, Entry]] | None = None
        self.version = 0
        self._cache: dict[str | None, tuple[Mapping[str, Entry], int, Mapping[str, Entry]]] = {}
        self._listeners: list[Callable[[], None]] = []

    def set(
        self, declared: Mapping[str, Profile], default_name: str | None = None
    ) -> None:
        """Swap the declared profiles (a manifest load or reload)."""
        self.declared = dict(declared)
        self.explicit_default = default_name is not None
        self.default_name = default_name or DEFAULT_PROFILE
        self.changed()

    def changed(self) -> None:
        """Something that shapes the served entries changed: recompute, tell listeners."""
        self.version += 1
        self._cache.clear()
        self._base = None
        for listener in list(self._listeners):
            listener()

    def on_change(self, listener: Callable[[], None]) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def names(self) -> list[str]:
        """Every name a client may ask for (the implicit all-tools `default` included)."""
        names = set(self.declared)
        if not self.explicit_default:
            names.add(self.default_name)
        return sorted(names)

    def exists(self, name: str) -> bool:
        return name in self.declared or (not self.explicit_default and name == self.default_name)

    def resolve(self, name: str | None) -> Profile | None:
        """The profile named `name` (None: the default one); None means every tool.

        Raises `UnknownProfile` for a name no manifest declares (the default name is known
        even undeclared, unless `default_profile` points elsewhere)."""
        wanted = self.default_name if name is None else name
        found = self.declared.get(wanted)
        if found is not None:
            return found
        if wanted == self.default_name and not self.explicit_default:
            return None
        known = ", ".join(self.names()) or "(none)"
        raise UnknownProfile(f"no profile named {wanted!r}; known profiles: {known}")

    def entries(
        self, profile: Profile | None, effective: Mapping[str, Entry]
    ) -> Mapping[str, Entry]:
        """The entries served through `profile` (None: every tool) for this registry state."""
        key = profile.name if profile is not None else None
        cached = self._cache.get(key)
        if cached is not None and cached[0] is effective and cached[1] == self.version:
            return cached[2]
        base = self._base
        if base is None or base[0] is not effective or base[1] != self.version:
            reshaped: Mapping[str, Entry] = effective
            for common in self.common:
                reshaped = common(reshaped)
            base = self._base = (effective, self.version, reshaped)
        picked = {
            n: e for n, e in base[2].items() if profile is None or profile.picks(n, e)
        }
        if profile is not None and profile.wraps:
            picked = {
                n: Entry(_scoped(e.tool, profile), e.key, e.definition, e.origin)
                for n, e in picked.items()
            }
        served: Mapping[str, Entry] = picked
        for wrap in self.wrappers:
            served = wrap(key or self.default_name, served)
        self._cache[key] = (effective, self.version, served)
        return served
