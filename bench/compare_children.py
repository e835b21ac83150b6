"""Child processes of `bench/compare.py` (one measurement per fresh process).

    .venv/bin/python bench/compare_children.py KIND [options]

Each child prints its result as one JSON line prefixed `RESULT ` on stdout (servers print
`PORT <n>` once they listen and run until stdin closes or SIGTERM). Kinds:
- `native --app sidecar|sidecar-nondurable|bare`: uvicorn serving the app or a bare Starlette echo;
- `bridge-core [--bytes SEQ] [--tools PER_TASK]`: `Snapshot.execute` on the upstream `echo`
  through the pool in this process, SEQ sequential calls, then 16 callers of PER_TASK calls;
- `large-upstream`, `large-command`, `disk --bytes N`: one large result through the seam (time,
  peak RSS with VmHWM reset first) and the fsynced file write they are compared with;
- `startup`, `launch`, `spawn --servers N [--upstream sdk|light|sh]`: time until every upstream
  is ready, from `Location.open`, from starting `sidecar stdio`, and with no sidecar (baseline);
- `catalog --servers S --tools T` or `--inproc K`: snapshot build, `GET /v1/tools` latency, RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
from timing import concurrent, sequential  # noqa: E402

UPSTREAM = HERE / "upstream.py"
TOKEN = "bench-token"


def status_kib(field: str, pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/{pid}/status")


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def result(data: dict[str, Any]) -> None:
    print("RESULT " + json.dumps(data), flush=True)


def upstream_argv(upstream: str, tools: int = 0) -> list[str]:
    """How to start one upstream of a kind: `sdk` (bench/upstream.py, the `mcp` SDK), `light`
    (bench/light_upstream.py, plain Python) or `sh` (bench/sh_upstream.sh, bash)."""
    if upstream == "light":
        return [sys.executable, str(HERE / "light_upstream.py")]
    if upstream == "sh":
        return ["bash", str(HERE / "sh_upstream.sh")]
    return [sys.executable, str(UPSTREAM)] + (["--tools", str(tools)] if tools else [])


def write_manifest(directory: Path, servers: int, tools: int = 0, upstream: str = "sdk") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    entries = {}
    for i in range(servers):
        key = "up" if servers == 1 else f"up{i:02d}"
        command, *args = upstream_argv(upstream, tools)
        entries[key] = {"command": command, "args": args,
                        "timeouts": {"startup": 120, "call": 900},
                        "max_result_bytes": 2**31 - 1}
    (directory / "bench.json").write_text(json.dumps({"mcpServers": entries}))
    return directory


def ctx(call_id: str) -> Any:
    from sidecar import ToolContext

    return ToolContext(session_id="bench", agent="bench", message_id="m", call_id=call_id)


# -- native API ------------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def uvicorn_on_free_port(app: Any) -> AsyncIterator[int]:
    """Serve `app` with uvicorn on 127.0.0.1 (a free port) in this loop; yields the port."""
    import uvicorn

    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                            lifespan="on", access_log=False, loop="uvloop")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        await task


async def serve_app(app: Any) -> None:
    async with uvicorn_on_free_port(app) as port:
        print(f"PORT {port}", flush=True)
        # run until stdin closes (the parent exits or closes it)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


async def native(app_kind: str) -> None:
    if app_kind == "bare":
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        async def echo(request: Request) -> JSONResponse:
            body = await request.json()
            return JSONResponse({"status": "completed",
                                 "output": {"echoed": body["input"]["text"]}})

        await serve_app(Starlette(routes=[Route("/echo", echo, methods=["POST"])]))
        return
    from pydantic import BaseModel

    from sidecar import Location, Tool
    from sidecar.serve.app import build_app

    class EchoIn(BaseModel):
        text: str

    class EchoOut(BaseModel):
        echoed: str

    async def run_echo(args: EchoIn, context: Any) -> EchoOut:
        return EchoOut(echoed=args.text)

    with tempfile.TemporaryDirectory() as tmp:
        async with Location.open(tmp, state_dir=Path(tmp) / "state",
                                 durable=app_kind != "sidecar-nondurable",
                                 entry_point_plugins=False) as location:
            location.tools.register({"echo": Tool(description="Echo text", input=EchoIn,
                                                   output=EchoOut, execute=run_echo)})
            await serve_app(build_app(location, token=TOKEN))


# -- the bridge core without a facade -------------------------------------------------------

async def bridge_core(seq: int, tasks: int, per_task: int, warm: int) -> None:
    """`Snapshot.execute` on the upstream `echo` through the pool, in this process: what the
    MCP facade adds on top is its own MCP server side."""
    from sidecar import Location

    with tempfile.TemporaryDirectory() as tmp:
        manifests = write_manifest(Path(tmp) / "manifests", 1)
        async with Location.open(tmp, state_dir=Path(tmp) / "state", manifests=[manifests],
                                 entry_point_plugins=False) as location:
            snapshot = location.snapshot()
            name = _find(snapshot, "echo")

            async def one(label: str) -> None:
                outcome = await snapshot.execute(name, {"text": f"hello {label}"}, ctx(label))
                assert outcome.status == "completed", outcome.error

            for i in range(warm):
                await one(f"w{i}")
            cpu0 = time.process_time()
            stats: dict[str, Any] = await sequential(one, seq)
            stats["cpu_us"] = (time.process_time() - cpu0) / seq * 1e6
            stats.update(await concurrent(one, tasks, per_task))
    result(stats)


# -- large outputs ---------------------------------------------------------------------------

async def large_upstream(nbytes: int) -> None:
    from sidecar import Location

    with tempfile.TemporaryDirectory() as tmp:
        manifests = write_manifest(Path(tmp) / "manifests", 1)
        async with Location.open(
            tmp, state_dir=Path(tmp) / "state", manifests=[manifests],
            store_quota_bytes=4 * nbytes + 2**26, entry_point_plugins=False,
        ) as location:
            health = location.server_health()
            if any(h.state != "ready" for h in health.values()):
                raise SystemExit(f"upstream not ready: {health}")
            snapshot = location.snapshot()
            name = _find(snapshot, "big")
            gc.collect()
            base = status_kib("VmRSS")
            reset_peak()
            start = time.perf_counter()
            outcome = await snapshot.execute(name, {"nbytes": nbytes}, ctx("big"))
            elapsed = time.perf_counter() - start
            peak = status_kib("VmHWM")
            if outcome.status != "completed":
                raise SystemExit(f"call failed: {outcome.error}")
            retained = sum(m.size_bytes for m in outcome.managed)
            if nbytes > 60_000 and retained != nbytes:
                raise SystemExit(f"retained {retained} of {nbytes} bytes")
    result({"seconds": elapsed, "peak_mb": peak / 1024, "base_mb": base / 1024,
            "retained": retained})


def _find(snapshot: Any, suffix: str) -> str:
    names: list[str] = [d.name for d in snapshot.definitions]
    return next(n for n in names if n.endswith(suffix))


async def large_command(nbytes: int) -> None:
    import command_large

    base = Path(tempfile.mkdtemp(prefix="bench-compare-"))
    try:
        elapsed, peak, before, _, _ = await command_large.through_seam(base, nbytes)
        plain = command_large.plain(base, nbytes)
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    result({"seconds": elapsed, "peak_mb": peak, "base_mb": before, "plain_s": plain})


def disk(nbytes: int) -> None:
    from upstream import big_text

    data = big_text(min(nbytes, 2**26)).encode()
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "out"
        start = time.perf_counter()
        with target.open("wb") as out:
            left = nbytes
            while left > 0:
                chunk = data[:left]
                out.write(chunk)
                left -= len(chunk)
            out.flush()
            os.fsync(out.fileno())
        elapsed = time.perf_counter() - start
    result({"seconds": elapsed})


# -- startup ---------------------------------------------------------------------------------

async def startup(servers: int, upstream: str) -> None:
    from sidecar import Location
    from sidecar.daemon.daemon import freeze_startup_heap

    freeze_startup_heap()  # as `sidecar serve` and `sidecar stdio` do before they open
    with tempfile.TemporaryDirectory() as tmp:
        manifests = write_manifest(Path(tmp) / "manifests", servers, upstream=upstream)
        start = time.perf_counter()
        async with Location.open(tmp, state_dir=Path(tmp) / "state", manifests=[manifests],
                                 entry_point_plugins=False) as location:
            opened = time.perf_counter() - start
            while True:
                states = [h.state for h in location.server_health().values()]
                if len(states) == servers and all(s == "ready" for s in states):
                    break
                if any(s in ("failed", "disabled") for s in states):
                    raise SystemExit(f"servers failed: {location.server_health()}")
                if time.perf_counter() - start > 300:
                    raise SystemExit("servers not ready after 300 s")
                await asyncio.sleep(0.005)
            ready = time.perf_counter() - start
    result({"open_s": opened, "ready_s": ready})


async def launch_seconds(tree: Path, manifests: Path, state: Path, servers: int) -> float:
    """Seconds from starting `python -P -m sidecar.cli stdio` from source tree `tree` (on
    `PYTHONPATH`; this venv's packages) until a `tools/list` answer, over its stdin/stdout,
    lists the `echo` of each of the `servers` upstreams `write_manifest` named (the daemon
    starts them in the background: it lists again after each `list_changed`)."""
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    ]
    start = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-P", "-m", "sidecar.cli", "stdio", "--manifests", str(manifests),
        "--state-dir", str(state), env=dict(os.environ, PYTHONPATH=str(tree)), cwd=tree,
        limit=2**26, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"".join(json.dumps(r).encode() + b"\n" for r in requests))
    await proc.stdin.drain()
    keys = ["up"] if servers == 1 else [f"up{i:02d}" for i in range(servers)]
    asked = 2
    while True:  # servers start in the background: list again on each list_changed
        line = await proc.stdout.readline()
        if not line:
            raise SystemExit(f"sidecar stdio from {tree} exited before answering tools/list")
        message = json.loads(line)
        if message.get("method") == "notifications/tools/list_changed":
            asked += 1
            proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": asked,
                                         "method": "tools/list"}).encode() + b"\n")
            await proc.stdin.drain()
        elif message.get("id") == asked:
            names = {tool["name"] for tool in message.get("result", {}).get("tools", [])}
            if all(f"{key}_echo" in names for key in keys) or not message.get(
                    "result", {}).get("_meta", {}).get("io.mcp-sidecar/starting"):
                break
    ready = time.perf_counter() - start
    proc.stdin.close()
    await proc.wait()
    missing = [key for key in keys if f"{key}_echo" not in names]
    if missing:
        raise SystemExit(f"tools/list lacks the echo of {missing}: {sorted(names)[:5]}")
    return ready


async def launch(servers: int, upstream: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        manifests = write_manifest(Path(tmp) / "manifests", servers, upstream=upstream)
        ready = await launch_seconds(ROOT, manifests, Path(tmp) / "state", servers)
    result({"ready_s": ready})


async def spawn(servers: int, upstream: str) -> None:
    argv = upstream_argv(upstream)
    hello = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "bench", "version": "1"}}}).encode() + b"\n"

    async def one() -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(hello)
        await proc.stdin.drain()
        if b'"result"' not in await proc.stdout.readline():
            raise SystemExit("an upstream did not answer initialize")
        return proc

    start = time.perf_counter()
    procs = await asyncio.gather(*(one() for _ in range(servers)))
    ready = time.perf_counter() - start
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.close()
        await proc.wait()
    result({"ready_s": ready})


# -- catalog scale ---------------------------------------------------------------------------

def schema_tool(i: int) -> Any:
    from sidecar import Tool, ToolResponse

    async def run(args: Any, context: Any) -> ToolResponse:
        return ToolResponse(content=str(args))

    schema = {
        "type": "object",
        "properties": {
            "text": {"type": "string", "description": "what to echo"},
            "count": {"type": "integer", "minimum": 0},
        },
        "required": ["text"],
    }
    return Tool(description=f"Synthetic tool number {i}: echoes its input", input=schema,
                execute=run)


async def stdio_listing(location: Any) -> tuple[list[float], list[float]]:
    """tools/list as `sidecar stdio` serves it (the facade with its stdio fast path), over
    in-memory streams instead of pipes: 10 timed requests after the first, through an SDK
    `ClientSession` (includes its parsing); then 10 as the pipe transport hands them to the
    fast path (`take_raw`), timed until the answer's bytes are ready to be written."""
    import anyio
    from mcp.client.session import ClientSession
    from mcp.shared.memory import create_client_server_memory_streams

    from sidecar.serve.mcp_facade.server import McpFacade
    from sidecar.serve.mcp_facade.stdio_fastpath import FastCalls

    facade = McpFacade(location, session_id="stdio-bench")
    times: list[float] = []
    async with facade.attached(), create_client_server_memory_streams() as (
        client_streams, server_streams
    ), anyio.create_task_group() as tg:
        read, write = server_streams
        options = facade.server.create_initialization_options()
        fast = FastCalls(facade, read, write)
        tg.start_soon(facade.server.run, fast, write, options)
        raw_times: list[float] = []
        async with ClientSession(*client_streams) as session:
            await session.initialize()
            await session.list_tools()
            for _ in range(10):
                t0 = time.perf_counter()
                await session.list_tools()
                times.append(time.perf_counter() - t0)
            answered = asyncio.Event()

            async def send_line(line: bytes) -> None:
                assert line.endswith(b"}\n") and b'"tools"' in line
                answered.set()

            wire = FastCalls(facade, read, write, send_line)
            for i in range(11):
                answered.clear()
                t0 = time.perf_counter()
                assert wire.take_raw({"jsonrpc": "2.0", "id": 1000 + i, "method": "tools/list"})
                await answered.wait()
                raw_times.append(time.perf_counter() - t0)
            await wire.close()
        await fast.close()
        tg.cancel_scope.cancel()
    return times, raw_times[1:]


async def catalog(servers: int, tools: int, inproc: int) -> None:
    import httpx
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from sidecar import Location
    from sidecar.serve.app import build_app
    from sidecar.serve.mcp_facade import mcp_http

    with tempfile.TemporaryDirectory() as tmp:
        manifests = [write_manifest(Path(tmp) / "manifests", servers, tools)] if servers else []
        gc.collect()
        rss0 = status_kib("VmRSS")
        start = time.perf_counter()
        async with Location.open(tmp, state_dir=Path(tmp) / "state", manifests=manifests,
                                 entry_point_plugins=False) as location:
            opened = time.perf_counter() - start
            gc.collect()
            rss_open = status_kib("VmRSS")
            if inproc:
                t0 = time.perf_counter()
                location.tools.register({f"tool_{i:05d}": schema_tool(i) for i in range(inproc)})
                register_s = time.perf_counter() - t0
            else:
                register_s = 0.0
                bad = {k: h.state for k, h in location.server_health().items() if h.state != "ready"}
                if bad:
                    raise SystemExit(f"servers not ready: {bad}")
            gc.collect()
            rss_loaded = status_kib("VmRSS")
            count = len(location.registry.effective())
            snaps = []
            for _ in range(21):
                t0 = time.perf_counter()
                location.snapshot()
                snaps.append(time.perf_counter() - t0)
            routes, lifespan = mcp_http(location)
            app = build_app(location, token=TOKEN, extra_routes=routes, extra_lifespan=lifespan)
            async with uvicorn_on_free_port(app) as port:
                lists = []
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60,
                                             headers={"authorization": f"Bearer {TOKEN}"}) as c:
                    for _ in range(11):
                        t0 = time.perf_counter()
                        r = await c.get("/v1/tools")
                        r.raise_for_status()
                        listed = len(r.json()["tools"])
                        lists.append(time.perf_counter() - t0)
                    # snapshot creation through the API too (what a runner does per model request)
                    posts = []
                    for _ in range(11):
                        t0 = time.perf_counter()
                        r = await c.post("/v1/snapshots", json={"session_id": "bench"})
                        r.raise_for_status()
                        posts.append(time.perf_counter() - t0)
                # the daemon's side of GET /v1/tools: the app answering in this process (ASGI,
                # no socket), the body read but not parsed
                served = []
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                             base_url="http://127.0.0.1",
                                             headers={"authorization": f"Bearer {TOKEN}"}) as c:
                    for _ in range(11):
                        t0 = time.perf_counter()
                        r = await c.get("/v1/tools")
                        r.raise_for_status()
                        served.append(time.perf_counter() - t0)
                # tools/list through the MCP facade (/mcp, streamable HTTP, one page)
                mcp_lists = []
                async with httpx2.AsyncClient(headers={"authorization": f"Bearer {TOKEN}"},
                                              timeout=60) as http2, Client(
                    streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http2,
                                           max_sse_event_size=64 * 2**20),
                    mode="legacy", cache=None,
                ) as mcp_client:
                    for _ in range(11):
                        t0 = time.perf_counter()
                        page = await mcp_client.list_tools()
                        mcp_lists.append(time.perf_counter() - t0)
                    mcp_listed = len(page.tools)
            stdio_lists, stdio_raw = await stdio_listing(location)
    result({
        "tools": count, "listed": listed, "open_s": opened, "register_s": register_s,
        "snapshot_ms": statistics.median(snaps) * 1e3,
        "list_ms": statistics.median(lists[1:]) * 1e3,
        "list_served_ms": statistics.median(served[1:]) * 1e3,
        "post_snapshot_ms": statistics.median(posts[1:]) * 1e3,
        "mcp_list_ms": statistics.median(mcp_lists[1:]) * 1e3, "mcp_listed": mcp_listed,
        "stdio_list_ms": statistics.median(stdio_lists) * 1e3,
        "stdio_wire_ms": statistics.median(stdio_raw) * 1e3,
        "rss_start_mb": rss0 / 1024, "rss_open_mb": rss_open / 1024,
        "rss_loaded_mb": rss_loaded / 1024,
    })


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind")
    parser.add_argument("--app", default="sidecar")
    parser.add_argument("--bytes", type=int, default=0)
    parser.add_argument("--servers", type=int, default=0)
    parser.add_argument("--tools", type=int, default=0)
    parser.add_argument("--inproc", type=int, default=0)
    parser.add_argument("--upstream", choices=["sdk", "light", "sh"], default="sdk",
                        help="startup, launch, spawn: which upstream (see `upstream_argv`)")
    args = parser.parse_args()
    import logging

    logging.basicConfig(level=logging.WARNING)
    if args.kind == "native":
        import uvloop

        uvloop.run(native(args.app))
    elif args.kind == "bridge-core":
        seq, tasks, per_task, warm = (args.bytes or 500), 16, (args.tools or 60), 30
        asyncio.run(bridge_core(seq, tasks, per_task, warm))
    elif args.kind == "large-upstream":
        asyncio.run(large_upstream(args.bytes))
    elif args.kind == "large-command":
        asyncio.run(large_command(args.bytes))
    elif args.kind == "disk":
        disk(args.bytes)
    elif args.kind == "startup":
        asyncio.run(startup(args.servers, args.upstream))
    elif args.kind == "launch":
        asyncio.run(launch(args.servers, args.upstream))
    elif args.kind == "spawn":
        asyncio.run(spawn(args.servers, args.upstream))
    elif args.kind == "catalog":
        asyncio.run(catalog(args.servers, args.tools, args.inproc))
    else:
        raise SystemExit(f"unknown kind {args.kind}")


if __name__ == "__main__":
    main()
