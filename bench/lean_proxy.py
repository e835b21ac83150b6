"""What the per-call work costs without the daemon's layers: a lean stdio MCP proxy, measured
beside direct stdio, the bare byte relay and `sidecar stdio` in one run.

    python bench/lean_proxy.py [--rounds R] [--block N]     (the comparison)
    python bench/lean_proxy.py [--depth D] -- COMMAND [ARGS...]   (the proxy itself)

For each `tools/call` the proxy does what the sidecar must: parses the request, checks the
arguments against the tool's input schema (jsonschema_rs, compiled from the listing),
fingerprints the call (SHA-256 of canonical JSON), appends its start to a journal file, forwards
it; on the answer parses it, checks its content, commits the outcome row to SQLite (WAL,
synchronous=NORMAL) before answering, keeps a history row (written 100 at a time), re-encodes
the answer and writes it. Every other line is relayed. It has no profiles, pins, rate limits,
permissions, hooks, bounding, metrics, cancellation or restarts: the price of those is what the
daemon adds above it. Blocks of sequential echo calls alternate between the targets; reported:
median calls/s, the ratio to direct, the relaying process's CPU per call (from /proc).

`--depth D` (the row "lean proxy, a task per call"): each call in an asyncio task of its own,
awaiting the answer D coroutines deep (`TASK_DEPTH`), as the daemon's fast route does: its price
against the lean row is what that design costs a call, apart from the layers' work.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.util
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
_CANONICAL = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"))
TASK_DEPTH = 14
"""Coroutines from `sidecar stdio`'s fast route to the upstream's pipe write, each awaiting the
next (2026-12-07, 814e988: FastCalls._run, InFlight.run, FastAnswers.call, Snapshot.execute,
Seam.execute, _run, _settle, the catalog's execute, Caller.__call__, _send, Connection.call,
_send_call, _direct_call, DirectRequests.request). The runs of 2026-12-07 00:29-00:30 in
bench/RESULTS.md used 11, from a list that named two levels since gone and left out five."""


class _Lines(asyncio.Protocol):
    """Calls `on_line` with each complete line as it arrives."""

    def __init__(self, on_line: Callable[[bytes], None]) -> None:
        self.rest = b""
        self.on_line = on_line
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        *lines, self.rest = (self.rest + data).split(b"\n")
        for line in lines:
            if line:
                self.on_line(line)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


class _Work:
    """The per-call work and its stores, in a private temporary directory."""

    def __init__(self, state: str) -> None:
        self.outcomes = self._open(os.path.join(state, "outcomes.sqlite"))
        self.outcomes.execute("CREATE TABLE outcomes (call_id TEXT PRIMARY KEY, tool TEXT, "
                              "status TEXT, body TEXT, created_at REAL, fingerprint TEXT) "
                              "WITHOUT ROWID")
        self.history = self._open(os.path.join(state, "history.sqlite"))
        self.history.execute("CREATE TABLE calls (seq INTEGER PRIMARY KEY, call_id TEXT, "
                             "tool TEXT, status TEXT, input TEXT, started REAL, ms REAL)")
        self.journal = os.open(os.path.join(state, "journal"),
                               os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.validators: dict[str, Any] = {}
        self.pending: dict[Any, tuple[str, str, Any, str, float, float]] = {}
        self.rows: list[tuple[Any, ...]] = []

    @staticmethod
    def _open(path: str) -> sqlite3.Connection:
        db = sqlite3.connect(path, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        return db

    def request(self, line: bytes) -> bytes | None:
        """The line to forward, or None with the refusal written by `answer` instead."""
        if b'"tools/call"' not in line:
            return line
        message = json.loads(line)
        params = message["params"]
        name, arguments = params["name"], params.get("arguments") or {}
        validator = self.validators.get(name)
        if validator is not None and not validator.is_valid(arguments):
            return None
        fingerprint = hashlib.sha256(
            _CANONICAL.encode([name, arguments, "session", "agent"]).encode()).hexdigest()[:32]
        call_id = f"session:{message['id']}"
        os.write(self.journal, f"{call_id}\t{name}\t{fingerprint}\n".encode())
        self.pending[message["id"]] = (call_id, name, arguments, fingerprint, time.time(),
                                       time.perf_counter())
        return line

    def answer(self, line: bytes) -> bytes:
        """The line to send the client for a line of the server."""
        if self.pending and b'"result"' in line:
            return self.settle(json.loads(line)) or line
        elif b'"inputSchema"' in line:
            import jsonschema_rs

            for tool in json.loads(line).get("result", {}).get("tools", []):
                self.validators[tool["name"]] = jsonschema_rs.validator_for(tool["inputSchema"])
        return line

    def settle(self, message: dict[str, Any]) -> bytes | None:
        """The client's line for the server's answer to a pending call (None: not one)."""
        call = self.pending.pop(message.get("id"), None)
        return None if call is None else self._settle(message, *call)

    def _settle(self, message: dict[str, Any], call_id: str, name: str, arguments: Any,
                fingerprint: str, started: float, t0: float) -> bytes:
        result = message["result"]
        content = result.get("content")
        if not isinstance(content, list) or not all(
                isinstance(c, dict) and isinstance(c.get("type"), str) for c in content):
            raise ValueError(f"not a tools/call result: {result!r}")
        status = "error" if result.get("isError") else "completed"
        body = json.dumps({"call_id": call_id, "tool": name, "status": status,
                           "content": content}, ensure_ascii=False, separators=(",", ":"))
        self.outcomes.execute("INSERT OR IGNORE INTO outcomes VALUES (?,?,?,?,?,?)",
                              (call_id, name, status, body, time.time(), fingerprint))
        self.rows.append((call_id, name, status, json.dumps(arguments), started,
                          (time.perf_counter() - t0) * 1000))
        if len(self.rows) >= 100:
            with self.history:
                self.history.executemany("INSERT INTO calls (call_id, tool, status, input, "
                                         "started, ms) VALUES (?,?,?,?,?,?)", self.rows)
            self.rows.clear()
        return json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result},
                          ensure_ascii=False, separators=(",", ":")).encode()


async def proxy(argv: list[str], depth: int = 0) -> None:
    loop = asyncio.get_running_loop()
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    assert child.stdin is not None and child.stdout is not None
    up, _ = await loop.connect_write_pipe(asyncio.Protocol, child.stdin)
    out, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(1, "wb", buffering=0))
    with tempfile.TemporaryDirectory() as state:
        work = _Work(state)

        answers: dict[Any, asyncio.Future[dict[str, Any]]] = {}  # (--depth) by request id
        calls: set[asyncio.Task[None]] = set()

        async def forward(line: bytes, key: Any, level: int) -> bytes:
            if level:
                return await forward(line, key, level - 1)
            answers[key] = answer = loop.create_future()
            up.write(line + b"\n")
            return work.settle(await answer) or b""

        async def call(line: bytes, key: Any) -> None:
            out.write(await forward(line, key, depth) + b"\n")

        def from_client(line: bytes) -> None:
            forward_line = work.request(line)
            if forward_line is None:
                error = {"jsonrpc": "2.0", "id": json.loads(line)["id"], "result": {
                    "content": [{"type": "text", "text": "invalid input"}], "isError": True}}
                out.write(json.dumps(error).encode() + b"\n")
            elif depth and b'"tools/call"' in line:
                task = loop.create_task(call(forward_line, json.loads(line)["id"]))
                calls.add(task)
                task.add_done_callback(calls.discard)
            else:
                up.write(forward_line + b"\n")

        def from_server(line: bytes) -> None:
            if answers and b'"result"' in line:
                message = json.loads(line)
                waiting = answers.pop(message.get("id"), None)
                if waiting is not None:
                    waiting.set_result(message)
                    return
            out.write(work.answer(line) + b"\n")

        await loop.connect_read_pipe(lambda: _Lines(from_server), child.stdout)
        client = _Lines(from_client)
        await loop.connect_read_pipe(lambda: client, os.fdopen(0, "rb", buffering=0))
        await client.closed
        up.close()
        await asyncio.to_thread(child.wait)


async def measure(rounds: int, block: int) -> None:
    spec = importlib.util.spec_from_file_location("compare", HERE / "compare.py")
    assert spec is not None and spec.loader is not None
    compare: Any = importlib.util.module_from_spec(spec)
    sys.modules["compare"] = compare
    spec.loader.exec_module(compare)
    py, upstream = sys.executable, str(HERE / "upstream.py")
    with tempfile.TemporaryDirectory() as tmp:
        manifests = compare.write_manifest(Path(tmp) / "m", protocol="legacy")
        state = Path(tmp) / "state"
        # the process whose CPU is counted: none (direct), the client's new child, the daemon
        targets: dict[str, tuple[Any, str | None]] = {
            "direct stdio": (compare.stdio_params(py, [upstream]), None),
            "bare byte relay": (compare.stdio_params(
                py, [str(HERE / "byte_relay.py"), "--", py, upstream]), "child"),
            "lean proxy": (compare.stdio_params(
                py, [str(HERE / "lean_proxy.py"), "--", py, upstream]), "child"),
            "lean proxy, a task per call": (compare.stdio_params(
                py, [str(HERE / "lean_proxy.py"), "--depth", str(TASK_DEPTH), "--", py,
                     upstream]), "child"),
            "sidecar stdio": (compare.stdio_params(
                py, ["-m", "sidecar.cli", "stdio", "--manifests", str(manifests),
                     "--state-dir", str(state)], env={"SIDECAR_STATE_DIR": str(state)}),
                "daemon"),
        }
        async with AsyncExitStack() as stack:
            sides: dict[str, tuple[Any, str, int | None]] = {}
            for label, (params, process) in targets.items():
                before = set(compare.new_children(set()))
                client = await stack.enter_async_context(compare.mcp_client(params))
                name = await compare.find_tool(client, "echo")
                for _ in range(200):
                    await compare.call(client, name, {"text": "warm"})
                pid = (compare.state_daemon(state) if process == "daemon"
                       else next(iter(compare.new_children(before)), None) if process
                       else None)
                sides[label] = (client, name, pid)
            rates: dict[str, list[float]] = {label: [] for label in sides}
            cpu: dict[str, list[float]] = {label: [] for label in sides}
            for r in range(rounds):
                for label in list(sides) if r % 2 == 0 else list(sides)[::-1]:
                    client, name, pid = sides[label]
                    used = compare.cpu_seconds(pid)
                    started = time.perf_counter()
                    for _ in range(block):
                        result = await compare.call(client, name, {"text": "hello"})
                    rates[label].append(block / (time.perf_counter() - started))
                    if targets[label][1] == "daemon":  # the rows its writers commit behind
                        await asyncio.sleep(compare.WRITE_BEHIND_SECONDS)
                    if "hello" not in str(result.content):  # each target answers the call
                        raise SystemExit(f"{label} answered {result!r}")
                    if pid:
                        cpu[label].append((compare.cpu_seconds(pid) - used) / block * 1e6)
    direct = statistics.median(rates["direct stdio"])
    print(f"{rounds} rounds of {block} sequential echo calls per target, taking turns; "
          f"load average {os.getloadavg()[0]:.2f}\n")
    print("| target | calls/s | vs direct | relaying process CPU µs/call |\n|---|---|---|---|")
    for label, got in rates.items():
        spent = f"{statistics.mean(cpu[label]):.0f}" if cpu[label] else ""
        print(f"| {label} | {statistics.median(got):,.0f} | "
              f"{statistics.median(got) / direct:.2f}x | {spent} |")


def main() -> None:
    if "--" in sys.argv:
        import uvloop

        split = sys.argv.index("--")
        own = argparse.ArgumentParser()
        own.add_argument("--depth", type=int, default=0)
        uvloop.run(proxy(sys.argv[split + 1:], own.parse_args(sys.argv[1:split]).depth))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block", type=int, default=300)
    args = parser.parse_args()
    asyncio.run(measure(args.rounds, args.block))


if __name__ == "__main__":
    main()
