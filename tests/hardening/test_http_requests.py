"""Issue 26 item 10: strict Host/Origin parsing and request targets, against a real daemon.

Every request goes over a raw socket to a `sidecar serve` process, so the bytes are exactly the
attacker's (an HTTP client library would normalise or refuse them first).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.hardening.daemon_process import Daemon, raw_request, serving


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with serving(tmp_path_factory.mktemp("http") / "state") as running:
        yield running


def _get(daemon: Daemon, *headers: str, target: str = "/v1/health") -> tuple[int, bytes]:
    lines = [f"GET {target} HTTP/1.1", f"Authorization: Bearer {daemon.token}", *headers,
             "Connection: close", "", ""]
    return raw_request(daemon.port, "\r\n".join(lines).encode("latin-1"))


def test_a_well_formed_local_request_is_served(daemon: Daemon) -> None:
    status, body = _get(daemon, f"Host: 127.0.0.1:{daemon.port}")
    assert status == 200, body
    assert _get(daemon, "Host: [::1]:8765")[0] == 200
    assert _get(daemon, "Host: localhost", "Origin: http://localhost:3000")[0] == 200


@pytest.mark.parametrize("host", [
    "[::1]evil.example",
    "[::1].evil.example",
    "[::1]:80evil.example",
    "[::1]@evil.example",
    "localhost:80@evil.example",
    "localhost@evil.example",
    "127.0.0.1:1@evil.example:80",
    "localhost:http",
    "localhost:99999",
    "localhost.",
    "localhost:",
    "local host",
    "[::1",
    "evil.example",
])
def test_a_host_header_that_is_not_exactly_a_local_name_is_refused(
    daemon: Daemon, host: str
) -> None:
    status, body = _get(daemon, f"Host: {host}")
    assert status == 403, body
    assert b'"forbidden_host"' in body


@pytest.mark.parametrize("origin", [
    "http://localhost:1@evil.example",
    "http://[::1]evil.example",
    "http://localhost/path",
    "http://localhost.evil.example",
    "null",
    "file://localhost",
])
def test_an_origin_that_is_not_exactly_a_local_origin_is_refused(
    daemon: Daemon, origin: str
) -> None:
    status, body = _get(daemon, "Host: localhost", f"Origin: {origin}")
    assert status == 403, body
    assert b'"forbidden_origin"' in body


@pytest.mark.parametrize("headers", [
    ("Host: evil.example", "Host: localhost"),
    ("Host: localhost", "Host: evil.example"),
    ("Host: localhost", "Host: localhost"),
    ("Host: localhost", "Origin: http://evil.example", "Origin: http://localhost"),
])
def test_a_duplicated_host_or_origin_header_is_refused(
    daemon: Daemon, headers: tuple[str, ...]
) -> None:
    status, body = _get(daemon, *headers)
    assert status == 400, body
    assert b"more than one" in body


@pytest.mark.parametrize("target", [
    "http://evil.example/v1/health",
    "http://localhost/v1/health",
    "HTTP://127.0.0.1/v1/health",
])
def test_an_absolute_form_request_target_is_refused(daemon: Daemon, target: str) -> None:
    status, body = _get(daemon, "Host: localhost", target=target)
    assert status == 400, body
    assert b"absolute-form" in body
