"""The private SQLite file every embedded store opens: created 0600 in a 0700 directory before
SQLite touches it (its -wal/-shm files follow the database's mode), autocommit, WAL.

Imports `sidecar.stores.state_dir`. Exports `private_connection`.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sidecar.stores.state_dir import PRIVATE_DIR_MODE, create_private_file

__all__ = ["private_connection"]


def private_connection(path: Path, *, timeout: float = 5.0) -> sqlite3.Connection:
    """A connection to `path` for the owner thread (`check_same_thread=False`), in WAL mode;
    `timeout`: how long a statement waits for another process's lock."""
    path.parent.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    create_private_file(path)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=timeout)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
    except BaseException:
        conn.close()
        raise
    return conn
