"""Definition pinning: a tool's definition cannot change behind the model's back (`Pins`,
whose docstring holds the policies and how a change is held and approved).

Imports `sidecar.model`, `sidecar.registry` and `sidecar.stores`. Exports `Pins`,
`PinPolicy`, `HeldChange`, `NotHeld`, `definition_json`, `definition_diff`, `fingerprint`
and `APPROVAL_POLL_SECONDS`.
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from sidecar.model.errors import CallError, ErrorKind, SidecarError
from sidecar.model.events import DefinitionChanged, EventSink
from sidecar.model.tool import tool_with
from sidecar.registry.registry import Entry, ToolDefinition
from sidecar.stores.pins import Pin, PinStore

__all__ = ["APPROVAL_POLL_SECONDS", "HeldChange", "NotHeld", "PinPolicy", "Pins",
           "definition_diff", "definition_json", "fingerprint"]

PinPolicy = Literal["hold", "warn", "off"]
log = logging.getLogger("sidecar.pins")
_MAX_DIFF_LINES = 60
APPROVAL_POLL_SECONDS = 2.0


class NotHeld(SidecarError):
    """`approve` named a tool with no pending definition change."""


def definition_json(definition: ToolDefinition) -> dict[str, Any]:
    """What is pinned of a definition (the name is the pin's key, not part of it)."""
    return {
        "description": definition.description, "title": definition.title,
        "input_schema": dict(definition.input_schema),
        "output_schema": dict(definition.output_schema) if definition.output_schema else None,
        "annotations": dict(definition.annotations) if definition.annotations else None,
    }


_Print = tuple[ToolDefinition, dict[str, Any], str]
"""A definition, what is pinned of it (`definition_json`) and its fingerprint."""


def _fingerprints(entries: list[Entry], known: Mapping[str, _Print]) -> dict[str, _Print]:
    """The fingerprints of the MCP definitions among `entries` that `known` has not seen."""
    prints: dict[str, _Print] = {}
    for entry in entries:
        if not entry.origin.startswith("mcp:"):
            continue
        key = f"{entry.origin[4:]}/{entry.key}"
        seen = known.get(key)
        if seen is None or seen[0] is not entry.definition:
            now = definition_json(entry.definition)
            prints[key] = (entry.definition, now, fingerprint(now))
    return prints


def fingerprint(data: Mapping[str, Any]) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def definition_diff(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> list[str]:
    """A unified diff of the two definitions as indented JSON (at most 60 lines)."""
    old = json.dumps(before, indent=1, sort_keys=True).splitlines() if before else []
    new = json.dumps(after, indent=1, sort_keys=True).splitlines()
    lines = [line.rstrip("\n") for line in difflib.unified_diff(
        old, new, "pinned" if before else "(not pinned)", "upstream now", n=1, lineterm="")]
    if len(lines) > _MAX_DIFF_LINES:
        lines = [*lines[:_MAX_DIFF_LINES], f"... {len(lines) - _MAX_DIFF_LINES} more lines"]
    return lines


@dataclass(frozen=True, slots=True)
class HeldChange:
    """A definition that differs from its pin, waiting for approval."""

    key: str
    name: str
    policy: PinPolicy
    action: Literal["kept_pinned", "withdrawn", "served"]
    diff: tuple[str, ...]
    fingerprint: str
    definition: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "tool": self.name, "policy": self.policy,
                "action": self.action, "diff": list(self.diff)}


class Pins:
    """The pins of a Location; `reshape` is the profiles' common entry wrapper.

    Each MCP server tool's definition is fingerprinted when first seen and pinned
    (`PinStore`), keyed by `<server>/<upstream name>`; the first listing of a server pins
    all its tools. After that a changed definition, or a new tool on a server that has pins,
    is handled by the server's policy: `hold` (default for HTTP/SSE: changed texts keep the
    pinned ones, a changed schema withdraws the tool), `warn` (default for stdio: served) or
    `off` (nothing pinned). Every change publishes `DefinitionChanged` once and stays a
    health problem until `approve`; while a change is held the store is read every
    `APPROVAL_POLL_SECONDS`, so an approval made elsewhere (another replica) releases it
    here too."""

    def __init__(self, store: PinStore | None, events: EventSink | None = None) -> None:
        self.store = store
        self.events = events
        self.policy: Callable[[str], PinPolicy | None] = lambda server: None
        """Server key -> its policy (None: not a known MCP server: nothing pinned)."""
        self.pins: dict[str, Pin] = {}
        self.held: dict[str, HeldChange] = {}
        self.on_approve: Callable[[], None] = lambda: None
        self._unwritten: list[Pin] = []
        self._writing: asyncio.Task[None] | None = None
        self._approvals: asyncio.Task[None] | None = None
        self._prints: dict[str, _Print] = {}

    async def load(self) -> None:
        if self.store is not None:
            self.pins = {pin.key: pin for pin in await self.store.load()}

    async def fingerprint_new(self, entries: Mapping[str, Entry]) -> None:
        """Fingerprint, in a worker thread, the MCP definitions `reshape` has not seen yet: a
        listing of thousands of tools is megabytes of JSON to serialize (about 1 s for 50 MB),
        which `reshape` would otherwise do on the event loop."""
        listed, known = list(entries.values()), dict(self._prints)  # picked in the thread too
        self._prints.update(await asyncio.to_thread(_fingerprints, listed, known))

    def reshape(self, entries: Mapping[str, Entry]) -> Mapping[str, Entry]:
        pinned_servers = {key.split("/", 1)[0] for key in self.pins}
        policies: dict[str, PinPolicy | None] = {}  # asked once per server, not per tool
        result: dict[str, Entry] = {}
        for name, entry in entries.items():
            server = entry.origin[4:] if entry.origin.startswith("mcp:") else None
            if server is not None and server not in policies:
                policies[server] = self.policy(server)
            policy = policies[server] if server is not None else None
            if server is None or policy is None or policy == "off":
                result[name] = entry
                continue
            served = self._check(f"{server}/{entry.key}", name, entry, policy,
                                 server in pinned_servers)
            if served is not None:
                result[name] = served
        return result

    def _check(
        self, key: str, name: str, entry: Entry, policy: PinPolicy, server_pinned: bool
    ) -> Entry | None:
        known = self._prints.get(key)
        if known is not None and known[0] is entry.definition:
            now, print_ = known[1], known[2]
        else:  # each listing makes new definitions: fingerprint once per listing, not per view
            now = definition_json(entry.definition)
            print_ = fingerprint(now)
            self._prints[key] = (entry.definition, now, print_)
        pin = self.pins.get(key)
        if pin is None and not server_pinned:
            self._pin(Pin(key, print_, now, time.time()))
            return entry
        if pin is not None and pin.fingerprint == print_:
            self.held.pop(key, None)
            return entry
        same_schemas = pin is not None and all(
            pin.definition.get(k) == now[k] for k in ("input_schema", "output_schema"))
        action: Literal["kept_pinned", "withdrawn", "served"] = (
            "served" if policy == "warn" else "kept_pinned" if same_schemas else "withdrawn")
        held = self.held.get(key)
        if held is None or held.fingerprint != print_:
            change = HeldChange(key, name, policy, action,
                                tuple(definition_diff(pin.definition if pin else None, now)),
                                print_, now)
            self.held[key] = change
            self._follow_approvals()
            log.warning("tool %s (%s) changed upstream; %s until approved (sidecar tools "
                        "approve %s):\n%s", name, key, action.replace("_", " "), name,
                        "\n".join(change.diff))
            if self.events is not None:
                self.events.publish(DefinitionChanged(key, name, policy, action,
                                                      list(change.diff)))
        if action == "served":
            return entry
        if action == "withdrawn" or pin is None:
            return None
        old = pin.definition
        tool = tool_with(entry.tool, description=old["description"], title=old["title"])
        definition = replace(entry.definition, description=old["description"],
                             title=old["title"], annotations=old["annotations"])
        return Entry(tool, entry.key, definition, entry.origin)

    def _pin(self, pin: Pin) -> None:
        self.pins[pin.key] = pin
        if self.store is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a snapshot taken outside a loop: pinned until restart
            return
        # Written in batches by one task: the pins of a listing of thousands of tools are one
        # job of the store's thread, not a task and a job each.
        self._unwritten.append(pin)
        if self._writing is None or self._writing.done():
            self._writing = loop.create_task(self._write_unwritten(), name="pin-writes")

    def _follow_approvals(self) -> None:
        if self.store is None or (self._approvals is not None and not self._approvals.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a snapshot taken outside a loop: approve here
            return
        self._approvals = loop.create_task(self._approved_elsewhere(), name="pin-approvals")

    async def _approved_elsewhere(self) -> None:
        """While changes are held: take in the pins another process stored for them."""
        assert self.store is not None
        while self.held:
            await asyncio.sleep(APPROVAL_POLL_SECONDS)
            try:
                stored = {pin.key: pin for pin in await self.store.load()}
            except Exception as exc:  # the store may answer at the next round
                log.warning("reading the pins failed: %s", exc)
                continue
            approved = [c for c in self.held.values() if (pin := stored.get(c.key)) is not None
                        and pin.fingerprint == c.fingerprint]
            for change in approved:
                self.pins[change.key] = stored[change.key]
                self.held.pop(change.key, None)
            if approved:
                log.info("definition change(s) approved elsewhere: %s",
                         ", ".join(c.name for c in approved))
                self.on_approve()

    async def _write_unwritten(self) -> None:
        assert self.store is not None
        while self._unwritten:
            batch, self._unwritten = self._unwritten, []
            try:
                await self.store.put_many(batch)
            except Exception:
                log.exception("recording the pins of %s failed (they hold until restart)",
                              _keys(batch))

    def refusal(self, entry: Entry) -> CallError | None:
        """The seam's admission check: a tool whose schema change is held (`withdrawn`) is
        callable from no snapshot, also not from one captured before the change (its upstream
        would run the new definition)."""
        if not self.held or not entry.origin.startswith("mcp:"):
            return None
        change = self.held.get(f"{entry.origin[4:]}/{entry.key}")
        if change is None or change.action != "withdrawn":
            return None
        return _held_error(change.name)

    def withdrawn(self, name: str) -> CallError | None:
        """Why `name` is missing from a snapshot when a held change withdrew it (the seam
        says so instead of `unknown_tool`)."""
        if any(c.name == name and c.action == "withdrawn" for c in self.held.values()):
            return _held_error(name)
        return None

    async def approve(self, name: str) -> HeldChange:
        """Pin the held definition of tool `name` (effective name or `<server>/<tool>` key)."""
        change = self.held.get(name) or next(
            (c for c in self.held.values() if c.name == name), None)
        if change is None:
            pending = ", ".join(sorted(c.name for c in self.held.values())) or "none"
            raise NotHeld(f"no definition change of {name!r} is waiting (waiting: {pending})")
        pin = Pin(change.key, change.fingerprint, change.definition, time.time())
        self.pins[pin.key] = pin
        self.held.pop(change.key, None)  # a check while the pin is written may have done it
        self.on_approve()
        if self.store is not None:
            await self.store.put(pin)
        return change

    async def aclose(self) -> None:
        if self._approvals is not None:
            self._approvals.cancel()
            await asyncio.wait([self._approvals])  # never swallows our own cancellation
        if self._writing is not None:
            await asyncio.wait([self._writing])
        if self.store is not None:
            await self.store.aclose()


def _keys(pins: Sequence[Pin]) -> str:
    shown = ", ".join(pin.key for pin in pins[:3])
    return shown if len(pins) <= 3 else f"{shown} and {len(pins) - 3} more"


def _held_error(name: str) -> CallError:
    return CallError(ErrorKind.UNAVAILABLE, (
        f"Tool {name} is held: its server changed its definition and the change waits for "
        f"approval (`sidecar tools approve {name}`, or the console's definitions page). It "
        "was not run."))
