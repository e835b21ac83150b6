"""A stopped server's process group counts as gone once every member has died, even while a
dead member waits to be reaped (`bridges.child_groups.group_alive`): real processes. The zombie
here is the test's own child, moved into the server's group and killed without being reaped,
as a server's grandchild stays while init has not reaped it (~1.7 s on these machines; never in
a container whose first process reaps nothing)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridges import prestart
from bridges.child_groups import group_alive
from bridges.mcp import stdio

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


@contextlib.contextmanager
def _member_of(pgid: int) -> Iterator[subprocess.Popen[bytes]]:
    """A process of this test's in group `pgid`; reaped at the end whatever happened."""
    member = subprocess.Popen(SLEEP, process_group=pgid)
    try:
        yield member
    finally:
        member.kill()
        member.wait()


def _zombie(member: subprocess.Popen[bytes]) -> None:
    """Kill `member` and leave it unreaped: a zombie until the test waits for it."""
    os.kill(member.pid, signal.SIGKILL)
    while _state(member.pid) != "Z":
        os.sched_yield()


def test_a_group_of_zombies_is_not_alive_though_killpg_still_finds_it() -> None:
    leader = subprocess.Popen(SLEEP, process_group=0)  # this session: the member may join
    try:
        with _member_of(leader.pid) as member:
            assert group_alive(leader.pid)
            leader.kill()
            leader.wait()
            assert group_alive(leader.pid)  # the member lives
            _zombie(member)
            os.killpg(leader.pid, 0)  # no ProcessLookupError: the zombie is in the group
            assert not group_alive(leader.pid)
        with pytest.raises(ProcessLookupError):
            os.killpg(leader.pid, 0)
        assert not group_alive(leader.pid)
    finally:
        leader.kill()
        leader.wait()


def test_a_prestarted_servers_stop_returns_when_no_member_lives() -> None:
    family = ("import subprocess, sys, time; "
              "print(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])"
              ".pid, flush=True); time.sleep(600)")
    process = subprocess.Popen([sys.executable, "-c", family], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, start_new_session=True)
    assert process.stdout is not None
    grandchild = int(process.stdout.readline())
    prestart.stop(process)
    assert not group_alive(process.pid)
    assert _state(grandchild) in ("Z", None)  # dead, reaped or not
    assert process.stdout.closed


@pytest.mark.anyio
async def test_a_servers_stop_does_not_wait_for_a_dead_member_to_be_reaped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The old check (killpg 0) found the zombie until its parent reaped it and waited
    # TERM_GRACE for it; with a grace of 10 minutes that wait is the test's timeout.
    monkeypatch.setattr(stdio, "TERM_GRACE", 600.0)
    server = await asyncio.create_subprocess_exec(
        *SLEEP, stdin=subprocess.PIPE, preexec_fn=os.setpgrp)  # uvloop: no process_group
    try:
        with _member_of(server.pid) as member:
            _zombie(member)
            async with asyncio.timeout(60):
                await stdio._stop(server, 0.0)  # stdin closed, no grace: SIGTERM at once
            assert server.returncode == -signal.SIGTERM
            assert _state(member.pid) == "Z"  # still unreaped: nothing waited for it
    finally:
        if server.returncode is None:
            server.kill()
            await server.wait()
