"""Which replica this process is: one name for health, response headers, logs and the rows a
replica owns in the fleet database (claims, locks).

`SIDECAR_REPLICA_ID` names it; without it the name is `<hostname>-<pid>`, unique on one
machine and readable in a fleet. The value is read once per process, so every part of a replica
reports the same name.
"""

from __future__ import annotations

import functools
import os
import socket

__all__ = ["REPLICA_HEADER", "replica_id"]

REPLICA_HEADER = "Sidecar-Replica"
"""The HTTP response header carrying `replica_id()` on every answer of `sidecar serve`."""

_MAX_LENGTH = 128


@functools.cache
def replica_id() -> str:
    """This replica's name: `SIDECAR_REPLICA_ID`, else `<hostname>-<pid>` (at most 128
    characters, printable ASCII, usable in a header)."""
    chosen = os.environ.get("SIDECAR_REPLICA_ID", "").strip()
    if not chosen:
        chosen = f"{socket.gethostname() or 'localhost'}-{os.getpid()}"
    cleaned = "".join(c if 0x21 <= ord(c) < 0x7F else "_" for c in chosen)
    return cleaned[:_MAX_LENGTH]
