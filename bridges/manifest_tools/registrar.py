"""The registrar of a Location's manifest tools: one scope, swapped in place on every apply.
Imports `bridges.manifest`, its `manifest_tools` siblings, `managed_store`, `sidecar.model`
and `sidecar.registry`; exports `ManifestTools`, `shared_client` and `LazyClient`.

    manifest_tools = ManifestTools(location.tools, store, root, permissions)
    await manifest_tools.apply(loaded.tools)      # first call: one registration (one scope)
    await manifest_tools.apply(reloaded.tools)    # later calls: scope.replace(...) in place
    await manifest_tools.aclose()                 # removes the tools, closes the HTTP client

`apply` keeps its registration's place in the precedence order, so a reload never lets an
older registration win. It is all or nothing: if the new set cannot be registered (two tools
become the same effective name, an invalid name) it raises `RegistrationError` and the tools
that were registered stay. A tool whose config did not change keeps its tool value; calls in
flight keep the tool value they captured and finish normally. All http tools share one
`httpx.AsyncClient` (`shared_client`) that the registrar owns, unless one is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self

from bridges.manifest.loading import Sourced
from bridges.manifest_tools.command_tool import command_tool
from bridges.manifest_tools.config import CommandToolConfig, HttpToolConfig, ManifestToolConfig
from managed_store import TextStore
from sidecar.model.errors import RegistrationError
from sidecar.model.permissions import PermissionGate
from sidecar.model.tool import Tool
from sidecar.registry.registry import Scope, Tools

if TYPE_CHECKING:
    import httpx

MAX_REDIRECTS = 10
MAX_CONNECTIONS = 100
MAX_KEEPALIVE_CONNECTIONS = 20


def shared_client() -> httpx.AsyncClient:
    """The default client: pooled, no redirects unless a request asks, env proxies honoured.

    `httpx` is imported here, with the first http tool, not at the top: its import also loads
    its command line's libraries (rich, click, pygments when installed), start-up time that a
    daemon without http tools does not pay."""
    import httpx

    limits = httpx.Limits(max_connections=MAX_CONNECTIONS,
                          max_keepalive_connections=MAX_KEEPALIVE_CONNECTIONS)
    return httpx.AsyncClient(follow_redirects=False, max_redirects=MAX_REDIRECTS, limits=limits)


class LazyClient:
    """A registrar's HTTP client: the one passed in, else a `shared_client` made on the first
    `get` (building one loads the CA bundle into an SSL context, ~0.1 s of blocking work, which
    a Location without http tools never needs). `aclose` closes only a client it made."""

    def __init__(self, client: httpx.AsyncClient | None = None) -> None:
        self._owned = client is None
        self.client = client

    def get(self) -> httpx.AsyncClient:
        if self.client is None:
            self.client = shared_client()
        return self.client

    async def aclose(self) -> None:
        if self._owned and self.client is not None:
            await self.client.aclose()


class ManifestTools:
    """Registers a Location's manifest tools (one scope, see the module docstring)."""

    def __init__(
        self,
        tools: Tools,
        store: TextStore,
        root: Path,
        permissions: PermissionGate | None = None,
        *,
        store_namespace: str = "default",
        client: httpx.AsyncClient | None = None,
        label: str = "manifest-tools",
    ) -> None:
        self._tools = tools
        self._store = store
        self._root = Path(root)
        self._permissions = permissions
        self._namespace = store_namespace
        self._client = LazyClient(client)
        self._label = label
        self._scope: Scope | None = None
        self._built: dict[str, tuple[ManifestToolConfig, Tool]] = {}
        self._closed = False

    @property
    def names(self) -> tuple[str, ...]:
        """The effective names registered now."""
        return self._scope.names if self._scope is not None else ()

    async def apply(self, configs: Mapping[str, ManifestToolConfig | Sourced]) -> None:
        """Make exactly `configs` the registered manifest tools (keyed by authored name).

        `configs` may be `ManifestSet.tools` as loaded (values are `Sourced`) or plain configs.
        """
        if self._closed:
            raise RegistrationError(f"{self._label}: the manifest tools registrar is closed")
        built: dict[str, tuple[ManifestToolConfig, Tool]] = {}
        for key, entry in configs.items():
            config = entry.value if isinstance(entry, Sourced) else entry
            if not isinstance(config, HttpToolConfig | CommandToolConfig):
                raise RegistrationError(
                    f"manifest tool {key!r}: expected a validated manifest tool config, got "
                    f"{type(config).__name__} (load manifests with manifest_tool_validator)"
                )
            previous = self._built.get(key)
            if previous is not None and previous[0] == config:
                built[key] = previous
            else:
                built[key] = (config, self._build(config))
        mapping = {key: tool for key, (_, tool) in built.items()}
        if self._scope is None:
            self._scope = self._tools.register(mapping, label=self._label)
        else:
            self._scope.replace(mapping)
        self._built = built

    def _build(self, config: ManifestToolConfig) -> Tool:
        if isinstance(config, HttpToolConfig):
            from bridges.manifest_tools.http_tool import http_tool  # imports httpx

            return http_tool(
                config,
                client=self._client.get(),
                store=self._store,
                store_namespace=self._namespace,
                permissions=self._permissions,
            )
        return command_tool(
            config,
            store=self._store,
            store_namespace=self._namespace,
            root=self._root,
            permissions=self._permissions,
        )

    async def aclose(self) -> None:
        """Remove the tools and close the HTTP client (if the registrar created it)."""
        if self._closed:
            return
        self._closed = True
        if self._scope is not None:
            self._scope.close()
        self._built = {}
        await self._client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
