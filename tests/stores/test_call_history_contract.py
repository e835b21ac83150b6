"""`CallHistory` contract: rows newest first with every field, filters and cursor pages, a
query sees every row added before it, rows kept across a restart, pruning in batches (and in
the background with a retention period); two histories on one storage see each other's rows
(a daemon and `sidecar calls --embedded`, or two replicas of a fleet)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from sidecar.backends.postgres.call_history import PostgresCallHistory
from sidecar.backends.sqlite.call_history import SqliteCallHistory
from sidecar.model.content import ImageContent, ResourceContent, TextContent
from sidecar.model.errors import CallError, ErrorKind
from sidecar.model.outcome import Outcome
from sidecar.model.token_count import count_tokens
from sidecar.stores.call_history import CallHistory, CallQuery, CallRecord, InvalidQuery
from tests.fleet.postgres import PostgresServer

pytestmark = pytest.mark.anyio

OpenHistory = Callable[..., Awaitable[CallHistory]]
"""Opens the same history anew; keyword arguments: `retention_seconds`, `prune_interval`."""


async def _sqlite(tmp_path: Path, request: pytest.FixtureRequest) -> OpenHistory:
    return lambda **options: SqliteCallHistory.open(tmp_path / "history.sqlite", **options)


async def _postgres(tmp_path: Path, request: pytest.FixtureRequest) -> OpenHistory:
    """A fresh database on the session's real PostgreSQL server (a pool per open)."""
    from sidecar.backends.postgres.pool import open_pool

    server: PostgresServer = request.getfixturevalue("postgres_server")
    dsn = await server.new_database()

    async def open_one(**options: Any) -> CallHistory:
        pool = await open_pool(dsn, max_size=2)
        return await PostgresCallHistory.on_pool(pool, owns_pool=True, **options)

    return open_one


IMPLEMENTATIONS = [pytest.param(_sqlite, id="sqlite"), pytest.param(_postgres, id="postgres")]


@pytest.fixture(params=IMPLEMENTATIONS)
async def open_history(request: pytest.FixtureRequest,
                       tmp_path: Path) -> AsyncIterator[OpenHistory]:
    make = await request.param(tmp_path, request)
    opened: list[CallHistory] = []

    async def open_one(**options: Any) -> CallHistory:
        history = await make(**options)
        opened.append(history)
        return history

    yield open_one
    for history in opened:
        await history.aclose()


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


async def test_rows_come_back_newest_first_with_every_field(open_history: OpenHistory) -> None:
    history = await open_history()
    history.add(row(1, retained=("m_abc",), error_kind="upstream", status="error",
                    replayed=True, profile="coding", input={"nested": [1, "two", None]}))
    history.add(row(2, input=None))
    rows, cursor = await history.query(CallQuery())
    assert [r.call_id for r in rows] == ["c2", "c1"] and cursor is None
    first = rows[1]
    assert first == row(1, retained=("m_abc",), error_kind="upstream", status="error",
                        replayed=True, profile="coding", input={"nested": [1, "two", None]},
                        seq=first.seq)
    assert rows[0].input is None and rows[0].seq > first.seq


async def test_rows_keep_the_guardrails_decisions(open_history: OpenHistory) -> None:
    decisions = ({"stage": "input", "rule": "secrets", "decision": "allow"},
                 {"stage": "output", "rule": "secrets", "decision": "redact",
                  "kinds": ["AWS Access Key"], "count": 1})
    history = await open_history()
    history.add(row(1, guardrail=decisions))
    history.add(row(2))
    rows, _ = await history.query(CallQuery())
    assert [(r.call_id, r.guardrail) for r in rows] == [("c2", None), ("c1", decisions)]
    assert rows[1].to_json()["guardrail"] == list(decisions)
    assert rows[0].to_json()["guardrail"] is None


