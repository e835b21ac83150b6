"""The sandbox: a pool of `monty` worker processes that run Code Mode programs.

`pydantic-monty` runs every program in a worker subprocess it manages (a crashed or killed
worker is replaced; the daemon is never at risk). Each run checks out a fresh session, feeds a
prelude (`import asyncio`, `import tools`), then the program. Host functions (the tools) run
here, on the daemon's event loop; the worker only ever sees their JSON values.

Ending a run early (a limit, a declined permission, `execute` cancelled) cancels the feed;
closing a session whose feed was cancelled discards its worker process, so a runaway program
never survives its run. Limits enforced inside the worker (CPU time, memory) surface as
errors of the program; wall time, output size and tool calls are enforced here.

    async with Sandbox() as sandbox:                 # workers start on the first run
        run = await sandbox.run(code, tools=tree, functions={...}, limits=limits,
                                guard=RunGuard())
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import pydantic_core
from pydantic_monty import (
    AsyncMonty,
    ExternalModule,
    MontyError,
    OSPolicy,
    ResourceLimits,
)

from sidecar.codemode.limits import CodeModeLimits
from sidecar.codemode.program import (
    NO_HOST_ACCESS,
    ProgramError,
    ProgramRun,
    from_monty,
    limit_error,
    refused_import,
    to_json_value,
)
from sidecar.model.errors import SidecarError

PRELUDE = "import asyncio\nimport tools\n"
PROGRAM_FILE = "<python-input-1>"
"""How the sandbox names the program in tracebacks: the session's second feed."""

_SUSPENSION_BACKSTOP = 1_000_000
"""monty's own cap on host round trips cannot be disabled; tool calls are limited here."""
_SETTLE_SECONDS = 0.05
"""After the pool closes, monty's I/O threads may still call into the event loop for a few
milliseconds (pydantic-monty 1.4.0 then rarely aborts the interpreter at exit); wait them out."""

ToolTree = Mapping[str, "Callable[..., Any] | ToolTree"]


class SandboxClosed(SidecarError):
    """A run was asked of a sandbox that has been closed."""


class RunGuard:
    """Lets host callbacks end a run early with a reason (thread-safe; the first reason
    wins)."""

    __slots__ = ("_cancel", "_lock", "reason")

    def __init__(self) -> None:
        self.reason: ProgramError | None = None
        self._cancel: Callable[[], None] | None = None
        self._lock = threading.Lock()

    def stop(self, reason: ProgramError) -> None:
        with self._lock:
            if self.reason is not None:
                return
            self.reason = reason
            cancel = self._cancel
        if cancel is not None:
            cancel()

    def _arm(self, cancel: Callable[[], None] | None) -> None:
        with self._lock:
            self._cancel = cancel
            stopped = self.reason is not None
        if stopped and cancel is not None:
            cancel()


class _Printed:
    """The print sink: keeps up to the output limit, then stops the run. Called from a
    monty I/O thread."""

    __slots__ = ("_guard", "_limit", "_parts", "_size")

    def __init__(self, limit: int, guard: RunGuard) -> None:
        self._limit = limit
        self._guard = guard
        self._parts: list[str] = []
        self._size = 0

    def __call__(self, stream: str, text: str) -> None:
        if self._size > self._limit:
            return
        size = len(text.encode("utf-8", "surrogatepass"))
        if self._size + size > self._limit:
            room = self._limit - self._size
            self._parts.append(text.encode("utf-8", "surrogatepass")[:room].decode(
                "utf-8", "ignore"))
            self._size = self._limit + 1
            self._guard.stop(limit_error(
                "output", f"The program printed more than {self._limit:,} bytes. The run was "
                "stopped; print less (summaries, counts, the first items) or return a value.",
            ))
            return
        self._parts.append(text)
        self._size += size

    @property
    def size(self) -> int:
        return min(self._size, self._limit)

    def text(self) -> str:
        return "".join(self._parts)


def _refuse_os(*, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], is_async: bool,
               **_: Any) -> Any:
    raise PermissionError(f"{name}: {NO_HOST_ACCESS}")


def _module(tree: ToolTree) -> ExternalModule:
    return ExternalModule({
        key: _module(value) if isinstance(value, Mapping) else value
        for key, value in tree.items()
    })


def _resource_limits(limits: CodeModeLimits) -> ResourceLimits:
    return {
        "max_feed_duration_secs": limits.cpu_time,
        "max_memory": limits.memory_bytes,
        "max_suspensions": _SUSPENSION_BACKSTOP,
        "max_total_sleep_secs": limits.wall_time,
    }


def _os_policy(limits: CodeModeLimits) -> OSPolicy:
    return {"sleep": "system", "sleep_system_max": limits.wall_time}


