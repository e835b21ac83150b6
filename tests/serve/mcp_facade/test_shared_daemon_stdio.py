"""`sidecar stdio` attached to the shared daemon (not `--standalone`), with every kind of stdin
and stdout a client can hand it, and clients that leave while their answers are written.

Real processes throughout: the daemon is started on demand by the first `sidecar stdio` (as an
agent's would be), its upstream is the conformance fixture; `/v1/health` and `/mcp` are asked
over the daemon's own socket, `<state>/daemon.sock`.
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import socket
import subprocess
import sys
import time
import tty
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sidecar.serve.local_door import OwnerLock
from tests.daemons import daemon_pid, stop_daemon
from tests.serve.mcp_facade.conftest import fixture_server, write_manifest
from tests.serve.mcp_facade.test_stdio_pipes import answers, check, conversation

ROOT = Path(__file__).resolve().parents[3]
STDIO = [sys.executable, "-m", "sidecar.cli", "stdio"]
SLEEP_SECONDS = 0.5
SLEEP = {"name": "test_sleep", "arguments": {"seconds": SLEEP_SECONDS}}
ANSWERED = {1, 2, 3, "four", 5, 6}
"""The ids `conversation()` gets answers for (`check` looks at them)."""


def environment(state: Path, manifests: Path) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "HOME": str(state.parent),
            "SIDECAR_STATE_DIR": str(state), "SIDECAR_MANIFESTS": str(manifests),
            "SIDECAR_IDLE_EXIT": "120"}


class Daemon:
    def __init__(self, state: Path, env: dict[str, str]) -> None:
        self.state, self.env = state, env

    def http(self) -> httpx.Client:
        token = (self.state / "token").read_text().strip()
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.state / "daemon.sock")),
                            base_url="http://localhost", timeout=30,
                            headers={"authorization": f"Bearer {token}"})

    def stdio(self, **kwargs: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(STDIO, cwd=ROOT, env=self.env, **kwargs)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon, started on demand by a first client, its upstream ready."""
    tmp = tmp_path_factory.mktemp("shared")
    manifests = write_manifest(tmp / "manifests", {"fixture": fixture_server()})
    shared = Daemon(tmp / "state", environment(tmp / "state", manifests))
    try:
        done = subprocess.run(STDIO, input=b"", cwd=ROOT, env=shared.env, capture_output=True,
                              timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        with shared.http() as http:
            deadline = time.monotonic() + 60
            while http.get("/v1/health").json()["status"] != "ok":
                assert time.monotonic() < deadline, http.get("/v1/health").json()
                time.sleep(0.1)
        yield shared
    finally:
        stop_daemon(shared.state)


# --- every kind of stdin and stdout --------------------------------------------------------


def _files(daemon: Daemon, tmp: Path, stdin_file: bool, stdout_file: bool) -> str:
    requests, replies = tmp / "requests.jsonl", tmp / "replies.jsonl"
    requests.write_text(conversation(), encoding="utf-8")
    with requests.open("rb") as source, replies.open("wb") as sink:
        done = subprocess.run(
            STDIO, cwd=ROOT, env=daemon.env, timeout=60, check=False, stderr=subprocess.PIPE,
            stdin=source if stdin_file else None,
            input=None if stdin_file else conversation().encode(),
            stdout=sink if stdout_file else subprocess.PIPE)
    assert done.returncode == 0, done.stderr
    return replies.read_text("utf-8") if stdout_file else done.stdout.decode()


@pytest.mark.parametrize(("stdin_file", "stdout_file"),
                         [(True, False), (False, True), (True, True), (False, False)],
                         ids=["stdin-file", "stdout-file", "both-files", "pipes"])
def test_requests_from_and_answers_to_regular_files_all_come_back(
    daemon: Daemon, tmp_path: Path, stdin_file: bool, stdout_file: bool
) -> None:
    """`sidecar stdio < requests.jsonl > out.jsonl`: the bytes go through the `sidecar stdio`
    process (the daemon cannot watch a regular file) and every request is answered."""
    check(answers(_files(daemon, tmp_path, stdin_file, stdout_file)))


def _read_all(sock: socket.socket) -> str:
    sock.settimeout(60)
    data = b""
    while chunk := sock.recv(1 << 16):
        data += chunk
    return data.decode()


def test_one_socket_as_stdin_and_stdout_is_served(daemon: Daemon) -> None:
    """A socketpair end as both stdin and stdout (inetd style), half-closed by the client
    once its requests are written: the daemon neither reads its own answers' socket dry nor
    closes it at the half-close."""
    ours, theirs = socket.socketpair()
    with ours:
        with theirs:
            proc = daemon.stdio(stdin=theirs, stdout=theirs)
        ours.sendall(conversation().encode())
        ours.shutdown(socket.SHUT_WR)
        check(answers(_read_all(ours)))
    assert proc.wait(30) == 0


def test_separate_sockets_for_stdin_and_stdout_are_served(daemon: Daemon) -> None:
    """Two socketpairs (how Node spawns a child); the reader of stdout half-closes its own
    direction at once, which must not close the daemon's writing side."""
    inbound, child_in = socket.socketpair()
    outbound, child_out = socket.socketpair()
    with inbound, outbound:
        with child_in, child_out:
            proc = daemon.stdio(stdin=child_in, stdout=child_out)
        outbound.shutdown(socket.SHUT_WR)
        inbound.sendall(conversation().encode())
        inbound.shutdown(socket.SHUT_WR)
        check(answers(_read_all(outbound)))
    assert proc.wait(30) == 0


def test_a_terminal_as_stdin_and_stdout_is_served(daemon: Daemon) -> None:
    """A pseudo-terminal (raw mode: no echo, no CR/LF rewriting) as both; the session ends
    when the terminal hangs up."""
    master, slave = pty.openpty()
    tty.setraw(slave)
    try:
        proc = daemon.stdio(stdin=slave, stdout=slave)
    finally:
        os.close(slave)
    data = b""
    try:
        os.write(master, conversation().encode())
        deadline = time.monotonic() + 60
        while not ANSWERED <= set(answers(_whole_lines(data))):
            assert time.monotonic() < deadline, data[-2000:]
            if select.select([master], [], [], 0.5)[0]:
                data += os.read(master, 1 << 16)
    finally:
        os.close(master)  # hang up
        ended = proc.wait(30)
    check(answers(_whole_lines(data)))
    assert ended == 0


def _whole_lines(data: bytes) -> str:
    return data[: data.rfind(b"\n") + 1].decode()


# --- clients that leave mid-answer ----------------------------------------------------------


def _handshake(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    for line in conversation().splitlines(keepends=True)[:3]:  # initialize, initialized, list
        proc.stdin.write(line.encode())
    proc.stdin.flush()
    got: set[Any] = set()
    while got != {1, 2}:  # notifications may come in between
        line = proc.stdout.readline()
        assert line, f"the session ended before answering the handshake: {got}"
        got |= set(answers(line.decode()))


def _call(proc: subprocess.Popen[bytes], request_id: int, progress: bool) -> None:
    params: dict[str, Any] = dict(SLEEP)
    if progress:  # a call with a progress token takes the SDK's route, not the fast one
        params["_meta"] = {"progressToken": request_id}
    assert proc.stdin is not None
    proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                                 "params": params}).encode() + b"\n")
    proc.stdin.flush()


