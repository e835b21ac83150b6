"""The registry: scoped registrations of tool values under authored names.

`register(mapping)` validates the whole mapping first (names, schemas) and either adds one
registration or raises `RegistrationError` leaving everything as it was. It returns a `Scope`;
closing the scope removes exactly that registration. The effective view is computed from the
active registrations in order: for each effective name, the latest active registration wins,
so closing it reveals the next-latest one. The caller's mapping is copied: mutating it after
`register` changes nothing.

Built-in names (`sidecar.model.names.RESERVED_NAMES`: `managed_read` and the Code Mode tools) are
reserved: a registration that is not a built-in one keeps its other tools, but a tool whose
effective name is reserved is left out, logged, and listed by `reserved_conflicts()` (shown
in the Location's health). It never shadows the built-in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Protocol

from sidecar.model.errors import CallError, RegistrationError, SchemaDefinitionError
from sidecar.model.names import RESERVED_NAMES, effective_name, plain_names
from sidecar.model.tool import Tool


@dataclass(frozen=True, slots=True)
class ToolDefinition:
    """What a model is shown for one tool (provider formats are derived from this)."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    output_schema: Mapping[str, Any] | None = None
    title: str | None = None
    annotations: Mapping[str, Any] | None = None
    meta: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "input_schema": dict(self.input_schema),
        }
        if self.output_schema is not None:
            data["output_schema"] = dict(self.output_schema)
        if self.title is not None:
            data["title"] = self.title
        if self.annotations:
            data["annotations"] = dict(self.annotations)
        if self.meta:
            data["meta"] = dict(self.meta)
        return data


@dataclass(frozen=True, slots=True)
class Entry:
    """One effective tool: the captured value, its authored key and its definition.

    `origin` is the label of the registration that holds it (`mcp:<server key>` for an MCP
    server's tools, `builtin`, `manifest-tools`, a plugin's label): profiles select by it.
    """

    tool: Tool
    key: str
    definition: ToolDefinition
    origin: str = ""


class Resolver(Protocol):
    """What a call resolves its tool against (a `Snapshot`): the seam needs only this."""

    def resolve(self, name: str) -> Entry | CallError:
        """The captured entry for `name`, or the model-visible error a call on it gets."""
        ...


def _definition(name: str, key: str, tool: Tool) -> ToolDefinition:
    try:
        input_schema = tool.input.json_schema()
        output_schema = tool.output.json_schema() if tool.output is not None else None
    except SchemaDefinitionError as exc:
        raise RegistrationError(f"tool {key!r}: {exc}") from None
    if input_schema.get("type", "object") != "object":
        raise RegistrationError(
            f"tool {key!r}: the input schema must describe a JSON object "
            f"(type 'object'), got type {input_schema.get('type')!r}"
        )
    annotations = tool.annotations.to_json() if tool.annotations is not None else None
    return ToolDefinition(
        name=name,
        description=tool.description,
        input_schema=input_schema,
        output_schema=output_schema,
        title=tool.title,
        annotations=annotations or None,
        meta=tool.meta or None,
    )


def build_entries(
    mapping: Mapping[str, Tool], namespace: str | None, *, plain: Collection[str] | None = None
) -> dict[str, Entry]:
    """Validate a whole mapping and name its entries; raise `RegistrationError` on any fault.
    `plain` (default: the mapping's own) as in `sidecar.model.names`, rule 2."""
    if plain is None:
        plain = plain_names(
            (key, tool.namespace if tool.namespace is not None else namespace)
            for key, tool in mapping.items() if isinstance(tool, Tool) and isinstance(key, str))
    entries: dict[str, Entry] = {}
    for key, tool in mapping.items():
        if not isinstance(tool, Tool):
            raise RegistrationError(f"tool {key!r}: expected a Tool, got {type(tool).__name__}")
        if not isinstance(key, str) or not key:
            raise RegistrationError(f"tool name {key!r}: a name must be a non-empty string")
        name = effective_name(key, tool.namespace if tool.namespace is not None else namespace,
                              plain=plain)
        clash = entries.get(name)
        if clash is not None:
            raise RegistrationError(
                f"tools {clash.key!r} and {key!r} both become {name!r}; rename one of them"
            )
        entries[name] = Entry(tool=tool, key=key, definition=_definition(name, key, tool))
    return entries


log = logging.getLogger("sidecar.registry.registry")


@dataclass(frozen=True, slots=True)
class ReservedConflict:
    """A tool left out because its effective name belongs to a built-in."""

    registration: str
    key: str
    name: str

    def to_json(self) -> dict[str, str]:
        return {"registration": self.registration, "tool": self.key, "name": self.name,
                "message": f"tool {self.key!r} of {self.registration!r} was left out: "
                           f"{self.name!r} is the name of a sidecar built-in (give its source "
                           "a namespace, or rename it)"}


