"""Logins whose redirect comes back to the daemon's public URL, on whichever replica the load
balancer picks (`SIDECAR_PUBLIC_URL`; `sidecar.stores.pending_logins`).

The replica that starts the login (`PublicRedirect.authorize`, in place of the SDK's
authorization step) has discovered the authorization server and registered the client as
usual; it then makes the PKCE pair and the `state`, keeps what finishing needs in the pending
logins (verifier, registered client, metadata, redirect URI, scope) under that state, shows
the authorization URL, and waits for the login's outcome there. The replica the browser's
redirect reaches (`finish_login`, from `GET /v1/auth/{server}/callback`) takes the pending
login (once), exchanges the code with the verifier and stores the tokens in the grant store,
which every replica reads: every replica waiting in `needs_auth` connects. The starting
replica then sees "authorized" and uses the stored tokens (`AuthorizedElsewhere`).

Codes, verifiers and tokens never appear in a message or a log line.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import urlencode, urljoin

import anyio
import httpx2
from mcp.client.auth import OAuthFlowError
from mcp.client.auth.oauth2 import PKCEParameters
from mcp.client.auth.utils import union_scopes, validate_authorization_response_iss
from mcp.shared._request_clock import waiting_on_a_person
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthMetadata,
    ProtectedResourceMetadata,
)
from pydantic import ValidationError

from bridges.manifest.loading import ServerConfig
from bridges.mcp.oauth.providers import (
    AuthorizationCodeAuth,
    AuthorizedElsewhere,
    Interactive,
    build_auth,
)
from bridges.mcp.oauth.records import LoginStatus, canonical_resource
from sidecar.model.replica import replica_id
from sidecar.stores.grants import GrantStore
from sidecar.stores.pending_logins import PendingLogins

OUTCOME_POLL = 0.5
"""How often the starting replica looks for the login's outcome."""


class CallbackFailed(Exception):
    """A redirect that reached the daemon could not finish its login (the message says why
    and holds no secret)."""


@dataclass(slots=True)
class PublicRedirect:
    """The authorization step of one login redirected to the public URL."""

    server: str
    resource: str
    """The canonical resource URL the grant is bound to."""
    pending: PendingLogins
    ttl: float
    finish_within: float
    """How long after its redirect was taken the login may go without an outcome (the
    receiving replica stopped mid-exchange): then it fails, naming that replica."""
    outcome: tuple[str, str] | None = None

    def interactive(self, redirect_uri: str,
                    show: Callable[[str], Awaitable[None]]) -> Interactive:
        return Interactive(redirect_uri, show, _no_loopback, elsewhere=self.authorize)

    async def authorize(self, provider: AuthorizationCodeAuth) -> NoReturn:
        """What the SDK's `_perform_authorization` does up to the redirect, with the state and
        the verifier kept in the pending logins; then wait for the replica the browser
        reaches. Raises `AuthorizedElsewhere`, or `OAuthFlowError` with the reason."""
        context = provider.context
        client = context.client_info
        if client is None or context.redirect_handler is None:
            raise OAuthFlowError("no registered client for the authorization")
        stored = await provider.storage.record()
        widened = union_scopes(context.client_metadata.scope,
                               (stored or {}).get("pending_scope"))
        if widened:
            context.client_metadata.scope = widened
        redirect_uri = str((context.client_metadata.redirect_uris or [""])[0])
        pkce = PKCEParameters.generate()
        state = secrets.token_urlsafe(32)
        params = {"response_type": "code", "client_id": client.client_id,
                  "redirect_uri": redirect_uri, "state": state,
                  "code_challenge": pkce.code_challenge, "code_challenge_method": "S256"}
        if context.should_include_resource_param(context.protocol_version):
            params["resource"] = context.get_resource_url()  # RFC 8707
        if context.client_metadata.scope:
            params["scope"] = context.client_metadata.scope
            if "offline_access" in context.client_metadata.scope.split():
                params["prompt"] = "consent"
        metadata = context.oauth_metadata
        endpoint = (str(metadata.authorization_endpoint) if metadata is not None
                    and metadata.authorization_endpoint else
                    urljoin(context.get_authorization_base_url(context.server_url), "/authorize"))
        await self.pending.add(state, self.server, {
            "server": self.server, "resource": self.resource, "redirect_uri": redirect_uri,
            "code_verifier": pkce.code_verifier, "client": _dump(client),
            "oauth_metadata": _dump(metadata),
            "resource_metadata": _dump(context.protected_resource_metadata),
            "auth_server_url": context.auth_server_url,
            "protocol_version": context.protocol_version,
            "scope": context.client_metadata.scope, "started_by": replica_id(),
            "started_at": time.time(),
        }, self.ttl)
        with waiting_on_a_person():  # as the SDK's step: a request's clock stops meanwhile
            await context.redirect_handler(f"{endpoint}?{urlencode(params)}")
            while True:  # another replica may finish it: its outcome is in the pending logins
                outcome = await self.pending.outcome(state, self.finish_within)
                if outcome is not None:
                    break
                await anyio.sleep(OUTCOME_POLL)
        self.outcome = outcome
        if outcome[0] == "authorized":
            raise AuthorizedElsewhere(outcome[1])
        raise OAuthFlowError(outcome[1])


