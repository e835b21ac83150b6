"""People behind requests: the access tokens of the manifest's OpenID provider
(`[auth.oidc]`), the roles `[[auth.grants]]` give (`roles`), per-user quotas (`quotas`).
docs/identities.md is the user's guide.

`Identities(location)` reads `location.manifests.auth` at every request (a manifest reload
applies at once) and keeps one `AccessTokenVerifier` per configured issuer and audience.

Imports `sidecar.serve.security` and its own modules. Exports `Identities`, `Identity`,
`InvalidAccessToken`, `UserQuotas`, `route_refusal`, `reached_profiles`, `user_of_scope`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sidecar.serve.identities.access_tokens import (
    AccessTokenVerifier,
    InvalidAccessToken,
    ProviderUnreachable,
    looks_like_jwt,
)
from sidecar.serve.identities.quotas import UserQuotas
from sidecar.serve.identities.roles import (
    Identity,
    identity_of_claims,
    reached_profiles,
    route_refusal,
)
from sidecar.serve.security import USER_KEY, TokenUnverifiable

if TYPE_CHECKING:
    from starlette.types import Scope

    from bridges.manifest.auth import AuthConfig, QuotaConfig
    from sidecar.location.location import Location

__all__ = ["Identities", "Identity", "InvalidAccessToken", "UserQuotas", "reached_profiles",
           "route_refusal", "user_of_scope"]


def user_of_scope(scope: Scope) -> str | None:
    user = scope.get(USER_KEY)
    return user if isinstance(user, str) else None


class Identities:
    def __init__(self, location: Location) -> None:
        self._location = location
        self._verifier: AccessTokenVerifier | None = None
        self.book = UserQuotas(self.quotas, lambda: location.snapshots.ttl_seconds,
                               store_usage=lambda: location.seam.store.owner_usage())
        """The per-user quota counts (`[auth.quotas]`)."""

    def quotas(self) -> QuotaConfig | None:
        auth = self.auth()
        return auth.quotas if auth is not None else None

    def auth(self) -> AuthConfig | None:
        try:
            manifests: Any = self._location.manifests
        except AttributeError:
            return None
        auth: AuthConfig | None = getattr(manifests, "auth", None)
        return auth

    @property
    def enabled(self) -> bool:
        auth = self.auth()
        return auth is not None and auth.oidc is not None

    async def identify(self, secret: str) -> Identity | None:
        """The identity an access token proves; None when the daemon has no `[auth.oidc]` or
        the secret is not a JWT. `InvalidAccessToken` (401, with the reason) for a token
        this daemon refuses; `TokenUnverifiable` (503) when the provider does not answer."""
        auth = self.auth()
        if auth is None or auth.oidc is None or not looks_like_jwt(secret):
            return None
        verifier = await self._verifier_for(auth)
        try:
            claims = await verifier.verify(secret)
        except ProviderUnreachable as exc:
            raise TokenUnverifiable(str(exc)) from None
        found = identity_of_claims(claims, auth)
        if isinstance(found, str):
            raise InvalidAccessToken(found)
        return found

    async def verifier(self) -> AccessTokenVerifier | None:
        """The verifier of the configured provider (None without `[auth.oidc]`): its
        discovery document and token endpoint serve the console's sign-in."""
        auth = self.auth()
        if auth is None or auth.oidc is None:
            return None
        return await self._verifier_for(auth)

    async def _verifier_for(self, auth: AuthConfig) -> AccessTokenVerifier:
        oidc = auth.oidc
        assert oidc is not None
        audience = oidc.audience or oidc.client_id
        current = self._verifier
        if current is not None and (current.issuer, current.audience) == (oidc.issuer, audience):
            return current
        if current is not None:
            await current.aclose()
        self._verifier = AccessTokenVerifier(oidc.issuer, audience, algorithms=oidc.algorithms,
                                             leeway=oidc.leeway)
        return self._verifier

    async def aclose(self) -> None:
        if self._verifier is not None:
            await self._verifier.aclose()
            self._verifier = None
