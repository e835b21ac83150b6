"""The `oauth` table of an HTTP server entry in a manifest (see docs/oauth.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OAuthSettings(_Strict):
    """The `oauth` table of an HTTP server entry. Every key is optional: without any, the
    sidecar discovers the authorization server and registers itself (CIMD or dynamic client
    registration) on `sidecar auth login NAME`."""

    grant: Literal["authorization_code", "client_credentials", "cross_app_access",
                   "token_exchange"] = "authorization_code"
    """`cross_app_access`: SEP-990 (enterprise-managed): the ID token `id_token` is exchanged
    at the enterprise IdP (`idp_token_endpoint`, RFC 8693) for an ID-JAG, which the MCP
    authorization server (`issuer`) takes as a jwt-bearer grant (RFC 7523).
    `token_exchange`: each call's own bearer token (the caller's identity-provider access
    token) is exchanged at `idp_token_endpoint` (RFC 8693) for a token of this server (its
    URL as `resource`, `audience` if set), per user; the tool list comes from the server's
    own login."""
    client_id: str | None = None
    client_secret: str | None = Field(default=None, repr=False)
    private_key: str | None = Field(default=None, repr=False)
    """PEM private key for `private_key_jwt` client authentication (client_credentials)."""
    signing_algorithm: str = "RS256"
    token_endpoint_auth_method: Literal[
        "none", "client_secret_basic", "client_secret_post", "private_key_jwt"
    ] | None = None
    scopes: list[str] | None = None
    """Scopes to ask for; default: the server's challenge, else its `scopes_supported`."""
    client_metadata_url: str | None = None
    """An https URL of this client's metadata document (CIMD), used as its client_id where
    the authorization server supports it."""
    client_name: str = "mcp-sidecar"
    redirect_uri: str | None = None
    """A fixed loopback redirect URI (http://127.0.0.1:PORT/PATH) registered for the client."""
    callback_port: Annotated[int, Field(ge=1, le=65535)] | None = None
    """Port of the loopback callback `sidecar auth login` listens on (default: ephemeral)."""
    issuer: str | None = None
    """The authorization server pre-registered credentials belong to (client_credentials,
    cross_app_access): tokens are then only requested there."""
    idp_token_endpoint: str | None = None
    idp_client_id: str | None = None
    id_token: str | None = Field(default=None, repr=False)
    idp_client_secret: str | None = Field(default=None, repr=False)
    """The secret of `idp_client_id` at the identity provider (token_exchange)."""
    audience: str | None = None
    """The `audience` a token exchange asks for (token_exchange)."""
    per_user: bool = False
    """Credentials per user: each signed-in user logs in once (`sidecar auth login NAME --user
    USER`) and a call carries its caller's grant, stored per (server, user); the tool list is
    read with the server's own login (docs/identities.md)."""

    @model_validator(mode="after")
    def _consistent(self) -> OAuthSettings:
        if self.grant == "client_credentials":
            if not self.client_id:
                raise ValueError("grant client_credentials needs `client_id`")
            if not self.client_secret and not self.private_key:
                raise ValueError("grant client_credentials needs `client_secret` or "
                                 "`private_key`")
        if self.grant == "cross_app_access":
            missing = [name for name in ("client_id", "client_secret", "issuer",
                                         "idp_token_endpoint", "idp_client_id", "id_token")
                       if not getattr(self, name)]
            if missing:
                raise ValueError(f"grant cross_app_access needs {', '.join(missing)}")
        if self.grant == "token_exchange":
            missing = [name for name in ("idp_token_endpoint", "idp_client_id")
                       if not getattr(self, name)]
            if missing:
                raise ValueError(f"grant token_exchange needs {', '.join(missing)}")
        if self.per_user and self.grant != "authorization_code":
            raise ValueError("`per_user` needs grant authorization_code (each user logs in)")
        if self.private_key and self.grant != "client_credentials":
            raise ValueError("`private_key` (private_key_jwt) is used with grant "
                             "client_credentials only")
        if self.client_secret and not self.client_id:
            raise ValueError("`client_secret` needs `client_id`")
        if self.redirect_uri is not None and not self.redirect_uri.startswith(
            ("http://127.0.0.1:", "http://localhost:", "http://[::1]:")
        ):
            raise ValueError("redirect_uri must be a loopback http URL with a port "
                             "(http://127.0.0.1:PORT/...)")
        return self