async def _no_loopback() -> AuthorizationCodeResult:
    raise OAuthFlowError("this login's redirect goes to the public URL, not a loopback")


def _dump(model: Any) -> Any:
    return None if model is None else model.model_dump(mode="json", exclude_none=True)


async def finish_login(server: str, config: ServerConfig, store: GrantStore,
                       record: dict[str, Any], code: str, iss: str | None,
                       exchange_timeout: float) -> str:
    """Exchange `code` for the login `record` describes and store the tokens; the sentence to
    show. `CallbackFailed` with the reason (never the code) otherwise, also when the token
    endpoint has not answered within `exchange_timeout` seconds (the whole exchange)."""
    assert config.url is not None
    if record.get("resource") != canonical_resource(config.url):
        raise CallbackFailed(f"the login of {server!r} was started for another URL of the "
                             "server than this replica's manifests name")
    try:
        client = OAuthClientInformationFull.model_validate(record["client"])
        metadata = (OAuthMetadata.model_validate(record["oauth_metadata"])
                    if record.get("oauth_metadata") else None)
        resource_metadata = (ProtectedResourceMetadata.model_validate(
            record["resource_metadata"]) if record.get("resource_metadata") else None)
    except (ValidationError, KeyError) as exc:
        raise CallbackFailed(f"the pending login of {server!r} is not readable "
                             f"({type(exc).__name__})") from None
    interactive = Interactive(str(record["redirect_uri"]), _show_nothing, _no_loopback)
    provider = build_auth(server, config, store, LoginStatus(server), interactive=interactive)
    assert isinstance(provider, AuthorizationCodeAuth)
    context = provider.context
    context.client_info = client
    context.oauth_metadata = metadata
    context.protected_resource_metadata = resource_metadata
    context.auth_server_url = record.get("auth_server_url")
    context.protocol_version = record.get("protocol_version")
    context.client_metadata.scope = record.get("scope")
    try:
        validate_authorization_response_iss(iss, metadata)  # RFC 9207
        request = await provider._exchange_token_authorization_code(
            code, str(record["code_verifier"]))
        with anyio.fail_after(exchange_timeout):
            async with httpx2.AsyncClient(timeout=exchange_timeout) as http:
                response = await http.send(request)
                await response.aread()
    except TimeoutError:
        raise CallbackFailed(f"{server}: the token endpoint did not answer within "
                             f"{exchange_timeout:g} s") from None
    except OAuthFlowError as exc:
        raise CallbackFailed(f"{server}: {exc}") from None
    except httpx2.HTTPError as exc:
        raise CallbackFailed(f"{server}: the token endpoint did not answer "
                             f"({type(exc).__name__})") from None
    if response.status_code not in (200, 201):
        raise CallbackFailed(f"{server}: the token endpoint refused the authorization code "
                             f"(HTTP {response.status_code}{_error_of(response)})")
    await provider.storage.set_client_info(client)
    try:
        await provider._handle_token_response(response)
    except (OAuthFlowError, ValidationError, ValueError) as exc:
        raise CallbackFailed(f"{server}: the token endpoint's answer is not usable "
                             f"({type(exc).__name__})") from None
    return f"{server}: authorized; tokens stored"


async def _show_nothing(url: str) -> None:
    return None


def _error_of(response: httpx2.Response) -> str:
    """`: <error>` of an OAuth error answer (RFC 6749 5.2), nothing else of its body."""
    try:
        body = response.json()
    except ValueError:
        return ""
    error = body.get("error") if isinstance(body, dict) else None
    return f": {error[:100]}" if isinstance(error, str) and error.isprintable() else ""
