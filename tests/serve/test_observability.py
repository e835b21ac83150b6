"""Traces, call history and metrics of a real `sidecar serve` process: spans exported over
OTLP/HTTP to a real receiver process (tests/serve/servers/otlp_receiver.py) and continuing the
client's `traceparent`; `GET /v1/calls` and `sidecar calls` (through the daemon, and from the
state directory once it has stopped); the histograms on `/metrics`."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

SIDECAR = [sys.executable, "-m", "sidecar.cli"]
RECEIVER = Path(__file__).parent / "servers" / "otlp_receiver.py"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
MANIFEST = """
[tools.numbers]
kind = "command"
description = "Print the numbers 1..n"
input = { type = "object", properties = { n = { type = "integer" }, api_key = {} } }
argv = ["seq", "{n}"]

[audit]
inputs = "redacted"
"""


@dataclass
class Daemon:
    url: str
    token: str
    env: dict[str, str]
    spans: Path

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30,
                            headers={"authorization": f"Bearer {self.token}"})

    def call(self, call_id: str, n: int, headers: dict[str, str] | None = None,
             session: str = "s1") -> dict[str, Any]:
        with self.client() as client:
            snap = client.post("/v1/snapshots", json={"session_id": session}).json()["id"]
            return dict(client.post(f"/v1/snapshots/{snap}/calls", headers=headers or {}, json={
                "name": "numbers", "input": {"n": n, "api_key": "sk-secret"},
                "context": {"session_id": session, "agent": "obs-test", "message_id": "m",
                            "call_id": call_id}}).json())


def started(argv: list[str], env: dict[str, str], marker: str, stream: str = "stderr"
            ) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(argv, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    pipe = proc.stderr if stream == "stderr" else proc.stdout
    assert pipe is not None
    lines = []
    while True:
        line = pipe.readline()
        assert line, f"{argv[1:3]} exited early: {''.join(lines)}"
        lines.append(line)
        if marker in line:
            threading.Thread(target=pipe.read, daemon=True).start()
            return proc, line.split(marker, 1)[1].strip()


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    spans = tmp_path / "spans.jsonl"
    receiver, port = started([sys.executable, str(RECEIVER), str(spans)], dict(os.environ),
                             "PORT ", stream="stdout")
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "tools.toml").write_text(MANIFEST)
    token = secrets.token_urlsafe(32)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SIDECAR_", "OTEL_"))}
    env.update(SIDECAR_STATE_DIR=str(tmp_path / "state"),
               SIDECAR_MANIFESTS=str(tmp_path / "manifests"), SIDECAR_TOKEN=token,
               OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
               OTEL_SERVICE_NAME="sidecar-under-test", OTEL_BSP_SCHEDULE_DELAY="50")
    try:
        proc, url = started([*SIDECAR, "serve", "--port", "0"], env, "listening on ")
        try:
            yield Daemon(url, token, env, spans)
        finally:
            stop(proc)
    finally:
        stop(receiver)


def spans_of(path: Path, name: str, within: float = 15.0) -> list[dict[str, Any]]:
    for _ in range(int(within / 0.05)):
        if path.exists():
            found = [json.loads(line) for line in path.read_text().splitlines()]
            found = [s for s in found if s["name"] == name]
            if found:
                return found
        time.sleep(0.05)
    raise AssertionError(f"no span {name!r} reached the receiver")


def test_spans_reach_a_real_otlp_receiver_in_the_clients_trace(daemon: Daemon) -> None:
    outcome = daemon.call("traced-1", 5, headers={"traceparent": PARENT})
    assert outcome["status"] == "completed"
    call = spans_of(daemon.spans, "execute_tool numbers")[0]
    assert call["trace_id"] == TRACE_ID and call["parent_span_id"] == "00f067aa0ba902b7"
    assert call["service"] == "sidecar-under-test"
    assert call["attributes"]["gen_ai.tool.call.id"] == "traced-1"
    assert call["attributes"]["sidecar.status"] == "completed"
    steps = {s["name"]: s for s in (json.loads(line) for line in
                                    daemon.spans.read_text().splitlines())}
    for step in ("validate_input", "record_outcome"):
        assert steps[step]["parent_span_id"] == call["span_id"], step


def test_history_through_the_api_and_the_cli(daemon: Daemon) -> None:
    daemon.call("h-1", 3, session="s-a")
    daemon.call("h-2", 100_000, session="s-b")
    daemon.call("h-1", 3, session="s-a")  # a replay is a row of its own
    with daemon.client() as client:
        body = client.get("/v1/calls", params={"session": "s-a"}).json()
        assert [c["call_id"] for c in body["calls"]] == ["h-1", "h-1"]
        assert [c["replayed"] for c in body["calls"]] == [True, False]
        first = body["calls"][1]
        assert first["input"] == {"n": 3, "api_key": "***"}  # redacted
        assert first["tool"] == "numbers" and first["agent"] == "obs-test"
        big = client.get("/v1/calls", params={"session": "s-b"}).json()["calls"][0]
        assert big["retained"] and big["content_bytes"] < big["input_bytes"] * 10_000
        page = client.get("/v1/calls", params={"limit": "1"}).json()
        assert len(page["calls"]) == 1 and page["next_cursor"]
        assert client.get("/v1/calls", params={"since": "soon"}).status_code == 400
        lines = client.get("/v1/calls", params={"format": "jsonl"}).text.splitlines()
        assert len(lines) == 3 and json.loads(lines[0])["call_id"] == "h-1"
        metrics = client.get("/metrics").text
        assert 'sidecar_call_duration_seconds_count{server="manifest-tools",tool="numbers"} 2.0' \
            in metrics
        assert 'sidecar_call_input_bytes_bucket{le="64.0",server="manifest-tools",' \
            'tool="numbers"} 2.0' in metrics
    shown = subprocess.run([*SIDECAR, "calls", "--session", "s-b"], env=daemon.env,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "h-2" in shown.stdout and "numbers" in shown.stdout and "h-1" not in shown.stdout
    assert big["retained"][0] in shown.stdout


def test_the_cli_reads_the_history_of_a_stopped_daemon(tmp_path: Path) -> None:
    token = secrets.token_urlsafe(32)
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "tools.toml").write_text(MANIFEST.replace('"redacted"', '"none"'))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIDECAR_", "OTEL_"))}
    env.update(SIDECAR_STATE_DIR=str(tmp_path / "state"),
               SIDECAR_MANIFESTS=str(tmp_path / "manifests"), SIDECAR_TOKEN=token)
    proc, url = started([*SIDECAR, "serve", "--port", "0"], env, "listening on ")
    try:
        Daemon(url, token, env, tmp_path / "unused").call("stopped-1", 2)
    finally:
        stop(proc)
    shown = subprocess.run([*SIDECAR, "calls", "--jsonl", "--embedded"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    rows = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [r["call_id"] for r in rows] == ["stopped-1"]
    assert rows[0]["input"] is None  # audit.inputs = "none"
    bad = subprocess.run([*SIDECAR, "calls", "--limit", "0", "--embedded"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "limit" in bad.stderr


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_an_mcp_client_trace_continues_through_sidecar_stdio(tmp_path: Path, mode: str) -> None:
    import anyio
    from mcp import Client, StdioServerParameters

    spans = tmp_path / "spans.jsonl"
    receiver, port = started([sys.executable, str(RECEIVER), str(spans)], dict(os.environ),
                             "PORT ", stream="stdout")
    try:
        (tmp_path / "manifests").mkdir()
        (tmp_path / "manifests" / "tools.toml").write_text(MANIFEST)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SIDECAR_", "OTEL_"))}
        env.update(SIDECAR_STATE_DIR=str(tmp_path / "state"),
                   SIDECAR_MANIFESTS=str(tmp_path / "manifests"),
                   OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
                   OTEL_BSP_SCHEDULE_DELAY="50")
        params = StdioServerParameters(command=sys.executable, args=["-m", "sidecar.cli", "stdio"],
                                       env=env)

        async def call() -> None:
            async with Client(params, mode=mode, cache=None, read_timeout_seconds=60) as client:
                result = await client.call_tool("numbers", {"n": 2}, meta={"traceparent": PARENT})
                assert not result.is_error

        anyio.run(call)
        span = spans_of(spans, "execute_tool numbers")[0]
        assert span["trace_id"] == TRACE_ID and span["parent_span_id"] == "00f067aa0ba902b7"
    finally:
        stop(receiver)


def test_a_fast_mcp_call_is_in_the_history_and_the_metrics_once_answered(
        daemon: Daemon) -> None:
    """The history row and the metrics of a call on `/mcp`'s fast route are written after its
    answer (`sidecar.execution.behind`), yet before the daemon reads the next request."""
    headers = {"accept": "application/json, text/event-stream",
               "content-type": "application/json"}
    with daemon.client() as client:
        opened = client.post("/mcp", headers=headers, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "raw", "version": "1"}}})
        assert opened.status_code == 200
        headers.update({"mcp-session-id": opened.headers["mcp-session-id"],
                        "mcp-protocol-version": "2025-11-25"})
        assert client.post("/mcp", headers=headers, json={
            "jsonrpc": "2.0", "method": "notifications/initialized"}).status_code == 202
        for request_id in (2, 3):  # the second listing is the fast route's, so are calls
            listed = client.post("/mcp", headers=headers, json={
                "jsonrpc": "2.0", "id": request_id, "method": "tools/list"})
            assert listed.status_code == 200
        assert listed.headers["content-type"] == "application/json"
        for n, call_id in enumerate(("fast-a", "fast-b", "fast-c"), start=1):
            called = client.post("/mcp", headers=headers, json={
                "jsonrpc": "2.0", "id": 10 + n, "method": "tools/call", "params": {
                    "name": "numbers", "arguments": {"n": n},
                    "_meta": {"io.mcp-sidecar/call_id": call_id}}})
            assert called.headers["content-type"] == "application/json"  # the fast route
            assert called.json()["result"]["content"][0]["text"].split() == [
                str(i) for i in range(1, n + 1)]
            calls = client.get("/v1/calls", params={"limit": "1"}).json()["calls"]
            assert calls[0]["call_id"] == call_id and calls[0]["status"] == "completed"
            metrics = client.get("/metrics").text
            assert ('sidecar_call_duration_seconds_count{server="manifest-tools",'
                    f'tool="numbers"}} {float(n)}') in metrics
