"""What a listing of tools costs a model's context, in tokens (`tool_tokens`): per tool, per
server and in total, for `GET /v1/tools`, `sidecar tools --tokens`, the console's tools page
and the `sidecar_tool_definition_tokens{profile}` gauge.

Definitions are counted as the model is shown them (name, description, input schema) with
`sidecar.model.token_count`, in a thread and once per definition value
(`sidecar.registry.definition_tokens`), so a registry of 5,000 tools never stalls the loop.

Imports the core. Exports `tool_tokens`, `ToolTokens`, `profile_tokens`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sidecar.model.token_count import ENCODING
from sidecar.registry.definition_tokens import definition_tokens
from sidecar.registry.registry import ToolDefinition

if TYPE_CHECKING:
    from sidecar.location.location import Location


@dataclass(frozen=True, slots=True)
class ToolTokens:
    tools: dict[str, int]
    """Tokens of each definition, by tool name, in the listing's order."""
    servers: dict[str, dict[str, Any]]
    """By server (an MCP server's key, else the registration's label such as `builtin`):
    `{"tokens": n, "tools": [names]}`, the costliest first."""
    total: int

    def to_json(self) -> dict[str, Any]:
        """The fields `GET /v1/tools` adds next to `tools`."""
        return {"token_encoding": ENCODING, "tokens": self.tools, "total_tokens": self.total,
                "tokens_by_server": self.servers}


def _server(location: Location, name: str) -> str:
    label = location.registry.source_of(name)
    return label.removeprefix("mcp:") if label else "sidecar"


async def tool_tokens(location: Location, definitions: Sequence[ToolDefinition]) -> ToolTokens:
    counts = await definition_tokens.count(definitions)
    tools = {d.name: n for d, n in zip(definitions, counts, strict=True)}
    servers: dict[str, dict[str, Any]] = {}
    for name, tokens in tools.items():
        entry = servers.setdefault(_server(location, name), {"tokens": 0, "tools": []})
        entry["tokens"] += tokens
        entry["tools"].append(name)
    ranked = dict(sorted(servers.items(), key=lambda kv: (-kv[1]["tokens"], kv[0])))
    return ToolTokens(tools=tools, servers=ranked, total=sum(counts))


async def profile_tokens(location: Location) -> dict[str, int]:
    """The total tokens of the definitions each profile serves (the `/metrics` gauge)."""
    totals: dict[str, int] = {}
    for profile in location.profiles.names():
        definitions = location.snapshot(hide_denied=False, keep=False,
                                        profile=profile).definitions
        totals[profile] = sum(await definition_tokens.count(definitions))
    return totals
