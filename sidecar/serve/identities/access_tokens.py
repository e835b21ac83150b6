"""Access tokens of an OpenID provider, checked the way a resource server must (RFC 9068,
RFC 8725): the signature against the issuer's published keys (JWKS, found through its
discovery document), an allowed asymmetric algorithm, `iss` equal to the configured issuer,
`aud` holding the configured audience, `exp` in the future (leeway allowed), `nbf`/`iat` not
in the future. PyJWT does the JOSE work; this module fetches and caches the keys.

Keys are fetched on first use and again when a token names a key id not in the cache (a key
rotation), at most once every `REFETCH_SECONDS`. A provider that does not answer makes the
token unverifiable (`ProviderUnreachable`: 503), never valid.

Imports `sidecar.serve.security`. Exports `AccessTokenVerifier`, `InvalidAccessToken`,
`ProviderUnreachable` and `looks_like_jwt`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

import httpx
import jwt

from sidecar.serve.security import TokenRefused

REFETCH_SECONDS = 30.0
FETCH_TIMEOUT = 10.0
MAX_DOCUMENT_BYTES = 512 * 1024


class InvalidAccessToken(TokenRefused):
    """The token is not one this daemon accepts; the message says why (never the token)."""


class ProviderUnreachable(Exception):
    """The issuer's discovery document or keys could not be fetched."""


def looks_like_jwt(value: str) -> bool:
    return value.count(".") == 2 and len(value) <= 16 * 1024


class AccessTokenVerifier:
    def __init__(self, issuer: str, audience: str, *, algorithms: Sequence[str],
                 leeway: float, client: httpx.AsyncClient | None = None) -> None:
        self.issuer = issuer
        self.audience = audience
        self._algorithms = list(algorithms)
        self._leeway = leeway
        self._client = client or httpx.AsyncClient(timeout=FETCH_TIMEOUT)
        self._own_client = client is None
        self._keys: dict[str, jwt.PyJWK] = {}
        self._discovery: dict[str, Any] | None = None
        self._failure: str | None = None
        """Why the last fetch of the keys failed (None: it did not): repeated, not retried,
        until `REFETCH_SECONDS` have passed."""
        self._fetched_at = -REFETCH_SECONDS
        self._lock = asyncio.Lock()

    async def aclose(self) -> None:
        if self._own_client:
            await self._client.aclose()

    async def verify(self, token: str) -> dict[str, Any]:
        """The token's claims, or `InvalidAccessToken` naming what is wrong."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise InvalidAccessToken(f"not a JSON Web Token ({exc})") from None
        alg = header.get("alg")
        if alg not in self._algorithms:
            raise InvalidAccessToken(f"the token's algorithm {alg!r} is not accepted "
                                     f"(accepted: {', '.join(self._algorithms)})")
        key = await self._key(header.get("kid"))
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key, algorithms=[alg], audience=self.audience, issuer=self.issuer,
                leeway=self._leeway, options={"require": ["exp", "iss", "aud"]})
        except jwt.ExpiredSignatureError:
            raise InvalidAccessToken("the access token has expired") from None
        except jwt.InvalidAudienceError:
            raise InvalidAccessToken(
                f"the access token is not for this gateway (its audience is not "
                f"{self.audience!r})") from None
        except jwt.InvalidIssuerError:
            raise InvalidAccessToken(
                f"the access token was not issued by {self.issuer}") from None
        except jwt.PyJWTError as exc:
            raise InvalidAccessToken(f"the access token is not valid ({exc})") from None
        return claims

    async def discovery(self) -> dict[str, Any]:
        """The issuer's discovery document (fetched once; `ProviderUnreachable`)."""
        if self._discovery is None:
            found = await self._get_json(f"{self.issuer}/.well-known/openid-configuration")
            if found.get("issuer", "").rstrip("/") != self.issuer:
                raise ProviderUnreachable(
                    f"the discovery document of {self.issuer} names another issuer "
                    f"({found.get('issuer')!r})")
            self._discovery = found
        return self._discovery

    async def post_form(self, url: str, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """POST `form` to the provider (its token endpoint): (status, JSON body)."""
        try:
            response = await self._client.post(url, data=form)
        except httpx.HTTPError as exc:
            raise ProviderUnreachable(f"the identity provider did not answer at {url}: "
                                      f"{exc.__class__.__name__}") from None
        try:
            body = json.loads(response.content) if len(response.content) < MAX_DOCUMENT_BYTES \
                else {}
        except ValueError:
            body = {}
        return response.status_code, body if isinstance(body, dict) else {}

    async def _key(self, kid: Any) -> jwt.PyJWK:
        found = self._find(kid)
        if found is not None:
            return found
        async with self._lock:
            found = self._find(kid)
            if found is None and time.monotonic() - self._fetched_at >= REFETCH_SECONDS:
                self._fetched_at = time.monotonic()
                try:
                    await self._fetch_keys()
                except ProviderUnreachable as exc:
                    self._failure = str(exc)
                    raise
                self._failure = None
                found = self._find(kid)
            elif found is None and self._failure is not None:
                raise ProviderUnreachable(self._failure)
        if found is None:
            raise InvalidAccessToken(f"no key {kid!r} is published by {self.issuer}")
        return found

    def _find(self, kid: Any) -> jwt.PyJWK | None:
        if kid is None and len(self._keys) == 1:
            return next(iter(self._keys.values()))
        return self._keys.get(kid) if isinstance(kid, str) else None

    async def _fetch_keys(self) -> None:
        discovery = await self.discovery()
        jwks_uri = discovery.get("jwks_uri")
        if not isinstance(jwks_uri, str):
            raise ProviderUnreachable(f"the discovery document of {self.issuer} has no jwks_uri")
        keys: dict[str, jwt.PyJWK] = {}
        for raw in (await self._get_json(jwks_uri)).get("keys", []):
            if not isinstance(raw, dict) or raw.get("use", "sig") != "sig":
                continue
            try:
                key = jwt.PyJWK(raw)
            except jwt.PyJWTError:
                continue  # a key type or curve we do not use
            keys[str(raw.get("kid", ""))] = key
        self._keys = keys

    async def _get_json(self, url: str) -> dict[str, Any]:
        try:
            response = await self._client.get(url)
        except httpx.HTTPError as exc:
            raise ProviderUnreachable(f"the identity provider did not answer at {url}: "
                                      f"{exc.__class__.__name__}") from None
        if response.status_code != 200 or len(response.content) > MAX_DOCUMENT_BYTES:
            raise ProviderUnreachable(f"the identity provider answered {url} with "
                                      f"HTTP {response.status_code}")
        try:
            data = json.loads(response.content)
        except ValueError:
            raise ProviderUnreachable(f"{url} did not answer JSON") from None
        if not isinstance(data, dict):
            raise ProviderUnreachable(f"{url} did not answer a JSON object")
        return data
