"""Tool values: a description, codecs, options and exactly one `execute`.

A tool value has no name: the key it is registered under (its authored name) and the
namespace give it one. The same value may be registered under several names.

    echo = Tool(description="Echo text", input=EchoIn, output=EchoOut, execute=run_echo)

`execute(input, context)` receives the decoded input and a `CallContext`, and returns either a
`ToolResponse` or a bare value (taken as the output). It raises `ToolFailure` to fail in a way
the model sees; any other exception is an operational failure.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from sidecar.model.codec import Codec, CodecLike, make_codec
from sidecar.model.content import ContentItem
from sidecar.model.frozen import quick_init

DEFAULT_MAX_BYTES = 50 * 1024
DEFAULT_MAX_LINES = 2000
_MIN_MAX_BYTES = 1024
_MIN_MAX_LINES = 16


@dataclass(frozen=True, slots=True)
class Bounds:
    """Limits on the model-facing text of one call. `None` means "inherit from the outer level".

    Levels, innermost wins: tool > server (bridges) > Location > daemon.
    """

    max_bytes: int | None = None
    max_lines: int | None = None

    def __post_init__(self) -> None:
        if self.max_bytes is not None and self.max_bytes < _MIN_MAX_BYTES:
            raise ValueError(f"bounds.max_bytes must be at least {_MIN_MAX_BYTES}")
        if self.max_lines is not None and self.max_lines < _MIN_MAX_LINES:
            raise ValueError(f"bounds.max_lines must be at least {_MIN_MAX_LINES}")

    def over(self, outer: Bounds) -> Bounds:
        """These bounds with unset fields taken from `outer`."""
        return Bounds(
            max_bytes=self.max_bytes if self.max_bytes is not None else outer.max_bytes,
            max_lines=self.max_lines if self.max_lines is not None else outer.max_lines,
        )

    @property
    def bytes_limit(self) -> int:
        return self.max_bytes if self.max_bytes is not None else DEFAULT_MAX_BYTES

    @property
    def lines_limit(self) -> int:
        return self.max_lines if self.max_lines is not None else DEFAULT_MAX_LINES


DEFAULT_BOUNDS = Bounds(DEFAULT_MAX_BYTES, DEFAULT_MAX_LINES)

StructuredOutput = Literal["bounded", "full", "off"]
STRUCTURED_OUTPUT_MODES: tuple[StructuredOutput, ...] = ("bounded", "full", "off")


@quick_init  # built for every call
@dataclass(frozen=True, slots=True)
class ToolContext:
    """The runner's context for one call: supplied by the caller, never inferred."""

    session_id: str
    agent: str
    message_id: str
    call_id: str
    owner: str | None = None
    """Who the call's retained text counts against in the managed store (its per-owner share
    of the quota); None: the session (`"session:<session_id>"`). The HTTP API sets
    `"token:<id>"` for a call made with a scoped token."""

    def __post_init__(self) -> None:
        values = (self.session_id, self.agent, self.message_id, self.call_id)
        if not all(type(v) is str and v for v in values):
            for name in ("session_id", "agent", "message_id", "call_id"):
                value = getattr(self, name)
                if not isinstance(value, str) or not value:
                    raise ValueError(f"ToolContext.{name} must be a non-empty string")
        if self.owner is not None and (type(self.owner) is not str or not self.owner):
            raise ValueError("ToolContext.owner must be a non-empty string or None")

    @property
    def store_owner(self) -> str:
        """The managed store's owner for this call's retained text."""
        return self.owner or f"session:{self.session_id}"


ProgressSink = Callable[[str, str, dict[str, Any]], None]
"""(call_id, tool name, snapshot) -> None"""


