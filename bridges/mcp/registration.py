"""A server's tools in the registry: `ToolRegistration` lists them (every page), builds the
catalog and registers it in one scope kept for the supervisor's whole life: the first listing
registers it, every later one (after a reconnect, a list_changed, a configuration change)
replaces it in place, so its precedence among registrations never changes. Re-listing after a
list_changed is debounced (`relist_loop`). Imports `bridges.mcp.{catalog,calls,listing,
listening,results,health_book}` and `sidecar.registry`; exports `ToolRegistration` and
`RELIST_DEBOUNCE`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
from mcp.shared.exceptions import MCPError

from bridges.manifest.loading import ServerConfig
from bridges.mcp.calls import Caller
from bridges.mcp.catalog import build_catalog, offered
from bridges.mcp.health_book import HealthBook
from bridges.mcp.listening import describe
from bridges.mcp.listing import ToolLimit
from bridges.mcp.results import is_transport_loss
from sidecar.model.errors import RegistrationError
from sidecar.registry.registry import Scope, Tools

if TYPE_CHECKING:
    from bridges.mcp.connection import Connection

log = logging.getLogger("bridges.mcp")

RELIST_DEBOUNCE = 0.1


class ToolRegistration:
    """One server's registration scope and its re-listing."""

    __slots__ = ("_book", "_caller", "_config", "_key", "_redact", "_relist", "_scope",
                 "_tools")

    def __init__(self, key: str, tools: Tools, caller: Caller, book: HealthBook, *,
                 config: Callable[[], ServerConfig], redact: Callable[[str], str]) -> None:
        self._key = key
        self._tools = tools
        self._caller = caller
        self._book = book
        self._config = config  # the supervisor's current configuration
        self._redact = redact
        self._scope: Scope | None = None
        self._relist = anyio.Event()

    async def list_and_register(self, connection: Connection) -> None:
        config = self._config()
        listing = await connection.list_tools(config.max_listing_bytes, ToolLimit(
            config.max_tools, functools.partial(offered, config=config)))
        # Off the loop (schemas can be megabytes); a start-up timeout that fires meanwhile
        # abandons the thread instead of waiting for it.
        catalog = await anyio.to_thread.run_sync(
            build_catalog, self._key, config, listing.tools, self._caller,
            abandon_on_cancel=True)
        for skipped in catalog.skipped:
            log.warning("[%s] tool %r left out: %s", self._key, skipped.name, skipped.reason)
        for warning in (listing.warning, listing.cap_reason):
            if warning:
                log.warning("[%s] %s", self._key, warning)
        namespace = self._config().effective_namespace(self._key)
        try:
            if self._scope is None:
                self._scope = self._tools.register(
                    catalog.tools, namespace=namespace, label=f"mcp:{self._key}"
                )
            else:
                self._scope.replace(catalog.tools, namespace=namespace)
        except RegistrationError as exc:
            log.error("[%s] registering its tools failed: %s", self._key, exc)
            self._book.set(last_error=self._redact(f"registering its tools failed: {exc}"))
            return
        self._book.set(tool_count=len(catalog.tools), skipped=catalog.skipped,
                       filtered=catalog.filtered, over_max_tools=listing.cap_reason)
        self._book.tools_changed()

    def unregister(self) -> None:
        """The tools out of the registry, and out of the server's health."""
        if self._scope is not None:
            self._scope.close()
            self._scope = None
            self._book.set(tool_count=0, skipped=(), filtered=0, over_max_tools=None)
            self._book.tools_changed()

    def close(self) -> None:
        """The tools out of the registry for good (the supervisor stops)."""
        if self._scope is not None:
            self._scope.close()
            self._scope = None
            self._book.tools_changed()

    def ask_relist(self) -> None:
        self._relist.set()

    async def relist_loop(self, connection: Connection) -> None:
        while True:
            await self._relist.wait()
            await anyio.sleep(RELIST_DEBOUNCE)
            self._relist = anyio.Event()  # changes announced from here on list again
            try:
                with anyio.fail_after(self._config().timeouts.startup):
                    await self.list_and_register(connection)
            except Exception as exc:  # a bad listing must not end the connection
                log.warning("[%s] re-listing tools failed: %s", self._key,
                            self._redact(describe(exc)))
                if isinstance(exc, MCPError) and is_transport_loss(exc, direct=False):
                    connection.lost.set()
