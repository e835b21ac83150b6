"""OAuth 2.1 for HTTP upstreams: the SDK's providers behind our own token storage.

    records.py    RecordStorage (the SDK's TokenStorage on the core GrantStore), LoginStatus
    providers.py  build_auth: the httpx2.Auth of one server (daemon or login mode)
    login.py      `sidecar auth login`: the loopback callback and one authorization
    callback.py   a login whose redirect reaches the daemon's public URL, on any replica
    attempts.py   logins started inside the daemon (`/v1/auth`, the MCP facade), one per server
    exchange.py   token_exchange (RFC 8693): a caller's token exchanged for the server's
    refresher.py  refreshes a server's token before it expires, off the call path

May import: the core (its `TokenStore` interface, never an implementation), `managed_store`
and the rest of `bridges`.
"""

from bridges.mcp.oauth.attempts import LoginAttempt, Logins
from bridges.mcp.oauth.callback import CallbackFailed, finish_login
from bridges.mcp.oauth.providers import Interactive, LoginRequired, SidecarAuth, build_auth
from bridges.mcp.oauth.records import (
    LoginStatus,
    RecordStorage,
    canonical_resource,
    grant_status,
    login_command,
    split_grant_key,
    user_grant_key,
)

__all__ = [
    "CallbackFailed",
    "Interactive",
    "LoginAttempt",
    "LoginRequired",
    "LoginStatus",
    "Logins",
    "RecordStorage",
    "SidecarAuth",
    "build_auth",
    "canonical_resource",
    "finish_login",
    "grant_status",
    "login_command",
    "split_grant_key",
    "user_grant_key",
]
