"""Retention policy: how long objects live and how many bytes they may take together.

Expiry is oldest first (by `created_at`). The quota is shared by owners (the clients the
caller names when it stores text): one owner may hold at most `owner_share` of it, or its own
limit when `OwnerLimits` names one (replaced at runtime, e.g. per user), and storing an
owner's object first evicts that owner's own oldest objects until it fits. When the whole
quota overflows, the oldest objects of the owner holding the most bytes
go first (objects stored without an owner count as one owner; with no owners at all that is
plain oldest first). So one client storing huge outputs evicts its own refs, not the others'.
The policy only chooses victims; the store deletes their rows and files.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from managed_store.errors import OwnerLimitExceeded, OwnerShareExceeded, RetentionError
from managed_store.index import Index
from managed_store.refs import ManagedRef


class OwnerLimits:
    """Byte limits of single owners, each in place of the share for the owner it covers: by
    exact name (`"user:alice"`) or, for owners without one, by name prefix (`"user:"`).
    Thread-safe: `set` replaces the whole table at once, and a reader sees the old one or
    the new one. Empty: every owner has the share."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._table: tuple[Mapping[str, int], tuple[tuple[str, int], ...]] = ({}, ())

    def set(self, exact: Mapping[str, int], prefixed: Mapping[str, int] | None = None) -> None:
        """Replace every limit: `exact` by owner, `prefixed` by name prefix (the longest
        matching prefix applies). Each limit is an int > 0 (`ValueError`, `TypeError`)."""
        prefixed = prefixed or {}
        for name, limit in (*exact.items(), *prefixed.items()):
            if isinstance(limit, bool) or not isinstance(limit, int):
                raise TypeError(f"the byte limit of {name!r} must be an int, got {limit!r}")
            if limit <= 0:
                raise ValueError(f"the byte limit of {name!r} must be > 0, got {limit!r}")
        table = (dict(exact), tuple(sorted(prefixed.items(), key=lambda p: -len(p[0]))))
        with self._lock:
            self._table = table

    def limit_of(self, owner: str) -> int | None:
        """`owner`'s own limit in bytes; None: the share applies."""
        exact, prefixed = self._table
        found = exact.get(owner)
        if found is not None:
            return found
        return next((limit for prefix, limit in prefixed if owner.startswith(prefix)), None)

    def usage(self, held: Mapping[str | None, int]) -> dict[str, tuple[int, int]]:
        """(bytes held, limit) of every owner with a limit that holds bytes (`held`) or is
        named exactly."""
        exact, _ = self._table
        found = {owner: (0, limit) for owner, limit in exact.items()}
        for owner, nbytes in held.items():
            limit = self.limit_of(owner) if owner is not None else None
            if owner is not None and limit is not None:
                found[owner] = (nbytes, limit)
        return dict(sorted(found.items()))


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """`ttl_seconds` may be `math.inf` (never expire); `quota_bytes` is a hard upper bound;
    `limits` (mutable, shared with whoever sets them) replace the share for some owners."""

    ttl_seconds: float
    quota_bytes: int
    owner_share: float = 0.5
    limits: OwnerLimits = field(default_factory=OwnerLimits, compare=False)

    def __post_init__(self) -> None:
        if not 0 < self.owner_share <= 1:
            raise ValueError(f"owner_share must be > 0 and <= 1, got {self.owner_share!r}")
        if not self.ttl_seconds > 0:
            raise ValueError(f"ttl_seconds must be > 0, got {self.ttl_seconds!r}")
        if isinstance(self.quota_bytes, bool) or not isinstance(self.quota_bytes, int):
            raise TypeError(f"quota_bytes must be an int, got {self.quota_bytes!r}")
        if self.quota_bytes < 0:
            raise ValueError(f"quota_bytes must be >= 0, got {self.quota_bytes!r}")

    def check_fits(self, size_bytes: int) -> None:
        """Raise `RetentionError` if an object of this size could never be stored."""
        if size_bytes > self.quota_bytes:
            raise RetentionError(
                f"object needs at least {size_bytes} bytes but the store quota is "
                f"{self.quota_bytes} bytes"
            )

    @property
    def owner_bytes(self) -> int:
        """The most bytes one owner may hold."""
        return math.floor(self.quota_bytes * self.owner_share)

    def bytes_for(self, owner: str) -> int:
        """The most bytes `owner` may hold: its own limit, else the share."""
        limit = self.limits.limit_of(owner)
        return self.owner_bytes if limit is None else limit

    def check_owner_fits(self, size_bytes: int, owner: str | None) -> None:
        """Raise `OwnerLimitExceeded` if one object of this size is over the owner's own
        limit, `OwnerShareExceeded` if over the share (for an owner without a limit)."""
        if owner is None:
            return
        limit = self.limits.limit_of(owner)
        if limit is not None:
            if size_bytes > limit:
                raise OwnerLimitExceeded(owner, limit, size_bytes)
            return
        if size_bytes > self.owner_bytes:
            raise OwnerShareExceeded(
                f"object of {size_bytes:,} bytes is over the per-owner share of the store "
                f"quota ({self.owner_bytes:,} bytes: {self.owner_share:.0%} of "
                f"{self.quota_bytes:,}); the whole text was not retained"
            )

    def expired(self, index: Index, now: float) -> list[ManagedRef]:
        if math.isinf(self.ttl_seconds):
            return []
        return index.created_before(now - self.ttl_seconds)

    def over_quota(
        self, index: Index, incoming_bytes: int, owner: str | None = None
    ) -> list[ManagedRef]:
        """Objects to evict so that `incoming_bytes` more, stored for `owner`, fit: first the
        owner's own oldest beyond its share, then the oldest of the largest holder (see the
        module docstring) until the whole quota has room."""
        victims: list[ManagedRef] = []
        if owner is not None:
            excess = index.owner_bytes(owner) + incoming_bytes - self.bytes_for(owner)
            if excess > 0:
                victims = _covering(index.oldest_of(owner, _BATCH), excess, index, owner)
        excess = index.totals().bytes - sum(v.size_bytes for v in victims) + incoming_bytes \
            - self.quota_bytes
        if excess <= 0:
            return victims
        held = index.holdings()
        queues: dict[str | None, list[ManagedRef]] = {}
        order = largest_holders_first({o: total for o, (total, _) in held.items()},
                                      {o: first for o, (_, first) in held.items()},
                                      victims, owner, incoming_bytes, excess)
        with contextlib.suppress(StopIteration):
            holder, after = next(order)
            while True:
                queue = queues.get(holder)
                if not queue:
                    queue = queues[holder] = index.oldest_of(holder, _BATCH, after=after)
                victim = queue.pop(0) if queue else None
                if victim is not None:
                    victims.append(victim)
                holder, after = order.send(victim)
        return victims


