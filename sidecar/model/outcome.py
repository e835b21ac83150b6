"""The one terminal result of a call.

A `completed` outcome has content (non-empty, bounded), optional metadata, and the encoded
output (ephemeral: never stored). An `error` outcome has exactly one `CallError` and at most one
bounded `partial` snapshot (the last progress the tool published). `managed` lists the texts
retained whole in the managed store for this call; previews in `content` point at them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from sidecar.model.content import Content, content_from_json, content_to_json
from sidecar.model.errors import CallError
from sidecar.model.frozen import quick_init

Status = Literal["completed", "error"]


@dataclass(frozen=True, slots=True)
class ManagedText:
    """A reference to a text retained whole in the managed store."""

    ref: str
    size_bytes: int
    lines: int

    def to_json(self) -> dict[str, Any]:
        return {"ref": self.ref, "size_bytes": self.size_bytes, "lines": self.lines}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ManagedText:
        return cls(ref=data["ref"], size_bytes=data["size_bytes"], lines=data["lines"])


@quick_init  # built for every call
@dataclass(frozen=True, slots=True)
class Outcome:
    call_id: str
    tool: str
    status: Status
    content: Content = ()
    output: Any = None
    metadata: dict[str, Any] | None = None
    error: CallError | None = None
    partial: dict[str, Any] | None = None
    managed: tuple[ManagedText, ...] = ()
    replayed: bool = field(default=False, compare=False)
    """True when this outcome was read back from the durable log instead of executed."""
    refused: bool = field(default=False, compare=False)
    """True when the call was refused before anything else (not admitted, or its call id
    belongs to another call): nothing ran and nothing is recorded under its id."""

    @classmethod
    def failed(
        cls,
        call_id: str,
        tool: str,
        error: CallError,
        partial: dict[str, Any] | None = None,
    ) -> Outcome:
        return cls(call_id=call_id, tool=tool, status="error", error=error, partial=partial)

    def to_json(self, *, include_output: bool = True) -> dict[str, Any]:
        data: dict[str, Any] = {"call_id": self.call_id, "tool": self.tool, "status": self.status}
        if self.status == "completed":
            data["content"] = content_to_json(self.content)
            if include_output:
                data["output"] = self.output
            if self.metadata is not None:
                data["metadata"] = self.metadata
        else:
            assert self.error is not None
            data["error"] = self.error.to_json()
            if self.partial is not None:
                data["partial"] = self.partial
        if self.managed:
            data["managed"] = [m.to_json() for m in self.managed]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], *, replayed: bool = False) -> Outcome:
        return cls(
            call_id=data["call_id"],
            tool=data["tool"],
            status=data["status"],
            content=content_from_json(data.get("content", [])),
            output=data.get("output"),
            metadata=data.get("metadata"),
            error=CallError.from_json(data["error"]) if "error" in data else None,
            partial=data.get("partial"),
            managed=tuple(ManagedText.from_json(m) for m in data.get("managed", ())),
            replayed=replayed,
        )
