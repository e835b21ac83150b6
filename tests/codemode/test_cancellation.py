"""Cancelling `execute` cancels its nested calls, stops the program and kills its worker."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.codemode import DEFAULT_LIMITS, RunGuard, Sandbox, SandboxClosed

from .conftest import Env, alive, monty_workers, wait_until

pytestmark = pytest.mark.anyio


async def _running_worker() -> set[int]:
    for _ in range(200):
        now = monty_workers()
        if now:
            return now
        await asyncio.sleep(0.01)
    raise AssertionError("no monty worker process showed up")


async def _gone(pids: set[int]) -> None:
    for _ in range(300):
        if not any(alive(pid) for pid in pids):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"worker processes {pids} outlived their cancelled run")


async def test_cancel_during_nested_calls_cancels_them_and_kills_the_worker(env: Env):
    task = asyncio.create_task(env.run(
        "await asyncio.gather(tools.slow(seconds=30, label='a'), tools.slow(seconds=30))\n",
        call_id="cx",
    ))
    await asyncio.wait_for(env.probe.started.wait(), 10)
    await wait_until(lambda: env.probe.inflight == 2)
    workers = monty_workers()
    assert len(workers) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sorted(env.probe.cancelled) == ["cx/1", "cx/2"]  # each slow call saw CancelledError
    assert env.probe.inflight == 0
    await _gone(workers)  # the cancelled run's worker was discarded, not returned to the pool
    assert await env.location.outcome("cx") is None  # cancellation is never a result
    assert await env.location.outcome("cx/1") is None
    await env.sandbox.aclose()
    assert not any(alive(pid) for pid in workers)
    assert monty_workers() == set()


async def test_cancel_during_a_busy_loop_kills_the_worker(env: Env):
    task = asyncio.create_task(env.run("n = 0\nwhile True:\n    n += 1\n"))
    workers = await _running_worker()
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _gone(workers)
    await env.sandbox.aclose()
    assert monty_workers() == set()


async def test_a_worker_is_reused_after_a_clean_run_and_the_pool_closes_clean(env: Env):
    first = await env.run("1 + 1", call_id="a")
    second = await env.run("2 + 2", call_id="b")
    assert (first.output["result"], second.output["result"]) == (2, 4)
    assert monty_workers()
    await env.sandbox.aclose()
    assert monty_workers() == set()
    with pytest.raises(SandboxClosed):
        await env.sandbox.run("1", tools={}, functions={}, limits=DEFAULT_LIMITS, guard=RunGuard())


async def test_an_unused_sandbox_starts_no_worker():
    async with Sandbox():
        assert monty_workers() == set()
