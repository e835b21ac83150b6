"""Hooks around every call (steps 1 and 9 of the seam) and when a snapshot is taken
(`Hooks`, whose docstring says what a hook may return and raise).

Imports `sidecar.model` (and `sidecar.registry` for types only). Exports `Hooks`,
`BeforeCall` and `AfterCall`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sidecar.model.outcome import Outcome
from sidecar.model.tool import ToolContext

if TYPE_CHECKING:
    from sidecar.registry.registry import ToolDefinition


@dataclass(frozen=True, slots=True)
class BeforeCall:
    name: str
    input: Any
    context: ToolContext


@dataclass(frozen=True, slots=True)
class AfterCall:
    outcome: Outcome
    context: ToolContext


BeforeHook = Callable[[BeforeCall], Awaitable[BeforeCall | None]]
AfterHook = Callable[[AfterCall], Awaitable[Outcome | None]]
DefinitionsHook = Callable[[str | None, "tuple[ToolDefinition, ...]"], Iterable[str] | None]
"""Called when a snapshot is taken, with its session id and definitions; returns the names to
remove from that request (calls on them then fail `unavailable`)."""


@dataclass(slots=True)
class Hooks:
    """The hooks of one Location, in registration order.

    A `before` hook receives the call as requested and returns a repaired `BeforeCall`
    (another name, fixed input) or None to leave it as is; it rejects the call by raising
    `ToolFailure` (model-visible) or `ToolUnavailable`. An `after` hook receives the bounded
    outcome (its `managed` field lists the retained texts) and returns a changed `Outcome` or
    None; whatever it returns is normalized and bounded again. Hooks run in registration
    order; each sees the changes of the ones before it. Any other exception from a hook is
    an operational failure."""

    before: list[BeforeHook] = field(default_factory=list)
    after: list[AfterHook] = field(default_factory=list)
    definitions: list[DefinitionsHook] = field(default_factory=list)
