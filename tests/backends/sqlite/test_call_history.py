"""The call history store on a real SQLite file: rows, filters, cursors, redaction, pruning."""

from __future__ import annotations

import asyncio
import stat
import time
from pathlib import Path

import pytest

from sidecar.backends.sqlite.call_history import SqliteCallHistory
from sidecar.model.audit_redaction import MASK, redact
from sidecar.stores.call_history import (
    AuditSettings,
    CallQuery,
    CallRecord,
    InvalidQuery,
    parse_time,
)

pytestmark = pytest.mark.anyio


def row(i: int, **over: object) -> CallRecord:
    values: dict[str, object] = {
        "call_id": f"c{i}", "tool": "echo" if i % 2 else "grep",
        "server": "up" if i % 3 else None, "profile": None, "session_id": f"s{i % 2}",
        "agent": "a", "message_id": "m", "status": "completed", "error_kind": None,
        "started_at": 1_000_000.0 + i, "duration_ms": 1.5, "input_bytes": 10,
        "input": {"text": "x"}, "content_bytes": 3, "retained": (), "replayed": False,
    }
    values.update(over)
    return CallRecord(**values)  # type: ignore[arg-type]


@pytest.fixture
async def history(tmp_path: Path):
    h = await SqliteCallHistory.open(tmp_path / "history.sqlite")
    yield h
    await h.aclose()


async def test_rows_come_back_newest_first_with_every_field(history: SqliteCallHistory) -> None:
    history.add(row(1, retained=("m_abc",), error_kind="upstream", status="error",
                    replayed=True))
    history.add(row(2))
    rows, cursor = await history.query(CallQuery())
    assert [r.call_id for r in rows] == ["c2", "c1"] and cursor is None
    first = rows[1]
    assert (first.retained, first.error_kind, first.status, first.replayed) == (
        ("m_abc",), "upstream", "error", True)
    assert first.input == {"text": "x"}
    assert first.to_json()["started_at"].endswith("Z")


async def test_filters_and_cursor_pages(history: SqliteCallHistory) -> None:
    for i in range(1, 26):
        history.add(row(i))
    echo, _ = await history.query(CallQuery(tool="echo", limit=1000))
    assert {r.tool for r in echo} == {"echo"} and len(echo) == 13
    session, _ = await history.query(CallQuery(session="s0", server="up"))
    assert all(r.session_id == "s0" and r.server == "up" for r in session) and session
    window, _ = await history.query(CallQuery(since=1_000_010.0, until=1_000_015.0))
    assert [r.call_id for r in window] == ["c14", "c13", "c12", "c11", "c10"]
    seen: list[str] = []
    cursor: str | None = None
    while True:
        page, cursor = await history.query(CallQuery(limit=10, cursor=cursor))
        seen += [r.call_id for r in page]
        if cursor is None:
            break
    assert seen == [f"c{i}" for i in range(25, 0, -1)]


async def test_a_forged_cursor_is_a_clear_error(history: SqliteCallHistory) -> None:
    with pytest.raises(InvalidQuery, match="cursor"):
        await history.query(CallQuery(cursor="not-ours"))
    with pytest.raises(InvalidQuery, match="limit"):
        CallQuery.from_params({"limit": "0"})
    with pytest.raises(InvalidQuery, match="since"):
        CallQuery.from_params({"since": "yesterday"})


def test_times_parse_as_iso_or_epoch() -> None:
    assert parse_time("1970-01-02", "since") == 86400.0
    assert parse_time("1970-01-01T01:00:00+01:00", "since") == 0.0
    assert parse_time("12.5", "since") == 12.5


async def test_prune_deletes_old_rows_in_batches(history: SqliteCallHistory) -> None:
    for i in range(1, 1201):
        history.add(row(i))
    assert await history.prune(1_000_000.0 + 1101, batch=100) == 1100
    rows, _ = await history.query(CallQuery(limit=1000))
    assert len(rows) == 100 and rows[-1].call_id == "c1101"


async def test_the_file_is_private(tmp_path: Path) -> None:
    h = await SqliteCallHistory.open(tmp_path / "state" / "history.sqlite")
    h.add(row(1))
    await h.query(CallQuery())
    await h.aclose()
    assert stat.S_IMODE((tmp_path / "state" / "history.sqlite").stat().st_mode) == 0o600


def test_redaction_masks_secrets_and_configured_fields_and_cuts_long_strings() -> None:
    value = {"Password": "p", "api_key": "k", "nested": [{"auth_token": "t", "q": "ok"}],
             "body": "x" * 1000, "customer": "Ada"}
    out = redact(value, frozenset({"customer"}))
    assert out["Password"] == out["api_key"] == out["customer"] == MASK
    assert out["nested"] == [{"auth_token": MASK, "q": "ok"}]
    assert out["body"].startswith("x" * 256) and out["body"].endswith("(1000 characters)")


def test_audit_modes() -> None:
    value = {"token": "secret", "n": 1}
    assert AuditSettings("full").keep(value) == (24, value)
    assert AuditSettings("redacted").keep(value) == (24, {"token": MASK, "n": 1})
    assert AuditSettings("none").keep(value) == (24, None)
    big = {"blob": "y" * 100_000}
    size, kept = AuditSettings("full").keep(big)
    assert size > 100_000 and "_omitted" in kept