class CallContext:
    """What `execute` receives: the runner context plus per-call services.

    `progress(snapshot)` publishes a small JSON object describing where the call is; the last
    one is kept and, if the call fails, stored with the error (bounded like metadata).
    """

    __slots__ = ("_last_progress", "_sink", "runner", "tool_name")

    def __init__(self, runner: ToolContext, tool_name: str, sink: ProgressSink | None) -> None:
        self.runner = runner
        self.tool_name = tool_name
        self._sink = sink
        self._last_progress: dict[str, Any] | None = None

    @property
    def session_id(self) -> str:
        return self.runner.session_id

    @property
    def agent(self) -> str:
        return self.runner.agent

    @property
    def message_id(self) -> str:
        return self.runner.message_id

    @property
    def call_id(self) -> str:
        return self.runner.call_id

    @property
    def store_owner(self) -> str:
        """Who text retained by this call counts against (`ToolContext.store_owner`): pass it
        as `owner=` to the managed store."""
        return self.runner.store_owner

    @property
    def last_progress(self) -> dict[str, Any] | None:
        return self._last_progress

    def progress(self, snapshot: Mapping[str, Any]) -> None:
        self._last_progress = dict(snapshot)
        if self._sink is not None:
            self._sink(self.runner.call_id, self.tool_name, self._last_progress)


@dataclass(frozen=True, slots=True)
class ToolResponse:
    """A full response: any of output (machine value), content (model-facing), metadata (UI)."""

    output: Any = None
    content: str | list[ContentItem] | list[dict[str, Any]] | tuple[ContentItem, ...] | None = (
        None
    )
    metadata: Mapping[str, Any] | None = None


Execute = Callable[[Any, CallContext], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Annotations:
    """Hints about a tool's behaviour (MCP's tool annotations, snake_case)."""

    title: str | None = None
    read_only_hint: bool | None = None
    destructive_hint: bool | None = None
    idempotent_hint: bool | None = None
    open_world_hint: bool | None = None

    def to_json(self) -> dict[str, Any]:
        fields = {k: getattr(self, k) for k in self.__dataclass_fields__}
        return {k: v for k, v in fields.items() if v is not None}


@dataclass(frozen=True, slots=True, init=False)
class Tool:
    """A reusable, nameless tool value. See the module docstring."""

    description: str
    input: Codec
    output: Codec | None
    execute: Execute
    title: str | None
    namespace: str | None
    codemode: bool
    permission_action: str | None
    annotations: Annotations | None
    bounds: Bounds | None
    meta: Mapping[str, Any] = field(default_factory=dict)
    structured_output: StructuredOutput | None = None
    """How the MCP facade sends this tool's output as `structuredContent` (None: "bounded");
    see docs/mcp-facade.md."""

    def __init__(
        self,
        *,
        description: str,
        input: CodecLike,
        execute: Execute,
        output: CodecLike | None = None,
        title: str | None = None,
        namespace: str | None = None,
        codemode: bool = True,
        permission_action: str | None = None,
        annotations: Annotations | None = None,
        bounds: Bounds | None = None,
        meta: Mapping[str, Any] | None = None,
        structured_output: StructuredOutput | None = None,
    ) -> None:
        if not callable(execute):
            raise TypeError("Tool.execute must be an async callable (input, context)")
        setter = object.__setattr__
        setter(self, "description", description)
        setter(self, "input", make_codec(input))
        setter(self, "output", None if output is None else make_codec(output))
        setter(self, "execute", execute)
        setter(self, "title", title)
        setter(self, "namespace", namespace)
        setter(self, "codemode", codemode)
        setter(self, "permission_action", permission_action)
        setter(self, "annotations", annotations)
        setter(self, "bounds", bounds)
        setter(self, "meta", dict(meta or {}))
        if structured_output not in (None, *STRUCTURED_OUTPUT_MODES):
            raise ValueError(f"structured_output must be one of {STRUCTURED_OUTPUT_MODES}")
        setter(self, "structured_output", structured_output)

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other



def tool_with(tool: Tool, **changes: Any) -> Tool:
    """A new tool value like `tool` with some fields changed (`execute`, `input`, `bounds`,
    ...): how profiles and overrides wrap a registered tool without touching it."""
    fields: dict[str, Any] = {
        "description": tool.description, "input": tool.input, "output": tool.output,
        "execute": tool.execute, "title": tool.title, "namespace": tool.namespace,
        "codemode": tool.codemode, "permission_action": tool.permission_action,
        "annotations": tool.annotations, "bounds": tool.bounds, "meta": tool.meta,
        "structured_output": tool.structured_output,
    }
    fields.update(changes)
    return Tool(**fields)
