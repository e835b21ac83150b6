"""SEP-2663 task status notifications: a client's `subscriptions/listen` stream that names a
task hears `notifications/tasks` (the task's full DetailedTask) as its status changes: over the
stdio pipe of a real `serve_stdio` process and over `/mcp` (the listen POST's SSE response),
with the suite's tasks fixture upstream."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx2
import pytest

from tests.serve.mcp_facade.conftest import HARNESS, TOKEN, serving, write_manifest

pytestmark = pytest.mark.anyio
TASKS_FIXTURE = Path(__file__).resolve().parents[2] / "conformance" / "tasks_fixture.py"
TASKS = "io.modelcontextprotocol/tasks"
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"


def meta(*, tasks: bool = True) -> dict[str, Any]:
    caps: dict[str, Any] = {"extensions": {TASKS: {}}} if tasks else {}
    return {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": caps}


class Pipe:
    """JSON-RPC lines to and from the daemon's stdin and stdout."""

    def __init__(self, process: anyio.abc.Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self._stdin = process.stdin
        self._stdout = process.stdout
        self._buffer = b""

    async def send(self, message: dict[str, Any]) -> None:
        await self._stdin.send((json.dumps(message) + "\n").encode())

    async def receive(self) -> dict[str, Any]:
        while b"\n" not in self._buffer:
            self._buffer += await self._stdout.receive()
        line, self._buffer = self._buffer.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        return message

    async def answer(self, request_id: int) -> dict[str, Any]:
        """The reply to `request_id` (notifications before it are skipped)."""
        with anyio.fail_after(30):
            while (message := await self.receive()).get("id") != request_id:
                pass
        return message


@asynccontextmanager
async def daemon(tmp_path: Path) -> AsyncIterator[Pipe]:
    manifests = write_manifest(tmp_path / "manifests", {"tasks": {
        "command": sys.executable, "args": [str(TASKS_FIXTURE)], "namespace": "",
        "protocol": "legacy"}})
    argv = [sys.executable, str(HARNESS), "stdio", "--manifests", str(manifests),
            "--state-dir", str(tmp_path / "state"), "--root", str(tmp_path)]
    async with await anyio.open_process(argv, stderr=None) as process:
        try:
            yield Pipe(process)
        finally:
            process.kill()


async def test_a_listen_stream_hears_its_task_until_it_completes(tmp_path: Path) -> None:
    async with daemon(tmp_path) as pipe:
        await pipe.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "slow_compute", "arguments": {"seconds": 0.5, "label": "heard"},
            "_meta": meta()}})
        created = (await pipe.answer(1))["result"]
        assert created["resultType"] == "task", created
        task_id = created["taskId"]
        await pipe.send({"jsonrpc": "2.0", "id": 2, "method": "subscriptions/listen",
                         "params": {"notifications": {"taskIds": [task_id, "not-a-task"]},
                                    "_meta": meta()}})
        heard: list[dict[str, Any]] = []
        with anyio.fail_after(30):
            ack = await pipe.receive()
            while not heard or heard[-1]["status"] != "completed":
                message = await pipe.receive()
                assert message.get("method") == "notifications/tasks", message
                heard.append(message["params"])
    assert ack["method"] == "notifications/subscriptions/acknowledged", ack
    assert ack["params"]["notifications"]["taskIds"] == [task_id]  # the ones it holds
    assert [p["status"] for p in heard] == ["working", "completed"]
    done = heard[-1]
    assert done["taskId"] == task_id and done["ttlMs"] > 0
    assert done["result"]["content"] == [{"type": "text", "text": "computed heard"}]
    assert done["_meta"][SUBSCRIPTION_ID] == 2


async def test_naming_tasks_without_the_extension_is_refused(tmp_path: Path) -> None:
    async with daemon(tmp_path) as pipe:
        await pipe.send({"jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen",
                         "params": {"notifications": {"taskIds": ["any"]},
                                    "_meta": meta(tasks=False)}})
        error = (await pipe.answer(1))["error"]
    assert error["code"] == -32021, error
    assert error["data"] == {"requiredCapabilities": {"extensions": {TASKS: {}}}}


async def test_over_streamable_http_the_listen_response_carries_them(tmp_path: Path) -> None:
    """Streamable HTTP: the listen POST's SSE response is the stream."""
    servers = {"tasks": {"command": sys.executable, "args": [str(TASKS_FIXTURE)],
                         "namespace": "", "protocol": "legacy"}}
    async with serving(tmp_path, servers) as served, httpx2.AsyncClient(timeout=30) as http:

        def headers(method: str, name: str) -> dict[str, str]:
            return {"authorization": f"Bearer {TOKEN}", "mcp-protocol-version": "2026-07-28",
                    "mcp-method": method, "mcp-name": name,
                    "accept": "application/json, text/event-stream"}

        called = await http.post(served.url, headers=headers("tools/call", "slow_compute"), json={
            "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                "name": "slow_compute", "arguments": {"seconds": 0.5, "label": "http"},
                "_meta": meta()}})
        task_id = _messages(called.text)[-1]["result"]["taskId"]
        listen = {"jsonrpc": "2.0", "id": 7, "method": "subscriptions/listen", "params": {
            "notifications": {"taskIds": [task_id]}, "_meta": meta()}}
        heard: list[dict[str, Any]] = []
        with anyio.fail_after(30):
            async with http.stream("POST", served.url, json=listen,
                                   headers=headers("subscriptions/listen", "")) as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                async for line in response.aiter_lines():
                    heard.extend(_messages(line))
                    if heard and heard[-1].get("params", {}).get("status") == "completed":
                        break
    assert heard[0]["method"] == "notifications/subscriptions/acknowledged"
    assert heard[0]["params"]["notifications"]["taskIds"] == [task_id]
    tasks = [m["params"] for m in heard if m.get("method") == "notifications/tasks"]
    assert [t["status"] for t in tasks] == ["working", "completed"]
    assert tasks[-1]["result"]["content"][0]["text"] == "computed http"
    assert tasks[-1]["_meta"][SUBSCRIPTION_ID] == 7


def _messages(text: str) -> list[dict[str, Any]]:
    """The JSON-RPC messages of a JSON body or of SSE `data:` lines."""
    if text.lstrip().startswith("{"):
        return [json.loads(text)]
    return [json.loads(line[5:]) for line in text.splitlines()
            if line.startswith("data:") and line[5:].strip()]
