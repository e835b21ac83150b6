"""Errors of the core: what a *tool* may raise to tell the model something, and what the *seam*
reports about a call (two families, kept apart). Imports nothing of ours.

    Exception
    ├── ToolFailure                 raised by a tool: the only model-visible failure it can cause
    │   └── ToolUnavailable         raised by a before-hook: this call may not run here
    └── SidecarError                developer-facing; never reaches a model as a tool result
        ├── CodecError              a value does not fit a codec (carries the JSON path)
        │   └── SchemaDefinitionError   a JSON Schema is itself invalid (when a tool is built)
        ├── RegistrationError       a registration was rejected whole
        └── CallIdConflict          a call id already settled a different call

Every terminal failure of a call becomes one `CallError` inside an `Outcome`, its `kind` one of
`ErrorKind`: every kind is model-visible except `operational`, which carries an `error_id`
that also appears in the daemon log next to the traceback.
"""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass
from typing import Any


class ErrorKind(enum.StrEnum):
    TOOL_FAILURE = "tool_failure"
    INVALID_INPUT = "invalid_input"
    INVALID_OUTPUT = "invalid_output"
    UNKNOWN_TOOL = "unknown_tool"
    UNAVAILABLE = "unavailable"
    DENIED = "denied"
    DECLINED = "declined"
    TIMEOUT = "timeout"
    UPSTREAM = "upstream"
    CONFLICT = "conflict"
    """The call id already settled a different call: nothing ran."""
    OPERATIONAL = "operational"
    EXPIRED = "expired"
    """A replayed call id whose outcome was pruned after the retention period: nothing ran."""
    INTERRUPTED = "interrupted"
    """A call id whose call started but never settled durably (the daemon was killed, or its
    outcome could not be recorded): it is not run again, and whether it finished is unknown."""
    GUARDRAIL = "guardrail"
    """A guardrail (manifest `[guardrails]`: a secret found, an external guard's denial) refused
    the call's input or output; the message names the rule (docs/guardrails.md)."""

    @property
    def model_visible(self) -> bool:
        return self is not ErrorKind.OPERATIONAL


@dataclass(frozen=True, slots=True)
class CallError:
    """The one error of a failed call, as stored and as shown.

    `message` is what a model may see (for `operational` it names only the `error_id`).
    `path` is a JSON path into the input or output when the error is about a value.
    """

    kind: ErrorKind
    message: str
    path: str | None = None
    error_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind.value, "message": self.message}
        if self.path is not None:
            data["path"] = self.path
        if self.error_id is not None:
            data["error_id"] = self.error_id
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CallError:
        return cls(
            kind=ErrorKind(data["kind"]),
            message=data["message"],
            path=data.get("path"),
            error_id=data.get("error_id"),
        )


def new_error_id() -> str:
    """An id that ties an operational error in an outcome to its traceback in the log."""
    return "op_" + secrets.token_hex(6)


class ToolFailure(Exception):
    """Raised by a tool's `execute` to fail the call with a message the model sees.

    `metadata` (a small JSON object) is kept with the error when it passes the metadata bounds.
    `kind` lets trusted sources (bridges, manifest tools) report `timeout` or `upstream`; plain
    tools leave it at `tool_failure`.
    """

    def __init__(
        self,
        message: str,
        metadata: dict[str, Any] | None = None,
        *,
        kind: ErrorKind = ErrorKind.TOOL_FAILURE,
    ) -> None:
        if kind is ErrorKind.OPERATIONAL:
            raise ValueError("ToolFailure cannot be operational; raise any other exception")
        super().__init__(message)
        self.message = message
        self.metadata = metadata
        self.kind = kind


class ToolUnavailable(ToolFailure):
    """Raised by a before-hook: the call is not available in this request."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind=ErrorKind.UNAVAILABLE)


class SidecarError(Exception):
    """Base of developer-facing errors."""


class CodecError(SidecarError):
    """A value does not fit a codec. `path` is a JSON path such as `$.items[2].name`."""

    def __init__(self, message: str, path: str = "$") -> None:
        super().__init__(f"{message} (at {path})")
        self.message = message
        self.path = path


class SchemaDefinitionError(CodecError):
    """A JSON Schema given as a codec is not a valid schema; `path` points into the schema."""


class RegistrationError(SidecarError):
    """A registration was rejected whole; the message names the tool and the problem."""


class CallIdConflict(SidecarError):
    """A call id already settled another call (its stored fingerprint differs); the seam
    answers it with a `conflict` error and nothing runs."""

    def __init__(self, call_id: str) -> None:
        super().__init__(f"call id {call_id!r} already settled a different call")
        self.call_id = call_id
