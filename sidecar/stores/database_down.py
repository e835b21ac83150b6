"""What a request answers when the fleet database does not (docs/fleet.md, "When the database
is down"): one sentence naming the database (`host:port/name`, never a user or password),
what could not be done, and why; /v1 sends it as a 503 `unavailable` error, /mcp as a
JSON-RPC internal error (-32603).

A failure is a database failure when `sidecar.stores.errors.database_failure` says so (a
refused or lost connection, no answer within `SIDECAR_DATABASE_TIMEOUT`); anything else stays
a defect (500 `internal_error`) so that bugs are not hidden behind "unavailable".

Imports only `sidecar.stores.errors`. Exports `UNAVAILABLE`, `database_label`,
`unavailable_message` and `unless_down`.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from sidecar.stores.errors import DatabaseUnavailable, database_failure, exception_chain

__all__ = ["UNAVAILABLE", "database_label", "unavailable_message", "unless_down"]

UNAVAILABLE = "unavailable"
"""The /v1 error code (HTTP 503), the same as a snapshot that could not be shared."""


def database_label(check: Any) -> str:
    """`host:port/name` of a Location's fleet database (its `database` check), or a generic
    name when the Location has none known."""
    label = getattr(check, "label", "")
    return f"the fleet database {label}" if label else "the fleet database"


def unavailable_message(exc: BaseException, what: str, label: str) -> str | None:
    """The answer for `exc` when it is a database failure, else None. `what` says what the
    request could not do; a `DatabaseUnavailable` carries its own (which call, and what to
    do)."""
    failure = database_failure(exc)
    if failure is None:
        return None
    said = next((e for e in exception_chain(exc) if isinstance(e, DatabaseUnavailable)), None)
    if said is not None:
        what = str(said)
    return f"{label} is unavailable: {what} ({_cause(failure)})"


async def unless_down(read: Awaitable[dict[str, Any]], database: Any, what: str
                      ) -> tuple[dict[str, Any], str | None]:
    """`read`'s result and None, or `{}` and the answer when the fleet database (`database`,
    a Location's check; None: no fleet database) failed under it."""
    try:
        return await read, None
    except Exception as exc:
        message = None if database is None else unavailable_message(
            exc, what, database_label(database))
        if message is None:
            raise
        return {}, message


def _cause(failure: BaseException) -> str:
    """Why: no answer in time, else the deepest cause's own words."""
    chain = list(exception_chain(failure))
    if any(isinstance(c, TimeoutError) for c in chain):
        return "no answer within the database timeout (SIDECAR_DATABASE_TIMEOUT)"
    for c in reversed(chain):  # the root's words first: a wrapper repeats them
        if str(c).strip() and not isinstance(c, DatabaseUnavailable):  # (that is the what)
            return str(c).strip()
    return type(chain[-1]).__name__
