"""The MCP client bridge: upstream MCP servers as registry entries behind the seam.

    from bridges.mcp import ServerPool

    async with ServerPool(servers, location.tools, permissions=gate) as pool:
        ...                      # every server's tools are registered (scope label "mcp:<key>")
        pool.health()            # {key: ServerHealth}
        await pool.update(new)   # apply a manifest change

Modules, in the order a call meets them: `pool` (all servers) -> `supervisor` (one server's
life: `health_book`, `failures`, `registration` of its tools, `server_messages`) ->
`connection` (one session, any transport; `call_results` decodes what a call answers) ->
`stdio` + `framing` (our own stdio transport, linear framing) -> `catalog` (listings -> tool
values, codecs in `codecs`) -> `calls` (one tool call) -> `results` (upstream results and
errors -> the core's terms). `stdio` uses `direct_requests`, `stderr_tail` and `pipes` (pipe
transports that close their descriptor once, also for the facade's stdio wire).
Imports `sidecar.model`, `sidecar.registry`, `sidecar.stores`, `managed_store`, other `bridges`.
"""

from bridges.manifest.loading import ServerConfig
from bridges.mcp.backoff import Backoff
from bridges.mcp.catalog import TASK_SUPPORT_META
from bridges.mcp.connection import Connection
from bridges.mcp.framing import (
    LargeLine,
    LineFramer,
    LineReader,
    OversizedLine,
    read_chunk,
    take_lines,
)
from bridges.mcp.health import ServerHealth, ServerState, SkippedTool
from bridges.mcp.listening import ResourceWatch
from bridges.mcp.passthrough import (
    CALLER_CAPABILITIES,
    CALLER_HEADERS,
    CALLER_INPUT_RESPONSES,
    INPUT_KEY,
    UPSTREAM_TASK,
    InflightCall,
    Relay,
    RelayTarget,
)
from bridges.mcp.pipes import connect_pipe
from bridges.mcp.pool import ServerPool
from bridges.mcp.results import STRUCTURED_KEY

__all__ = [
    "CALLER_CAPABILITIES",
    "CALLER_HEADERS",
    "CALLER_INPUT_RESPONSES",
    "INPUT_KEY",
    "STRUCTURED_KEY",
    "TASK_SUPPORT_META",
    "UPSTREAM_TASK",
    "Backoff",
    "Connection",
    "InflightCall",
    "LargeLine",
    "LineFramer",
    "LineReader",
    "OversizedLine",
    "Relay",
    "RelayTarget",
    "ResourceWatch",
    "ServerConfig",
    "ServerHealth",
    "ServerPool",
    "ServerState",
    "SkippedTool",
    "connect_pipe",
    "read_chunk",
    "take_lines",
]
