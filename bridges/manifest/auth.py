"""The `[auth]` table of a manifest: who may sign in, with which role, reaching which
profiles, under which quotas (docs/identities.md says what each key means).

    [auth.oidc]
    issuer = "https://id.example.com"
    client_id = "sidecar"
    client_secret = "${env:SIDECAR_OIDC_SECRET}"   # a secret reference, never a literal
    audience = "urn:sidecar"                       # the `aud` an access token must carry
    groups_claim = "groups"                        # roles_claim: a claim naming roles directly
    [[auth.grants]]
    groups = ["engineering"]                       # and/or users = ["alice"]
    role = "user"                                  # admin | operator | user
    profiles = ["coding"]
    [auth.quotas]                                  # per user; [auth.quotas.users.NAME] overrides
    calls_per_minute = 60
    store_bytes = 104857600                        # retained text in the managed store
Imports nothing of ours. Exports `AuthConfig`, `OidcConfig`, `GrantConfig`, `QuotaConfig`
and `ROLES`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

ROLES = ("admin", "operator", "user")
Role = Literal["admin", "operator", "user"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OidcConfig(_Strict):
    issuer: str
    client_id: str
    client_secret: SecretStr | None = None
    """A secret reference (`${env:...}`, `${file:...}`): resolved when the manifest loads."""
    audience: str | None = None
    """The `aud` an access token must carry; default: `client_id`."""
    scopes: list[str] = ["openid", "profile"]
    user_claim: str = "sub"
    groups_claim: str = "groups"
    roles_claim: str | None = None
    algorithms: list[str] = ["RS256", "ES256", "PS256", "EdDSA"]
    leeway: Annotated[float, Field(ge=0, le=300)] = 30.0
    """Seconds of clock skew allowed on `exp`, `nbf` and `iat`."""

    @field_validator("issuer")
    @classmethod
    def _https_or_local(cls, value: str) -> str:
        if not value.startswith(("https://", "http://127.0.0.1", "http://localhost")):
            raise ValueError("the issuer must be an https:// URL (http only on localhost)")
        return value.rstrip("/")


class GrantConfig(_Strict):
    groups: list[str] = []
    users: list[str] = []
    role: Role = "user"
    profiles: list[str] | None = None
    """The profiles the role reaches; None: every profile (admin and operator) or the
    default profile (user)."""

    @model_validator(mode="after")
    def _names_someone(self) -> GrantConfig:
        if not self.groups and not self.users:
            raise ValueError("a grant names at least one of groups or users")
        return self


class QuotaLimits(_Strict):
    calls_per_minute: Annotated[int, Field(gt=0)] | None = None
    concurrent_calls: Annotated[int, Field(gt=0)] | None = None
    snapshots: Annotated[int, Field(gt=0)] | None = None
    store_bytes: Annotated[int, Field(gt=0)] | None = None

    @field_validator("store_bytes", mode="before")
    @classmethod
    def _a_number_of_bytes(cls, value: object) -> object:
        if isinstance(value, str):
            raise ValueError("store_bytes is a number of bytes, such as 52428800 for 50 MiB "
                             f"(not a string: {value!r})")
        return value


class QuotaConfig(QuotaLimits):
    users: dict[str, QuotaLimits] = {}
    """Per-user overrides, key by key."""

    def for_user(self, user: str) -> QuotaLimits:
        own = self.users.get(user)
        if own is None:
            return self
        merged = {k: getattr(own, k) if getattr(own, k) is not None else getattr(self, k)
                  for k in QuotaLimits.model_fields}
        return QuotaLimits(**merged)

    def store_bytes_limits(self) -> tuple[dict[str, int], int | None]:
        """`store_bytes` of the users who set their own, and of every other user (None: none,
        the managed store's per-owner share applies)."""
        own = {user: limits.store_bytes for user, limits in self.users.items()
               if limits.store_bytes is not None}
        return own, self.store_bytes


class AuthConfig(_Strict):
    oidc: OidcConfig | None = None
    grants: list[GrantConfig] = []
    quotas: QuotaConfig | None = None
