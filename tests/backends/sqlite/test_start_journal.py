"""`StartJournal`, the starts of running calls appended before each call runs: a start not
settled or released is read back (and only then), a torn line is skipped, the file is
rewritten with the running calls alone past its size limit, and it is private (0600)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from sidecar.backends.sqlite import start_journal
from sidecar.backends.sqlite.start_journal import Start, StartJournal


def test_starts_not_settled_nor_released_are_read_back(tmp_path: Path) -> None:
    path = tmp_path / "outcomes.sqlite-starts"
    journal = StartJournal(path)
    journal.start("loc", "a", "echo", "fp-a", 1.0)
    journal.start("loc", "b", "echo", "fp-b", 2.0)
    journal.start("loc", "c", "deploy", "fp-c", 3.0)
    journal.settled("loc", "a")  # its outcome row says so: the line stays
    journal.release("loc", "b")  # cancelled before it settled: a release line
    journal.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    read = {s.call_id: s for s in StartJournal.read(path)}
    assert read["c"] == Start("loc", "c", "deploy", "fp-c", 3.0)
    assert "b" not in read
    assert "a" in read  # the open skips it because its outcome exists


def test_a_torn_line_is_skipped_with_a_warning(tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "starts"
    journal = StartJournal(path)
    journal.start("loc", "a", "echo", "", 1.0)
    journal.close()
    with path.open("ab") as file:
        file.write(b'["loc", "b", "ec')  # a power cut mid-line
    assert [s.call_id for s in StartJournal.read(path)] == ["a"]
    assert "line 2: not a call start" in caplog.text


@pytest.fixture
def small(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, StartJournal]:
    """A journal rewritten past 2,000 bytes."""
    monkeypatch.setattr(start_journal, "ROTATE_BYTES", 2_000)
    path = tmp_path / "starts"
    return path, StartJournal(path)


def test_past_its_limit_the_file_keeps_only_the_running_calls(
    small: tuple[Path, StartJournal],
) -> None:
    path, journal = small
    journal.start("loc", "long-running", "deploy", "", 1.0)
    for i in range(200):
        journal.start("loc", f"c{i}", "echo", "", 2.0)
        journal.settled("loc", f"c{i}")
    assert path.stat().st_size <= 2_000
    journal.close()
    ids = {s.call_id for s in StartJournal.read(path)}
    assert "long-running" in ids and "c0" not in ids
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_empty_forgets_every_line(tmp_path: Path) -> None:
    path = tmp_path / "starts"
    journal = StartJournal(path)
    journal.start("loc", "a", "echo", "", 1.0)
    journal.empty()
    journal.start("loc", "b", "echo", "", 2.0)
    journal.close()
    assert [s.call_id for s in StartJournal.read(path)] == ["b"]


def row(call_id: str, body: str = '{"status":"completed"}') -> tuple[object, ...]:
    return ("loc", call_id, "s", "a", "m", "echo", "completed", body, 5.0, "fp")


def test_settled_rows_are_read_back_and_their_starts_are_settled(tmp_path: Path) -> None:
    path = tmp_path / "starts"
    journal = StartJournal(path)
    journal.start("loc", "a", "echo", "fp", 1.0)
    journal.start("loc", "b", "echo", "fp", 2.0)
    journal.settle(row("a", 'text with\na newline, "quotes" and é'))
    journal.close()
    with path.open("ab") as file:
        file.write(b'["settled", "loc", "c", "s"')  # a power cut mid-line
    starts, settled = StartJournal.read_all(path)
    assert [s.call_id for s in starts] == ["b"]
    assert settled == [row("a", 'text with\na newline, "quotes" and é')]


def test_past_its_limit_the_file_keeps_the_rows_sqlite_lacks(
    small: tuple[Path, StartJournal],
) -> None:
    path, journal = small
    journal.settle(row("kept"))  # never `written`: SQLite does not have it
    for i in range(100):
        journal.start("loc", f"c{i}", "echo", "", 2.0)
        journal.settle(row(f"c{i}"))
        journal.written("loc", f"c{i}")
    assert path.stat().st_size <= 2_000
    journal.close()
    starts, settled = StartJournal.read_all(path)
    assert starts == [] and row("kept") in settled and row("c0") not in settled


def test_a_body_given_as_json_is_written_as_its_value_and_read_back_as_text(
    tmp_path: Path,
) -> None:
    path = tmp_path / "starts"
    journal = StartJournal(path)
    body = '{"content":[{"type":"text","text":"a \\"quoted\\" line\\n\\u00e9"}]}'
    journal.settle(row("raw", body), body.encode())
    journal.close()
    assert b'"status":' not in path.read_bytes()  # (the value, not an escaped string)
    assert b',{"content":[' in path.read_bytes()
    _, settled = StartJournal.read_all(path)
    assert len(settled) == 1 and json.loads(settled[0][7]) == json.loads(body)
    assert settled[0][:7] == row("raw")[:7] and settled[0][8:] == row("raw")[8:]


def test_rows_sqlite_lacks_past_the_limit_are_not_copied_again_at_every_line(
    small: tuple[Path, StartJournal], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SQLite behind (its commits not yet `written`, as while the loop is busy): the live
    rows alone pass the limit. A rewrite copies them only once the file holds as many bytes
    of lines no longer needed, not at every line (before: 300 calls here, 299 rewrites)."""
    path, journal = small
    copied: list[int] = []
    rotate = journal._rotate

    def counted() -> None:
        copied.append(journal._live)
        rotate()

    monkeypatch.setattr(journal, "_rotate", counted)
    body = "x" * 200
    for i in range(300):  # ~90 KB of rows, none written to SQLite
        journal.start("loc", f"c{i}", "echo", "fp", 1.0)
        journal.settle(row(f"c{i}", body))
    assert len(copied) <= 8 and sum(copied) <= 2 * path.stat().st_size, copied
    for i in range(300):  # committed at last: the next rewrite drops them
        journal.written("loc", f"c{i}")
    journal.start("loc", "running", "echo", "fp", 2.0)
    for _ in range(40):
        journal.release("loc", "running")
        journal.start("loc", "running", "echo", "fp", 2.0)
    assert path.stat().st_size <= 2_000
    journal.close()
    starts, settled = StartJournal.read_all(path)
    assert [s.call_id for s in starts] == ["running"] and settled == []


def test_every_row_sqlite_lacks_survives_the_rewrites(small: tuple[Path, StartJournal]) -> None:
    path, journal = small
    for i in range(300):
        journal.start("loc", f"c{i}", "echo", "fp", 1.0)
        journal.settle(row(f"c{i}", "y" * 100))
        if i % 3:  # two rows in three reached SQLite
            journal.written("loc", f"c{i}")
        assert path.stat().st_size <= max(2_000, 2 * journal._live) + 400  # (a line)
    journal.start("loc", "running", "echo", "fp", 2.0)
    journal.close()
    starts, settled = StartJournal.read_all(path)
    assert [s.call_id for s in starts] == ["running"]
    assert {r[1] for r in settled} >= {f"c{i}" for i in range(0, 300, 3)}