class Registration:
    __slots__ = ("builtin", "entries", "label", "refused")

    def __init__(self, entries: Mapping[str, Entry], label: str, builtin: bool = False) -> None:
        self.label = label
        self.builtin = builtin
        self.refused: tuple[ReservedConflict, ...] = ()
        self.entries: Mapping[str, Entry] = MappingProxyType({})
        self.set_entries(entries)

    def set_entries(self, entries: Mapping[str, Entry]) -> None:
        kept = dict(entries)
        if not self.builtin:
            refused = [ReservedConflict(self.label, e.key, n) for n, e in entries.items()
                       if n in RESERVED_NAMES]
            for conflict in refused:
                del kept[conflict.name]
                log.warning("%s", conflict.to_json()["message"])
            self.refused = tuple(refused)
        self.entries = self.stamped(kept)

    def stamped(self, entries: Mapping[str, Entry]) -> Mapping[str, Entry]:
        """`entries` with this registration's label as their `origin`."""
        return MappingProxyType({
            n: e if e.origin == self.label else replace(e, origin=self.label)
            for n, e in entries.items()
        })


class Scope:
    """One registration's lifetime: `close()` (or leaving `async with`) removes exactly it."""

    __slots__ = ("_registration", "_registry")

    def __init__(self, registry: Registry, registration: Registration) -> None:
        self._registry: Registry | None = registry
        self._registration = registration

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._registration.entries)

    @property
    def closed(self) -> bool:
        return self._registry is None

    def replace(self, mapping: Mapping[str, Tool], *, namespace: str | None = None) -> None:
        """Swap this registration's tools in place, keeping its place in the precedence order.

        Validated whole first; on error nothing changes.
        """
        if self._registry is None:
            raise RegistrationError(f"scope {self._registration.label!r} is closed")
        self._registry._replace(self._registration, build_entries(mapping, namespace))

    def close(self) -> None:
        if self._registry is not None:
            self._registry._remove(self._registration)
            self._registry = None

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> Scope:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


Listener = Callable[[], None]


class Registry:
    """Ordered active registrations and the effective view derived from them.

    A registry may sit on a `parent` (the process-wide application registry under a
    Location's): the parent's tools are visible, and any tool of this registry wins over a
    parent tool of the same effective name.
    """

    def __init__(self, parent: Registry | None = None) -> None:
        self._registrations: list[Registration] = []
        self._effective: Mapping[str, Entry] | None = None
        self._effective_at: tuple[int, int] = (-1, -1)
        self._listeners: list[Listener] = []
        self._parent = parent
        self.version = 0
        if parent is not None:
            parent.on_change(self._notify)

    def register(
        self, mapping: Mapping[str, Tool], *, namespace: str | None = None, label: str = "",
        builtin: bool = False,
    ) -> Scope:
        """See `Tools.register`; `builtin` (the daemon's own tools only) may use reserved
        names."""
        registration = Registration(
            build_entries(mapping, namespace), label or "registration", builtin=builtin
        )
        self._registrations.append(registration)
        self._changed()
        return Scope(self, registration)

    def effective(self) -> Mapping[str, Entry]:
        """The effective tools by effective name (the latest active registration wins)."""
        parent_version = self._parent.version if self._parent is not None else 0
        if self._effective is None or self._effective_at != (self.version, parent_version):
            merged: dict[str, Entry] = (
                dict(self._parent.effective()) if self._parent is not None else {}
            )
            for registration in self._registrations:
                merged.update(registration.entries)
            self._effective = MappingProxyType(merged)
            self._effective_at = (self.version, parent_version)
        return self._effective

    def source_of(self, name: str) -> str | None:
        """The label of the registration that provides the effective tool `name` (for an MCP
        server `mcp:<server>`), or None when no tool has that name."""
        for registration in reversed(self._registrations):
            if name in registration.entries:
                return registration.label
        return self._parent.source_of(name) if self._parent is not None else None

    def detach(self) -> None:
        """Stop listening to the parent (when the Location closes)."""
        if self._parent is not None:
            self._parent._listeners.remove(self._notify)
            self._parent = None

    def on_change(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` after every change of this registry's effective view."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def reserved_conflicts(self) -> list[ReservedConflict]:
        """Tools of active registrations (this registry's and its parent's) left out for
        taking a built-in's name."""
        found = self._parent.reserved_conflicts() if self._parent is not None else []
        for registration in self._registrations:
            found.extend(registration.refused)
        return found

    def _replace(self, registration: Registration, entries: Mapping[str, Entry]) -> None:
        registration.set_entries(entries)
        self._changed()

    def _remove(self, registration: Registration) -> None:
        self._registrations.remove(registration)
        self._changed()

    def _changed(self) -> None:
        self.version += 1
        self._notify()

    def _notify(self) -> None:
        for listener in list(self._listeners):
            listener()


application_registry = Registry()
"""Process-wide application registrations; every Location sees them under its own."""


def sorted_definitions(entries: Iterable[Entry]) -> tuple[ToolDefinition, ...]:
    """Definitions in a deterministic order, so a provider's prompt cache survives."""
    return tuple(sorted((e.definition for e in entries), key=lambda d: d.name))


class Tools:
    """The narrow registration capability: all a plugin (or a bridge, or a built-in) gets."""

    __slots__ = ("_registry",)

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def register(
        self, mapping: Mapping[str, Tool], *, namespace: str | None = None, label: str = ""
    ) -> Scope:
        """Add `mapping` as one registration; close the returned scope to remove exactly it."""
        return self._registry.register(mapping, namespace=namespace, label=label)
