"""One server's stored grant, as the SDK's OAuth providers read and write it.

`RecordStorage` implements the SDK's `TokenStorage` on top of the core `GrantStore`: the record
of a server holds its tokens (with an absolute expiry, so a restarted daemon knows whether to
refresh), the registered client, the discovered metadata (so a refresh after a restart goes to
the right token endpoint) and the canonical resource URL the grant is bound to. A record whose
resource is not the server's current one (the manifest's `url` changed host or path) is never
used: its tokens are never sent to another resource.

`LoginStatus` is what the bridge knows about a server's authorization between requests: why
a login is needed (None: it is not), and the scope the last challenge asked for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mcp.shared.auth import (
    OAuthClientInformationFull,
    OAuthMetadata,
    OAuthToken,
    ProtectedResourceMetadata,
)
from mcp.shared.auth_utils import resource_url_from_server_url
from pydantic import ValidationError

from sidecar.stores.grants import GrantRecord, GrantStore


def canonical_resource(url: str) -> str:
    """The RFC 8707 resource identifier of an MCP server URL (no fragment, lower-case host)."""
    return resource_url_from_server_url(url)


USER_GRANT = "@user:"
"""Between a server's key and a user's name in the key of that user's grant (per_user)."""


def user_grant_key(server: str, user: str) -> str:
    """The grant store key of `user`'s own grant for `server` (`oauth.per_user`)."""
    return f"{server}{USER_GRANT}{user}"


def split_grant_key(key: str) -> tuple[str, str | None]:
    """(server, user) of a grant store key; user None for a server's own grant."""
    server, sep, user = key.partition(USER_GRANT)
    return (server, user) if sep else (key, None)


def login_command(server: str) -> str:
    """The command that stores the grant of key `server` (a server's, or one user's)."""
    name, user = split_grant_key(server)
    return f"sidecar auth login {name}" + (f" --user {user}" if user is not None else "")


@dataclass(slots=True)
class LoginStatus:
    """Whether `server` needs a login, and why. Owned by one server's bridge."""

    server: str
    reason: str | None = None
    pending_scope: str | None = None
    transient: str | None = None
    """A failure retrying may fix (the authorization server did not answer)."""
    store_error: str | None = None
    """Why the grant store cannot be used here (a fleet replica without `SIDECAR_GRANT_KEY`):
    no login helps until it is fixed."""

    @property
    def needs_login(self) -> bool:
        return self.reason is not None

    def require(self, reason: str, scope: str | None = None) -> None:
        self.reason = reason
        if scope:
            self.pending_scope = scope

    def clear(self) -> None:
        self.reason = None
        self.transient = None
        self.store_error = None

    def hint(self) -> str:
        """The sentence every health report and call error carries while a login is needed."""
        if self.store_error is not None:
            return f"{self.reason}, and {self.store_error}"
        return f"{self.reason}; run `{login_command(self.server)}`"


def _dump(model: Any) -> Any:
    return None if model is None else model.model_dump(mode="json", exclude_none=True)


