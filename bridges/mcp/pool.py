"""`ServerPool`: every upstream MCP server of a Location, and nothing left behind. Imports the
rest of `bridges`, `sidecar.model`, `sidecar.registry`, `sidecar.stores`; exports `ServerPool`.

    async with ServerPool(manifest_servers, location.tools, permissions=gate,
                          on_health=publish_health, on_tools_changed=publish_tools) as pool:
        pool.health()                 # {key: ServerHealth}
        await pool.update(new_servers)  # apply a manifest change

Entering starts one supervisor task per server, concurrently, and returns once each server has
settled its first attempt (ready, backoff, failed or disabled): twenty servers are ready in
about the time of the slowest, and a server that fails never makes entering fail. With
`wait=False` entering returns at once and each server registers its tools when it is ready
(`starting()` names those still on their first attempt, `settled()` waits for them). Leaving
stops every supervisor: connections closed, child processes stopped and reaped, registrations
removed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import TracebackType

import anyio
import anyio.abc

from bridges.manifest.loading import ServerConfig
from bridges.mcp.backoff import DEFAULT_BACKOFF, Backoff
from bridges.mcp.connection import Connection
from bridges.mcp.health import ServerHealth
from bridges.mcp.oauth.attempts import Logins
from bridges.mcp.passthrough import Relay
from bridges.mcp.supervisor import Supervisor
from sidecar.model.permissions import PermissionGate
from sidecar.registry.registry import Tools
from sidecar.stores.grants import GrantStore
from sidecar.stores.pending_logins import LoginCallbacks


class ServerPool:
    """Owns every upstream connection and child process; see the module docstring.

    Callbacks run on the event loop and must not block or raise (a raise is logged and
    ignored): `on_health(key, health)` on every change of a server's health except the latency
    of single calls (read it from `health()`); `on_tools_changed(key)` whenever a server's
    registration was made, replaced (re-list after a reconnect, a list_changed or a restart) or
    removed. The registry's own change listeners fire as well, so a frontend that follows the
    registry needs neither.
    """

    def __init__(
        self,
        servers: Mapping[str, ServerConfig],
        tools: Tools,
        *,
        permissions: PermissionGate | None = None,
        on_health: Callable[[str, ServerHealth], None] | None = None,
        on_tools_changed: Callable[[str], None] | None = None,
        backoff: Backoff = DEFAULT_BACKOFF,
        grants: GrantStore | None = None,
        wait: bool = True,
        login_callbacks: LoginCallbacks | None = None,
    ) -> None:
        self._initial = dict(servers)
        self._tools = tools
        self._permissions = permissions
        self._on_health = on_health
        self._on_tools_changed = on_tools_changed
        self._backoff = backoff
        self._grants = grants
        """Where OAuth grants live; None: no server is authorized with OAuth."""
        self._supervisors: dict[str, Supervisor] = {}
        self._task_group: anyio.abc.TaskGroup | None = None
        self._wait = wait
        self.relay = Relay()
        """Where server-to-client requests and notifications go (`bridges.mcp.passthrough`)."""
        self.logins = Logins(grants, login_callbacks) if grants is not None else None
        """OAuth logins started inside the daemon (`/v1/auth`, the MCP facade)."""

    async def __aenter__(self) -> ServerPool:
        if self._task_group is not None:
            raise RuntimeError("ServerPool is already running")
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        try:
            started = [self._start(key, config) for key, config in self._initial.items()]
            if self._wait:
                await self._settle(started)
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # The body's own exception (if any) propagates unchanged once everything is stopped.
        await self._close()

    def health(self) -> dict[str, ServerHealth]:
        """The current health of every server, by key."""
        return {key: sup.health for key, sup in self._supervisors.items()}

    def starting(self) -> list[str]:
        """The servers that have not settled their first attempt yet, by key."""
        return [key for key, sup in self._supervisors.items()
                if not sup.settled.is_set() and sup.health.state == "starting"]

    async def settled(self) -> None:
        """Wait until every server has settled its first attempt (bound it with a cancel
        scope: a server's first attempt lasts up to its `timeouts.startup`)."""
        await self._settle(list(self._supervisors.values()))

    def connection(self, key: str) -> Connection | None:
        """The live connection of one server, or None (unknown, starting, down)."""
        sup = self._supervisors.get(key)
        return sup.connection if sup is not None else None

    def config(self, key: str) -> ServerConfig | None:
        """The current configuration of one server, or None."""
        sup = self._supervisors.get(key)
        return sup.config if sup is not None else None

    async def restart(self, key: str) -> bool:
        """Restart one server (its process or connection), keeping its place in the registry,
        and return once its new attempt settled (bound it with a cancel scope); False for an
        unknown key."""
        sup = self._supervisors.get(key)
        if sup is None:
            return False
        sup.restart()
        await sup.settled.wait()
        return True

    def stderr(self, key: str, after: int = 0) -> tuple[int, str] | None:
        """(mark, text): what server `key` wrote to stderr after mark `after` (redacted; at
        most the last 64 KiB are kept) and the mark to read on from; None for an unknown key."""
        sup = self._supervisors.get(key)
        return sup.stderr.read(after) if sup is not None else None

    def namespaces(self) -> dict[str, str]:
        """Each enabled server's effective namespace, by key, in configuration order."""
        return {
            key: sup.config.effective_namespace(key)
            for key, sup in self._supervisors.items()
            if not sup.config.disabled
        }

    async def update(self, servers: Mapping[str, ServerConfig]) -> None:
        """Apply a new set of servers: new ones start, removed ones stop, changed ones restart
        (keeping their place in the registry), unchanged ones are not touched. Returns once the
        started and restarted servers have settled their first attempt."""
        if self._task_group is None:
            raise RuntimeError("ServerPool.update() needs a running pool (use `async with`)")
        servers = dict(servers)
        removed = [sup for key, sup in self._supervisors.items() if key not in servers]
        for sup in removed:
            del self._supervisors[sup.key]
            sup.request_stop()  # its tools leave the registry with its health entry
        async with anyio.create_task_group() as tg:
            for sup in removed:
                tg.start_soon(sup.stop)
        touched: list[Supervisor] = []
        for key, config in servers.items():
            current = self._supervisors.get(key)
            if current is None:
                touched.append(self._start(key, config))
            elif current.config != config:
                current.reconfigure(config)
                touched.append(current)
        await self._settle(touched)

    def _start(self, key: str, config: ServerConfig) -> Supervisor:
        assert self._task_group is not None
        sup = Supervisor(
            key,
            config,
            tools=self._tools,
            permissions=self._permissions,
            backoff=self._backoff,
            on_health=self._on_health,
            on_tools_changed=self._on_tools_changed,
            relay=self.relay,
            grants=self._grants,
        )
        self._supervisors[key] = sup
        self._task_group.start_soon(sup.run, name=f"mcp supervisor {key}")
        return sup

    @staticmethod
    async def _settle(supervisors: Iterable[Supervisor]) -> None:
        for sup in supervisors:
            await sup.settled.wait()

    async def _close(self) -> None:
        task_group, self._task_group = self._task_group, None
        if task_group is None:
            return
        if self.logins is not None:
            await self.logins.aclose()
        supervisors = list(self._supervisors.values())
        self._supervisors.clear()
        for sup in supervisors:
            sup.request_stop()
        # Shielded: stopping must finish (children reaped) even when the caller is cancelled.
        task_group.cancel_scope.shield = True
        await task_group.__aexit__(None, None, None)
