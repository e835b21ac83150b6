"""The database check's port: whether the fleet database answers now, for health (and the
label answers name it by, `sidecar.stores.database_down`).

Imports nothing of the sidecar. Exports `DatabaseCheck` (implementation:
`sidecar.backends.postgres.health`).
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["DatabaseCheck"]


class DatabaseCheck(Protocol):
    """Whether the fleet database answers, for health."""

    async def unreachable(self) -> str | None:
        """None when a trivial query succeeds now (within a few seconds); else why not, in
        one line naming the database (never its credentials)."""
        ...
