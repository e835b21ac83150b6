"""The token store's port: scoped bearer tokens, each reaching only the profiles it was made
for, and the helpers that make and check them.

    secret, record = await create_token(tokens, profiles=("coding",), label="ci",
                                        user="alice")   # optional: the token is alice's
    await verify_token(tokens, secret)      # -> the record, or None (unknown or revoked)

A secret is `sct_` + 43 URL-safe characters (256 random bits). Only its SHA-256 digest is
stored (a random 256-bit secret needs no slow hash); the secret is shown once, when it is
made. Revoking deletes the row, so the token stops working at its next request. The single
generated token of `sidecar serve` is not in this store: it keeps reaching everything.

Imports `sidecar.model` only. Exports `TokenStore`, `TokenRecord`, `TokenError`,
`create_token`, `verify_token`, `digest_of` and `SECRET_PREFIX`.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sidecar.model.errors import SidecarError

__all__ = ["SECRET_PREFIX", "TokenError", "TokenRecord", "TokenStore", "create_token",
           "digest_of", "verify_token"]

SECRET_PREFIX = "sct_"
_PROFILE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_USER = re.compile(r"[^\s:]{1,256}")


class TokenError(SidecarError):
    """A token request that cannot be done (no profile, a bad name, an unknown id)."""


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """What is stored about one scoped token (never its secret)."""

    id: str
    profiles: tuple[str, ...]
    label: str
    created_at: float
    user: str | None = None
    """The user the token belongs to (docs/identities.md): its calls are that user's in the
    history and quotas, and it reads that user's history; None: nobody's."""

    def to_json(self) -> dict[str, Any]:
        data = {"id": self.id, "profiles": list(self.profiles), "label": self.label,
                "created_at": self.created_at}
        if self.user is not None:
            data["user"] = self.user
        return data


class TokenStore(Protocol):
    """Where scoped tokens live, by the digest of their secret."""

    async def add(self, record: TokenRecord, digest: str) -> None: ...

    async def find(self, digest: str) -> TokenRecord | None: ...

    async def list(self) -> list[TokenRecord]: ...

    async def revoke(self, token_id: str) -> bool:
        """Remove the token; False when no token has that id."""
        ...

    async def aclose(self) -> None: ...


def digest_of(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


async def create_token(
    store: TokenStore, *, profiles: Sequence[str], label: str = "", user: str | None = None
) -> tuple[str, TokenRecord]:
    """Make a token that reaches `profiles`; returns (secret, record). The secret is not
    stored anywhere: show it to the user now."""
    if not profiles:
        raise TokenError("a scoped token needs at least one profile")
    for name in profiles:
        if not _PROFILE.fullmatch(name):
            raise TokenError(f"{name!r} is not a profile name (1-64 letters, digits, _ or -)")
    if user is not None and not _USER.fullmatch(user):
        raise TokenError(f"{user!r} is not a user name (1-256 characters, no space or colon)")
    record = TokenRecord(
        id="tok_" + secrets.token_hex(6), profiles=tuple(dict.fromkeys(profiles)),
        label=label, created_at=time.time(), user=user,
    )
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    await store.add(record, digest_of(secret))
    return secret, record


async def verify_token(store: TokenStore, secret: str) -> TokenRecord | None:
    """The record of a scoped token's secret, or None (not a scoped token, or revoked)."""
    if not secret.startswith(SECRET_PREFIX):
        return None
    return await store.find(digest_of(secret))
