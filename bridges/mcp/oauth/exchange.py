"""`oauth.grant = "token_exchange"` (RFC 8693): a caller's identity-provider access token
exchanged at `idp_token_endpoint` for a token of one upstream server (its canonical URL as
`resource`, `audience` when configured), and the `httpx2.Auth` that sends it. Imports
`bridges.manifest` and `httpx2`; exports `exchange_token`, `ExchangeRefused`, `BearerAuth`.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Generator
from urllib.parse import quote

import httpx2

from bridges.manifest.oauth import OAuthSettings

GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN = "urn:ietf:params:oauth:token-type:access_token"
TIMEOUT = 30.0


class ExchangeRefused(Exception):
    """The identity provider did not exchange the token (the reason is the message)."""


class BearerAuth(httpx2.Auth):
    """Sends `token` (an exchanged access token, replaced as it is renewed)."""

    def __init__(self) -> None:
        self.token: str | None = None
        self.expires_at: float | None = None
        self.subject: str | None = None
        """The caller's token this one was exchanged for."""

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request,
                                                              httpx2.Response, None]:
        if self.token is not None:
            request.headers["Authorization"] = f"Bearer {self.token}"
        yield request

    def fresh(self, subject: str, margin: float = 60.0) -> bool:
        """Whether the token may be sent for a call that carries `subject`."""
        if self.token is None or self.subject != subject:
            return False
        return self.expires_at is None or self.expires_at - margin > time.time()


async def exchange_token(settings: OAuthSettings, resource: str, subject: str
                         ) -> tuple[str, float | None]:
    """(access token, absolute expiry or None) for `subject` at the server `resource`."""
    assert settings.idp_token_endpoint is not None and settings.idp_client_id is not None
    form = {"grant_type": GRANT, "subject_token": subject,
            "subject_token_type": ACCESS_TOKEN, "requested_token_type": ACCESS_TOKEN,
            "resource": resource}
    if settings.audience:
        form["audience"] = settings.audience
    if settings.scopes:
        form["scope"] = " ".join(settings.scopes)
    headers = {}
    if settings.idp_client_secret:
        # client_secret_basic (RFC 6749 2.3.1): both form-encoded, then base64
        client, secret = settings.idp_client_id, settings.idp_client_secret
        pair = f"{quote(client, safe='')}:{quote(secret, safe='')}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    else:
        form["client_id"] = settings.idp_client_id
    try:
        async with httpx2.AsyncClient(timeout=TIMEOUT) as http:
            response = await http.post(settings.idp_token_endpoint, data=form, headers=headers)
    except httpx2.HTTPError as exc:
        raise ExchangeRefused(f"the identity provider did not answer: {exc!r}") from None
    try:
        body = response.json()
    except ValueError:
        body = {}
    if response.status_code != 200 or not isinstance(body, dict) or not isinstance(
            body.get("access_token"), str):
        error = body.get("error") if isinstance(body, dict) else None
        raise ExchangeRefused(f"the identity provider refused the exchange (HTTP "
                              f"{response.status_code}{': ' + str(error) if error else ''})")
    expires_in = body.get("expires_in")
    expires_at = time.time() + float(expires_in) if isinstance(expires_in, int | float) else None
    return body["access_token"], expires_at