class Sandbox:
    """A lazily started pool of monty workers; close it (or leave `async with`) to stop
    them. `max_workers` programs run at once; more wait for a worker (within their wall
    time)."""

    def __init__(
        self, *, max_workers: int = 2, warm_workers: int = 1, binary_path: str | None = None
    ) -> None:
        if max_workers < 1 or not 0 <= warm_workers <= max_workers:
            raise ValueError("Sandbox needs max_workers >= 1 and 0 <= warm_workers <= max_workers")
        self.max_workers = max_workers
        self.warm_workers = warm_workers
        self.binary_path = binary_path
        self._pool: AsyncMonty | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        async with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
            if pool is not None:
                await pool.__aexit__(None, None, None)
                await asyncio.sleep(_SETTLE_SECONDS)

    async def _started(self) -> AsyncMonty:
        async with self._lock:
            if self._closed:
                raise SandboxClosed("the Code Mode sandbox is closed")
            if self._pool is None:
                pool = AsyncMonty(
                    binary_path=self.binary_path,
                    min_processes=self.warm_workers,
                    max_processes=self.max_workers,
                )
                await pool.__aenter__()
                self._pool = pool
            return self._pool

    async def run(
        self,
        code: str,
        *,
        tools: ToolTree,
        functions: Mapping[str, Callable[..., Any]],
        limits: CodeModeLimits,
        guard: RunGuard,
    ) -> ProgramRun:
        """Run `code` to its end or to the first limit. Program failures come back in
        `ProgramRun.error`; a failure of the sandbox itself raises. Cancelling this call
        stops the program and discards its worker before the cancellation propagates."""
        started = time.perf_counter()
        size = len(code.encode("utf-8", "surrogatepass"))
        if size > limits.max_code_bytes:
            too_big = limit_error("code_size", f"The program is {size:,} bytes; the limit is "
                                  f"{limits.max_code_bytes:,}.")
            return ProgramRun("", None, too_big, 0.0)
        refused = refused_import(code)
        if refused is not None:
            return ProgramRun("", None, refused, 0.0)
        pool = await self._started()
        printed = _Printed(limits.max_output_bytes, guard)
        worker: list[int | None] = [None]
        feed = asyncio.ensure_future(
            self._feed(pool, code, tools, functions, limits, printed, worker)
        )
        loop = asyncio.get_running_loop()

        def cancel_feed() -> None:
            loop.call_soon_threadsafe(feed.cancel)

        guard._arm(cancel_feed)
        try:
            done, _ = await asyncio.wait({feed}, timeout=limits.wall_time)
            if not done:
                guard.stop(limit_error(
                    "wall_time", f"The program ran longer than {limits.wall_time:g} s (tool "
                    "calls included). The run was stopped.",
                ))
                await asyncio.wait({feed})
        except asyncio.CancelledError:
            feed.cancel()
            await asyncio.wait({feed})
            raise
        finally:
            guard._arm(None)
        duration = time.perf_counter() - started
        error: ProgramError | None = guard.reason
        result: Any = None
        if error is None:
            exc = feed.exception() if not feed.cancelled() else None
            if isinstance(exc, MontyError):
                error = from_monty(exc, PROGRAM_FILE)
            elif exc is not None:
                raise exc
            elif feed.cancelled():  # cancelled without a reason: never expected
                raise RuntimeError("the Code Mode feed was cancelled without a reason")
            else:
                result = to_json_value(feed.result())
                error = _oversized(result, printed.size, limits)
                if error is not None:
                    result = None
        return ProgramRun(printed.text(), result, error, duration, worker[0])

    async def _feed(
        self,
        pool: AsyncMonty,
        code: str,
        tools: ToolTree,
        functions: Mapping[str, Callable[..., Any]],
        limits: CodeModeLimits,
        printed: _Printed,
        worker: list[int | None],
    ) -> Any:
        session = pool.checkout(
            limits=_resource_limits(limits),
            os_policy=_os_policy(limits),
            external_modules={"tools": _module(tools)},
        )
        async with session:
            worker[0] = pid = session.worker_pid
            try:
                await session.feed_run(PRELUDE, os=_refuse_os)
                return await session.feed_run(
                    code, external_lookup=dict(functions), print_callback=printed, os=_refuse_os
                )
            except asyncio.CancelledError:
                # monty sometimes returns the worker of a cancelled feed to the pool; a
                # stopped program must not outlive its run, so its process goes now (the
                # session then discards it and the pool starts a fresh one when needed)
                if pid is not None:
                    _kill_worker(pid)
                raise


def _kill_worker(pid: int) -> None:
    """SIGKILL one of our own worker processes (checked via /proc where there is one)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            parent = int(stat.read().rsplit(b")", 1)[1].split()[1])
        if parent != os.getpid():
            return
    except FileNotFoundError:
        if os.path.isdir("/proc"):
            return  # already gone
    except (OSError, ValueError, IndexError):
        pass
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _oversized(result: Any, printed: int, limits: CodeModeLimits) -> ProgramError | None:
    if result is None or isinstance(result, bool | int | float):
        return None
    size = len(pydantic_core.to_json(result)) + printed
    if size <= limits.max_output_bytes:
        return None
    return limit_error(
        "output", f"The program's output and result are {size:,} bytes; the limit is "
        f"{limits.max_output_bytes:,}. Return or print less (summaries, counts, the first items).",
    )
