"""Running greps: admission per owner, their own threads, and killable matching. Imports its
`managed_store` siblings; exports `SearchLimits`, `Searches`, `LineMatcher`, `TooManySearches`.

RE2 matches in time linear in the text, but the factor is the pattern's program size: a valid
pattern such as `a.{1000}.{1000}c` costs about 20 µs a byte, so one 3.5 MB line takes over a
minute, and an RE2 search cannot be stopped once started. So the matching runs in worker
processes (`search_worker`), fed batches of lines by the scanning thread, which waits for each
answer only until the search's deadline and kills the worker past it: the time limit holds
inside a line. Workers run at a lower priority (nice 10) than the daemon.
"""

from __future__ import annotations

import asyncio
import math
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypeVar

from managed_store.errors import ManagedStoreError, SearchTimeout
from managed_store.search_worker import HEADER

_T = TypeVar("_T")
_WORKER = Path(__file__).with_name("search_worker.py")
_POLL = 0.1  # how often a waiting scan looks at its stop flag (a cancelled request)

TIME_LIMIT_ENV = "SIDECAR_SEARCH_TIME_LIMIT"
PER_OWNER_ENV = "SIDECAR_SEARCHES_PER_CLIENT"
WORKERS_ENV = "SIDECAR_SEARCH_WORKERS"


class TooManySearches(ManagedStoreError):
    """The owner already runs as many searches as `SearchLimits.per_owner` allows."""


@dataclass(frozen=True, slots=True)
class SearchLimits:
    """`time_limit` seconds per search (from admission); `per_owner` concurrent searches per
    owner; `workers` searches running at once in the whole store (more wait their turn)."""

    time_limit: float = 30.0
    per_owner: int = 2
    workers: int = 4

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> SearchLimits:
        """`SIDECAR_SEARCH_TIME_LIMIT` (seconds), `SIDECAR_SEARCHES_PER_CLIENT` and
        `SIDECAR_SEARCH_WORKERS`, each defaulting to the field's default. A value that is not
        a positive number is a `ValueError` naming the variable."""
        default = cls()
        return cls(
            time_limit=_positive(environ, TIME_LIMIT_ENV, float, default.time_limit),
            per_owner=_positive(environ, PER_OWNER_ENV, int, default.per_owner),
            workers=_positive(environ, WORKERS_ENV, int, default.workers),
        )


def _positive(environ: Mapping[str, str], name: str, kind: type[_T], default: _T) -> _T:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)  # type: ignore[call-arg]
    except ValueError:
        value = None
    if not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a positive {kind.__name__}, got {raw!r}")
    return value


class LineMatcher:
    """What a scan calls for each batch of lines: `flags(lines, first_line)` gives one byte per
    line (1: it matches), or None when the search was cancelled (the scan then stops; its
    result is thrown away). Raises `SearchTimeout` past the deadline."""

    def __init__(self, worker: _Worker, ref_id: str, deadline: float, time_limit: float,
                 stop: threading.Event) -> None:
        self._worker, self._ref_id, self._stop = worker, ref_id, stop
        self._deadline, self._time_limit = deadline, time_limit

    def flags(self, lines: list[bytes], first_line: int) -> bytes | None:
        if self._stop.is_set():
            return None
        if time.monotonic() >= self._deadline:
            raise _timeout(self._ref_id, self._time_limit, first_line)
        self._worker.send(b"L", b"\n".join(lines))
        while True:
            left = self._deadline - time.monotonic()
            if self._stop.is_set() or left <= 0:
                # The worker is inside one RE2 search that nothing else can stop.
                self._worker.kill()
                if self._stop.is_set():
                    return None
                raise _timeout(self._ref_id, self._time_limit, first_line)
            if self._worker.answered(min(left, _POLL)):
                return self._worker.receive(len(lines))


def _timeout(ref_id: str, time_limit: float, line: int) -> SearchTimeout:
    return SearchTimeout(
        f"the search of {ref_id} stopped after {time_limit:g} s at line {line:,}: narrow the "
        "pattern or read the text in ranges"
    )


