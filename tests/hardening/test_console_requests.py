"""Issue 38 item 8: the console sends a Content-Security-Policy and the framing, sniffing and
referrer headers on every answer, and a `/ui/login` body is bounded in memory before the token
is checked (a 300 MiB multipart body was written to the temporary directory first)."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.hardening.conftest import TEXT_TOOL, Daemon, start_daemon, stop_daemon
from tests.hardening.daemon_process import raw_request


@pytest.fixture
def console(tmp_path: Path) -> Iterator[tuple[Daemon, Path]]:
    spool = tmp_path / "tmp"
    spool.mkdir()
    running = start_daemon(tmp_path, env={"TMPDIR": str(spool)},
                           manifests={"text.toml": TEXT_TOOL})
    try:
        yield running, spool
    finally:
        stop_daemon(running)


def _headers_ok(response: httpx.Response) -> str:
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "same-origin"
    policy = response.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy
    return policy


def test_every_console_answer_sends_the_security_headers(console: tuple[Daemon, Path]) -> None:
    daemon, _ = console
    with httpx.Client(base_url=daemon.url, timeout=30) as browser:
        login = browser.get("/ui/login")
        assert "script-src 'none'" in _headers_ok(login)
        refused = browser.post("/ui/login", data={"token": "wrong"})
        assert refused.status_code == 401
        _headers_ok(refused)
        _headers_ok(browser.get("/ui/tools"))  # the redirect to the login page
        done = browser.post("/ui/login", data={"token": daemon.token}, follow_redirects=True)
        assert done.status_code == 200 and "log out" in done.text, done.text
        calls = browser.get("/ui/calls")
        policy = _headers_ok(calls)
        script = re.search(r"<script>(.*?)</script>", calls.text, re.S)
        assert script is not None
        digest = base64.b64encode(hashlib.sha256(script.group(1).encode()).digest()).decode()
        assert f"script-src 'sha256-{digest}'" in policy  # the page's own script runs
        assert "'unsafe-inline'" not in policy


def test_a_login_body_is_bounded_before_the_token_is_checked(
        console: tuple[Daemon, Path]) -> None:
    daemon, spool = console

    def chunks() -> Iterator[bytes]:  # chunked: no Content-Length to refuse it by
        yield b"--b\r\nContent-Disposition: form-data; name=f; filename=x\r\n\r\n"
        for _ in range(64):
            yield b"x" * 65536

    with httpx.Client(base_url=daemon.url, timeout=30) as browser:
        multipart = browser.post("/ui/login", content=chunks(),
                                 headers={"content-type": "multipart/form-data; boundary=b"})
        assert multipart.status_code == 401  # not a login form: no token in it, not parsed
        big = browser.post("/ui/login", content=chunks(), headers={
            "content-type": "application/x-www-form-urlencoded"})
        assert big.status_code == 413 and "larger than 16384 bytes" in big.text
    status, answer = raw_request(daemon.port, (  # 300 MiB announced: refused unread
        b"POST /ui/login HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\n"
        b"Content-Length: %d\r\n\r\ntoken=" % (300 * 1024 * 1024)))
    assert status == 413, answer
    assert list(spool.iterdir()) == []  # nothing spooled to disk
    daemon.health()
