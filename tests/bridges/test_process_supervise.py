"""`supervise` when a pump fails: alone, the failure is raised; in the same loop turn as the
caller's cancellation, the cancellation is (asyncio's TaskGroup gives the failure priority)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from bridges.manifest_tools.capture import OutputCapture
from bridges.manifest_tools.process import ProcessSpec, spawn, supervise
from managed_store import ManagedStore, RetentionError

pytestmark = pytest.mark.anyio

SLEEPER = "import time; print('ready', flush=True); time.sleep(30)"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ManagedStore]:
    async with await ManagedStore.open(tmp_path / "store") as opened:
        yield opened


class FailingCapture(OutputCapture):
    """Fails on its first bytes, as a full disk would; `before` runs first."""

    def __init__(self, store: ManagedStore, before: Callable[[], object]) -> None:
        super().__init__(store, namespace="t", memory_cap=1024, hard_cap=10**6)
        self._before = before

    async def feed(self, data: bytes) -> None:
        self._before()
        raise RetentionError("could not write the object: no space left on device (test)")


def _spec(tmp_path: Path) -> ProcessSpec:
    return ProcessSpec(argv=(sys.executable, "-c", SLEEPER), cwd=tmp_path,
                       env=dict(os.environ), stdin=None, timeout=30, terminate_grace=0.2)


async def _run(store: ManagedStore, tmp_path: Path, cancel: bool) -> asyncio.Task[object]:
    spec = _spec(tmp_path)
    running = await spawn(spec)
    runner: asyncio.Task[object] | None = None

    def before() -> None:
        if cancel and runner is not None:
            runner.cancel()

    out = FailingCapture(store, before)
    err = OutputCapture(store, namespace="t", memory_cap=1024, hard_cap=10**6)
    async with out, err:
        runner = asyncio.create_task(supervise(running, spec, out, err))
        await asyncio.wait([runner], timeout=20)
    assert runner.done(), "supervise did not return"
    assert running.proc.returncode is not None  # the group was stopped and the leader reaped
    return runner


async def test_a_pump_failing_alone_raises_its_error_and_stops_the_group(store, tmp_path):
    runner = await _run(store, tmp_path, cancel=False)
    with pytest.raises(RetentionError, match="no space left"):
        runner.result()


async def test_a_cancellation_in_the_same_turn_as_a_pump_failure_propagates(store, tmp_path):
    runner = await _run(store, tmp_path, cancel=True)
    assert runner.cancelled(), f"the cancellation was lost: {runner.exception()!r}"
