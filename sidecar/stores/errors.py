"""Store errors, without a driver: what a store raises when its database is unreachable or
its schema too new, and how a failure is told apart from a defect.

A backend whose driver has failures of its own (a refused, lost or silent connection) makes
them known with `register_failure_kind` when its module is imported; an install without that
driver registers nothing, and then only `DatabaseError` counts.

Imports nothing of the sidecar. Exports `DatabaseError`, `DatabaseUnavailable`,
`SchemaTooNew`, `exception_chain`, `database_error_in`, `database_failure`, `driver_failure`
and `register_failure_kind`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = [
    "DatabaseError",
    "DatabaseUnavailable",
    "FailurePredicate",
    "SchemaTooNew",
    "database_error_in",
    "database_failure",
    "driver_failure",
    "exception_chain",
    "register_failure_kind",
]

FailurePredicate = Callable[[BaseException], bool]
"""Says whether one exception (one link of a chain, not following its causes) is of a kind."""


class DatabaseError(Exception):
    """The fleet database is unreachable, or its schema is one this sidecar cannot use."""


class DatabaseUnavailable(DatabaseError):
    """The fleet database did not answer while a request needed it. The message says what
    could not be done and what the caller should do (e.g. retry with the same call id); the
    answering surface (/v1, /mcp) adds which database (`sidecar.stores.database_down`)."""


class SchemaTooNew(DatabaseError):
    """The database holds a component's schema newer than this sidecar knows."""


@dataclass(frozen=True, slots=True)
class _FailureKind:
    unreachable: FailurePredicate
    from_driver: FailurePredicate


_KINDS: list[_FailureKind] = []


def register_failure_kind(unreachable: FailurePredicate, from_driver: FailurePredicate) -> None:
    """A driver's failures: `unreachable` says whether an exception is the database refusing,
    losing or not answering a connection; `from_driver` whether it is any error the driver
    raised (or raised inside it), as opposed to a `DatabaseError` in the sidecar's own words.
    Registering the same pair again changes nothing."""
    kind = _FailureKind(unreachable, from_driver)
    if kind not in _KINDS:
        _KINDS.append(kind)


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then what it was raised from (`__cause__`, else `__context__`), and so on, each
    once."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        yield current
        seen.add(id(current))
        current = current.__cause__ or current.__context__


def database_error_in(exc: BaseException) -> DatabaseError | None:
    """The `DatabaseError` that `exc` is or was raised from (a store may wrap it in its own
    error, e.g. `OutcomeLogError`), or None: what the CLI reports as one line."""
    return next((e for e in exception_chain(exc) if isinstance(e, DatabaseError)), None)


def database_failure(exc: BaseException) -> BaseException | None:
    """The database failure `exc` is or was raised from, or None when it is something else
    (a defect, a constraint violated): a `DatabaseError`, or what a registered driver says is
    an unreachable database (a lost or refused connection, no answer in time)."""
    for current in exception_chain(exc):
        if isinstance(current, DatabaseError) or any(k.unreachable(current) for k in _KINDS):
            return current
    return None


def driver_failure(exc: BaseException) -> bool:
    """Whether a registered driver raised `exc` or what it was raised from: the database
    itself failed, rather than a setting the sidecar reports as a `DatabaseError`."""
    return any(k.from_driver(c) for c in exception_chain(exc) for k in _KINDS)
