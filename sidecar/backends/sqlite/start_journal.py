"""`StartJournal`: the starts of the calls an outcome log has claimed and not yet settled, one
line appended per call to a private file (`<outcomes file>-starts`) before the call runs, and
the outcome row of each call that settled, appended before its answer leaves and kept until the
row is committed to SQLite behind it.

A line is one `write` to the page cache (a few µs, durable once written, as a WAL commit with
`synchronous=NORMAL`: it survives the process being killed); a SQLite row cost its own commit
and a second statement to delete it, and committing the outcome row on the call's path cost
~70 µs of the daemon's CPU (2026-12-06). A call cancelled before it settled appends a release.
At the next open, `read_all` gives the settled rows (the log inserts those SQLite lacks) and the
starts neither released nor settled (the log turns those without an outcome into `interrupted`
outcomes), then the file is emptied. While running, the file is rewritten with only the calls
still running and the rows not yet in SQLite (its live lines) once it passes `ROTATE_BYTES` and
at least half of it is lines no longer needed: a rewrite copies at most as many bytes as were
appended since the last one (docs/state.md says why).

Imports `sidecar.stores.state_dir` and `sidecar.model.json_text`. Exports `StartJournal`,
`Start`, `ROTATE_BYTES`.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, NamedTuple

from sidecar.model.json_text import compact
from sidecar.stores.state_dir import PRIVATE_FILE_MODE

__all__ = ["ROTATE_BYTES", "ROW_COLUMNS", "Start", "StartJournal"]

ROW_COLUMNS = ("location", "call_id", "session_id", "agent", "message_id", "tool", "status",
               "body", "created_at", "fingerprint")
"""An outcome row as `settle` takes it (the outcome log's columns, in its order)."""
SETTLED = "settled"

ROTATE_BYTES = 1 << 20
"""The file is rewritten with the running calls alone once it is larger (~8,000 calls)."""

logger = logging.getLogger("sidecar.stores.outcome_log")


class Start(NamedTuple):
    location: str
    call_id: str
    tool: str
    fingerprint: str
    started_at: float


class StartJournal:
    """Use from one thread (the event loop): `start`, `settled`, `release`, `close`."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd = _open(path, os.O_APPEND)
        self._size = os.fstat(self._fd).st_size
        self._running: dict[tuple[str, str], bytes] = {}
        self._unwritten: dict[tuple[str, str], bytes] = {}
        """Settled rows SQLite does not have yet (`written` drops them)."""
        self._live = 0
        """The bytes of the lines in `_running` and `_unwritten`: what a rewrite keeps."""

    @staticmethod
    def read(path: Path) -> list[Start]:
        """The starts in `path` that were neither released nor settled (a line that cannot be
        read, such as one torn by a power cut, is skipped with a warning)."""
        return StartJournal.read_all(path)[0]

    @staticmethod
    def read_all(path: Path) -> tuple[list[Start], list[tuple[Any, ...]]]:
        """`read`'s starts, and the outcome rows of the calls that settled (`settle`), in the
        order they were written."""
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            return [], []
        starts: dict[tuple[str, str], Start] = {}
        settled: list[tuple[Any, ...]] = []
        for number, line in enumerate(text.splitlines(), 1):
            try:
                fields = json.loads(line)
                if fields[0] == "release" and len(fields) == 3:
                    starts.pop((str(fields[1]), str(fields[2])), None)
                    continue
                if fields[0] == SETTLED and len(fields) == len(ROW_COLUMNS) + 1:
                    if not isinstance(fields[8], str):  # the body as its JSON value
                        fields[8] = json.dumps(fields[8], ensure_ascii=False,
                                               separators=(",", ":"))
                    row = tuple(fields[1:])
                    if not all(isinstance(v, str) for k, v in zip(ROW_COLUMNS, row, strict=True)
                               if k != "created_at") or not isinstance(row[8], int | float):
                        raise ValueError(row)
                    starts.pop((row[0], row[1]), None)
                    settled.append(row)
                    continue
                start = Start(str(fields[0]), str(fields[1]), str(fields[2]), str(fields[3]),
                              float(fields[4]))
            except (ValueError, IndexError, TypeError):
                logger.warning("%s line %d: not a call start, skipped", path, number)
                continue
            starts[(start.location, start.call_id)] = start
        return list(starts.values()), settled

    def empty(self) -> None:
        """Forget every line (after the open turned them into outcomes)."""
        os.ftruncate(self._fd, 0)
        self._size = self._live = 0
        self._running.clear()
        self._unwritten.clear()

    def start(self, location: str, call_id: str, tool: str, fingerprint: str,
              started_at: float) -> None:
        fields = [location, call_id, tool, fingerprint, started_at]
        line = (compact(fields) or json.dumps(fields, ensure_ascii=False).encode()) + b"\n"
        self._write(line)
        self._keep(self._running, (location, call_id), line)

    def settled(self, location: str, call_id: str) -> None:
        """Its outcome is committed: nothing to write (the outcome row says so)."""
        self._drop(self._running, (location, call_id))

    def settle(self, row: tuple[Any, ...], body_json: bytes | None = None) -> None:
        """The call settled: its outcome row (`ROW_COLUMNS`), kept here until `written`.
        `body_json`: the row's body as compact JSON bytes, written as the JSON value it is
        (not escaped again as a string: a long text's every quote and backslash would be)."""
        head = compact([SETTLED, *row[:7]], allow_nan=False)
        tail = compact([row[8], row[9]], allow_nan=False)
        if body_json is not None and head is not None and tail is not None:
            line = head[:-1] + b"," + body_json + b"," + tail[1:] + b"\n"
        else:
            line = (compact([SETTLED, *row], allow_nan=False) or json.dumps(
                [SETTLED, *row], ensure_ascii=False, allow_nan=False).encode()) + b"\n"
        key = (row[0], row[1])
        self._write(line)
        self._drop(self._running, key)
        self._keep(self._unwritten, key, line)

    def written(self, location: str, call_id: str) -> None:
        """Its settled row is committed to SQLite: a rotation need not keep it."""
        self._drop(self._unwritten, (location, call_id))

    def release(self, location: str, call_id: str) -> None:
        if self._drop(self._running, (location, call_id)):
            self._write(json.dumps(["release", location, call_id],
                                   ensure_ascii=False).encode() + b"\n")

    def _keep(self, lines: dict[tuple[str, str], bytes], key: tuple[str, str],
              line: bytes) -> None:
        self._drop(lines, key)
        lines[key] = line
        self._live += len(line)

    def _drop(self, lines: dict[tuple[str, str], bytes], key: tuple[str, str]) -> bool:
        line = lines.pop(key, None)
        if line is None:
            return False
        self._live -= len(line)
        return True

    def _write(self, line: bytes) -> None:
        size = self._size + len(line)
        if size > ROTATE_BYTES and size > 2 * self._live:
            self._rotate()
        os.write(self._fd, line)
        self._size += len(line)

    def _rotate(self) -> None:
        """Rewrite the file with the running calls alone (a new file renamed over it)."""
        fresh = self._path.with_name(self._path.name + ".new")
        kept = b"".join(self._running.values()) + b"".join(self._unwritten.values())
        fd = _open(fresh, os.O_APPEND | os.O_TRUNC)
        try:
            os.write(fd, kept)
            os.replace(fresh, self._path)
        except BaseException:
            os.close(fd)
            raise
        os.close(self._fd)
        self._fd, self._size = fd, len(kept)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _open(path: Path, flags: int) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | flags,
                   PRIVATE_FILE_MODE)
