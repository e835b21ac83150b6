"""What the pool reports about each upstream server: `ServerHealth`, an immutable snapshot the
pool builds anew on every change and hands to `on_health`, and `SkippedTool`. Imports nothing
of ours. It never holds a secret: `last_error` and stderr excerpts pass through the server's
`Redactor` first, and neither `env` nor `headers` is ever copied in. States:

    starting   connecting: spawning, handshaking, listing tools (bounded by timeouts.startup);
               first, for a sandboxed npx/uvx server, `preparing` its package
    ready      connected; its tools are registered and callable
    backoff    the last attempt failed or the connection was lost; retrying at `retry_at`
    needs_auth the server wants an OAuth login (`last_error` names the command to run,
               `sidecar auth login NAME`); no retries until new tokens are stored
    failed     a fault no retry can fix (the command does not exist, a bad `protocol` value,
               the same start-up failure 5 times in a row); nothing runs until the server's
               configuration changes
    disabled   `disabled = true` in the manifest; nothing was started
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

ServerState = Literal["starting", "ready", "backoff", "needs_auth", "failed", "disabled"]


@dataclass(frozen=True, slots=True)
class SkippedTool:
    """An upstream tool that was left out of the registry, and why."""

    name: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class ServerHealth:
    """One server's status. `to_json()` is what `sidecar health` and the HTTP API show."""

    server: str
    state: ServerState
    transport: str
    protocol_version: str | None = None
    last_error: str | None = None
    tool_count: int = 0
    skipped: tuple[SkippedTool, ...] = ()
    filtered: int = 0
    """Upstream tools left out on purpose by `tools.allow` / `tools.deny`."""
    over_max_tools: str | None = None
    """Why tools were left out past the server's `max_tools` (naming the cap and how many)."""
    restarts: int = 0
    """Connections made after the first one (reconnects and configuration restarts)."""
    last_call_latency_ms: float | None = None
    since: float = 0.0
    """Wall-clock time (epoch seconds) of the last state change."""
    retry_at: float | None = None
    """In `backoff`: wall-clock time of the next attempt."""
    pid: int | None = None
    """The stdio child's process id while it runs."""
    sandbox: dict[str, Any] | None = field(default=None, hash=False)
    """The stdio server's sandbox (`bridges.manifest.sandbox.describe_sandbox`); None: none."""
    preparing: str | None = None
    """In `starting`: what is fetched for its sandbox before its first start (`bridges.sandbox.
    launchers`: "npm: PKG@VERSION", "uv: PKG==VERSION"), outside timeouts.startup."""

    def to_json(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "state": self.state,
            "transport": self.transport,
            "protocol_version": self.protocol_version,
            "last_error": self.last_error,
            "tool_count": self.tool_count,
            "skipped": [s.to_json() for s in self.skipped],
            "filtered": self.filtered,
            "over_max_tools": self.over_max_tools,
            "restarts": self.restarts,
            "last_call_latency_ms": self.last_call_latency_ms,
            "since": self.since,
            "retry_at": self.retry_at,
            "pid": self.pid,
            "sandbox": self.sandbox,
            "preparing": self.preparing,
        }
