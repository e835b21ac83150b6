"""Whose history a request may read: a signed-in `user` reads only their own calls (the
query is narrowed to them; asking for another user's is 403 `forbidden_role`); operators,
admins and the all-access token read everyone's (`?user=NAME` filters).

Imports `sidecar.stores` and `sidecar.serve.security`. Exports `own_history`.
"""

from __future__ import annotations

from dataclasses import replace

from starlette.types import Scope

from sidecar.serve.security import ROLE_KEY, USER_KEY
from sidecar.stores.call_history import CallQuery


def own_history(scope: Scope, query: CallQuery) -> CallQuery | str:
    """`query` as the request's identity may run it, or why it may not (403)."""
    if scope.get(ROLE_KEY) != "user":
        return query
    user = scope.get(USER_KEY)
    if query.user is not None and query.user != user:
        return (f"{user} has the role user and reads only their own history, "
                             f"not {query.user}'s")
    return replace(query, user=user)
