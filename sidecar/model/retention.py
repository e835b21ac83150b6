"""The retention period: how long retained texts and stored outcomes are kept.

One period for both (`Location.open(retention_seconds=...)`); the CLI reads it from
`$SIDECAR_RETENTION` (seconds, or a number with `s`, `m`, `h` or `d`). Light on purpose: the
CLI checks the variable before it starts or attaches to a daemon.
"""

from __future__ import annotations

import os
import sys

DEFAULT_RETENTION_SECONDS = 7 * 86400
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds from "604800", "90s", "30m", "12h" or "7d"; ValueError otherwise."""
    value = text.strip().lower()
    scale = _UNITS.get(value[-1:], None)
    number = value[:-1] if scale is not None else value
    try:
        seconds = float(number) * (scale or 1)
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (use seconds, or 90s, 30m, 12h, 7d)") from None
    if not 0 < seconds < float("inf"):
        raise ValueError(f"a duration must be positive and finite, got {text!r}")
    return seconds


def retention_from_env() -> float:
    """`$SIDECAR_RETENTION` (see `parse_duration`), else 7 days. A bad value ends the command
    with a one-line message and exit status 2 (a usage error)."""
    text = os.environ.get("SIDECAR_RETENTION", "").strip()
    try:
        return parse_duration(text) if text else DEFAULT_RETENTION_SECONDS
    except ValueError as exc:
        print(f"sidecar: SIDECAR_RETENTION: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