_BATCH = 256


def _covering(
    refs: list[ManagedRef], nbytes: int, index: Index, owner: str | None
) -> list[ManagedRef]:
    """The first of `owner`'s objects (oldest first, `refs` the first batch) adding up to at
    least `nbytes`."""
    chosen: list[ManagedRef] = []
    freed = 0
    while refs and freed < nbytes:
        for ref in refs:
            if freed >= nbytes:
                break
            chosen.append(ref)
            freed += ref.size_bytes
        if freed < nbytes:
            refs = index.oldest_of(owner, _BATCH, after=chosen[-1].created_at)
    return chosen


class Sized(Protocol):
    """What eviction needs of an object."""

    @property
    def size_bytes(self) -> int: ...

    @property
    def created_at(self) -> float: ...


def largest_holders_first(
    stored: dict[str | None, int], oldest: dict[str | None, float], chosen: Sequence[Sized],
    owner: str | None, incoming: int, excess: int,
) -> Generator[tuple[str | None, float], Sized | None, None]:
    """The order in which the whole quota gives up `excess` bytes, without any I/O: the local
    index and the S3 store's PostgreSQL index both drive it. `stored`/`oldest`: bytes held and
    oldest `created_at` per owner; `chosen`: `owner`'s objects already chosen for its share
    (oldest first); `incoming`: the bytes about to be stored for `owner`.

    Yields `(holder, after)`, asking for `holder`'s oldest object created after `after`; the
    caller sends it (it becomes a victim) or None when there is none. Ends when `excess` is
    freed or nothing is left to evict (the quota check then refuses the commit)."""
    stored, oldest = dict(stored), dict(oldest)
    last: dict[str | None, float] = {}
    for victim in chosen:  # already chosen: the owner's oldest, in order
        stored[owner] -= victim.size_bytes
        last[owner] = oldest[owner] = victim.created_at
    weight = dict(stored)  # the incoming object counts for its owner
    weight[owner] = weight.get(owner, 0) + incoming
    while excess > 0:
        candidates = [o for o, total in stored.items() if total > 0]
        if not candidates:
            return
        # The largest holder; on a tie, the one whose oldest object is oldest.
        largest = max(candidates, key=lambda o: (weight[o], -oldest[o]))
        found = yield largest, last.get(largest, -1.0)
        if found is None:  # cannot happen while its bytes are counted; stop looking at it
            stored[largest] = 0
            continue
        last[largest] = oldest[largest] = found.created_at
        stored[largest] -= found.size_bytes
        weight[largest] -= found.size_bytes
        excess -= found.size_bytes
