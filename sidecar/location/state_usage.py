"""How much disk a Location's state directory takes, by part, and what its upkeep removed:
the `state` section of `sidecar health` and `/metrics` (`sidecar_state_bytes{part}` and the
pruning/eviction counters); the parts are `state_usage`'s docstring. Sizes come from `stat`
calls on a handful of files, in a thread; the object directory is never walked (it can hold
many thousands of files).

Imports `sidecar.stores` and `managed_store`. Exports `state_usage` and `usage_report`.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from managed_store import StoreStats
from sidecar.stores.outcome_log import OutcomeLog

_SMALL_DATABASES = {"permissions": "permissions.sqlite", "tokens": "tokens.sqlite"}
_KNOWN = {name + suffix for name in ("outcomes.sqlite", *_SMALL_DATABASES.values())
          for suffix in ("", "-wal", "-shm")}


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _other_bytes(state_dir: Path) -> int:
    total = 0
    try:
        with os.scandir(state_dir) as entries:
            for entry in entries:
                if entry.name not in _KNOWN and entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    except OSError:
        return 0
    return total


def _small_databases(state_dir: Path) -> dict[str, int]:
    return {part: _size(state_dir / name) + _size(state_dir / f"{name}-wal")
            for part, name in _SMALL_DATABASES.items()}


async def usage_report(location: Any) -> dict[str, Any]:
    """The `store` and `state` sections of a Location's health report. A store writing
    behind (S3) adds `store.staged`: what this replica committed and has not uploaded yet."""
    stats = await location.seam.store.stats()
    quota = location.store_quota_bytes
    store: dict[str, Any] = {"objects": stats.count, "bytes": stats.bytes,
                             **location.store_pressure.report(stats, quota)}
    if stats.staged is not None:
        staged = stats.staged
        store["staged"] = {"objects": staged.objects, "bytes": staged.bytes,
                           "oldest_seconds": staged.oldest_seconds,
                           "retrying": staged.retrying, "last_error": staged.last_error}
    return {"store": store,
            "state": await state_usage(location.state_dir, location.seam.outcomes, stats,
                                       retention_seconds=location.retention_seconds,
                                       quota_bytes=quota)}


async def state_usage(
    state_dir: Path,
    outcomes: OutcomeLog | None,
    store: StoreStats,
    *,
    retention_seconds: float,
    quota_bytes: int,
) -> dict[str, Any]:
    """The `state` section of a health report (JSON-ready), by part:

    | part | what |
    |---|---|
    | `outcomes`, `outcomes_wal` | the outcome log's database file and its write-ahead log |
    | `managed_objects` | the retained texts (the managed store's own byte count) |
    | `managed_index` | the managed store's SQLite index (database + WAL) |
    | `permissions` | persisted permission rules (database + WAL) |
    | `tokens` | scoped bearer tokens (database + WAL) |
    | `other` | every other file directly in the state directory (token, daemon.json, ...) |
    """
    parts: dict[str, int] = {"outcomes": 0, "outcomes_wal": 0}
    upkeep: dict[str, Any] = {}
    if outcomes is not None:
        log = await outcomes.stats()
        parts.update(log.disk_bytes)
        upkeep = {"outcomes_stored": log.outcomes, "outcomes_expired": log.expired,
                  "outcomes_pruned": log.pruned, "wal_checkpoints": log.wal_checkpoints,
                  "wal_truncations": log.wal_truncations}
    parts["managed_objects"] = store.bytes
    parts["managed_index"] = store.index_bytes
    small, parts["other"] = await asyncio.to_thread(
        lambda: (_small_databases(state_dir), _other_bytes(state_dir)))
    parts.update(small)
    return {
        "dir": str(state_dir),
        "bytes": parts,
        "total_bytes": sum(parts.values()),
        "retention_seconds": retention_seconds,
        "managed_quota_bytes": quota_bytes,
        "upkeep": {**upkeep, "managed_evicted_expired": store.evicted_expired,
                   "managed_evicted_quota": store.evicted_quota},
    }
