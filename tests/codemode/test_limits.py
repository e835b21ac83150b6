"""Every limit ends the run with a clear error, and a program cannot catch its way past one."""

from __future__ import annotations

import pytest

from sidecar.codemode import CodeModeLimits
from sidecar.model.content import text_of

from .conftest import Env

pytestmark = pytest.mark.anyio


def limit_of(outcome) -> str:
    assert outcome.status == "completed", outcome
    error = outcome.output["error"]
    assert error["type"] == "LimitExceeded"
    assert outcome.metadata is not None and outcome.metadata["error"] == error["limit"]
    return str(error["limit"])


async def test_wall_time_counts_tool_calls_and_stops_the_run(env: Env):
    outcome = await env.run(
        "print('before')\nawait tools.slow(seconds=30)\nprint('after')\n",
        limits=CodeModeLimits(wall_time=0.5),
    )
    assert limit_of(outcome) == "wall_time"
    text = text_of(outcome.content)
    assert "before" in text and "after" not in text and "longer than 0.5 s" in text
    assert env.probe.cancelled == ["c1/1"]  # the slow call was cancelled, not abandoned


async def test_cpu_time_stops_a_busy_loop_even_if_it_catches(env: Env):
    outcome = await env.run(
        "n = 0\ntry:\n    while True:\n        n += 1\nexcept Exception:\n    pass\n"
        "print('survived')\n",
        limits=CodeModeLimits(cpu_time=0.3),
    )
    assert limit_of(outcome) == "cpu_time"
    assert "survived" not in text_of(outcome.content)


async def test_memory_limit_stops_an_allocating_program(env: Env):
    outcome = await env.run(
        "chunks = []\ntry:\n    while True:\n        chunks.append('x' * 100000)\n"
        "except MemoryError:\n    print('survived')\n",
        limits=CodeModeLimits(memory_bytes=16 * 1024 * 1024),
    )
    assert limit_of(outcome) == "memory"
    assert "ran out of memory" in outcome.output["error"]["message"]
    assert "survived" not in text_of(outcome.content)


async def test_tool_call_limit_stops_the_run(env: Env):
    outcome = await env.run(
        "for i in range(10):\n"
        "    try:\n"
        "        await tools.calc.add(a=i)\n"
        "    except RuntimeError:\n"
        "        pass\n",
        limits=CodeModeLimits(max_tool_calls=3),
    )
    assert limit_of(outcome) == "tool_calls"
    assert len(outcome.output["tool_calls"]) == 3
    assert len(env.probe.contexts) == 3
    assert "more than 3 tool calls" in text_of(outcome.content)


async def test_printed_output_limit_stops_the_run(env: Env):
    outcome = await env.run(
        "for i in range(100000):\n    print('x' * 50)\n",
        limits=CodeModeLimits(max_output_bytes=2000),
    )
    assert limit_of(outcome) == "output"
    text = text_of(outcome.content)
    assert "printed more than 2,000 bytes" in text
    assert text.count("x" * 50) <= 40


async def test_result_counts_toward_the_output_limit(env: Env):
    outcome = await env.run("'y' * 5000", limits=CodeModeLimits(max_output_bytes=2000))
    assert limit_of(outcome) == "output"
    assert outcome.output["result"] is None


async def test_program_size_limit(env: Env):
    outcome = await env.run("x = 1\n" * 100, limits=CodeModeLimits(max_code_bytes=100))
    assert limit_of(outcome) == "code_size"


def test_limits_are_validated():
    with pytest.raises(ValueError, match="wall_time"):
        CodeModeLimits(wall_time=0)
    with pytest.raises(ValueError, match="max_tool_calls"):
        CodeModeLimits(max_tool_calls=0)
