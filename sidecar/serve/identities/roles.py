"""Roles: who a signed-in person is (`Identity`), which role and profiles the manifest's
`[[auth.grants]]` give them (`identity_of_claims`), and which routes each role reaches
(`route_refusal`).

    admin     every route, every profile (what the all-access token reaches)
    operator  every route (servers, approvals, definitions, everyone's history); tools of the
              profiles its grants list (every profile when a grant lists none)
    user      `/mcp/NAME`, tools, snapshots and calls of its profiles, retained text, its own
              history (`GET /v1/calls`, narrowed to the user) and the permission asks of its
              own calls (`/v1/permissions`, narrowed)

A person matched by several grants gets the highest role among them and the union of their
profiles. A `roles_claim` in the token may name roles directly (admin, operator, user).

Imports nothing of ours (the grants are read duck-typed from `bridges.manifest.auth`).
Exports `Identity`, `identity_of_claims`, `reached_profiles`, `route_refusal`, `RANK` and
`USER_PATHS`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bridges.manifest.auth import AuthConfig

RANK = {"user": 0, "operator": 1, "admin": 2}
_MCP = re.compile(r"/mcp(?:/([A-Za-z0-9_-]{1,64}))?")
USER_PATHS = re.compile(r"/v1/(?:tools|snapshots|snapshots/[^/]+/calls|managed/[^/]+|calls|"
                        r"permissions|permissions/[^/]+/reply|auth/[^/]+|auth/[^/]+/login)")
"""What the `user` role reaches on `/v1` (each route narrows further: profiles, own history)."""


@dataclass(frozen=True, slots=True)
class Identity:
    user: str
    role: str
    profiles: frozenset[str] | None
    """The profiles reached; None: every profile."""
    via: str = "oidc"
    """How the request proved it: `oidc` (an access token) or `token` (a local scoped one)."""
    groups: tuple[str, ...] = ()


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def identity_of_claims(claims: Mapping[str, Any], auth: AuthConfig) -> Identity | str:
    """The identity the claims of a verified access token give, or why they give none."""
    oidc = auth.oidc
    assert oidc is not None
    user = claims.get(oidc.user_claim)
    if not isinstance(user, str) or not user:
        return f"the access token has no {oidc.user_claim!r} claim naming the user"
    groups = tuple(_strings(claims.get(oidc.groups_claim)))
    roles = [r for r in _strings(claims.get(oidc.roles_claim)) if r in RANK] \
        if oidc.roles_claim else []
    return _granted(user, groups, roles, auth.grants) or (
        f"{user} signed in, but no [[auth.grants]] entry names them or their groups "
        f"({', '.join(groups) or 'none'})")


def _granted(user: str, groups: tuple[str, ...], roles: Iterable[str],
             grants: Iterable[Any]) -> Identity | None:
    best: str | None = None
    profiles: set[str] | None = set()
    for role in roles:
        best = role if best is None or RANK[role] > RANK[best] else best
        profiles = None if role != "user" else profiles
    for grant in grants:
        if user not in grant.users and not set(groups) & set(grant.groups):
            continue
        best = grant.role if best is None or RANK[grant.role] > RANK[best] else best
        if grant.profiles is None and grant.role != "user":
            profiles = None
        elif profiles is not None and grant.profiles is not None:
            profiles.update(grant.profiles)
    if best is None:
        return None
    if best == "admin":
        profiles = None
    return Identity(user, best, frozenset(profiles) if profiles is not None else None,
                    groups=groups)


def reached_profiles(identity: Identity,
                     default_profile: Callable[[], str]) -> frozenset[str] | None:
    """The profiles the identity reaches now (a user granted none reaches the default)."""
    if identity.profiles is None or identity.profiles or identity.role != "user":
        return identity.profiles
    return frozenset({default_profile()})


def route_refusal(identity: Identity, path: str, method: str,
                  default_profile: Callable[[], str]) -> str | None:
    """Why `identity` may not reach `method path` (None: it may, so far: routes narrow)."""
    if identity.role == "admin":
        return None
    profiles = reached_profiles(identity, default_profile)
    mcp = _MCP.fullmatch(path)
    if mcp is not None:
        profile = mcp.group(1) or default_profile()
        if profiles is None or profile in profiles:
            return None
        return (f"{identity.user} ({identity.role}) reaches only the profiles "
                f"{', '.join(sorted(profiles)) or 'none'}")
    if identity.role == "operator" or USER_PATHS.fullmatch(path):
        return None
    return (f"{identity.user} has the role user: it reaches /mcp/NAME of its profiles, "
            f"/v1/tools, /v1/snapshots and calls on them, /v1/managed and its own /v1/calls and "
            f"/v1/permissions; "
            f"not {method} {path}")
