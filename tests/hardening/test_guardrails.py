"""Issue 42, guardrails: a real `sidecar serve` with a real MCP test server (`--leaky`: tools that
return a fake AWS key or private key, and one that records what it received) and a real HTTP
guard on 127.0.0.1. Secrets are redacted for the model and in the managed store's kept text,
blocked with error kind `guardrail` in a stricter profile, refused or redacted on input before
the upstream sees them; the guard allows, denies and replaces; a guard that is down fails
closed or open as configured; every decision is in the history (`/v1/calls`, `sidecar calls`)
and in `/metrics`."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.bridges.helpers import TESTSERVER
from tests.hardening.conftest import SIDECAR, Daemon, start_daemon, stop_daemon

AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
AWS_MARK = "[redacted: AWS Access Key]"


class Guard(BaseHTTPRequestHandler):
    """The external guard: denies inputs holding `deny-me`, replaces `swap-me` inputs and
    `hide-output` outputs, allows the rest; keeps every request it got."""

    seen: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        payload = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.seen.append(payload)
        text = json.dumps(payload["content"])
        answer: dict[str, Any] = {"decision": "allow"}
        if payload["stage"] == "input" and "deny-me" in text:
            answer = {"decision": "deny", "reason": "deny-me is not welcome here"}
        elif payload["stage"] == "input" and "swap-me" in text:
            answer = {"decision": "replace", "content": {"text": "swapped by the guard"}}
        elif payload["stage"] == "output" and "hide-output" in text:
            answer = {"decision": "replace", "content": "hidden by the guard"}
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _closed_port() -> int:
    """A port nothing listens on (bound, then closed): connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _manifest(events: Path, guard: int, dead: int) -> str:
    py, server = json.dumps(sys.executable), json.dumps(str(TESTSERVER))
    return f'''
[guardrails]
secrets = "redact"

[mcpServers.up]
command = {py}
args = [{server}, "--leaky", "--events", {json.dumps(str(events))}]

[mcpServers.plain]
command = {py}
args = [{server}, "--leaky"]
guardrails = {{ secrets = "off" }}

[profiles.strict]
servers = ["up"]
guardrails = {{ secrets = "block" }}

[profiles.hooked]
servers = ["up"]
guardrails = {{ hook = "http://127.0.0.1:{guard}/guard", timeout = 5 }}

[profiles.closed]
servers = ["up"]
guardrails = {{ hook = "http://127.0.0.1:{dead}/guard", timeout = 2 }}

[profiles.open]
servers = ["up"]
guardrails = {{ hook = "http://127.0.0.1:{dead}/guard", timeout = 2, on_error = "allow" }}
'''


@pytest.fixture(scope="module")
def guard() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Guard)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory,
           guard: ThreadingHTTPServer) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("guardrails")
    events = tmp / "events.jsonl"
    manifest = _manifest(events, guard.server_address[1], _closed_port())
    running = start_daemon(tmp, manifests={"m.toml": manifest})
    try:
        deadline = time.monotonic() + 60
        while any(running.health()["servers"][key]["state"] != "ready" for key in ("up", "plain")):
            assert time.monotonic() < deadline, running.health()["servers"]
            time.sleep(0.05)
        yield running
    finally:
        stop_daemon(running)


def _call(daemon: Daemon, profile: str | None, name: str, args: dict[str, Any],
          call_id: str) -> dict[str, Any]:
    with daemon.client() as client:
        snap = client.post("/v1/snapshots", json={"session_id": "s", "profile": profile})
        assert snap.status_code == 201, snap.text
        answer = client.post(f"/v1/snapshots/{snap.json()['id']}/calls", json={
            "name": name, "input": args,
            "context": {"session_id": "s", "agent": "a", "message_id": "m", "call_id": call_id}})
    assert answer.status_code == 200, answer.text
    outcome: dict[str, Any] = answer.json()
    return outcome


def _text(outcome: dict[str, Any]) -> str:
    assert outcome["status"] == "completed", outcome
    return "\n".join(item.get("text", "") for item in outcome["content"])


def _remembered(daemon: Daemon) -> list[str]:
    lines = (daemon.state.parent / "events.jsonl").read_text().splitlines()
    return [e["text"] for e in map(json.loads, lines) if e["event"] == "remembered"]


def _history(daemon: Daemon, call_id: str) -> dict[str, Any]:
    with daemon.client() as client:
        rows = client.get("/v1/calls", params={"limit": 1000}).json()["calls"]
    [row] = [r for r in rows if r["call_id"] == call_id]
    return row


def test_secrets_are_redacted_for_the_model_and_in_the_managed_store(daemon: Daemon) -> None:
    aws = _text(_call(daemon, None, "up_leak", {"kind": "aws"}, "r-aws"))
    assert AWS_MARK in aws and AWS_KEY not in aws and "region = eu-west-1" in aws
    pem = _text(_call(daemon, None, "up_leak", {"kind": "private_key"}, "r-pem"))
    assert "[redacted: Private Key]" in pem and "(end of file)" in pem
    assert "MIIE" not in pem and "bm90IGEg" not in pem and "BEGIN RSA" not in pem
    structured = _call(daemon, None, "up_leak_structured", {}, "r-structured")
    assert structured["output"] == {"key": AWS_MARK}, structured
    assert AWS_KEY not in json.dumps(structured)

    big = _call(daemon, None, "up_leak", {"kind": "big", "bytes": 200_000}, "r-big")
    [kept] = big["managed"]
    assert AWS_KEY not in _text(big)
    with daemon.client() as client:
        found = client.get(f"/v1/managed/{kept['ref']}", params={"pattern": "key "}).json()
        leaked = client.get(f"/v1/managed/{kept['ref']}", params={"pattern": "AKIA"}).json()
    assert [m["text"] for m in found["matches"]] == [f"key {AWS_MARK}"]
    assert leaked["matches"] == []

    row = _history(daemon, "r-aws")
    assert row["guardrail"] == [
        {"stage": "input", "rule": "secrets", "decision": "allow"},
        {"stage": "output", "rule": "secrets", "decision": "redact",
         "kinds": ["AWS Access Key"], "count": 1},
    ]


