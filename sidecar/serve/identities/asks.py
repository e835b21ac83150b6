"""Whose permission asks a request may see and answer: a signed-in `user` sees and replies to
the asks of their own calls only (`GET /v1/permissions`, `POST /v1/permissions/ID/reply`);
operators, admins and the all-access token see every ask.

An ask names its call id; `CallUsers` remembers which user started each call made through
this replica's `/v1` (the last `MAX_REMEMBERED`). Asks of calls made through `/mcp` go to the
MCP client itself (elicitation); in a fleet, a call started on another replica is not known
here, and its ask is not shown to the user (an operator answers it).

Imports `sidecar.model` and `sidecar.serve.security`. Exports `CallUsers` and
`MAX_REMEMBERED`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from starlette.types import Scope

from sidecar.model.permissions import PendingAsk
from sidecar.serve.security import ROLE_KEY, USER_KEY

MAX_REMEMBERED = 10_000


class CallUsers:
    def __init__(self) -> None:
        self._users: OrderedDict[str, str] = OrderedDict()

    def started(self, call_id: str, user: str | None) -> None:
        if user is None:
            return
        self._users[call_id] = user
        self._users.move_to_end(call_id)
        while len(self._users) > MAX_REMEMBERED:
            self._users.popitem(last=False)

    def visible(self, scope: Scope, asks: Iterable[PendingAsk]) -> list[PendingAsk]:
        """The asks the request's identity may see."""
        if scope.get(ROLE_KEY) != "user":
            return list(asks)
        user = scope.get(USER_KEY)
        return [a for a in asks if self._users.get(a.request.call_id) == user]
