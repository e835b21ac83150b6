"""Supervision: concurrent start, failures reported not raised, crash and reconnect, updates,
disabled servers, and no leaked processes."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

from bridges.manifest.loading import ServerConfig
from bridges.mcp import Backoff, ServerHealth, ServerPool
from sidecar import Location, TextContent, Tool, ToolResponse
from sidecar.model.errors import ErrorKind
from tests.bridges.helpers import (
    ctx,
    eventually,
    legacy,
    live_children,
    pid_alive,
    processes_mentioning,
    read_events,
    stdio,
)

pytestmark = pytest.mark.anyio

FAST = Backoff(initial=0.2, cap=1.0)


async def test_twenty_servers_start_concurrently(location: Location, events: Path) -> None:
    # Each server answers only once all twenty run: a pool that started them one by one
    # (waiting for one to be ready before spawning the next) would never see the first ready.
    servers = {f"s{i:02d}": legacy("--start-together", "20", events=events) for i in range(20)}
    async with ServerPool(servers, location.tools) as pool:
        assert {h.state for h in pool.health().values()} == {"ready"}
        assert len([n for n in location.snapshot().names if n.endswith("_echo")]) == 20
    starts = [e["t"] for e in read_events(events, "start")]
    readies = [e["t"] for e in read_events(events, "ready")]
    assert len(starts) == len(readies) == 20
    assert max(starts) < min(readies)  # every server was spawned before any was ready


async def test_failing_servers_are_reported_and_never_break_the_pool(location: Location) -> None:
    reported: list[tuple[str, str]] = []
    servers = {
        "good": legacy(),
        "missing": ServerConfig(command="/nonexistent/mcp-server"),
        "exits": legacy("--exit-at-start", "4"),
        "hangs": legacy("--hang-at-start", timeouts={"startup": 0.5}),
    }

    def on_health(key: str, health: ServerHealth) -> None:
        reported.append((key, health.state))

    async with ServerPool(servers, location.tools, on_health=on_health, backoff=FAST) as pool:
        health = pool.health()
        assert health["good"].state == "ready"
        missing = health["missing"]
        assert missing.state == "failed"
        assert missing.last_error is not None and "/nonexistent/mcp-server" in missing.last_error
        exits = health["exits"]  # retrying already, or waiting to
        assert exits.state in ("backoff", "starting")
        assert exits.last_error is not None
        assert "exited with code 4" in exits.last_error
        assert "exiting on purpose" in exits.last_error  # the stderr tail
        hangs = health["hangs"]
        assert hangs.state in ("backoff", "starting")
        assert hangs.last_error is not None and "timeouts.startup" in hangs.last_error
        # the good server works regardless
        outcome = await location.snapshot().execute("good_echo", {"text": "fine"}, ctx())
        assert outcome.status == "completed"
        # retries go on with backoff (and count as restarts)
        await eventually(lambda: pool.health()["exits"].restarts >= 1, what="a retry")
    assert ("good", "ready") in reported and ("missing", "failed") in reported


async def test_a_crash_mid_call_fails_upstream_then_the_server_comes_back(
    location: Location, events: Path
) -> None:
    async with ServerPool({"t": stdio(events=events)}, location.tools, backoff=FAST) as pool:
        first_pid = pool.health()["t"].pid
        assert first_pid is not None
        snapshot = location.snapshot()
        crashed = await snapshot.execute("t_crash", {}, ctx())
        assert crashed.error is not None and crashed.error.kind is ErrorKind.UPSTREAM
        assert "'t'" in crashed.error.message and "'crash'" in crashed.error.message
        assert "about to crash" in crashed.error.message  # the server's last stderr line
        # the same snapshot keeps working once the supervisor has reconnected
        again = await snapshot.execute("t_echo", {"text": "back"}, ctx())
        assert again.content == (TextContent("back"),)
        health = pool.health()["t"]
        assert health.state == "ready" and health.restarts == 1
        assert health.pid != first_pid
        assert not pid_alive(first_pid)
        assert len(read_events(events, "ready")) == 2  # tools re-listed on a new process


async def test_disabled_servers_start_nothing(location: Location, events: Path) -> None:
    children = live_children()
    servers = {"off": stdio(events=events, disabled=True)}
    async with ServerPool(servers, location.tools) as pool:
        assert pool.health()["off"].state == "disabled"
        assert live_children() == children
        assert not any(n.startswith("off_") for n in location.snapshot().names)
    assert not read_events(events)


async def test_update_applies_a_diff(location: Location, tmp_path: Path) -> None:
    ev = {name: tmp_path / f"{name}.jsonl" for name in ("keep", "change", "drop", "new")}
    changed: list[str] = []
    servers = {name: legacy(events=ev[name]) for name in ("keep", "change", "drop")}
    async with ServerPool(servers, location.tools, on_tools_changed=changed.append) as pool:
        before = pool.health()
        # a plugin registered after the pool overrides one of the server's tools
        override = Tool(description="plugin", input={"type": "object"},
                        execute=lambda a, c: _content("plugin"))
        async with location.tools.register({"change_echo": override}, label="plugin"):
            await pool.update({
                "keep": servers["keep"],
                "change": legacy(events=ev["change"], namespace="change",
                                 timeouts={"call": 30}),
                "new": legacy(events=ev["new"]),
                "off": legacy(disabled=True),
            })
            after = pool.health()
            assert set(after) == {"keep", "change", "new", "off"}
            assert after["keep"].pid == before["keep"].pid  # untouched
            assert after["keep"].restarts == 0
            assert after["change"].pid != before["change"].pid  # restarted
            assert after["change"].restarts == 1
            assert not pid_alive(before["drop"].pid or 0)  # stopped and reaped
            names = location.snapshot().names
            assert "new_echo" in names and not any(n.startswith("drop_") for n in names)
            # the restarted server's registration kept its place: the plugin still wins
            outcome = await location.snapshot().execute("change_echo", {"text": "x"}, ctx())
            assert outcome.content == (TextContent("plugin"),)
        assert "drop" in changed and "new" in changed


async def _content(value: str) -> ToolResponse:
    return ToolResponse(content=value)


async def test_no_process_outlives_start_stop_cycles_or_a_crash(
    location: Location, tmp_path: Path
) -> None:
    marker = str(tmp_path)  # every server below carries it in its command line
    children = live_children()
    servers = {
        "a": legacy(events=tmp_path / "a.jsonl"),
        "b": legacy(events=tmp_path / "b.jsonl", timeouts={"call": 0.3}),
    }
    for cycle in range(3):
        if cycle == 0:  # an SDK server too, once (it is slower to start)
            servers["c"] = stdio(events=tmp_path / "c.jsonl")
        else:
            servers.pop("c", None)
        async with ServerPool(servers, location.tools, backoff=FAST) as pool:
            assert {h.state for h in pool.health().values()} == {"ready"}
            assert len(live_children() - children) == len(servers)
            if cycle == 1:
                crashed = await location.snapshot().execute("a_crash", {}, ctx())
                assert crashed.error is not None
                await eventually(lambda: pool.health()["a"].state == "ready", what="restart")
                timed_out = await location.snapshot().execute("b_slow", {"seconds": 1}, ctx())
                assert timed_out.error is not None and timed_out.error.kind is ErrorKind.TIMEOUT
        assert live_children() == children, f"cycle {cycle}: leaked child processes"
        assert processes_mentioning(marker) == [], f"cycle {cycle}: leaked processes"


async def test_stopping_kills_a_server_that_ignores_its_closed_stdin(
    location: Location, tmp_path: Path
) -> None:
    # `sleep` never reads stdin and never speaks MCP: the startup times out, and shutdown
    # must still stop it (SIGTERM to its process group) without leaking it.
    marker = str(tmp_path / "never-mcp")
    script = f"import time, sys; sys.argv.append({marker!r}); time.sleep(60)"
    config = ServerConfig(command=sys.executable, args=["-c", script, marker],
                          timeouts={"startup": 0.5})
    async with ServerPool({"mute": config}, location.tools) as pool:
        assert pool.health()["mute"].state == "backoff"
    with anyio.fail_after(5):
        while processes_mentioning(marker):  # noqa: ASYNC110 (polling another process)
            await anyio.sleep(0.05)


REPEATING = ("import sys\n"
             "for _ in range(12): print('config file not found', file=sys.stderr)\n"
             "print('pid', __import__('os').getpid(), file=sys.stderr)\n"
             "sys.exit(3)")


async def test_the_same_startup_failure_five_times_in_a_row_is_failed(location: Location) -> None:
    """Backoff is for transient faults: a server that fails the same way again and again
    (numbers such as its pid aside) goes to `failed` with the reason; its repeated stderr line
    is shown once with a count."""
    servers = {"broken": ServerConfig(command=sys.executable, args=["-c", REPEATING])}
    async with ServerPool(servers, location.tools, backoff=Backoff(initial=0.05, cap=0.1)) \
            as pool:
        first = pool.health()["broken"]
        assert first.state in ("backoff", "starting")
        assert first.last_error is not None
        assert "config file not found (x12) | pid " in first.last_error, first.last_error
        await eventually(lambda: pool.health()["broken"].state == "failed", what="failed")
        failed = pool.health()["broken"]
        assert failed.last_error is not None
        assert "exited with code 3" in failed.last_error
        assert "the same failure 5 times in a row" in failed.last_error
        assert failed.restarts == 4  # five attempts, then no more
