"""One command run as its own process group, its output pumped into captures, its life bounded.
Imports `bridges.child_groups` and its `manifest_tools` siblings; exports `spawn`,
`supervise`, `ProcessSpec`, `Running`, `Exited`, `PipeChunks`, `signal_group`, `stop_group`.

    spawn (start_new_session: the child leads a new process group, no shell)
    -> pump stdout and stderr (and feed stdin) until the leader exits and the pipes close
    -> the leader exited: whatever is left in its group is killed (SIGKILL), so nothing a
       command started outlives its call or holds its pipes open
    -> timeout or cancellation: SIGTERM to the group, `terminate_grace` seconds, SIGKILL to the
       group, the leader reaped; a cancellation is re-raised, never turned into a result, even
       when a pump fails in the same loop turn (asyncio's TaskGroup then raises the failure)

Pipes are always drained: past a capture's hard cap the bytes are counted and discarded, so a
chatty child never blocks on a full pipe and its exit code stays meaningful. How the output is
read, and what memory that takes: `supervise`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bridges.child_groups import CHILD_GROUPS, die_with_parent
from bridges.manifest_tools.capture import OutputCapture
from bridges.manifest_tools.progress import LineProgress

STREAM_LIMIT = 1024 * 1024
PIPE_SIZE = 1024 * 1024
"""Kernel buffer of the output pipes (Linux; the default 64 KiB costs a wake-up per 64 KiB)."""
READ_SIZE = PIPE_SIZE
"""Bytes one read of an output pipe may take (a full pipe in one chunk)."""


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    argv: tuple[str, ...]
    cwd: Path
    env: Mapping[str, str]
    stdin: bytes | None
    timeout: float
    terminate_grace: float


@dataclass(frozen=True, slots=True)
class Exited:
    """How a run ended. `returncode` is the leader's (negative: killed by that signal), or None
    when it did not exit before the timeout. `timed_out` is also true when the leader exited
    but processes it started kept the output pipes open until the timeout."""

    pid: int
    returncode: int | None
    timed_out: bool


class Running:
    """A started command: its process and our read ends of its stdout and stderr pipes.

    The pipes are ours (not asyncio's), so they can be enlarged to `PIPE_SIZE` (fewer wake-ups
    per megabyte) and are closed by `close()` whatever the command's descendants still hold.
    """

    def __init__(
        self, proc: asyncio.subprocess.Process, readers: tuple[PipeChunks, PipeChunks]
    ) -> None:
        self.proc = proc
        self.stdout, self.stderr = readers

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self) -> None:
        self.stdout.close()
        self.stderr.close()


async def spawn(spec: ProcessSpec) -> Running:
    """Start the command; `OSError` (no such program, not executable, bad cwd) propagates."""
    out_read, out_write = _pipe()
    err_read, err_write = _pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            *spec.argv,
            stdin=asyncio.subprocess.PIPE if spec.stdin is not None
            else asyncio.subprocess.DEVNULL,
            stdout=out_write,
            stderr=err_write,
            cwd=spec.cwd,
            env=dict(spec.env),
            start_new_session=True,
            preexec_fn=die_with_parent(),  # dies with the daemon (`child_groups`)
        )
    except BaseException:
        for fd in (out_read, err_read):
            os.close(fd)
        raise
    finally:
        os.close(out_write)
        os.close(err_write)
    CHILD_GROUPS.add(proc.pid)
    stdout: PipeChunks | None = None
    try:
        stdout = PipeChunks(STREAM_LIMIT, out_read)  # each owns its pipe from here on
        stderr = PipeChunks(STREAM_LIMIT, err_read)
    except BaseException:
        if stdout is None:
            os.close(out_read)
        else:
            stdout.close()
        os.close(err_read)
        await stop_group(proc, 0)
        CHILD_GROUPS.remove(proc.pid)
        raise
    return Running(proc, (stdout, stderr))


def _pipe() -> tuple[int, int]:
    read_fd, write_fd = os.pipe()
    if hasattr(fcntl, "F_SETPIPE_SZ"):
        with contextlib.suppress(OSError):  # over /proc/sys/fs/pipe-max-size: keep the default
            fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    return read_fd, write_fd


class PipeChunks:
    """The read end of a pipe as the chunks the loop read, in order; `read()` returns the next
    one, b"" at the end. Reading pauses while more than `limit` bytes wait to be taken.

    With `fd`, the loop reads it itself (`add_reader`, then `os.read` of up to `READ_SIZE`: the
    kernel copies straight into the chunk, a full pipe at once). A read pipe transport reads at
    most 256 KiB at a time, and under uvloop copies every byte through its receive buffer first;
    for 1 GiB of output, reading ourselves took 6-7 % less daemon CPU in interleaved A/B runs
    (2026-12-03, both loops; `bench/RESULTS.md` history). `close()` stops reading and closes
    `fd`. Without `fd` the `*_received`/`connection_lost` methods feed it (tests).
    """

    def __init__(self, limit: int, fd: int | None = None) -> None:
        self._limit = limit
        self._chunks: collections.deque[bytes] = collections.deque()
        self._queued = 0
        self._ended = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._fd = -1 if fd is None else fd
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reading = False
        self._held = False
        if fd is not None:
            self._loop = asyncio.get_running_loop()
            os.set_blocking(fd, False)
            self._resume()

    @property
    def fd(self) -> int:
        """The pipe's read end (-1 once closed, or without one)."""
        return self._fd

    def hold(self) -> list[bytes] | None:
        """Stop reading and return the chunks read but not yet taken: `fd` is the caller's to
        read until `release()`. None (and nothing changes) at the end or without an `fd`."""
        if self._ended or self._fd < 0:
            return None
        self._pause()
        self._held = True
        chunks = list(self._chunks)
        self._chunks.clear()
        self._queued = 0
        return chunks

    def release(self) -> None:
        """Read `fd` again after `hold()`."""
        self._held = False
        self._resume()

    def _resume(self) -> None:
        if (
            not self._reading
            and not self._held
            and not self._ended
            and self._fd >= 0
            and self._loop is not None
        ):
            self._loop.add_reader(self._fd, self._read_ready)
            self._reading = True

    def _pause(self) -> None:
        if self._reading and self._loop is not None:
            self._loop.remove_reader(self._fd)
            self._reading = False

    def _read_ready(self) -> None:
        if not self._reading:  # a callback queued before `_pause()`: the fd may be held now
            return
        try:
            data = os.read(self._fd, READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.connection_lost(exc)
            return
        if data:
            self.data_received(data)
        else:
            self.eof_received()

    def data_received(self, data: bytes) -> None:
        self._chunks.append(data)
        self._queued += len(data)
        if self._queued > self._limit:
            self._pause()
        self._wake()

    def eof_received(self) -> None:
        self._ended = True
        self._pause()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self._error = exc
        self.eof_received()

    def close(self) -> None:
        """Stop reading and close the pipe; chunks already read can still be taken."""
        self._ended = True
        self._pause()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def read(self) -> bytes:
        while not self._chunks:
            if self._ended:
                if self._error is not None:
                    raise self._error
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = self._chunks.popleft()
        self._queued -= len(data)
        if self._queued <= self._limit // 2:
            self._resume()
        return data


async def supervise(
    running: Running,
    spec: ProcessSpec,
    stdout: OutputCapture,
    stderr: OutputCapture,
    progress: LineProgress | None = None,
) -> Exited:
    """Pump the output of `running` until it ends, or stop its group; see the module docstring.

    Memory per stream is bounded by the chunks read and not yet pumped (`STREAM_LIMIT`: reading
    pauses above it) plus what the capture keeps (see `capture`). Chunks go to the capture as
    the loop read them (`PipeChunks`, which reads the pipes itself), not through a
    `StreamReader`, which would copy every byte into its buffer and out again. Once a capture
    spools and no progress lines are published, the loop holds off and the pipe is read by the
    spool's threads instead (`OutputCapture.feed_from`). The output pipes are created by `spawn`
    (1 MiB kernel buffers) and closed on return, whatever happened, after any thread reading
    them let go, even if a process that escaped the group still holds their other end."""
    proc = running.proc
    returncode: int | None = None
    deadline = asyncio.timeout(spec.timeout)
    task = asyncio.current_task()
    cancelling = task.cancelling() if task is not None else 0
    try:
        async with deadline:
            async with asyncio.TaskGroup() as group:
                group.create_task(_pump(running.stdout, stdout, "stdout", progress))
                group.create_task(_pump(running.stderr, stderr, "stderr", progress))
                if spec.stdin is not None and proc.stdin is not None:
                    group.create_task(_feed(proc.stdin, spec.stdin))
                returncode = await proc.wait()
                signal_group(proc.pid, signal.SIGKILL)
    except TimeoutError:
        await stop_group(proc, spec.terminate_grace)
        if not deadline.expired():
            raise
        return Exited(proc.pid, returncode, timed_out=True)
    except BaseExceptionGroup as failed:  # a pump failed (e.g. the store could not retain)
        # Cancelled in the same loop turn, the TaskGroup raised the pump's error instead; from
        # Python 3.13 on it also re-arms the cancellation, which would cancel the stop below at
        # its first await and leave the group running. It is held while the group stops, then
        # propagates.
        held = 0
        while task is not None and task.cancelling() > cancelling:
            task.uncancel()
            held += 1
        try:
            await stop_group(proc, spec.terminate_grace)
        finally:
            if task is not None:
                for _ in range(held):
                    task.cancel()
        if held:
            raise asyncio.CancelledError() from failed.exceptions[0]
        raise failed.exceptions[0] from None
    except BaseException:  # cancellation: stop the group, then let it propagate
        await stop_group(proc, spec.terminate_grace)
        raise
    finally:
        running.close()
        CHILD_GROUPS.remove(proc.pid)  # the group was killed above, whichever way it ended
    return Exited(proc.pid, returncode, timed_out=False)


async def _pump(
    reader: PipeChunks,
    capture: OutputCapture,
    stream: str,
    progress: LineProgress | None,
) -> None:
    while data := await reader.read():
        if progress is not None:
            progress.feed(stream, data)
        await capture.feed(data)
        if progress is None and capture.takes_fd and (held := reader.hold()) is not None:
            for chunk in held:
                await capture.feed(chunk)
            if capture.takes_fd and await capture.feed_from(reader.fd):
                return
            reader.release()


async def _feed(writer: asyncio.StreamWriter, data: bytes) -> None:
    try:
        writer.write(data)
        await writer.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the command stopped reading its input; its exit code says what it made of it
    finally:
        writer.close()


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send `sig` to the process group `pgid`; a group that is already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def stop_group(proc: asyncio.subprocess.Process, grace: float) -> None:
    """SIGTERM the group, give the leader `grace` seconds, then SIGKILL the group and reap."""
    try:
        if proc.returncode is None and grace > 0:
            signal_group(proc.pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await proc.wait()
    finally:
        signal_group(proc.pid, signal.SIGKILL)
    await proc.wait()