def test_clients_that_leave_while_answered_hurt_no_other_client(daemon: Daemon) -> None:
    """Three clients send a call and go away before its answer is written: two on pipes
    (handed to the daemon; one call on the SDK's route, one on the fast route) close both
    pipes, one relayed through `sidecar stdio` (stdout a file) is killed. The daemon keeps
    serving: daemon.json stays, a new stdio client gets every answer, /mcp initializes, health
    says the facade serves, and the log has no traceback."""
    pid = daemon_pid(daemon.state)
    log_before = (daemon.state / "daemon.log").read_text()
    leaving = [daemon.stdio(stdin=subprocess.PIPE, stdout=subprocess.PIPE) for _ in range(2)]
    relayed_out = daemon.state.parent / "relayed.jsonl"
    with relayed_out.open("wb") as sink:
        relayed = daemon.stdio(stdin=subprocess.PIPE, stdout=sink)
    assert relayed.stdin is not None
    for line in conversation().splitlines(keepends=True)[:3]:
        relayed.stdin.write(line.encode())
    relayed.stdin.flush()
    for progress, proc in zip((True, False), leaving, strict=True):
        _handshake(proc)
        _call(proc, 7, progress)
        assert proc.stdout is not None and proc.stdin is not None
        proc.stdout.close()
        proc.stdin.close()
    deadline = time.monotonic() + 30
    while len(answers(relayed_out.read_text())) < 2:
        assert time.monotonic() < deadline, relayed_out.read_text()
        time.sleep(0.05)
    _call(relayed, 7, True)
    time.sleep(SLEEP_SECONDS / 2)  # the call reached the daemon; its answer is not due yet
    relayed.send_signal(signal.SIGKILL)
    relayed.stdin.close()
    for proc in [*leaving, relayed]:
        proc.wait(30)
    time.sleep(SLEEP_SECONDS + 0.5)  # the answers were due by now

    assert daemon_pid(daemon.state) == pid  # daemon.json is still there, same daemon
    check(answers(_files(daemon, daemon.state.parent, stdin_file=True, stdout_file=True)))
    with daemon.http() as http:
        health = http.get("/v1/health")
        assert health.status_code == 200 and health.json()["mcp_facade"] == {"state": "serving"}
        initialize = http.post("/mcp", headers={"accept": "application/json, text/event-stream"},
                               json=json.loads(conversation().splitlines()[0]))
        assert initialize.status_code == 200, initialize.text
    log = (daemon.state / "daemon.log").read_text()[len(log_before):]
    assert "Traceback" not in log and "closed=True" not in log, log[-3000:]


