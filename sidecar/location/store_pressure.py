"""Whether the managed store is under eviction pressure, for `health`.

The store evicts the oldest objects when new text would exceed its byte quota: one client
retaining a few huge outputs can push everyone else's refs out. Health says so before and
while it happens, so operators can raise the quota or find the client:

- `pressure: "high"` when the store holds at least `HIGH_RATIO` of its quota, or when objects
  were evicted for quota within the last `WINDOW_SECONDS` (seen between two reports);
- `evicted_for_quota`: objects evicted for quota since the daemon started.

Imports `managed_store`. Exports `StorePressure`, `store_quota_from_env`,
`owner_share_from_env`, `HIGH_RATIO`, `WINDOW_SECONDS` and `DEFAULT_OWNER_SHARE`.
"""

from __future__ import annotations

import os
import time
from typing import Any

from managed_store import StoreStats

HIGH_RATIO = 0.8
WINDOW_SECONDS = 3600.0


class StorePressure:
    """Remembers when quota evictions were last seen; one per Location."""

    def __init__(self) -> None:
        self._seen = 0
        self._last_eviction: float | None = None

    def report(self, stats: StoreStats, quota_bytes: int) -> dict[str, Any]:
        now = time.monotonic()
        if stats.evicted_quota > self._seen:
            self._seen = stats.evicted_quota
            self._last_eviction = now
        recent = self._last_eviction is not None and now - self._last_eviction < WINDOW_SECONDS
        used = stats.bytes / quota_bytes if quota_bytes > 0 else 0.0
        return {
            "quota_bytes": quota_bytes,
            "used_percent": round(100 * used, 1),
            "evicted_for_quota": stats.evicted_quota,
            "pressure": "high" if used >= HIGH_RATIO or recent else "normal",
        }


DEFAULT_OWNER_SHARE = 0.5


def owner_share_from_env(default: float = DEFAULT_OWNER_SHARE) -> float:
    """`SIDECAR_STORE_OWNER_SHARE`: the part of the store quota one client (a session, or a
    scoped token) may hold, as a fraction (`0.25`) or a percentage (`25%`), more than 0 and at
    most 1; else `default`. Anything else is a `ValueError` naming it."""
    raw = os.environ.get("SIDECAR_STORE_OWNER_SHARE", "").strip()
    if not raw:
        return default
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        value = 0.0
    if not 0 < value <= 1:
        raise ValueError("SIDECAR_STORE_OWNER_SHARE must be a fraction of the store quota "
                         f"above 0 and at most 1 (such as 0.5 or 50%), got {raw!r}")
    return value


_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def store_quota_from_env(default: int) -> int:
    """`SIDECAR_STORE_QUOTA` (bytes, or with a K/M/G/T suffix in powers of 1024, e.g. `4G`),
    else `default`. A value that is not a positive size is a `ValueError` naming it."""
    raw = os.environ.get("SIDECAR_STORE_QUOTA", "").strip()
    if not raw:
        return default
    text = raw.lower().removesuffix("ib").removesuffix("b")
    unit = text[-1:] if text[-1:] in _UNITS else ""
    number = text[: len(text) - len(unit)]
    try:
        value = int(float(number) * _UNITS[unit])
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"SIDECAR_STORE_QUOTA must be a positive size such as 2G, got {raw!r}")
    return value
