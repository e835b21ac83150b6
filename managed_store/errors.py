"""Errors of the managed store.

Every error the store raises on purpose is a `ManagedStoreError`; argument mistakes (a negative
offset, an invalid regex, an empty namespace) are plain `ValueError`s, raised before any I/O.

    Exception
    ├── ValueError                  a bad argument: offset, limit, namespace, grep pattern
    └── ManagedStoreError           anything the store itself reports
        ├── InvalidRef              not a well-formed id; refused before the index or disk
        │                           is touched
        ├── ManagedNotFound         a well-formed id the index does not hold (never stored,
        │                           expired, evicted)
        ├── RetentionError          a write could not be made durable (I/O error, disk full,
        │   │                       invalid UTF-8, quota impossible); nothing is left behind
        │   └── OwnerShareExceeded  one object larger than its owner's share of the quota
        ├── SearchTimeout           a grep ran past its time limit
        ├── TooManySearches         the owner already runs its share of concurrent greps
        │                           (defined in `managed_store.search`)
        ├── StoreInUse              another live store (process) holds the root
        └── StoreClosed             the store (or spool) was used after it was closed

A caller that shows errors to a model may pass `str(error)` through: messages name the cause
but never a filesystem path outside the store.
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


class SearchTimeout(ManagedStoreError):
    """A grep ran past its time limit (RE2 is linear, but a huge object is still huge)."""


class StoreInUse(ManagedStoreError):
    """Another store, in this or another process, has the root open (its lock is held)."""


class StoreClosed(ManagedStoreError):
    """The store or the spool has been closed."""
