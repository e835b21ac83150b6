"""`sidecar call` on a tool that asks first, against a real `sidecar serve`: it says where to
answer; interrupted (SIGINT, SIGTERM) it withdraws the ask, so answering it later runs
nothing; `sidecar asks` lists and answers asks."""

from __future__ import annotations

import re
import select
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.hardening.daemon_process import SIDECAR, Daemon, run_cli, serving, sidecar_env

MANIFEST = """
[tools.mark]
kind = "command"
description = "Write a marker file"
input = { type = "object", properties = { path = { type = "string" } }, required = ["path"] }
argv = ["touch", "{path}"]

[[permissions.rules]]
action = "mark"
decision = "ask"
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("asks")
    (root / "manifests").mkdir()
    (root / "manifests" / "asks.toml").write_text(MANIFEST)
    with serving(root / "state", manifests=root / "manifests") as daemon:
        yield daemon


def _env(daemon: Daemon) -> dict[str, str]:
    return sidecar_env(daemon.state, daemon.state.parent / "manifests")


def _start_call(daemon: Daemon, marker: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*SIDECAR, "call", "mark", "--input", f'{{"path": "{marker}"}}'], env=_env(daemon),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _ask_of(proc: subprocess.Popen[str], timeout: float = 30) -> tuple[str, str]:
    """(the ask id the call names, the line naming it) from the call's stderr."""
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], deadline - time.monotonic())
        if not ready:
            break
        line = proc.stderr.readline()
        assert line, f"the call ended without naming its ask: {''.join(seen)}"
        seen.append(line)
        found = re.search(r"\(ask (perm_\w+)\)", line)
        if found:
            return found.group(1), line
    raise AssertionError(f"no ask named within {timeout} s: {''.join(seen)}")


def _v1(daemon: Daemon) -> httpx.Client:
    return httpx.Client(base_url=daemon.url, timeout=30,
                        headers={"authorization": f"Bearer {daemon.token}"})


def test_a_waiting_call_says_where_to_answer(daemon: Daemon, tmp_path: Path) -> None:
    proc = _start_call(daemon, tmp_path / "marker")
    try:
        ask, line = _ask_of(proc)
        assert f"{daemon.url}/ui/asks" in line
        assert f"sidecar asks reply {ask} once|always|reject" in line
        listed = run_cli("asks", env=_env(daemon))
        assert listed.returncode == 0 and ask in listed.stdout and "mark" in listed.stdout
        answered = run_cli("asks", "reply", ask, "once", env=_env(daemon))
        assert answered.returncode == 0, answered.stderr
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert (tmp_path / "marker").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_call_withdraws_its_ask_and_a_later_answer_runs_nothing(
        daemon: Daemon, tmp_path: Path, signum: int) -> None:
    marker = tmp_path / "marker"
    proc = _start_call(daemon, marker)
    ask, _ = _ask_of(proc)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "was cancelled on the daemon" in lines[0], err
    with _v1(daemon) as client:
        assert client.get("/v1/permissions").json()["pending"] == []
        late = client.post(f"/v1/permissions/{ask}/reply", json={"reply": "once"})
        assert late.status_code == 404 and late.json()["error"]["code"] == "unknown_ask"
    assert not marker.exists()
    again = run_cli("asks", "reply", ask, "always", env=_env(daemon))
    assert again.returncode == 1 and "no ask" in again.stderr
    assert not marker.exists()