class RecordStorage:
    """The SDK's `TokenStorage` for one server, on the core `GrantStore`."""

    def __init__(
        self,
        store: GrantStore,
        server: str,
        resource: str,
        *,
        context: Callable[[], Any] | None = None,
        on_tokens: Callable[[OAuthToken], None] | None = None,
        on_saved: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.server = server
        self.resource = resource
        self.context = context
        """Returns the provider's `OAuthContext`, whose discovered metadata is saved too."""
        self._on_tokens = on_tokens
        self._on_saved = on_saved
        """Called once new tokens are stored."""
        self.generation: float | None = None
        """`updated_at` of the record last read or written here."""
        self.marked: float | None = None
        """`updated_at` of the `login_required` mark last written here (until a login)."""

    async def record(self) -> GrantRecord | None:
        """The server's record if it is bound to this resource, else None."""
        record = await self.store.get(self.server)
        if record is None or record.get("resource") != self.resource:
            return None
        self.generation = record.get("updated_at")
        return record

    async def get_tokens(self) -> OAuthToken | None:
        found = await self.current()
        return None if found is None else found[1]

    async def current(self) -> tuple[GrantRecord, OAuthToken] | None:
        """The server's record and its tokens, read once; None when it has none."""
        record = await self.record()
        if record is None or not record.get("tokens"):
            return None
        try:
            tokens = OAuthToken.model_validate(record["tokens"])
        except ValidationError:
            return None
        if self._on_tokens is not None:
            self._on_tokens(tokens)
        return record, tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        now = time.time()
        expires_at = now + int(tokens.expires_in) if tokens.expires_in is not None else None
        if self._on_tokens is not None:
            self._on_tokens(tokens)

        def change(old: GrantRecord | None) -> GrantRecord:
            record = self._base(old)
            record.update(tokens=_dump(tokens), obtained_at=now, expires_at=expires_at,
                          pending_scope=None, login_required=None)
            self._add_metadata(record)
            return record

        await self._update(change)
        if self._on_saved is not None:
            self._on_saved()

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        record = await self.record()
        if record is None or not record.get("client"):
            return None
        try:
            return OAuthClientInformationFull.model_validate(record["client"])
        except ValidationError:
            return None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        def change(old: GrantRecord | None) -> GrantRecord:
            record = self._base(old)
            record["client"] = _dump(client_info)
            self._add_metadata(record)
            return record

        await self._update(change)

    async def note_login_required(self, reason: str, scope: str | None, refused: str | None,
                                  *, whatever_stored: bool = False) -> bool:
        """Remember why a login is needed and the scope it must ask for (for `auth status`
        and for the next `sidecar auth login`, which may run in another process). `refused`
        is the access token the refused request carried (None: it carried none). Returns
        False, and leaves the record as it is, when the store holds other tokens: they were
        stored after that request left (a login through another replica, a refresh), and
        marking them would leave every reader waiting for a login that already happened.
        `whatever_stored`: mark the record whichever tokens it holds (a login that failed)."""

        noted = True

        def change(old: GrantRecord | None) -> GrantRecord:
            nonlocal noted
            if not whatever_stored and old is not None and old.get("tokens") and (
                    old["tokens"].get("access_token") != refused):
                noted = False
                return old
            record = self._base(old)
            record["login_required"] = reason
            if scope:
                record["pending_scope"] = scope
            return record

        await self._update(change)
        if noted:
            self.marked = self.generation
        return noted

    async def forget_tokens(self) -> None:
        """Drop the tokens (keep the registered client and metadata)."""

        def change(old: GrantRecord | None) -> GrantRecord:
            record = self._base(old)
            record.update(tokens=None, expires_at=None, obtained_at=None)
            return record

        await self._update(change)

    # --- helpers -----------------------------------------------------------------------

    def _base(self, old: GrantRecord | None) -> GrantRecord:
        if old is None or old.get("resource") != self.resource:
            return {"resource": self.resource}
        return dict(old)

    def _add_metadata(self, record: GrantRecord) -> None:
        context = self.context() if self.context is not None else None
        if context is None:
            return
        if context.oauth_metadata is not None:
            record["oauth_metadata"] = _dump(context.oauth_metadata)
        if context.protected_resource_metadata is not None:
            record["resource_metadata"] = _dump(context.protected_resource_metadata)
        if context.auth_server_url is not None:
            record["auth_server_url"] = context.auth_server_url

    async def _update(self, change: Callable[[GrantRecord | None], GrantRecord]) -> None:
        """Apply `change`; a change that returns the old record itself leaves it as it is
        (not stamped, and not taken as read here: the next reader here reloads it)."""
        kept = False

        def stamped(old: GrantRecord | None) -> GrantRecord:
            nonlocal kept
            record = change(old)
            if old is not None and record is old:
                kept = True
                return old
            # Strictly increasing, so a reader can tell this write from the one before it.
            previous = old.get("updated_at", 0.0) if old else 0.0
            record["updated_at"] = max(time.time(), float(previous) + 1e-6)
            return record

        record = await self.store.update(self.server, stamped)
        if record is not None and not kept:
            self.generation = record.get("updated_at")


def restore_metadata(record: GrantRecord, context: Any) -> None:
    """Put the metadata a record saved back into a provider's `OAuthContext`."""
    try:
        if record.get("oauth_metadata") and context.oauth_metadata is None:
            context.oauth_metadata = OAuthMetadata.model_validate(record["oauth_metadata"])
        if record.get("resource_metadata") and context.protected_resource_metadata is None:
            context.protected_resource_metadata = ProtectedResourceMetadata.model_validate(
                record["resource_metadata"]
            )
    except ValidationError:
        return
    if record.get("auth_server_url") and context.auth_server_url is None:
        context.auth_server_url = record["auth_server_url"]


def grant_status(
    server: str, config: Any, record: GrantRecord | None, now: float
) -> dict[str, Any]:
    """What `sidecar auth status` and `GET /v1/auth/{server}` report for one server
    (`config`: its `ServerConfig`, None when the manifests no longer name it)."""
    entry: dict[str, Any] = {"configured": config is not None, "authorized": False,
                             "expires_at": None, "scopes": None, "needs_login": True,
                             "reason": None}
    url = getattr(config, "url", None)
    if url is not None and record is not None and record.get("resource") != (
        canonical_resource(url)
    ):
        record = None  # bound to another resource: never used
        entry["reason"] = "the stored tokens belong to another URL"
    tokens = (record or {}).get("tokens") or {}
    if tokens:
        expires_at = (record or {}).get("expires_at")
        refreshable = bool(tokens.get("refresh_token"))
        expired = expires_at is not None and expires_at <= now and not refreshable
        entry.update(authorized=not expired, expires_at=expires_at, scopes=tokens.get("scope"),
                     refreshable=refreshable)
        entry["needs_login"] = expired or bool((record or {}).get("login_required"))
    if record is not None and record.get("login_required"):
        entry["reason"] = record["login_required"]
        entry["pending_scope"] = record.get("pending_scope")
    oauth = getattr(config, "oauth", None)
    if oauth is not None and oauth.grant not in ("authorization_code", "token_exchange"):
        entry["needs_login"] = False  # the daemon fetches its own tokens
    if entry["needs_login"]:
        entry["command"] = login_command(server)
    return entry
