"""A failed call's error message in the call history: kept, and added to a history file
written before the history kept it."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from sidecar.backends.sqlite.call_history import SqliteCallHistory
from sidecar.stores.call_history import CallQuery
from tests.backends.sqlite.test_call_history import row

pytestmark = pytest.mark.anyio

OLD_SCHEMA = """
CREATE TABLE calls (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, call_id TEXT NOT NULL, tool TEXT NOT NULL,
    server TEXT, profile TEXT, session_id TEXT NOT NULL, agent TEXT NOT NULL,
    message_id TEXT NOT NULL, status TEXT NOT NULL, error_kind TEXT, started_at REAL NOT NULL,
    duration_ms REAL NOT NULL, input_bytes INTEGER NOT NULL, input TEXT,
    content_bytes INTEGER NOT NULL, retained TEXT NOT NULL, replayed INTEGER NOT NULL
);
INSERT INTO calls (call_id, tool, session_id, agent, message_id, status, error_kind,
                   started_at, duration_ms, input_bytes, content_bytes, retained, replayed)
VALUES ('before', 'echo', 's', 'a', 'm', 'error', 'upstream', 1000000, 1, 2, 0, '[]', 0);
"""


async def test_a_history_from_before_error_messages_gets_the_column(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.executescript(OLD_SCHEMA)
    history = await SqliteCallHistory.open(path)
    try:
        history.add(row(1, status="error", error_kind="tool_failure", error="disk full"))
        rows, _ = await history.query(CallQuery())
    finally:
        await history.aclose()
    assert [(r.call_id, r.error) for r in rows] == [("c1", "disk full"), ("before", None)]
    assert rows[0].to_json()["error"] == "disk full"
