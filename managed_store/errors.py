"""Errors of the managed store; imports nothing. Argument mistakes (a negative offset, an invalid
regex, an empty namespace) are plain `ValueError`s, raised before any I/O; everything the store
itself reports is a `ManagedStoreError`:

    ManagedStoreError
    ├── InvalidRef, ManagedNotFound     a malformed id (refused before any I/O); a well-formed
    │                                   one the index does not hold (never stored, expired, evicted)
    ├── RetentionError                  a write could not be made durable (I/O error, disk full,
    │   │                               invalid UTF-8, quota impossible); nothing is left behind
    │   └── OwnerShareExceeded          one object larger than its owner's share of the quota
    │       └── OwnerLimitExceeded      ... or than the owner's own limit (`OwnerLimits`)
    ├── SearchTimeout, TooManySearches  a grep past its time limit; past the owner's share of
    │                                   concurrent greps (`TooManySearches` is in `search`)
    └── StoreInUse, StoreClosed         another live store holds the root; used after closing

Messages name the cause but never a filesystem path outside the store.
"""

from __future__ import annotations


class ManagedStoreError(Exception):
    """Base class of every error the store raises on purpose."""


class InvalidRef(ManagedStoreError):
    """The id is not of the form `m_` + 26 characters from `[0-9a-z]`."""


class ManagedNotFound(ManagedStoreError):
    """The id is well formed but the store does not hold it (any more)."""


class RetentionError(ManagedStoreError):
    """A write failed; no object became visible and no temp file was left behind.

    The underlying exception, if any, is chained as `__cause__`.
    """


class OwnerShareExceeded(RetentionError):
    """One object is larger than its owner's share of the quota (`owner_share`): a limit the
    client hit, not a fault of the store; nothing was stored."""


class OwnerLimitExceeded(OwnerShareExceeded):
    """One object is larger than its owner's own byte limit (`retention.OwnerLimits`, which
    replaces the share for that owner); nothing was stored. Names `owner`, `limit_bytes`
    and the object's `size_bytes`."""

    def __init__(self, owner: str, limit_bytes: int, size_bytes: int) -> None:
        super().__init__(
            f"object of {size_bytes:,} bytes is over the limit of {owner} in the store "
            f"({limit_bytes:,} bytes); the whole text was not retained")
        self.owner = owner
        self.limit_bytes = limit_bytes
        self.size_bytes = size_bytes

    def __reduce__(self) -> tuple[type[OwnerLimitExceeded], tuple[str, int, int]]:
        return type(self), (self.owner, self.limit_bytes, self.size_bytes)


class SearchTimeout(ManagedStoreError):
    """A grep ran past its time limit (RE2 is linear, but a huge object is still huge)."""


class StoreInUse(ManagedStoreError):
    """Another store, in this or another process, has the root open (its lock is held)."""


class StoreClosed(ManagedStoreError):
    """The store or the spool has been closed."""
