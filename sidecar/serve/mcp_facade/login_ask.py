"""A call to a tool of a server that waits for an OAuth login, from a client that can open a
URL: the login first (`log_in_first`, whose docstring says when the client is asked and what
the call does then; `opens_urls`).

Imports `sidecar.execution`, `sidecar.location`, `sidecar.model` and the face
`bridges.mcp.oauth` (a user's grant key). Exports `log_in_first`,
`opens_urls`, `LOGIN_WAIT` and `READY_WAIT`.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types

from bridges.mcp.oauth import user_grant_key
from sidecar.execution.snapshot import Snapshot
from sidecar.model.events import ServerHealthChanged

if TYPE_CHECKING:
    from sidecar.location.location import Location

MCP_ORIGIN = "mcp:"
LOGIN_WAIT = 300.0
"""How long a call waits for the person to finish the login in the browser."""
READY_WAIT = 30.0
"""How long it then waits for the server to connect with the new tokens."""

Ask = Callable[[str, types.ElicitRequestURLParams], Awaitable[Any]]
"""Sends the elicitation to the calling client: (server, params) -> its answer."""


def opens_urls(session: Any) -> bool:
    """Whether the client declared URL-mode elicitation."""
    capabilities = getattr(session, "client_capabilities", None)
    elicitation = capabilities.elicitation if capabilities is not None else None
    return elicitation is not None and elicitation.url is not None


async def log_in_first(
    location: Location, snapshot: Snapshot, tool: str, session: Any, ask: Ask,
    owner: str | None = None,
) -> None:
    """Before a call of `tool`: when its server waits for a login and the client can open a
    URL, ask it to open the authorization URL and wait for the login.

    When a downstream client calls a tool of an upstream server in state `needs_auth` and
    declared URL-mode elicitation (`capabilities.elicitation.url`, MCP 2025-11-25), the daemon
    starts the server's login (`bridges.mcp.oauth.attempts`, the same login as
    `POST /v1/auth/{server}/login`) and sends the client an `elicitation/create` in URL mode with
    the authorization URL (on the call's own stream; a 2026-07-28 client gets it as an
    `input_required` round). Once the client accepts, the call waits up to `LOGIN_WAIT` for the
    login to store tokens and up to `READY_WAIT` for the server to be ready, then runs. When the
    client declines, the login fails or the wait ends, the call runs anyway and fails as it
    would have, naming `sidecar auth login NAME`. Clients without URL-mode elicitation are never
    asked.

    The redirect comes back to the daemon's loopback callback (127.0.0.1), so the browser that
    opens the URL must run on the daemon's machine, as for the `/v1` login; with the daemon's
    public URL (`SIDECAR_PUBLIC_URL`) it comes back to `/v1/auth/{server}/callback` there, on
    any replica (`bridges.mcp.oauth.callback`).

    A server with credentials per user (`oauth.per_user`) asks the calling user (`owner`,
    `user:NAME`) the same way for their own login while they have no usable grant, whatever
    the server's health; the call then runs on a connection with their new grant."""
    entry = snapshot.entry(tool)
    if entry is None or not entry.origin.startswith(MCP_ORIGIN) or not opens_urls(session):
        return
    server = entry.origin.removeprefix(MCP_ORIGIN)
    pool = location.upstreams
    if pool is None or pool.logins is None:
        return
    health, config = pool.health().get(server), pool.config(server)
    key = server
    if config is not None and config.oauth is not None and config.oauth.per_user:
        if owner is None or not owner.startswith("user:") or health is None or (
                health.state != "ready"):
            return
        key = user_grant_key(server, owner.removeprefix("user:"))
        record = await pool.logins.store.get(key)
        if record is not None and record.get("tokens") and not record.get("login_required"):
            return  # logged in: a refused grant fails the call, naming the command
    elif health is None or health.state != "needs_auth" or config is None:
        return
    attempt = await pool.logins.begin(key, config)
    if attempt.state == "pending":
        if attempt.authorization_url is None:
            return
        answer = await ask(server, types.ElicitRequestURLParams(
            message=(f"The MCP server {server!r} needs you to sign in before {tool!r} can run: "
                     "open this page to authorize mcp-sidecar. The call continues once you "
                     "have signed in."),
            url=attempt.authorization_url,
            elicitation_id=secrets.token_urlsafe(12),
        ))
        if _action(answer) != "accept" or not await attempt.finished(LOGIN_WAIT):
            return
    if attempt.state != "authorized" or key != server:
        return
    async with location.events.subscribe() as events:  # checked after subscribing: no race
        with anyio.move_on_after(READY_WAIT):
            while pool.health().get(server, health).state != "ready":
                event = await events.next()
                if isinstance(event, ServerHealthChanged) and event.server == server and (
                    event.health.get("state") == "ready"
                ):
                    return

def _action(answer: Any) -> Any:
    """The `action` of an ElicitResult (2026-07-28 rounds may hand back a plain dict)."""
    if isinstance(answer, dict):
        return answer.get("action")
    return getattr(answer, "action", None)
