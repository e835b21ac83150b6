"""/v1 answers while the fleet database is down: 503 `unavailable`, naming the database and
what the route could not do (`sidecar.stores.database_down`). Imports `sidecar.stores`;
exports `route_unavailable` and `UNAVAILABLE`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sidecar.stores.database_down import UNAVAILABLE, database_label, unavailable_message

__all__ = ["UNAVAILABLE", "route_unavailable"]

COULD_NOT = {
    "list_tools": "the tools could not be listed",
    "approve": "the definition change could not be approved",
    "create_snapshot": "the snapshot could not be kept",
    "call": "the call could not be run",
    "call_history": "the call history could not be read",
    "call_state": "the call's state could not be read or changed",
    "managed": "the managed text could not be read",
    "event_stream": "the event stream could not be opened",
    "permissions": "the pending asks could not be listed",
    "reply": "the reply could not be given",
    "prometheus": "the metrics could not be read",
    "status": "the OAuth state could not be read",
    "start_login": "the OAuth login could not be started",
}
"""What each route (by its handler's name) could not do when the fleet database failed under
it; any other: "the request could not be answered"."""


def route_unavailable(endpoint: Callable[..., Any], exc: BaseException) -> str | None:
    """The 503 message for `exc` raised by `endpoint` (a bound handler of an object with a
    `location`), or None when `exc` is not a database failure."""
    location = getattr(getattr(endpoint, "__self__", None), "location", None)
    what = COULD_NOT.get(getattr(endpoint, "__name__", ""), "the request could not be answered")
    stores = getattr(location, "stores", None)
    return unavailable_message(exc, what, database_label(getattr(stores, "database", None)))