# --- a task of the facade that dies ---------------------------------------------------------


def test_a_facade_task_that_dies_stops_the_daemon_in_one_line_and_frees_the_state(
    tmp_path: Path,
) -> None:
    """The stdio door cannot open (its socket's path is taken by a directory): the daemon
    started on demand does not keep serving /v1 without it. It exits 7 with one line naming
    the door, lets go of the state's lock, and the `sidecar stdio` that started it says so at
    once instead of waiting."""
    manifests = write_manifest(tmp_path / "manifests", {})
    state = tmp_path / "state"
    (state / "stdio.sock").mkdir(parents=True, mode=0o700)
    state.chmod(0o700)
    (state / "stdio.sock" / "keep").write_text("")
    started = time.monotonic()
    try:
        done = subprocess.run(STDIO, input=b"", cwd=ROOT, env=environment(state, manifests),
                              capture_output=True, timeout=120, check=False)
    finally:
        stop_daemon(state)
    assert time.monotonic() - started < 60  # not START_TIMEOUT: it knew the daemon exited
    assert done.returncode != 0
    assert b"exit 7" in done.stderr and b"the stdio door failed" in done.stderr, done.stderr
    log = (state / "daemon.log").read_text()
    failures = [line for line in log.splitlines() if "the stdio door failed" in line]
    assert len(failures) == 1 and "IsADirectoryError" in failures[0], log
    assert "Traceback" not in log, log
    assert not (state / "daemon.json").exists()
    lock = OwnerLock.acquire(state)
    assert lock is not None, "the daemon kept the state's lock"
    lock.release()


def test_the_health_report_names_a_failed_facade_while_the_daemon_stops() -> None:
    """What `/v1/health` merges over the Location's report (`Api.health_extras`) once a task
    of the facade died: 503 (`unavailable`), the first failure named, later ones ignored.
    (A real daemon closes its listeners as it stops, so no new request sees this window.)"""
    from sidecar.daemon.daemon import FacadeHealth

    extras: dict[str, object] = {}
    facade = FacadeHealth()
    facade.report_in(extras)
    assert extras == {"mcp_facade": {"state": "serving"}}
    try:
        raise OSError(28, "No space left on device")
    except OSError as exc:
        assert facade.fail("the stdio door", exc)
        assert not facade.fail("the daemon watcher", exc)
    assert extras["status"] == "unavailable"
    failed = extras["mcp_facade"]
    assert isinstance(failed, dict) and failed["state"] == "failed"
    assert failed["error"].startswith("the stdio door failed: OSError: [Errno 28] No space")
