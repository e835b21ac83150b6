"""Permission values (the `PermissionV2` model): rules, requests, pending asks, `decide`, the
`denied` and `declined` failures, and `ask_permission`, the ask of trusted tools. Imports
`sidecar.model.errors` and `sidecar.model.tool`; asks are answered by `sidecar.policy`.

Rules: `action` glob over permission actions (a tool's effective name unless it sets
`permission_action`), optional `resource` glob, `decision` allow | deny | ask. Layers, later
wins: daemon defaults < Location manifest < persisted `always` rules < session rules < the
rules of the profile a call came through (`SCOPE_RULES`); within a layer the last matching
rule wins. With no matching rule the request's `default` decides (bridges derive it from MCP
annotations and the server's manifest), else allow. The registry never authorizes on its own.
"""

from __future__ import annotations

import fnmatch
import secrets
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from sidecar.model.errors import ErrorKind, ToolFailure
from sidecar.model.tool import CallContext

Decision = Literal["allow", "deny", "ask"]
Reply = Literal["once", "always", "reject"]
"""`once`: this request only; `always`: persisted as a rule for the session or Location;
`reject` (with optional feedback): also rejects the other pending asks of the same session."""


@dataclass(frozen=True, slots=True)
class PermissionRule:
    action: str
    decision: Decision
    resource: str | None = None

    def matches(self, action: str, resources: tuple[str, ...]) -> bool:
        if not fnmatch.fnmatchcase(action, self.action):
            return False
        if self.resource is None:
            return True
        return bool(resources) and all(fnmatch.fnmatchcase(r, self.resource) for r in resources)


@dataclass(frozen=True, slots=True)
class PermissionRequest:
    session_id: str
    agent: str
    action: str
    message_id: str = ""
    call_id: str = ""
    resources: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    default: Decision | None = None
    """Used when no rule matches (e.g. derived from MCP annotations); None means allow."""


@dataclass(frozen=True, slots=True)
class PendingAsk:
    id: str
    request: PermissionRequest
    created_at: float

    def to_json(self) -> dict[str, Any]:
        r = self.request
        return {
            "id": self.id,
            "session_id": r.session_id,
            "agent": r.agent,
            "action": r.action,
            "resources": list(r.resources),
            "source": {"message_id": r.message_id, "call_id": r.call_id},
            "metadata": dict(r.metadata),
            "created_at": self.created_at,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PendingAsk:
        """The ask `to_json` described (the request's `default` is not part of it: it was
        used when the ask was raised)."""
        source = data.get("source") or {}
        return cls(
            id=str(data["id"]),
            request=PermissionRequest(
                session_id=str(data["session_id"]), agent=str(data["agent"]),
                action=str(data["action"]), message_id=str(source.get("message_id", "")),
                call_id=str(source.get("call_id", "")),
                resources=tuple(str(r) for r in data.get("resources", ())),
                metadata=dict(data.get("metadata") or {}),
            ),
            created_at=float(data["created_at"]),
        )


SCOPE_RULES: ContextVar[tuple[PermissionRule, ...]] = ContextVar("SCOPE_RULES", default=())
"""The permission rules of the profile a call was made through (`sidecar.registry.profiles` sets it
around the tool's `execute`); they are the last layer, so they win over every other."""


class PermissionGate(Protocol):
    """What a trusted tool captures to ask before acting."""

    async def ask(self, request: PermissionRequest) -> None:
        """Return when the call may proceed; else raise `ToolFailure`: `denied` (a deny rule),
        `declined` (the user rejected without feedback, or the ask timed out: the runner should
        end the turn), or `tool_failure` carrying the user's feedback (the model can go on)."""
        ...

    def decision(self, session_id: str, action: str, resources: tuple[str, ...] = (),
                 default: Decision | None = None) -> Decision:
        """What the rules known now decide, as `ask` would start with (no request built)."""
        ...


async def ask_permission(
    gate: PermissionGate | None,
    ctx: CallContext,
    *,
    metadata: Mapping[str, Any],
    resources: tuple[str, ...] = (),
    default: Decision | None = None,
) -> None:
    """Ask `gate` whether the call `ctx` describes may run, its tool name as the action (the
    session, agent, message and call ids come from `ctx`); returns when it may, raises what
    `ask` raises otherwise. Without a gate there is nothing to ask; a call the rules allow
    outright builds no request (most calls: an `allow` default or rule)."""
    if gate is None or gate.decision(ctx.session_id, ctx.tool_name, resources,
                                     default) == "allow":
        return
    await gate.ask(PermissionRequest(
        session_id=ctx.session_id,
        agent=ctx.agent,
        message_id=ctx.message_id,
        call_id=ctx.call_id,
        action=ctx.tool_name,
        resources=resources,
        metadata=metadata,
        default=default,
    ))


def decide(
    layers: Iterable[Iterable[PermissionRule]], action: str, resources: tuple[str, ...]
) -> Decision | None:
    """The decision of the last matching rule over all layers (later layers win), or None."""
    decision: Decision | None = None
    for layer in layers:
        for rule in layer:
            if rule.matches(action, resources):
                decision = rule.decision
    return decision


def new_ask_id() -> str:
    return "perm_" + secrets.token_hex(8)


def denied(action: str) -> ToolFailure:
    return ToolFailure(
        f"Permission denied: {action} is not allowed by the permission policy.",
        kind=ErrorKind.DENIED,
    )


def declined(action: str, why: str = "the user declined this call") -> ToolFailure:
    return ToolFailure(f"{action}: {why}.", kind=ErrorKind.DECLINED)
