"""The console's sign-in through the manifest's OpenID provider: the authorization code flow
with PKCE (RFC 7636, S256) and a single-use `state`.

    GET /ui/login/oidc      a pending login (state, code verifier, a browser-binding cookie)
                            -> 303 to the provider's authorization endpoint
    GET /ui/login/callback  the provider's redirect: state checked, the code exchanged (with
                            the verifier and the client secret) for an access token, which
                            is checked like any bearer (`sidecar.serve.identities`): its
                            user and role become the console session's

The binding cookie (`sidecar_login`, HttpOnly, SameSite=Lax, path `/ui/login`) ties the
callback to the browser that began the login, so a stolen redirect cannot sign in someone
else. Pending logins live `PENDING_SECONDS` in memory (at most `MAX_PENDING`).

Imports `sidecar.serve.identities`. Exports `OidcLogins`, `PENDING_SECONDS`, `MAX_PENDING`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
import urllib.parse
from dataclasses import dataclass

from starlette.requests import Request

from sidecar.serve.identities import Identities, Identity, InvalidAccessToken
from sidecar.serve.identities.access_tokens import ProviderUnreachable
from sidecar.serve.security import TokenUnverifiable

PENDING_SECONDS = 600.0
MAX_PENDING = 256
BINDING_COOKIE = "sidecar_login"
CALLBACK_PATH = "/ui/login/callback"


@dataclass(frozen=True, slots=True)
class _Pending:
    verifier: str
    binding: str
    redirect_uri: str
    expires: float


class SignInFailed(Exception):
    """The sign-in did not complete; the message says why (shown on the login page)."""


class OidcLogins:
    def __init__(self, identities: Identities) -> None:
        self._identities = identities
        self._pending: dict[str, _Pending] = {}

    @property
    def provider(self) -> str | None:
        """The issuer to name on the login page (None: no `[auth.oidc]`)."""
        auth = self._identities.auth()
        return auth.oidc.issuer if auth is not None and auth.oidc is not None else None

    async def begin(self, request: Request) -> tuple[str, str]:
        """(the provider's authorization URL, the binding cookie's value)."""
        auth = self._identities.auth()
        verifier = await self._identities.verifier()
        if auth is None or auth.oidc is None or verifier is None:
            raise SignInFailed("this daemon has no [auth.oidc] identity provider")
        oidc = auth.oidc
        try:
            endpoint = (await verifier.discovery()).get("authorization_endpoint")
        except ProviderUnreachable as exc:
            raise SignInFailed(str(exc)) from None
        if not isinstance(endpoint, str):
            raise SignInFailed(f"{oidc.issuer} publishes no authorization_endpoint")
        now = time.monotonic()
        self._pending = {k: p for k, p in self._pending.items() if p.expires > now}
        while len(self._pending) >= MAX_PENDING:
            del self._pending[next(iter(self._pending))]
        state, code_verifier, binding = (secrets.token_urlsafe(32) for _ in range(3))
        redirect_uri = f"{request.url.scheme}://{request.headers['host']}{CALLBACK_PATH}"
        self._pending[state] = _Pending(code_verifier, binding, redirect_uri,
                                        now + PENDING_SECONDS)
        params = {"response_type": "code", "client_id": oidc.client_id,
                  "redirect_uri": redirect_uri, "scope": " ".join(oidc.scopes), "state": state,
                  "code_challenge": _challenge(code_verifier), "code_challenge_method": "S256",
                  "nonce": secrets.token_urlsafe(16)}
        resource = _resource(oidc.audience)
        if resource is not None:
            params["resource"] = resource
        sep = "&" if "?" in endpoint else "?"
        return endpoint + sep + urllib.parse.urlencode(params), binding

    async def finish(self, request: Request) -> Identity:
        """The identity the provider's redirect proves, or `SignInFailed`."""
        params = request.query_params
        pending = self._pending.pop(params.get("state", ""), None)
        if pending is None or pending.expires <= time.monotonic():
            raise SignInFailed("this sign-in is unknown or expired: start it again")
        if not hmac.compare_digest(request.cookies.get(BINDING_COOKIE, "").encode(),
                                   pending.binding.encode()):
            raise SignInFailed("this sign-in was started in another browser")
        if "error" in params:
            raise SignInFailed(f"the identity provider refused: {params['error']} "
                               f"{params.get('error_description', '')}".rstrip())
        code = params.get("code")
        auth = self._identities.auth()
        verifier = await self._identities.verifier()
        if not code or auth is None or auth.oidc is None or verifier is None:
            raise SignInFailed("the identity provider sent no code")
        oidc = auth.oidc
        form = {"grant_type": "authorization_code", "code": code,
                "redirect_uri": pending.redirect_uri, "code_verifier": pending.verifier,
                "client_id": oidc.client_id}
        if oidc.client_secret is not None:
            form["client_secret"] = oidc.client_secret.get_secret_value()
        resource = _resource(oidc.audience)
        if resource is not None:
            form["resource"] = resource
        try:
            token_endpoint = (await verifier.discovery()).get("token_endpoint")
            if not isinstance(token_endpoint, str):
                raise SignInFailed(f"{oidc.issuer} publishes no token_endpoint")
            status, body = await verifier.post_form(token_endpoint, form)
            if status != 200 or not isinstance(body.get("access_token"), str):
                raise SignInFailed(f"the identity provider did not give a token (HTTP "
                                   f"{status}: {body.get('error', 'no error named')})")
            identity = await self._identities.identify(body["access_token"])
        except (ProviderUnreachable, TokenUnverifiable, InvalidAccessToken) as exc:
            raise SignInFailed(str(exc)) from None
        if identity is None:
            raise SignInFailed("the identity provider's access token is not a JWT this "
                               "daemon can check (configure it to issue JWT access tokens "
                               "for the audience)")
        return identity


def _challenge(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _resource(audience: str | None) -> str | None:
    """RFC 8707's `resource` for an audience that is an absolute URI (a provider issues JWT
    access tokens for it); None otherwise."""
    if audience is None or ":" not in audience:
        return None
    return audience
