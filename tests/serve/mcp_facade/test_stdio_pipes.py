"""`sidecar stdio`'s wire (`sidecar.serve.mcp_facade.stdio_pipes`), spoken as raw JSON lines
to a subprocess: pipes on the event loop, regular files on the SDK's threaded transport, the
wire moved off fds 0 and 1 while serving, and requests written before stdin closes answered."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.serve.mcp_facade.test_stdio_and_conformance import params

TEXT = "This is a simple text response for testing."
WIDE = "é ✓ 😀 \u2028 \"quoted\" \\ back"


def conversation() -> str:
    """A whole session as a client would write it: handshake, a listing, calls on the fast
    path (tools are listed), a line that is not JSON, two more listings (fast path)."""
    lines: list[Any] = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
         "params": {"name": "test_simple_text", "arguments": {}}},
        "this is not JSON",
        {"jsonrpc": "2.0", "id": "four", "method": "tools/call",
         "params": {"name": "test_structured", "arguments": {"value": {"text": WIDE}}}},
        {"jsonrpc": "2.0", "id": 5, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 6, "method": "tools/list"},  # its JSON comes from the cache
    ]
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                   for line in lines)


def answers(stdout: str) -> dict[Any, dict[str, Any]]:
    replies = [json.loads(line) for line in stdout.split("\n") if line.strip()]
    return {reply["id"]: reply for reply in replies if "id" in reply}


def check(replies: dict[Any, dict[str, Any]]) -> None:
    assert set(replies) >= {1, 2, 3, "four", 5, 6}, replies
    assert replies[3]["result"]["content"][0]["text"] == TEXT
    assert replies["four"]["result"]["structuredContent"] == {"value": {"text": WIDE}}
    assert replies[5]["result"] == replies[6]["result"] == replies[2]["result"]


def test_a_pipeline_gets_every_answer_before_the_daemon_exits(tmp_path: Path) -> None:
    """Requests written before stdin closes are answered (within EOF_GRACE), on pipes."""
    p = params(tmp_path)
    done = subprocess.run([p.command, *p.args], input=conversation(), capture_output=True,
                          text=True, encoding="utf-8", timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    check(answers(done.stdout))


def test_regular_files_take_the_threaded_transport(tmp_path: Path) -> None:
    requests, replies = tmp_path / "requests.jsonl", tmp_path / "replies.jsonl"
    requests.write_text(conversation(), encoding="utf-8")
    p = params(tmp_path)
    with requests.open("rb") as stdin, replies.open("wb") as stdout:
        done = subprocess.run([p.command, *p.args], stdin=stdin, stdout=stdout,
                              stderr=subprocess.PIPE, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    # The SDK's threaded transport ends the session as soon as it reads the end of the file:
    # calls still running then are cancelled (no EOF_GRACE there). The handshake, read first,
    # is always answered.
    got = answers(replies.read_text(encoding="utf-8"))
    assert got[1]["result"]["serverInfo"]["name"]
    assert all("error" not in reply for reply in got.values())


def test_the_wire_leaves_fds_0_and_1_while_serving(tmp_path: Path) -> None:
    """A child or a stray print cannot read the client's requests or write into the wire."""
    p = params(tmp_path)
    proc = subprocess.Popen([p.command, *p.args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(conversation().splitlines(keepends=True)[0].encode())
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["id"] == 1  # serving now
        fd = Path(f"/proc/{proc.pid}/fd")
        assert os.readlink(fd / "0") == "/dev/null"
        assert os.readlink(fd / "1") == os.readlink(fd / "2")
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert proc.returncode == 0


def test_one_socket_as_stdin_and_stdout_half_closed_gets_every_answer(tmp_path: Path) -> None:
    """The standalone wire on one socket for both (on asyncio; the shared daemon's, on uvloop,
    is `test_shared_daemon_stdio`): the client half-closes once its requests are written,
    and the answers still come back on the same socket."""
    p = params(tmp_path)
    ours, theirs = socket.socketpair()
    with ours:
        with theirs:
            proc = subprocess.Popen([p.command, *p.args], stdin=theirs, stdout=theirs,
                                    stderr=subprocess.DEVNULL)
        ours.sendall(conversation().encode())
        ours.shutdown(socket.SHUT_WR)
        ours.settimeout(60)
        data = b""
        while chunk := ours.recv(1 << 16):
            data += chunk
    assert proc.wait(30) == 0
    check(answers(data.decode()))
