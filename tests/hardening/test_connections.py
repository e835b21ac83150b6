"""Issue 26 item 4: idle and half-sent connections time out, a connection cap holds before
authentication, and a daemon out of descriptors reports `operational`, not `tool_failure`."""

from __future__ import annotations

import json
import os
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hardening.conftest import TEXT_TOOL, Daemon, start_daemon, stop_daemon

LIMITS = {"SIDECAR_HTTP_MAX_CONNECTIONS": "40", "SIDECAR_HTTP_HEADER_TIMEOUT": "2",
          "SIDECAR_HTTP_BODY_TIMEOUT": "2"}


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[Daemon]:
    running = start_daemon(tmp_path, env=LIMITS, manifests={"text.toml": TEXT_TOOL})
    try:
        yield running
    finally:
        stop_daemon(running)


def _connect(daemon: Daemon) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", daemon.port), timeout=30)
    return sock


def _answer(sock: socket.socket) -> tuple[int, dict[str, Any]]:
    """Read until the daemon closes: the status and the JSON body (30 s at most: generous,
    it proves the connection was not left open forever)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_idle_connections_are_capped_then_timed_out(limited: Daemon) -> None:
    idle = [_connect(limited) for _ in range(40)]
    try:
        over = _connect(limited)  # served: the oldest connection without a token makes room
        status, body = _answer(idle[0])
        assert status == 503 and body["error"]["code"] == "too_many_connections"
        assert "made room" in body["error"]["message"]
        for sock in [*idle[1:], over]:
            status, body = _answer(sock)
            assert status == 408 and body["error"]["code"] == "request_timeout"
        over.close()
    finally:
        for sock in idle:
            sock.close()
    limited.health()


def test_a_cap_full_of_answered_requests_refuses_the_next(limited: Daemon) -> None:
    streams = [_connect(limited) for _ in range(40)]
    try:
        for sock in streams:  # /v1/events answers for ever: each holds a request
            sock.sendall(b"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Authorization: Bearer " + limited.token.encode() + b"\r\n\r\n")
        for sock in streams:
            assert sock.recv(12).startswith(b"HTTP/1.1 200")
        over = _connect(limited)
        status, body = _answer(over)  # refused before a byte is read
        assert status == 503 and body["error"]["code"] == "too_many_connections"
        assert "valid token" in body["error"]["message"]
        over.close()
    finally:
        for sock in streams:
            sock.close()
    limited.health(timeout=30)


def test_header_allowance_shrinks_near_the_cap(tmp_path: Path) -> None:
    env = {**LIMITS, "SIDECAR_HTTP_HEADER_TIMEOUT": "10"}
    daemon = start_daemon(tmp_path, env=env, manifests={"text.toml": TEXT_TOOL})
    idle = [_connect(daemon) for _ in range(35)]  # 30 of 40 is where pressure begins
    try:
        status, body = _answer(idle[-1])  # 10 s / 5: answered before the first
        assert status == 408, body
        assert "within 2 s (shortened from 10 s" in body["error"]["message"]
        idle[0].setblocking(False)
        with pytest.raises(BlockingIOError):  # still waiting out its 10 s
            idle[0].recv(1)
    finally:
        for sock in idle:
            sock.close()
        stop_daemon(daemon)


def test_half_sent_headers_and_bodies_time_out(limited: Daemon) -> None:
    headers = _connect(limited)
    headers.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthor")
    body = _connect(limited)
    body.sendall(b"POST /v1/snapshots HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Authorization: Bearer " + limited.token.encode() + b"\r\n"
                 b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                 b'{"session_')
    try:
        status, answer = _answer(headers)
        assert status == 408 and "headers" in str(answer["error"])
        status, answer = _answer(body)
        assert status == 408 and "body" in str(answer["error"])
    finally:
        headers.close()
        body.close()
    limited.health()
    assert "Traceback" not in limited.log()


LOW_FILES = 160


def _few_descriptors() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LOW_FILES, LOW_FILES))


def _wait_for_descriptors(pid: int, count: int) -> None:
    """Until the daemon holds `count` descriptors: the kernel completes connections before
    the daemon accepts them, and the call must come after they are accepted."""
    deadline = time.monotonic() + 60
    while len(os.listdir(f"/proc/{pid}/fd")) < count:
        assert time.monotonic() < deadline, len(os.listdir(f"/proc/{pid}/fd"))
        time.sleep(0.05)


def test_a_daemon_out_of_descriptors_reports_operational(tmp_path: Path) -> None:
    env = {"SIDECAR_HTTP_MAX_CONNECTIONS": "1000", "SIDECAR_HTTP_HEADER_TIMEOUT": "120"}
    daemon = start_daemon(tmp_path, env=env, manifests={"text.toml": TEXT_TOOL},
                          preexec_fn=_few_descriptors)
    idle: list[socket.socket] = []
    try:
        with daemon.client() as client:  # one kept-alive connection, opened first
            snap = client.post("/v1/snapshots", json={"session_id": "s"}).json()
            idle.extend(_connect(daemon) for _ in range(200))  # kept as they open
            _wait_for_descriptors(daemon.proc.pid, LOW_FILES - 5)
            call = client.post(f"/v1/snapshots/{snap['id']}/calls", json={
                "name": "text", "input": {"line": "x", "count": 1},
                "context": {"session_id": "s", "agent": "a", "message_id": "m",
                            "call_id": "emfile"}})
            assert call.status_code == 200, call.text
            outcome = call.json()
            assert outcome["error"]["kind"] == "operational", outcome
        for sock in idle:
            sock.close()
        idle.clear()
        daemon.health(timeout=30)
        assert "Too many open files" in daemon.log()
    finally:
        for sock in idle:
            sock.close()
        stop_daemon(daemon)


def test_a_flood_without_a_token_does_not_keep_out_a_client_with_one(
        daemon: Daemon) -> None:
    """Issue 38 item 4: 512 idle connections (the default cap) held without a token, renewed
    as they are evicted; a client with the token is served all along."""
    flood = [_connect(daemon) for _ in range(512)]
    latencies: list[float] = []
    try:
        for _ in range(10):
            flood.extend(_connect(daemon) for _ in range(16))  # the flood goes on
            started = time.monotonic()
            daemon.health(timeout=10)  # a fresh connection: it makes room, then is served
            latencies.append(time.monotonic() - started)
        outcome = daemon.call("text", {"line": "served", "count": 1}, "flooded")
        assert outcome["status"] == "completed", outcome
        assert "served" in outcome["content"][0]["text"]
        status, body = _answer(flood[0])  # the oldest made room first
        assert status == 503 and body["error"]["code"] == "too_many_connections"
    finally:
        for sock in flood:
            sock.close()
    print(f"/v1/health during the flood: max {max(latencies) * 1000:.0f} ms, "
          f"median {sorted(latencies)[len(latencies) // 2] * 1000:.0f} ms")


def _read_answer(sock: socket.socket) -> tuple[int, bytes]:
    """One answer on a kept-alive connection (by its content-length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(65536)
    return int(head.split()[1]), body


def test_deadlines_follow_each_request_on_a_kept_alive_connection(tmp_path: Path) -> None:
    """The deadlines are times a connection's one timer looks at: a later request's headers
    are still timed, and a body may take longer than the header allowance, within its own."""
    env = {**LIMITS, "SIDECAR_HTTP_HEADER_TIMEOUT": "1", "SIDECAR_HTTP_BODY_TIMEOUT": "4"}
    daemon = start_daemon(tmp_path, env=env, manifests={"text.toml": TEXT_TOOL})
    token = b"Authorization: Bearer " + daemon.token.encode() + b"\r\n"
    kept, slow = _connect(daemon), _connect(daemon)
    try:
        kept.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + token + b"\r\n")
        assert _read_answer(kept)[0] == 200
        body = json.dumps({"session_id": "slow-body"}).encode()
        slow.sendall(b"POST /v1/snapshots HTTP/1.1\r\nHost: 127.0.0.1\r\n" + token
                     + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                     % len(body) + body[:5])
        time.sleep(1.5)  # kept alive between requests: no deadline; the body's is 4 s
        kept.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthor")
        started = time.monotonic()
        time.sleep(0.5)
        slow.sendall(body[5:])  # 2 s after its headers: past 1 s, within 4 s
        status, answer = _read_answer(slow)
        assert status != 408 and status < 500, answer
        status, late = _answer(kept)
        assert status == 408 and "headers" in late["error"]["message"]
        assert 0.9 <= time.monotonic() - started < 3
    finally:
        kept.close()
        slow.close()
        stop_daemon(daemon)
