"""mcp-sidecar: many MCP servers and manifest tools behind one validated, bounded seam.

    from sidecar import Tool, ToolResponse, ToolFailure, ToolContext, Location

This package is the core: tool, codec, names, content and bounding, metadata, registry,
snapshot, seam, hooks, permissions, events, outcomes, `Location` (`location`) and the store
interfaces (`stores`). The core may import only itself and `managed_store`. Beside it, in the
same package: the frontends (`serve`, `cli*`) and the composition root (`daemon`), the one
module that picks store implementations and attaches `bridges`; nothing imports the root but
`cli` and the lazy `Location` export below (`tests/test_architecture.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sidecar.execution.hooks import AfterCall, BeforeCall
from sidecar.model.content import (
    AudioContent,
    ImageContent,
    ResourceContent,
    ResourceLink,
    TextContent,
)
from sidecar.model.errors import CallError, ErrorKind, ToolFailure, ToolUnavailable
from sidecar.model.outcome import ManagedText, Outcome
from sidecar.model.tool import Annotations, Bounds, CallContext, Tool, ToolContext, ToolResponse

if TYPE_CHECKING:
    from sidecar.daemon.daemon import Location

__all__ = [
    "AfterCall",
    "Annotations",
    "AudioContent",
    "BeforeCall",
    "Bounds",
    "CallContext",
    "CallError",
    "ErrorKind",
    "ImageContent",
    "Location",
    "ManagedText",
    "Outcome",
    "ResourceContent",
    "ResourceLink",
    "TextContent",
    "Tool",
    "ToolContext",
    "ToolFailure",
    "ToolResponse",
    "ToolUnavailable",
]


def __getattr__(name: str) -> Any:
    # The Location class lives in the core (`sidecar.location.location`); the public name is the
    # composition root's subclass that attaches the manifests' sources by default. It is
    # loaded lazily so that `import sidecar` (and every bridge) imports the core only.
    if name == "Location":
        from sidecar.daemon.daemon import Location

        return Location
    raise AttributeError(f"module 'sidecar' has no attribute {name!r}")
