"""MCP Server Cards (SEP-2127): the facade described for discovery before a client connects.

One card per MCP endpoint (`/mcp`: the default profile; `/mcp/{profile}`), in the v2 shape of
the SEP's schema: name, version, title, description, `remotes` (the streamable-HTTP URL, its
`Authorization` header, the protocol versions both eras accept) and, in `_meta`, what the
schema has no field for: the auth the daemon asks for and the extensions it advertises (the
same map as `server/discover`). Served without a token (public metadata, CORS `*`) at
`/.well-known/mcp/server-card[/PROFILE]`, at the SEP's reserved `<endpoint>/server-card`, and
listed by `/.well-known/mcp/catalog.json`. May import the core and the rest of
`sidecar.serve`. Exports `card_routes`, `server_card` and `MEDIA_TYPE`
(the token exemption is `sidecar.serve.security.SERVER_CARD_PATH`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

if TYPE_CHECKING:
    from sidecar.location.location import Location

SCHEMA = "https://static.modelcontextprotocol.io/schemas/v2/server-card.schema.json"
MEDIA_TYPE = "application/mcp-server-card+json"
DESCRIPTION = "MCP servers and local tools behind one validated, bounded and logged seam"
HEADERS = {"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Methods": "GET",
           "Access-Control-Allow-Headers": "Content-Type",
           "Cache-Control": "public, max-age=300"}
_NAME_PART = re.compile(r"[^a-zA-Z0-9._-]")


def server_card(
    base_url: str, profile: str | None, *, version: str, extensions: Mapping[str, Any],
    auth_required: bool, oidc_issuer: str | None = None,
) -> dict[str, Any]:
    """The card of `/mcp` (`profile` None) or `/mcp/{profile}` under `base_url`."""
    path = "/mcp" if profile is None else f"/mcp/{profile}"
    suffix = "" if profile is None else "." + (_NAME_PART.sub("-", profile) or "profile")
    remote: dict[str, Any] = {
        "type": "streamable-http",
        "url": base_url.rstrip("/") + path,
        "supportedProtocolVersions": [*MODERN_PROTOCOL_VERSIONS,
                                      *reversed(HANDSHAKE_PROTOCOL_VERSIONS)],
    }
    auth: dict[str, Any] = {"type": "bearer", "required": auth_required}
    if auth_required:
        accepted = "the daemon's token or a scoped token of this profile"
        if oidc_issuer is not None:
            accepted += f", or an access token of {oidc_issuer}"
            auth["oidcIssuer"] = oidc_issuer
        remote["headers"] = [{
            "name": "Authorization", "isRequired": True, "isSecret": True,
            "description": f"Bearer <token>: {accepted}", "placeholder": "Bearer <token>",
        }]
    return {
        "$schema": SCHEMA,
        "name": f"io.mcp-sidecar/gateway{suffix}",
        "version": version,
        "title": "mcp-sidecar" if profile is None else f"mcp-sidecar ({profile})",
        "description": DESCRIPTION,
        "websiteUrl": "https://modelcontextprotocol.io/seps/2127-mcp-server-cards",
        "remotes": [remote],
        "_meta": {"io.mcp-sidecar/auth": auth,
                  "io.mcp-sidecar/extensions": dict(extensions),
                  "io.mcp-sidecar/profile": profile},
    }


def card_routes(
    location: Location, extensions: Callable[[], Mapping[str, Any]], version: str
) -> list[BaseRoute]:
    """The card and catalog routes (GET); an unknown profile is 404."""

    def card(request: Request, profile: str | None) -> Response:
        if profile is not None and not location.profiles.exists(profile):
            return JSONResponse({"error": {"kind": "not_found", "message": (
                f"no profile named {profile!r}")}}, status_code=404, headers=HEADERS)
        identities = getattr(request.app.state, "identities", None)
        config = identities.auth() if identities is not None else None
        issuer = config.oidc.issuer if config is not None and config.oidc is not None else None
        body = server_card(
            str(request.base_url), profile, version=version, extensions=extensions(),
            auth_required=getattr(request.app.state, "auth_required", True),
            oidc_issuer=issuer)
        return JSONResponse(body, headers=HEADERS, media_type=MEDIA_TYPE)

    async def default_card(request: Request) -> Response:
        return card(request, None)

    async def profile_card(request: Request) -> Response:
        return card(request, request.path_params["profile"])

    async def catalog(request: Request) -> Response:
        base = str(request.base_url).rstrip("/")
        entries = [{"identifier": "urn:air:mcp-sidecar:gateway", "displayName": "mcp-sidecar",
                    "type": MEDIA_TYPE, "url": f"{base}/mcp/server-card"}]
        entries += [{"identifier": f"urn:air:mcp-sidecar:gateway:{name}",
                     "displayName": f"mcp-sidecar ({name})", "type": MEDIA_TYPE,
                     "url": f"{base}/mcp/{name}/server-card"}
                    for name in location.profiles.names()]
        return JSONResponse({"specVersion": "draft", "entries": entries}, headers=HEADERS)

    return [
        Route("/.well-known/mcp/server-card", default_card, methods=["GET"]),
        Route("/.well-known/mcp/server-card.json", default_card, methods=["GET"]),
        Route("/.well-known/mcp/server-card/{profile}", profile_card, methods=["GET"]),
        Route("/.well-known/mcp/catalog.json", catalog, methods=["GET"]),
        Route("/mcp/server-card", default_card, methods=["GET"]),
        Route("/mcp/{profile}/server-card", profile_card, methods=["GET"]),
    ]
