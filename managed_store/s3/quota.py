"""Which objects a location must lose so that more bytes fit: the local store's rules
(`managed_store.retention`) asked of the PostgreSQL index, for the whole fleet at once.

An owner holds at most `policy.bytes_for(owner)` (its own limit, else the share); storing for
it first evicts its own oldest objects beyond that. When the whole quota still overflows, the
oldest objects of the owner holding the most bytes go first (objects without an owner count
as one owner; with no owners at all that is plain oldest first). The caller holds
`LOCK_MANAGED_QUOTA` in the transaction of `conn`, so no other replica changes the holdings
meanwhile.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from managed_store.retention import RetentionPolicy, largest_holders_first

_BATCH = 256
_OBJECTS = "FROM sidecar_managed_objects WHERE location = $1"


@dataclass(frozen=True, slots=True)
class _Object:
    id: str
    size_bytes: int
    created_at: float


async def over_quota(conn: Any, location: str, incoming: int, policy: RetentionPolicy,
                     owner: str | None = None) -> list[str]:
    """Ids to evict (oldest of each owner first) so that `incoming` more bytes, stored for
    `owner`, fit its share and the quota; fewer when nothing else is left to evict."""
    victims: list[_Object] = []
    if owner is not None:
        held = await conn.fetchval(
            f"SELECT COALESCE(SUM(size_bytes), 0) {_OBJECTS} AND owner = $2", location, owner)
        excess = int(held) + incoming - policy.bytes_for(owner)
        while excess > 0:
            after = victims[-1].created_at if victims else -1.0
            batch = await _oldest_of(conn, location, owner, after)
            if not batch:
                break
            for item in batch:
                if excess <= 0:
                    break
                victims.append(item)
                excess -= item.size_bytes
    total = int(await conn.fetchval(f"SELECT COALESCE(SUM(size_bytes), 0) {_OBJECTS}",
                                    location))
    excess = total - sum(v.size_bytes for v in victims) + incoming - policy.quota_bytes
    if excess <= 0:
        return [v.id for v in victims]
    rows = await conn.fetch(
        f"SELECT owner, SUM(size_bytes) AS held, MIN(created_at) AS first {_OBJECTS} "
        "GROUP BY owner", location)
    queues: dict[str | None, list[_Object]] = {}
    order = largest_holders_first({row["owner"]: int(row["held"]) for row in rows},
                                  {row["owner"]: row["first"] for row in rows},
                                  victims, owner, incoming, excess)
    with contextlib.suppress(StopIteration):
        holder, after = next(order)
        while True:
            queue = queues.get(holder)
            if not queue:
                queue = queues[holder] = await _oldest_of(conn, location, holder, after)
            victim = queue.pop(0) if queue else None
            if victim is not None:
                victims.append(victim)
            holder, after = order.send(victim)
    return [v.id for v in victims]


async def _oldest_of(conn: Any, location: str, owner: str | None, after: float
                     ) -> list[_Object]:
    rows = await conn.fetch(
        f"SELECT id, size_bytes, created_at {_OBJECTS} AND owner IS NOT DISTINCT FROM $2 "
        "AND created_at > $3 ORDER BY created_at, id LIMIT $4", location, owner, after, _BATCH)
    return [_Object(row["id"], int(row["size_bytes"]), row["created_at"]) for row in rows]