def test_a_server_entry_turns_the_scan_off_for_its_tools(daemon: Daemon) -> None:
    assert AWS_KEY in _text(_call(daemon, None, "plain_leak", {"kind": "aws"}, "plain-aws"))
    assert _history(daemon, "plain-aws").get("guardrail") is None


def test_a_stricter_profile_blocks_outputs_and_inputs(daemon: Daemon) -> None:
    blocked = _call(daemon, "strict", "up_leak", {"kind": "aws"}, "b-out")
    assert blocked["status"] == "error"
    assert blocked["error"]["kind"] == "guardrail"
    assert blocked["error"]["message"].startswith(
        'Guardrail "secrets" blocked the output of up_leak: it held a secret (AWS Access Key)')
    assert AWS_KEY not in json.dumps(blocked)

    refused = _call(daemon, "strict", "up_remember", {"text": f"b-in {AWS_KEY}"}, "b-in")
    assert refused["error"]["kind"] == "guardrail", refused
    assert "up_remember was not run" in refused["error"]["message"]
    assert not any(text.startswith("b-in") for text in _remembered(daemon))
    row = _history(daemon, "b-in")
    assert row["guardrail"] == [
        {"stage": "input", "rule": "secrets", "decision": "block", "kinds": ["AWS Access Key"]}]
    assert row["input"] == {"text": f"b-in {AWS_MARK}"}  # the history keeps no secret either


def test_inputs_are_redacted_before_the_upstream_sees_them(daemon: Daemon) -> None:
    done = _call(daemon, None, "up_remember", {"text": f"i-red my key is {AWS_KEY}"}, "i-red")
    assert _text(done) == "remembered"
    assert f"i-red my key is {AWS_MARK}" in _remembered(daemon)
    assert not any(AWS_KEY in text for text in _remembered(daemon))
    assert _history(daemon, "i-red")["input"] == {"text": f"i-red my key is {AWS_MARK}"}


def test_the_guard_allows_denies_and_replaces(daemon: Daemon,
                                              guard: ThreadingHTTPServer) -> None:
    assert _text(_call(daemon, "hooked", "up_echo", {"text": "hello"}, "h-allow")) == "hello"
    asked = [p for p in Guard.seen if p["tool"] == "up_echo"][:2]
    assert asked == [
        {"stage": "input", "tool": "up_echo", "profile": "hooked", "content": {"text": "hello"}},
        {"stage": "output", "tool": "up_echo", "profile": "hooked",
         "content": [{"type": "text", "text": "hello"}]},
    ]
    denied = _call(daemon, "hooked", "up_remember", {"text": "h-deny deny-me"}, "h-deny")
    assert denied["error"] == {
        "kind": "guardrail", "message": 'Guardrail "hook" denied the input of up_remember: '
        "deny-me is not welcome here; up_remember was not run."}
    assert not any(text.startswith("h-deny") for text in _remembered(daemon))
    swapped = _call(daemon, "hooked", "up_remember", {"text": "swap-me"}, "h-swap")
    assert _text(swapped) == "remembered"
    assert "swapped by the guard" in _remembered(daemon)
    hidden = _call(daemon, "hooked", "up_echo", {"text": "hide-output"}, "h-hide")
    assert _text(hidden) == "hidden by the guard"
    assert _history(daemon, "h-hide")["guardrail"][-1] == {
        "stage": "output", "rule": "hook", "decision": "replace"}


def test_a_guard_that_is_down_fails_closed_or_open(daemon: Daemon) -> None:
    closed = _call(daemon, "closed", "up_remember", {"text": "d-closed"}, "d-closed")
    assert closed["error"]["kind"] == "guardrail", closed
    assert closed["error"]["message"] == (
        'Guardrail "hook" refused the input of up_remember: the guard could not be reached '
        '(ConnectError), and on_error is "deny"; up_remember was not run.')
    assert "d-closed" not in _remembered(daemon)
    opened = _call(daemon, "open", "up_remember", {"text": "d-open"}, "d-open")
    assert _text(opened) == "remembered" and "d-open" in _remembered(daemon)
    decisions = _history(daemon, "d-open")["guardrail"]
    assert [(d["stage"], d["rule"], d["decision"]) for d in decisions] == [
        ("input", "secrets", "allow"), ("input", "hook", "error_allow"),
        ("output", "secrets", "allow"), ("output", "hook", "error_allow")]


def test_decisions_show_in_sidecar_calls_and_metrics(daemon: Daemon) -> None:
    _call(daemon, None, "up_leak", {"kind": "aws"}, "m-aws")
    shown = subprocess.run(
        [*SIDECAR, "calls", "--url", daemon.url, "--tool", "up_leak"], capture_output=True,
        text=True, timeout=60, check=False,
        env={"SIDECAR_TOKEN": daemon.token, "PATH": "/usr/bin:/bin"})
    [line] = [line for line in shown.stdout.splitlines() if "m-aws" in line]
    assert "guardrail: input secrets allow; output secrets redact (AWS Access Key)" in line
    with daemon.client() as client:
        metrics = client.get("/metrics").text
    assert ('sidecar_guardrail_decisions_total{decision="redact",rule="secrets",'
            'stage="output"}') in metrics