class Searches:
    """The running searches of one store (see the module docstring). Use from the event loop;
    `close` kills every worker.

    A thread pool of its own (`SearchLimits.workers` threads, never the event loop's default
    executor that file and SQLite I/O share), at most one worker process per thread, and a
    count of running searches per owner (`SearchLimits.per_owner`; one more is refused with
    `TooManySearches`). The deadline starts when the search is admitted, so a search waiting
    for a free thread also ends within the time limit."""

    def __init__(self, limits: SearchLimits) -> None:
        self.limits = limits
        self._running: dict[str, int] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()
        self._closed = False

    @contextmanager
    def admitted(self, owner: str | None) -> Iterator[None]:
        """Count one search of `owner` while the block runs; `TooManySearches` when it already
        runs `per_owner`. None counts nothing (only the thread pool bounds those)."""
        if owner is None:
            yield
            return
        cap = self.limits.per_owner
        if self._running.get(owner, 0) >= cap:
            raise TooManySearches(
                f"too many searches at once: {owner} already runs {cap}, the limit is {cap} "
                f"concurrent searches per client; wait for one to end (each ends within "
                f"{self.limits.time_limit:g} s)"
            )
        self._running[owner] = self._running.get(owner, 0) + 1
        try:
            yield
        finally:
            self._running[owner] -= 1
            if not self._running[owner]:
                del self._running[owner]

    async def in_thread(self, fn: Callable[[], _T]) -> _T:
        """`fn()` in a search thread (pattern compilation)."""
        return await asyncio.get_running_loop().run_in_executor(self._threads(), fn)

    async def run(self, ref_id: str, pattern: str, scan: Callable[[LineMatcher], _T], *,
                  time_limit: float | None = None) -> _T:
        """`scan(matcher)` in a search thread, matching `pattern` (already checked by
        `compile_pattern`) in a worker process, within `time_limit` seconds from now
        (default: `limits.time_limit`). A cancelled caller stops the scan (and kills its
        worker if it is mid-batch)."""
        limit = self.limits.time_limit if time_limit is None else time_limit
        deadline = time.monotonic() + limit
        stop = threading.Event()
        job = asyncio.get_running_loop().run_in_executor(
            self._threads(), self._scan, ref_id, pattern, scan, deadline, limit, stop)
        try:
            return await job
        finally:
            stop.set()

    def close(self) -> None:
        self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            idle, busy = self._idle, self._all.difference(self._idle)
            self._idle, self._all = [], busy
        for worker in idle:
            worker.kill()
        for worker in busy:  # its thread sees the end of the pipe, fails and closes it
            worker.signal_kill()

    def _threads(self) -> ThreadPoolExecutor:
        if self._closed:
            raise ManagedStoreError("the managed store is closed: no search can start")
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.limits.workers, "managed-search")
        return self._executor

    def _scan(self, ref_id: str, pattern: str, scan: Callable[[LineMatcher], _T],
              deadline: float, limit: float, stop: threading.Event) -> _T:
        if time.monotonic() >= deadline:  # it waited its whole time for a thread
            raise _timeout(ref_id, limit, 1)
        worker = self._take()
        try:
            worker.use(pattern)
            return scan(LineMatcher(worker, ref_id, deadline, limit, stop))
        finally:
            self._give_back(worker)

    def _take(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.alive:
                    return worker
                self._all.discard(worker)
            if self._closed:
                raise ManagedStoreError("the managed store is closed: no search can start")
            worker = _Worker()
            self._all.add(worker)
            return worker

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            if worker.alive and not self._closed:
                self._idle.append(worker)
                return
            self._all.discard(worker)
        worker.kill()


class _Worker:
    """One `search_worker` process; used by one scanning thread at a time."""

    def __init__(self) -> None:
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", str(_WORKER)], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, bufsize=0, close_fds=True)
        except OSError as exc:
            raise ManagedStoreError(f"could not start a search worker: {exc}") from exc
        self._pattern: str | None = None

    @property
    def alive(self) -> bool:
        return self._proc.returncode is None and self._proc.poll() is None

    def use(self, pattern: str) -> None:
        if pattern != self._pattern:
            self.send(b"P", pattern.encode("utf-8"))
            self._pattern = pattern

    def send(self, kind: bytes, payload: bytes) -> None:
        try:
            self._stdin.write(HEADER.pack(kind, len(payload)))
            self._stdin.write(payload)
        except OSError as exc:  # BrokenPipeError: it died (out of memory, killed)
            self.kill()
            raise ManagedStoreError(f"the search worker ended unexpectedly: {exc}") from None

    def answered(self, timeout: float) -> bool:
        ready, _, _ = select.select([self._stdout], [], [], timeout)
        return bool(ready)

    def receive(self, count: int) -> bytes:
        header = self._read(HEADER.size)
        kind, size = HEADER.unpack(header)
        flags = self._read(size)
        if kind != b"F" or size != count:
            self.kill()
            raise ManagedStoreError("the search worker answered out of turn")
        return flags

    def signal_kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()

    def kill(self) -> None:
        """Kill, reap and close the pipes: only by the thread using it (or when idle)."""
        self.signal_kill()
        self._proc.wait()
        self._stdin.close()
        self._stdout.close()

    @property
    def _stdin(self) -> IO[bytes]:
        assert self._proc.stdin is not None
        return self._proc.stdin

    @property
    def _stdout(self) -> IO[bytes]:
        assert self._proc.stdout is not None
        return self._proc.stdout

    def _read(self, size: int) -> bytes:
        chunks, left = [], size
        while left:
            chunk = os.read(self._stdout.fileno(), left)
            if not chunk:
                self.kill()
                raise ManagedStoreError("the search worker ended unexpectedly")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
