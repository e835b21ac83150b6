"""The sources port: what a Location's manifests attach, as the core and the frontends use it.

Owns `Sources` (the manifests' MCP servers, tools, policy and live reload, attached by the
composition root: `sidecar.daemon.sources.ManifestSources`) and `UpstreamPool` (the upstream
MCP servers: `Location.upstreams`, the one way a frontend reaches them). The Location reads its
manifest-driven settings (`audit`, `codemode`, `expose`) from its sources; nothing assigns them
on it.
May import the core below `location`; the bridges' value types are named for types only.
Exports `Sources`, `UpstreamPool`, `RelayPoint`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from sidecar.model.codemode import CodeModeSetting, ExposeSetting
from sidecar.stores.call_history import AuditSettings

if TYPE_CHECKING:
    from bridges.manifest.loading import ManifestSet, ServerConfig
    from bridges.manifest.values import ManifestProblem
    from bridges.mcp import Connection, RelayTarget, ServerHealth
    from bridges.mcp.oauth import Logins

__all__ = ["RelayPoint", "Sources", "UpstreamPool"]


class RelayPoint(Protocol):
    """Where a frontend attaches to receive the upstream servers' requests and notifications
    (`bridges.mcp.passthrough.Relay`)."""

    def attach(self, target: RelayTarget) -> Callable[[], None]:
        """Add `target`; the function returned removes it again."""
        ...


class UpstreamPool(Protocol):
    """The upstream MCP servers of a Location (`bridges.mcp.ServerPool`), by manifest key."""

    def health(self) -> dict[str, ServerHealth]: ...

    def starting(self) -> list[str]:
        """The servers still on their first attempt (their tools are not listed yet)."""
        ...

    async def settled(self) -> None:
        """Return once every server has settled its first attempt."""
        ...

    def connection(self, key: str) -> Connection | None:
        """The live connection of one server, or None (unknown, starting, down)."""
        ...

    def config(self, key: str) -> ServerConfig | None: ...

    async def restart(self, key: str) -> bool:
        """Restart one server and wait for its new attempt to settle; False: unknown key."""
        ...

    def stderr(self, key: str, after: int = 0) -> tuple[int, str] | None:
        """(mark, text) of what one server wrote to stderr after mark `after`; None: unknown."""
        ...

    def namespaces(self) -> dict[str, str]:
        """Each enabled server's namespace, by key, in configuration order."""
        ...

    @property
    def logins(self) -> Logins | None:
        """OAuth logins started inside the daemon; None: no grant store."""
        ...

    @property
    def relay(self) -> RelayPoint: ...


class Sources(Protocol):
    """What `Wiring.attach_sources` attaches to a Location (entering applies the manifests,
    exiting stops every server and manifest tool)."""

    @property
    def manifests(self) -> ManifestSet:
        """The manifests applied now (`Location.manifests`)."""
        ...

    @property
    def upstreams(self) -> UpstreamPool | None:
        """The upstream MCP servers (`Location.upstreams`)."""
        ...

    @property
    def audit(self) -> AuditSettings:
        """What the call history keeps of inputs (manifest `[audit]`)."""
        ...

    @property
    def codemode(self) -> CodeModeSetting | None:
        """The manifests' Code Mode setting; None: the Location's own."""
        ...

    @property
    def expose(self) -> ExposeSetting | None:
        """The manifests' top-level `expose`; None: the Location's own."""
        ...

    @property
    def reload_problems(self) -> Sequence[ManifestProblem]:
        """Why the last reload was rejected (empty once one applies)."""
        ...

    def unmatched_globs(self) -> Sequence[ManifestProblem]:
        """The manifests' globs that match no tool (health)."""
        ...

    async def reload(self) -> bool:
        """Re-read the manifests; apply them when all are valid. True when applied."""
        ...

    async def watch(self) -> None:
        """Reload on every change to a manifest file, until cancelled."""
        ...