async def test_filters_and_cursor_pages(open_history: OpenHistory) -> None:
    history = await open_history()
    for i in range(1, 26):
        history.add(row(i))
    echo, _ = await history.query(CallQuery(tool="echo", limit=1000))
    assert {r.tool for r in echo} == {"echo"} and len(echo) == 13
    session, _ = await history.query(CallQuery(session="s0", server="up"))
    assert session and all(r.session_id == "s0" and r.server == "up" for r in session)
    window, _ = await history.query(CallQuery(since=1_000_010.0, until=1_000_015.0))
    assert [r.call_id for r in window] == ["c14", "c13", "c12", "c11", "c10"]
    assert (await history.query(CallQuery(agent="nobody")))[0] == []
    seen: list[str] = []
    cursor: str | None = None
    while True:
        page, cursor = await history.query(CallQuery(limit=10, cursor=cursor))
        seen += [r.call_id for r in page]
        if cursor is None:
            break
    assert seen == [f"c{i}" for i in range(25, 0, -1)]


async def test_a_forged_cursor_is_a_clear_error(open_history: OpenHistory) -> None:
    history = await open_history()
    with pytest.raises(InvalidQuery, match="cursor"):
        await history.query(CallQuery(cursor="not-ours"))


async def test_rows_survive_a_restart(open_history: OpenHistory) -> None:
    history = await open_history()
    history.add(row(1))
    await history.aclose()  # writes what is pending
    reopened = await open_history()
    assert [r.call_id for r in (await reopened.query(CallQuery()))[0]] == ["c1"]


async def test_two_histories_on_one_storage_see_each_others_rows(
    open_history: OpenHistory,
) -> None:
    a = await open_history()
    b = await open_history()
    a.add(row(1))
    await a.query(CallQuery())  # written
    b.add(row(2))
    assert [r.call_id for r in (await b.query(CallQuery()))[0]] == ["c2", "c1"]
    assert [r.call_id for r in (await a.query(CallQuery()))[0]] == ["c2", "c1"]


async def test_prune_deletes_old_rows_in_batches(open_history: OpenHistory) -> None:
    history = await open_history()
    for i in range(1, 1201):
        history.add(row(i))
    assert await history.prune(1_000_000.0 + 1101, batch=100) == 1100
    rows, _ = await history.query(CallQuery(limit=1000))
    assert len(rows) == 100 and rows[-1].call_id == "c1101"


async def test_rows_past_the_retention_are_pruned_in_the_background(
    open_history: OpenHistory,
) -> None:
    history = await open_history(retention_seconds=60, prune_interval=0.05)
    now = time.time()
    history.add(row(1, started_at=now - 3600))
    history.add(row(2, started_at=now))
    for _ in range(200):
        rows, _ = await history.query(CallQuery())
        if len(rows) == 1:
            break
        await asyncio.sleep(0.05)
    assert [r.call_id for r in rows] == ["c2"]


async def test_rows_carry_the_tokens_of_what_the_model_read(open_history: OpenHistory) -> None:
    """The writer counts the tokens of each row's outcome (text items and embedded text, or a
    failed call's error message); a row without an outcome has no count."""
    text = "The quick brown fox jumps over the lazy dog. " * 40
    completed = Outcome(call_id="c1", tool="echo", status="completed",
                        content=(TextContent(text), ImageContent("aGk=", "image/png"),
                                 ResourceContent("file:///a", text="résumé ✓")))
    failed = Outcome.failed("c2", "echo", CallError(ErrorKind.UPSTREAM, "the server hung up"))
    history = await open_history()
    history.add(row(1, outcome=completed))
    history.add(row(2, outcome=failed, status="error", error_kind="upstream",
                    error="the server hung up"))
    history.add(row(3))
    rows, _ = await history.query(CallQuery())
    tokens = {r.call_id: r.content_tokens for r in rows}
    assert tokens == {"c1": count_tokens(text + "\nrésumé ✓"),
                      "c2": count_tokens("the server hung up"), "c3": None}
    assert tokens["c1"] is not None and 400 < tokens["c1"] < 500
    assert rows[2].to_json()["content_tokens"] == tokens["c1"]
    assert "outcome" not in rows[2].to_json()