async def test_rows_past_the_retention_are_pruned_in_the_background(tmp_path: Path) -> None:
    h = await SqliteCallHistory.open(tmp_path / "h.sqlite", retention_seconds=60,
                                     prune_interval=0.05)
    try:
        now = time.time()
        h.add(row(1, started_at=now - 3600))
        h.add(row(2, started_at=now))
        for _ in range(200):
            rows, _ = await h.query(CallQuery())
            if len(rows) == 1:
                break
            await asyncio.sleep(0.05)
        assert [r.call_id for r in rows] == ["c2"] and h.pruned == 1
    finally:
        await h.aclose()


def test_the_kept_copy_is_encoded_once_and_reused() -> None:
    plain = {"text": "hello", "n": [1, 2]}
    size, kept, kept_json = AuditSettings("redacted").keep_encoded(plain)
    assert kept is plain and kept_json == '{"text":"hello","n":[1,2]}' and size == 26
    secret = {"q": "ok", "nested": {"api_key": "k"}}
    size, kept, kept_json = AuditSettings("redacted").keep_encoded(secret)
    assert kept == {"q": "ok", "nested": {"api_key": MASK}} and secret["nested"]["api_key"] == "k"
    assert kept_json == '{"q":"ok","nested":{"api_key":"***"}}'
    assert AuditSettings("redacted").keep_encoded({1: "a"})[1:] == ({"1": "a"}, '{"1":"a"}')
    assert AuditSettings("none").keep_encoded(plain) == (26, None, None)
    odd = {"when": object()}  # not JSON: sized by its repr, kept through str()
    size, kept, kept_json = AuditSettings("full").keep_encoded(odd)
    assert size == len(repr(odd)) and kept is odd and kept_json is not None
    assert kept_json.startswith('{"when":"<object object at')


async def test_the_stored_input_is_the_kept_copy(history: SqliteCallHistory) -> None:
    settings = AuditSettings("redacted", frozenset({"customer"}))
    for i, value in enumerate([{"text": "é"}, {"customer": "Ada", "x": "y" * 300}, "raw"]):
        size, kept, kept_json = settings.keep_encoded(value)
        history.add(row(i, input=kept, input_bytes=size, input_json=kept_json))
    history.add(row(9, input={"written": "without its JSON"}))
    rows, _ = await history.query(CallQuery())
    assert [r.input for r in rows] == [
        {"written": "without its JSON"}, "raw",
        {"customer": MASK, "x": "y" * 256 + "... (300 characters)"}, {"text": "é"},
    ]
    assert rows[-1].input_bytes == 13  # bytes of UTF-8 (12 characters)


async def test_gathered_rows_are_written_before_a_query_and_at_close(tmp_path: Path) -> None:
    """Rows wait up to `gather_seconds` to be written together; a query or the close never
    waits for that, nor misses a row."""
    h = await SqliteCallHistory.open(tmp_path / "h.sqlite", gather_seconds=3600)
    for i in range(3):
        h.add(row(i))
    rows, _ = await h.query(CallQuery())
    assert [r.call_id for r in rows] == ["c2", "c1", "c0"]
    h.add(row(3))
    h.add(row(4))
    await h.aclose()
    h = await SqliteCallHistory.open(tmp_path / "h.sqlite")
    try:
        rows, _ = await h.query(CallQuery())
    finally:
        await h.aclose()
    assert [r.call_id for r in rows] == ["c4", "c3", "c2", "c1", "c0"]


async def test_a_history_from_before_errors_and_tokens_gains_their_columns(
    tmp_path: Path,
) -> None:
    """A file written by an older sidecar (no `error`, `content_tokens` or `guardrail`) keeps
    its rows and gains the columns; its old rows have no token count and no decisions."""
    import sqlite3

    path = tmp_path / "history.sqlite"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE calls (seq INTEGER PRIMARY KEY AUTOINCREMENT, call_id TEXT NOT NULL,
            tool TEXT NOT NULL, server TEXT, profile TEXT, session_id TEXT NOT NULL,
            agent TEXT NOT NULL, message_id TEXT NOT NULL, status TEXT NOT NULL,
            error_kind TEXT, started_at REAL NOT NULL, duration_ms REAL NOT NULL,
            input_bytes INTEGER NOT NULL, input TEXT, content_bytes INTEGER NOT NULL,
            retained TEXT NOT NULL, replayed INTEGER NOT NULL);
        INSERT INTO calls (call_id, tool, session_id, agent, message_id, status, started_at,
            duration_ms, input_bytes, content_bytes, retained, replayed)
            VALUES ('old', 'echo', 's', 'a', 'm', 'completed', 1.0, 1.0, 2, 3, '[]', 0);
    """)
    db.close()
    history = await SqliteCallHistory.open(path)
    try:
        history.add(row(1, content_tokens=7,
                        guardrail=({"stage": "input", "rule": "hook", "decision": "deny"},)))
        rows, _ = await history.query(CallQuery())
    finally:
        await history.aclose()
    assert [(r.call_id, r.error, r.content_tokens, r.guardrail) for r in rows] == [
        ("c1", None, 7, ({"stage": "input", "rule": "hook", "decision": "deny"},)),
        ("old", None, None, None)]
