"""The `/v1` request bodies and error shape: what the handlers (`api`) validate and the OpenAPI
document (`openapi`) describes, in one module below both.

Imports `sidecar.formats`. Exports `SnapshotBody`, `ContextBody`, `CallBody`, `ReplyBody` and
`error_schema`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sidecar.formats import Format

Id = Annotated[str, Field(min_length=1, max_length=512)]


class _Body(BaseModel):
    # strict: 0 is not false and "1" is not 1; unknown fields are errors
    model_config = ConfigDict(extra="forbid", strict=True)


class SnapshotBody(_Body):
    session_id: Id
    allow: list[str] | None = None
    deny: list[str] | None = None
    final_step: bool = False
    format: Format = "mcp"
    strict: bool = False
    codemode: Literal["direct", "codemode", "both"] | None = None
    profile: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    expose: Literal["all", "search"] | None = None
    """Tool search (docs/tool-search.md); None: the profile's, else the manifests'."""


class ContextBody(_Body):
    session_id: Id
    agent: Id
    message_id: Id
    call_id: Id


class CallBody(_Body):
    name: Annotated[str, Field(min_length=1, max_length=256)]
    input: dict[str, Any] | str = Field(default_factory=dict)
    context: ContextBody
    format: Format | None = None
    tool_call_id: str | None = None


class ReplyBody(_Body):
    reply: Literal["once", "always", "reject"]
    feedback: str | None = None
    scope: Literal["session", "location"] = "session"


def error_schema() -> Mapping[str, Any]:
    return {
        "type": "object",
        "required": ["error"],
        "properties": {"error": {"type": "object", "required": ["code", "message"],
                                 "properties": {"code": {"type": "string"},
                                                "message": {"type": "string"},
                                                "field": {"type": "string"}}}},
    }
