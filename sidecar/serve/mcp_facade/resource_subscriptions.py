"""Clients' resource subscriptions, and what the facade asks of the upstream servers for them
(`ResourceSubscriptions`).

A handshake-era client's `resources/subscribe` is held per (server key, upstream URI) with the
ids of the sessions that hold it (`holders`: the relay sends `notifications/resources/updated`
to those, with the facade's URI; `relays.UpstreamRelay`). While sessions hold one of a server's
URIs, the facade holds it once in the server's `ResourceWatch` (`Connection.watched`, kept by
its supervisor across reconnects). A handshake-era server is sent `resources/subscribe` and
`resources/unsubscribe`, and the held URIs again after a reconnect (its session forgot them). A
2026-07-28 server has no such method: its `subscriptions/listen` stream asks for the held URIs
(`bridges.mcp.listening`). A 2026-07-28 client's own listen stream on the facade holds the URIs
of its filter the same way while it is open. A session that ends lets go of its own.

Imports the face `bridges.mcp` and the rest of `sidecar.serve`. Exports
`ResourceSubscriptions` and `SUBSCRIBE_PATIENCE`.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import ListenHandler, SubscriptionBus
from mcp.shared.exceptions import MCPError

from bridges.mcp import ResourceWatch
from sidecar.serve.mcp_facade import upstream
from sidecar.serve.mcp_facade.sessions import SessionState

SUBSCRIBE_PATIENCE = 5.0
"""How long a subscription (a `resources/subscribe`, a client's listen stream) waits for a
2026-07-28 server's listen stream to ask for its URIs before it is answered."""

Key = tuple[str, str]  # (server key, upstream URI)


class ResourceSubscriptions:
    """The facade's `resources/subscribe` and `resources/unsubscribe` handlers' work, the
    facade's `subscriptions/listen` handler (`listen`) and `ended` for a session that ends."""

    def __init__(self, upstreams: upstream.Upstreams, bus: SubscriptionBus) -> None:
        self._upstreams = upstreams
        self._listen = ListenHandler(bus)
        self.holders: dict[Key, set[str]] = {}
        """Which sessions hold each subscription (read by the relay)."""
        self._watched: dict[Key, ResourceWatch] = {}
        """The watch each subscription is held in (one hold per key)."""

    async def subscribe(self, state: SessionState, uri: str) -> None:
        up, original = self._upstreams.resolve_uri(uri)
        key = (up.key, original)
        # Held before the upstream hears of it: a server may announce an update at once.
        state.subscriptions.add(key)
        self.holders.setdefault(key, set()).add(state.id)
        try:
            watch = self._watched.get(key)
            if watch is None:
                watch = self._watched[key] = up.connection.watched
                watch.hold(original)
            if up.connection.modern:
                await watch.caught_up(SUBSCRIBE_PATIENCE)
            else:
                await upstream.subscribe(self._upstreams, uri, on=True)
        except BaseException:
            self._let_go(state, key)
            raise

    async def unsubscribe(self, state: SessionState, uri: str) -> None:
        up, original = self._upstreams.resolve_uri(uri)
        if self._let_go(state, (up.key, original)) and not up.connection.modern:
            await upstream.subscribe(self._upstreams, uri, on=False)

    def ended(self, state: SessionState) -> None:
        """A session ended: what it held is let go (a handshake-era server is not told: it
        cannot be from here, and its next subscribe is sent to it again anyway)."""
        for key in list(state.subscriptions):
            self._let_go(state, key)

    def _let_go(self, state: SessionState, key: Key) -> bool:
        """Forget that a session holds a subscription; True when nobody holds it any more."""
        state.subscriptions.discard(key)
        holders = self.holders.get(key, set())
        holders.discard(state.id)
        if holders:
            return False
        self.holders.pop(key, None)
        watch = self._watched.pop(key, None)
        if watch is not None:
            watch.release(key[1])
        return True

    async def listen(
        self, ctx: ServerRequestContext[Any, Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        """A 2026-07-28 client's listen stream: the URIs of its filter that a 2026-07-28 server
        serves are held in that server's watch while the stream is open (acknowledged once the
        server's own stream asks for them, or after `SUBSCRIBE_PATIENCE`). A URI that names
        no connected server, or a handshake-era one, is honored and hears that server's
        updates only while a handshake-era client subscribes to it."""
        held: list[tuple[ResourceWatch, str]] = []
        try:
            for uri in params.notifications.resource_subscriptions or ():
                try:
                    up, original = self._upstreams.resolve_uri(uri)
                except MCPError:
                    continue
                if up.connection.modern:
                    up.connection.watched.hold(original)
                    held.append((up.connection.watched, original))
            for watch in {id(w): w for w, _ in held}.values():
                await watch.caught_up(SUBSCRIBE_PATIENCE)
            return await self._listen(ctx, params)
        finally:
            for watch, original in held:
                watch.release(original)
