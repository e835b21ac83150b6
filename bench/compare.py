"""Side-by-side benchmarks of mcp-sidecar against what users would pick instead (issue 8).

    .venv/bin/python bench/compare.py [--quick] [--only SECTION[,SECTION]] [--rounds N]

Sections: bridge (1), native (2), large (3), startup (4), catalog (5). Prints markdown tables,
each with the machine, versions, the command and its baseline. `--quick` is a smoke version
(seconds, tiny sizes) that CI runs so the benchmark never rots: no timing is asserted anywhere.

External targets run in their own virtualenvs (gitignored), created on demand:
    python3 -m venv bench/.venvs/fastmcp   && bench/.venvs/fastmcp/bin/pip install fastmcp
    python3 -m venv bench/.venvs/mcp-proxy && bench/.venvs/mcp-proxy/bin/pip install mcp-proxy
(see bench/requirements-compare.txt). A missing venv, or a missing `sidecar stdio` / `/mcp`
facade, prints its row as "n/a (...)". Everything binds 127.0.0.1; every child is stopped by
PID. Method: shared/notes/anchor-bench.md (mcp.Client, mode="legacy", cache=None, raw
`send_request(CallToolRequest)`; the bridge section interleaves every target in short
blocks and reports median per-block ratios, the others interleave rounds, best of N).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "RESULTS.md"
UPSTREAM = HERE / "upstream.py"
CHILDREN = HERE / "compare_children.py"
VENVS = HERE / ".venvs"
FASTMCP_PY = VENVS / "fastmcp" / "bin" / "python"
MCP_PROXY = VENVS / "mcp-proxy" / "bin" / "mcp-proxy"
SIDECAR = Path(sys.executable).parent / "sidecar"
TOKEN = "bench-token"
MB = 1_000_000
SECTIONS = ("bridge", "native", "large", "startup", "catalog")

sys.path.insert(0, str(HERE))
from timing import concurrent, pct, sequential  # noqa: E402

# -- small helpers ---------------------------------------------------------------------------


def fmt_ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "–"


def table(header: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def pkg_version(python: Path | str, name: str) -> str:
    try:
        r = subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({name!r}))"],
                           capture_output=True, text=True, timeout=30)
        return r.stdout.strip() or "–"
    except (OSError, subprocess.TimeoutExpired):
        return "–"


def machine() -> str:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = "?"
    with contextlib.suppress(OSError):
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kib / 2**20:.0f} GiB"
    return (f"{platform.node()}: {os.cpu_count()} CPU ({cpu}), {mem} RAM, "
            f"Linux {platform.release()}, Python {platform.python_version()}")


def versions() -> str:
    py = sys.executable
    main = ", ".join(f"{n} {pkg_version(py, n)}" for n in
                     ("mcp-sidecar", "mcp", "uvicorn", "uvloop", "starlette", "httpx", "anyio"))
    extra = []
    if FASTMCP_PY.exists():
        extra.append(f"fastmcp {pkg_version(FASTMCP_PY, 'fastmcp')} (mcp {pkg_version(FASTMCP_PY, 'mcp')})")
    if MCP_PROXY.exists():
        proxy_py = MCP_PROXY.parent / "python"
        extra.append(f"mcp-proxy {pkg_version(proxy_py, 'mcp-proxy')} (mcp {pkg_version(proxy_py, 'mcp')})")
    return main + ("; " + "; ".join(extra) if extra else "")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop(proc: subprocess.Popen[Any] | asyncio.subprocess.Process) -> None:
    """Stop one child we started (and its process group), by PID."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)


def child_json(args: list[str], timeout: float) -> dict[str, Any]:
    proc = subprocess.Popen([sys.executable, str(CHILDREN), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        proc.communicate()
        raise RuntimeError(f"timed out after {timeout:.0f} s") from None
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]))
    raise RuntimeError((err.strip().splitlines() or ["no result"])[-1][:200])


def write_manifest(directory: Path, servers: int = 1, tools: int = 0,
                   protocol: str | None = None) -> Path:
    """`protocol`: the entries' `protocol` key (None: the default, `auto`)."""
    directory.mkdir(parents=True, exist_ok=True)
    entries = {}
    for i in range(servers):
        key = "up" if servers == 1 else f"up{i:02d}"
        args = [str(UPSTREAM)] + (["--tools", str(tools)] if tools else [])
        entries[key] = {"command": sys.executable, "args": args,
                        "timeouts": {"startup": 120, "call": 900}}
        if protocol is not None:
            entries[key]["protocol"] = protocol
    (directory / "bench.json").write_text(json.dumps({"mcpServers": entries}))
    return directory


# -- section 1: MCP targets ------------------------------------------------------------------


@dataclass
class Target:
    """One way to reach the upstream `echo`: how to connect an `mcp.Client` to it."""

    name: str
    connect: Callable[[], contextlib.AbstractAsyncContextManager[Any]]
    setup: Callable[[], contextlib.AbstractAsyncContextManager[Any]] | None = None
    unavailable: str | None = None
    server_pid: int | None = None  # long-lived HTTP server targets
    state_dir: Path | None = None  # `sidecar stdio`: the state whose daemon serves the client
    writes_behind: bool = False
    """A sidecar daemon: its writer threads commit a block's outcome and history rows up to
    `WRITE_BEHIND_SECONDS` after its last call; its CPU is read once they have."""
    ended_by: str | None = None
    """What ended its client early (the transport's own exception, which a call that fails
    with it only reports as `Connection closed`): added to a "failed" row."""
    log_tail: deque[str] | None = None
    """The last lines its server wrote to stderr (an HTTP server the bench started): printed
    to stderr when the target failed."""


def stdio_params(command: str, args: list[str], env: dict[str, str] | None = None) -> Any:
    from mcp import StdioServerParameters

    return StdioServerParameters(command=command, args=args, env=env, cwd=str(ROOT))


@contextlib.asynccontextmanager
async def mcp_client(target: Any, *, http_headers: dict[str, str] | None = None,
                     mode: str = "legacy") -> AsyncIterator[Any]:
    """`mcp.Client(target, mode="legacy", cache=None)`; URLs get an httpx2 client with headers
    and no SSE event size cap (the default 1 MiB fails 10 MB results)."""
    from mcp import Client

    if isinstance(target, str):
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        http = httpx2.AsyncClient(headers=http_headers or {}, timeout=httpx2.Timeout(900.0))
        async with http:
            transport = streamable_http_client(target, http_client=http,
                                               max_sse_event_size=2**31)
            async with Client(transport, mode="legacy", cache=None,
                              read_timeout_seconds=900) as client:
                yield client
    else:
        async with Client(target, mode=mode, cache=None,
                          read_timeout_seconds=900) as client:
            yield client


async def find_tool(client: Any, suffix: str, patience: float = 120.0) -> str:
    """The listed tool named `suffix` or `*_suffix`; a sidecar daemon starts its servers in
    the background, so this lists again (for up to `patience` s) until it appears."""
    deadline = time.monotonic() + patience
    while True:
        tools: list[str] = []
        cursor = None
        while True:
            page = await client.list_tools(cursor=cursor)
            tools += [t.name for t in page.tools]
            cursor = page.next_cursor
            if cursor is None:
                break
        for name in tools:
            if name == suffix or name.endswith("_" + suffix) or name.endswith("-" + suffix):
                return name
        if time.monotonic() > deadline:
            raise RuntimeError(f"no tool *{suffix} in {tools[:10]}")
        await asyncio.sleep(0.1)


async def call(client: Any, name: str, arguments: dict[str, Any]) -> Any:
    from mcp import types

    request = types.CallToolRequest(params=types.CallToolRequestParams(name=name, arguments=arguments))
    return await client.session.send_request(request, types.CallToolResult)


@contextlib.asynccontextmanager
async def http_server(argv: list[str], env: dict[str, str], ready: Callable[[str], str | None],
                      timeout: float = 60, tail: deque[str] | None = None,
                      ) -> AsyncIterator[tuple[str, int]]:
    """Start a long-lived HTTP server child; `ready(line)` returns its URL from a log line.
    `tail` keeps the last lines of its stderr."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **env}, start_new_session=True, cwd=str(ROOT))
    assert proc.stderr is not None
    url = None
    try:
        async with asyncio.timeout(timeout):
            while url is None:
                line = await proc.stderr.readline()
                if not line:
                    raise RuntimeError(f"{argv[0]} exited ({await proc.wait()})")
                url = ready(line.decode(errors="replace"))
        drain = asyncio.create_task(_drain(proc.stderr, tail))
        try:
            yield url, proc.pid
        finally:
            drain.cancel()
    finally:
        stop(proc)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(15):
                await proc.wait()
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


async def _drain(stream: asyncio.StreamReader, tail: deque[str] | None = None) -> None:
    if tail is not None:
        with contextlib.suppress(ValueError):  # a line over the reader's limit: stop keeping
            while line := await stream.readline():
                tail.append(line.decode(errors="replace").rstrip("\n"))
    while await stream.read(65536):
        pass


async def wait_port(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


class Targets:
    """Builds the pluggable target list; probes what is installed."""

    def __init__(self, tmp: Path, *, fastmcp_limit: int = 0) -> None:
        self.tmp = tmp
        # Every other target speaks the 2025 handshake era to the upstream (the direct client is
        # `mcp.Client(mode="legacy")`, FastMCP's proxy sends `initialize`, mcp-proxy runs `mcp`
        # 1.x), so the sidecar rows compared with them do too. `auto` (the default) picks the
        # 2026-07-28 era, in which the SDK's server does more per call: its own row.
        self.manifests = write_manifest(tmp / "manifests", protocol="legacy")
        self.manifests_auto = write_manifest(tmp / "manifests-auto")
        self.py = sys.executable
        self.fastmcp_limit = fastmcp_limit
        self.stack = contextlib.AsyncExitStack()

    def direct(self) -> Target:
        params = stdio_params(self.py, [str(UPSTREAM)])
        return Target("direct stdio", lambda: mcp_client(params))

    def direct_auto(self) -> Target:
        """The same upstream, the client picking the 2026-07-28 era (`mode="auto"`): the
        like-for-like baseline of the `sidecar stdio, upstream era auto` row."""
        params = stdio_params(self.py, [str(UPSTREAM)])
        return Target(DIRECT_AUTO, lambda: mcp_client(params, mode="auto"))

    def byte_relay(self) -> Target:
        params = stdio_params(self.py, [str(HERE / "byte_relay.py"), "--", self.py,
                                        str(UPSTREAM)])
        return Target("bare byte relay (floor)", lambda: mcp_client(params))

    def lean_proxy(self) -> Target:
        params = stdio_params(self.py, [str(HERE / "lean_proxy.py"), "--", self.py,
                                        str(UPSTREAM)])
        return Target(LEAN, lambda: mcp_client(params))

    def sidecar_stdio(self, *, auto: bool = False) -> Target:
        name = AUTO if auto else "sidecar stdio"
        state = self.tmp / ("state-stdio-auto" if auto else "state-stdio")
        manifests = self.manifests_auto if auto else self.manifests
        params = stdio_params(str(SIDECAR), ["stdio", "--manifests", str(manifests),
                                             "--state-dir", str(state)],
                              env={"SIDECAR_STATE_DIR": str(state)})
        return Target(name, lambda: mcp_client(params), state_dir=state, writes_behind=True)

    def fastmcp(self, limit: int = 0) -> Target:
        name = "FastMCP proxy stdio" + (f" (ResponseLimiting {limit // 1000} kB)" if limit else "")
        if not FASTMCP_PY.exists():
            return Target(name, _none, unavailable="n/a (no bench/.venvs/fastmcp)")
        args = [str(HERE / "fastmcp_proxy.py")] + (["--limit", str(limit)] if limit else [])
        params = stdio_params(str(FASTMCP_PY), [*args, "--", self.py, str(UPSTREAM)],
                              env={"FASTMCP_LOG_LEVEL": "WARNING"})
        return Target(name, lambda: mcp_client(params))

    async def sidecar_http(self) -> Target:
        name = "sidecar /mcp (HTTP)"
        state = self.tmp / "state-http"
        def ready(line: str) -> str | None:
            return line.split("listening on", 1)[1].strip() if "listening on" in line else None

        tail: deque[str] = deque(maxlen=40)
        try:
            url, pid = await self.stack.enter_async_context(http_server(
                [str(SIDECAR), "serve", "--port", "0", "--manifests", str(self.manifests),
                 "--state-dir", str(state)],
                {"SIDECAR_TOKEN": TOKEN, "SIDECAR_ALLOW_WEAK_TOKEN": "1",
                 "SIDECAR_STATE_DIR": str(state)}, ready, tail=tail))
        except Exception as exc:
            return Target(name, _none, unavailable=f"n/a (serve failed: {exc})")
        headers = {"authorization": f"Bearer {TOKEN}"}
        return Target(name, lambda: mcp_client(url + "/mcp", http_headers=headers),
                      server_pid=pid, writes_behind=True, log_tail=tail)

    async def direct_http(self) -> Target:
        """The upstream itself over streamable HTTP (the SDK's `streamable_http_app`): what
        `/mcp` is held against with 16 callers."""
        return await self._http_on_port("direct streamable HTTP",
                                        lambda port: [self.py, str(UPSTREAM), "--http", port])

    async def mcp_proxy(self) -> Target:
        name = "mcp-proxy (streamable HTTP)"
        if not MCP_PROXY.exists():
            return Target(name, _none, unavailable="n/a (no bench/.venvs/mcp-proxy)")
        return await self._http_on_port(name, lambda port: [
            str(MCP_PROXY), "--host", "127.0.0.1", "--port", port, "--pass-environment", "--",
            self.py, str(UPSTREAM)])

    async def _http_on_port(self, name: str, argv: Callable[[str], list[str]]) -> Target:
        """A streamable HTTP server started as `argv(port)` on a free port, stopped with the
        run; its `/mcp` is the target."""
        port = free_port()
        try:
            proc = subprocess.Popen(
                argv(str(port)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, cwd=str(ROOT))
            self.stack.callback(stop, proc)
            await wait_port(port)
        except Exception as exc:
            return Target(name, _none, unavailable=f"n/a ({exc})")
        return Target(name, lambda: mcp_client(f"http://127.0.0.1:{port}/mcp"),
                      server_pid=proc.pid)

    async def probe(self, target: Target, tool: str = "echo") -> Target:
        """A target that cannot list tools and answer one echo in 60 s is "n/a"."""
        if target.unavailable:
            return target
        try:
            async with asyncio.timeout(60):
                async with target.connect() as client:
                    name = await find_tool(client, tool)
                    await call(client, name, {"text": "probe"})
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            target.unavailable = f"n/a ({_short(exc)})"
        return target


def _leaves(exc: BaseException) -> str:
    """Each exception at the bottom of `exc` (through groups, causes and contexts), short."""
    found: list[str] = []

    def walk(e: BaseException, depth: int = 0) -> None:
        if depth > 20:
            return
        if isinstance(e, BaseExceptionGroup):
            for inner in e.exceptions:
                walk(inner, depth + 1)
            return
        below = e.__cause__ or e.__context__
        if below is not None:
            walk(below, depth + 1)
            return
        text = _text(e)[:120]
        if text not in found:
            found.append(text)

    walk(exc)
    return "; ".join(found[:3])


def _short(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return _text(exc)[:90]


def _text(exc: BaseException) -> str:
    """`Type: message` on one line, fit for a table cell."""
    return f"{type(exc).__name__}: {exc}".replace("|", "/").replace("\n", " ")


@contextlib.asynccontextmanager
async def _none() -> AsyncIterator[Any]:
    raise RuntimeError("unavailable")
    yield


def new_children(before: set[int]) -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process().children() if p.pid not in before]


def state_daemon(state: Path | None) -> int | None:
    """The daemon that owns `state` (`<state>/daemon.json`): `sidecar stdio` hands its
    client's pipes to it and then only waits, so the daemon is the process doing the work."""
    if state is None:
        return None
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return int(json.loads((state / "daemon.json").read_text())["pid"])
    return None


def start_daemon(argv: list[str], state: Path) -> subprocess.Popen[bytes]:
    """A `sidecar daemon` (`argv`: its command line) on `state`, in a session of its own; its
    output discarded. `wait_state_daemon` waits for it."""
    return subprocess.Popen(argv, env={**os.environ, "SIDECAR_STATE_DIR": str(state)}, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


async def wait_state_daemon(process: subprocess.Popen[Any], state: Path) -> None:
    """Until `process` (a `sidecar daemon` started by a bench script) owns `state`; exits the
    script when it ends first or takes 30 s."""
    for _ in range(600):
        if state_daemon(state) == process.pid:
            return
        if process.poll() is not None:
            raise SystemExit(f"the daemon exited ({process.returncode})")
        await asyncio.sleep(0.05)
    raise SystemExit("the daemon did not start")


def attached_stdio(manifests: Path, state: Path) -> Any:
    """`sidecar stdio` on `manifests`, attached to the daemon that owns `state`."""
    return stdio_params(sys.executable, ["-m", "sidecar.cli", "stdio", "--manifests",
                                         str(manifests), "--state-dir", str(state)],
                        env={"SIDECAR_STATE_DIR": str(state)})


WRITE_BEHIND_SECONDS = 0.15
"""Longer than the daemon gathers rows before committing them (`SETTLE_GATHER_SECONDS` and the
call history's `GATHER_SECONDS`, 0.1 s): a block's CPU includes its own writes (and the idle
daemon's timers over this wait, which only adds)."""


def cpu_seconds(pid: int | None) -> float:
    """The process's CPU time, every thread's, in nanoseconds from /proc/PID/task/*/schedstat
    (clock ticks, 10 ms each, made a block of 50 calls read 0 or 200 µs a call); psutil's
    ticks where schedstat is missing."""
    if pid is None:
        return 0.0
    try:
        total = 0
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
        return total / 1e9
    except (OSError, ValueError, IndexError):
        pass
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
        return float(t.user + t.system)
    except psutil.Error:
        return 0.0


@dataclass
class Phase:
    """One target's calls in one phase (sequential or concurrent), block by block."""

    rates: dict[int, float] = field(default_factory=dict)  # block number -> calls/s
    latencies: list[float] = field(default_factory=list)  # seconds, every call
    calls: int = 0
    seconds: float = 0.0
    cpu: float = 0.0  # CPU seconds of the process the client talks to

    @property
    def rate(self) -> float:
        return self.calls / self.seconds if self.seconds else 0.0

    def p(self, q: float) -> float:
        return pct(self.latencies, q) * 1e3


@dataclass
class Connected:
    target: Target
    client: Any
    tool: str
    pid: int | None
    seq: Phase = field(default_factory=Phase)
    conc: Phase = field(default_factory=Phase)

    async def one(self, label: str) -> None:
        await call(self.client, self.tool, {"text": f"hello {label}"})


async def _hold(target: Target, opened: asyncio.Future[Any], done: asyncio.Event) -> None:
    """Keep one target's client open in a task of its own until `done`: a client's task group
    that fails cancels this task, not the one measuring every target."""
    try:
        async with target.connect() as client:
            opened.set_result(client)
            await done.wait()
    except Exception as exc:
        if not opened.done():
            opened.set_exception(exc)
        if not done.is_set():  # a failure while closing does not undo the measurements
            target.ended_by = _leaves(exc)
            target.unavailable = target.unavailable or f"failed: {_short(exc)}"
    finally:
        if not opened.done():
            opened.set_exception(RuntimeError("the client closed before it opened"))


def block_ratio(mine: Phase, other: Phase) -> list[float]:
    """`mine`'s rate over `other`'s in each block both ran, sorted."""
    return sorted(rate / other.rates[k] for k, rate in mine.rates.items()
                  if other.rates.get(k))


def fmt_median(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f}x" if ratios else "–"


def fmt_middle(ratios: list[float]) -> str:
    """The middle half of the block ratios (25th to 75th percentile)."""
    if not ratios:
        return "–"
    return f"{pct(ratios, 0.25):.2f}–{pct(ratios, 0.75):.2f}"


_PHASES = {"seq": "sequential", "conc": "concurrent"}


async def run_blocks(live: list[Connected], blocks: int, phase: str, measure: Callable[
        [Connected, list[float]], Any]) -> list[Connected]:
    """Every live target runs block 0, then block 1, ...; the order rotates each block, so no
    target always follows the same one. A target that fails is dropped (reported "failed")."""
    for k in range(blocks):
        order = live[k % len(live):] + live[:k % len(live)] if live else []
        for item in order:
            part: Phase = getattr(item, phase)
            cpu0 = cpu_seconds(item.pid)
            try:
                async with asyncio.timeout(120):
                    stats = await measure(item, part.latencies)
            except Exception as exc:  # includes the timeout; a cancellation propagates
                item.target.unavailable = (f"failed in {_PHASES[phase]} block {k + 1} of "
                                           f"{blocks}: {_short(exc)}")
                continue
            if item.target.writes_behind:  # its block's rows, committed behind its calls
                await asyncio.sleep(WRITE_BEHIND_SECONDS)
            part.cpu += cpu_seconds(item.pid) - cpu0
            rate_key, seconds_key = (("seq_rate", "seq_seconds") if phase == "seq"
                                     else ("conc_rate", "conc_seconds"))
            part.rates[k] = stats[rate_key]
            part.seconds += stats[seconds_key]
            part.calls += round(stats[rate_key] * stats[seconds_key])
        live = [x for x in live if not x.target.unavailable]
    return live


async def section_bridge(opts: argparse.Namespace) -> str:
    import psutil

    quick = opts.quick
    rounds = opts.rounds or (1 if quick else 3)
    seq, tasks, per_task, warm = (20, 16, 3, 5) if quick else (500, 16, 60, 30)
    seq_block, conc_block = (10, 3) if quick else (50, 10)
    seq_blocks, conc_blocks = rounds * (seq // seq_block), rounds * (per_task // conc_block)
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp:
        t = Targets(Path(tmp))
        async with t.stack:
            targets = [t.direct(), t.byte_relay(), t.lean_proxy(), t.sidecar_stdio(),
                       t.direct_auto(), t.sidecar_stdio(auto=True), await t.sidecar_http(),
                       await t.direct_http()]
            if not opts.no_external:
                targets += [t.fastmcp(), await t.mcp_proxy()]
            for target in targets:
                await t.probe(target)
            for target in targets:
                if target.name.startswith("sidecar") and target.unavailable:
                    target.unavailable = f"n/a (facade not available: {target.unavailable[5:-1]})"
            done = asyncio.Event()
            holders: list[asyncio.Task[None]] = []
            live: list[Connected] = []
            try:
                for target in targets:  # all connected at once; idle while the others run
                    if target.unavailable:
                        continue
                    before = {p.pid for p in psutil.Process().children()}
                    opened: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                    holders.append(asyncio.create_task(_hold(target, opened, done)))
                    try:
                        async with asyncio.timeout(120):
                            client = await opened
                            tool = await find_tool(client, "echo")
                            item = Connected(target, client, tool, target.server_pid
                                             or state_daemon(target.state_dir)
                                             or next(iter(new_children(before)), None))
                            for i in range(warm):
                                await item.one(f"w{i}")
                    except Exception as exc:
                        target.unavailable = f"failed: {_short(exc)}"
                        continue
                    live.append(item)
                connected = list(live)
                live = await run_blocks(live, seq_blocks, "seq", lambda item, into: sequential(
                    item.one, seq_block, into))
                await run_blocks(live, conc_blocks, "conc", lambda item, into: concurrent(
                    item.one, tasks, conc_block, into))
            finally:
                done.set()
                await asyncio.gather(*holders, return_exceptions=True)
    for target in targets:
        if target.unavailable and target.unavailable.startswith("failed"):
            if target.ended_by:
                target.unavailable += f" (its client ended with {target.ended_by})"
            if target.log_tail:
                print(f"{target.name} failed; the last lines of its server's stderr:",
                      *target.log_tail, sep="\n  ", file=sys.stderr)
    by_name = {item.target.name: item for item in connected}
    direct = by_name.get("direct stdio")
    rows_seq, rows_conc = [], []
    for target in targets:
        row = by_name.get(target.name)
        if target.unavailable or row is None or not row.seq.calls:
            rows_seq.append([target.name, target.unavailable or "no calls", "", "", "", "", ""])
            rows_conc.append([target.name, target.unavailable or "no calls", "", "", "", ""])
            continue
        cpu = f"{row.seq.cpu / row.seq.calls * 1e6:.0f}" if row.pid else ""
        seq_ratios = block_ratio(row.seq, direct.seq) if direct else []
        conc_ratios = block_ratio(row.conc, direct.conc) if direct else []
        rows_seq.append([target.name, f"{row.seq.rate:.0f}", fmt_median(seq_ratios),
                         fmt_middle(seq_ratios), f"{row.seq.p(0.5):.2f}",
                         f"{row.seq.p(0.99):.2f}", cpu])
        rows_conc.append([target.name, f"{row.conc.rate:.0f}" if row.conc.calls else "–",
                          fmt_median(conc_ratios), fmt_middle(conc_ratios),
                          f"{row.conc.p(0.5):.1f}" if row.conc.calls else "–",
                          f"{row.conc.p(0.99):.1f}" if row.conc.calls else "–"])
    out = [f"### 1. Bridge: `echo` through each target (interleaved blocks; rounds: {rounds})\n",
           "Every target is connected at once (`mcp.Client`, one session each) and warmed up "
           f"({warm} calls); then they take turns in blocks, the order rotating every block: "
           f"{seq_blocks} × {seq_block} sequential calls, then {conc_blocks} × ({tasks} "
           f"concurrent callers × {conc_block} calls). A block takes 0.2–1 s, so "
           "the VM's speed swings (2–3x within minutes here) hit every target alike. `calls/s`: "
           "all calls over all the target's block time. `vs direct`: the median over blocks of "
           "the target's rate divided by direct stdio's rate in the same block; `middle half`: "
           "the 25th–75th percentile of those ratios. Latencies are over every call. "
           "`cpu µs/call` is the CPU of the process the client talks to (the upstream itself "
           "for direct, the proxy otherwise; for `sidecar stdio` the state's daemon, which the "
           "stdio process hands its client's pipes to) during the sequential blocks.\n",
           table(["target", "calls/s", "vs direct", "middle half", "p50 ms", "p99 ms",
                  "cpu µs/call"], rows_seq),
           f"\n{tasks} concurrent callers on one session:\n",
           table(["target", "calls/s", "vs direct", "middle half", "p50 ms", "p99 ms"],
                 rows_conc),
           "\nBaseline (anchor-bench, same kind of box, mcp.Client): sequential direct 900–980, "
           "mcp-proxy 200–260, FastMCP 160–220 calls/s; 16 concurrent: direct 1,110–1,180, "
           "mcp-proxy 370–410, FastMCP 245–320.",
           "Targets: sidecar stdio >= 0.6x direct calls/s (>= 0.8x with 16 callers) and >= "
           "1.3x FastMCP and mcp-proxy; p99 <= 2x direct p99; `/mcp` >= 1.3x mcp-proxy "
           "(sequential and 16 callers) and >= 1.0x direct streamable HTTP with 16 callers; "
           "the daemon's CPU per sequential echo call <= 350 µs (stdio) and <= 450 µs (`/mcp`).",
           "`direct streamable HTTP`: `bench/upstream.py --http`, the same server over the "
           "SDK's own streamable HTTP app (uvicorn, uvloop), no proxy.",
           "`bare byte relay (floor)`: `bench/byte_relay.py`, a Python process that copies bytes "
           "between the client's pipes and the upstream's and parses nothing: the extra process "
           "and the two extra pipes every stdio proxy adds, with no work of its own.",
           f"`{LEAN}`: `bench/lean_proxy.py`, a stdio proxy of two line protocols and no task "
           "per call that does the per-call work alone (the request parsed, its arguments "
           "checked against the tool's schema, a fingerprint, a start line journaled, the "
           "outcome committed to SQLite before the answer, a history row, the answer "
           "re-encoded) and none of the layers (profiles, pins, rate limits, permissions, "
           "hooks, bounding, metrics, cancellation, restarts): its CPU is what this machine "
           "needs for that work now, beside the daemon's in the same blocks.",
           "Upstream era: the direct client, FastMCP's proxy and mcp-proxy all talk to the upstream "
           "in the 2025 handshake era, and so do the `sidecar stdio` and `/mcp` rows (manifest "
           "`protocol: legacy`). `sidecar stdio, upstream era auto` is the default manifest: the "
           "sidecar picks the 2026-07-28 era, where the SDK's server handles a per-request "
           f"`_meta` envelope on every call; `{DIRECT_AUTO}` is the direct client in that era "
           "(`mcp.Client(mode=\"auto\")`), the row the verdict compares it with."]
    out.append("\n" + verdict_bridge(by_name))
    # the bridge core without the facade: Snapshot.execute -> pool -> upstream, in one process
    try:
        core = child_json(["bridge-core", "--bytes", str(seq), "--tools", str(per_task)], 600)
        out += [
            "\nSidecar bridge core without an MCP front (`Snapshot.execute` → ServerPool → "
            "upstream `echo`, durable outcome log on, in the daemon process; run after the "
            "blocks above and not interleaved with them, so compare with care):\n",
            table(["path", "seq calls/s", "vs direct (all blocks)", "p50 ms", "p99 ms",
                   "daemon cpu µs/call", "16-conc calls/s", "vs direct (all blocks)", "p50 ms",
                   "p99 ms"],
                  [["Snapshot.execute via pool", f"{core['seq_rate']:.0f}",
                    fmt_ratio(core["seq_rate"], direct.seq.rate if direct else None),
                    f"{core['seq_p50']:.2f}", f"{core['seq_p99']:.2f}", f"{core['cpu_us']:.0f}",
                    f"{core['conc_rate']:.0f}",
                    fmt_ratio(core["conc_rate"], direct.conc.rate if direct else None),
                    f"{core['conc_p50']:.1f}", f"{core['conc_p99']:.1f}"]]),
        ]
    except RuntimeError as exc:
        out.append(f"\nbridge core: failed: {exc}")
    return "\n".join(out)


def verdict_bridge(by_name: dict[str, Connected]) -> str:
    """Each sidecar row against the targets: median block ratios, p99 over every call."""
    lines = []
    for mine in ("sidecar stdio", AUTO, "sidecar /mcp (HTTP)"):
        s = by_name.get(mine)
        d = by_name.get("direct stdio")
        direct = "direct"
        auto = by_name.get(DIRECT_AUTO)
        if mine == AUTO and auto is not None and auto.seq.calls:
            d, direct = auto, "direct in that era"  # like for like: both speak 2026-07-28
        if not s or not d or not s.seq.calls or s.target.unavailable:
            lines.append(f"- {mine}: not measured")
            continue
        parts = []
        for mode, phase in (("sequential", "seq"), ("16 concurrent", "conc")):
            ours: Phase = getattr(s, phase)
            theirs: Phase = getattr(d, phase)
            if not ours.calls or not theirs.calls:
                parts.append(f"{mode}: not measured")
                continue
            ratios = block_ratio(ours, theirs)
            r = statistics.median(ratios) if ratios else 0.0
            q = ours.p(0.99) / theirs.p(0.99)
            others = []
            for other in ("bare byte relay (floor)", "FastMCP proxy stdio",
                          "mcp-proxy (streamable HTTP)", "direct streamable HTTP"):
                o = by_name.get(other)
                vs = block_ratio(ours, getattr(o, phase)) if o else []
                if vs:
                    v = statistics.median(vs)
                    label = other.split()[0] if other != "direct streamable HTTP" else \
                        "direct HTTP"
                    goal = HTTP_GOALS.get((mine, other, phase))
                    others.append(f"{v:.2f}x {label}" + (
                        "" if goal is None else f" ({'ok' if v >= goal else 'MISS'})"))
            floor = 0.8 if phase == "conc" else 0.6
            parts.append(f"{mode}: {r:.2f}x {direct} ({'ok' if r >= floor else 'MISS'}), "
                         f"p99 {q:.2f}x {direct} ({'ok' if q <= 2 else 'MISS'})"
                         + (", " + ", ".join(others) if others else ""))
        if s.seq.calls and s.pid:
            cpu = s.seq.cpu / s.seq.calls * 1e6
            goal_us = CPU_GOALS.get(mine)
            lean = by_name.get(LEAN)
            parts.append(f"daemon CPU {cpu:.0f} µs/call" + (
                "" if goal_us is None else f" ({'ok' if cpu <= goal_us else 'MISS'}: "
                                           f"<= {goal_us})") + (
                f", the lean proxy's {lean.seq.cpu / lean.seq.calls * 1e6:.0f} in the same "
                "blocks" if lean is not None and lean.seq.calls and lean.pid else ""))
        lines.append(f"- {mine}: " + "; ".join(parts))
    return "\n".join(lines)


HTTP_GOALS = {
    ("sidecar /mcp (HTTP)", "mcp-proxy (streamable HTTP)", "seq"): 1.3,
    ("sidecar /mcp (HTTP)", "mcp-proxy (streamable HTTP)", "conc"): 1.3,
    ("sidecar /mcp (HTTP)", "direct streamable HTTP", "conc"): 1.0,
}
"""Ratios `/mcp` is held to (issue 40), per (row, other row, phase)."""
LEAN = "lean proxy (the per-call work alone)"
DIRECT_AUTO = "direct stdio, era auto (2026-07-28)"
AUTO = "sidecar stdio, upstream era auto (2026-07-28)"
CPU_GOALS = {"sidecar stdio": 350, "sidecar /mcp (HTTP)": 450}
"""The daemon's CPU per sequential echo call, at most (µs, issue 40)."""


# -- section 2: native API -------------------------------------------------------------------


@contextlib.asynccontextmanager
async def native_server(app: str) -> AsyncIterator[tuple[str, int]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(CHILDREN), "native", "--app", app, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True, cwd=str(ROOT))
    assert proc.stdout is not None and proc.stdin is not None
    try:
        async with asyncio.timeout(60):
            while True:
                line = (await proc.stdout.readline()).decode()
                if not line:
                    raise RuntimeError(f"native server {app} exited")
                if line.startswith("PORT "):
                    break
        yield f"http://127.0.0.1:{int(line.split()[1])}", proc.pid
    finally:
        proc.stdin.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await proc.wait()
        stop(proc)
        await proc.wait()


async def native_round(url: str, app: str, seq: int, tasks: int, per_task: int, warm: int) -> dict[str, Any]:
    import httpx

    headers = {"authorization": f"Bearer {TOKEN}"}
    limits = httpx.Limits(max_connections=tasks, max_keepalive_connections=tasks)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60, limits=limits) as c:
        if app == "bare":
            path = "/echo"
        else:
            r = await c.post("/v1/snapshots", json={"session_id": "bench"})
            r.raise_for_status()
            path = f"/v1/snapshots/{r.json()['id']}/calls"
        run = uuid.uuid4().hex[:8]

        async def one(i: str) -> None:
            body = {"name": "echo", "input": {"text": f"hello {i}"},
                    "context": {"session_id": "bench", "agent": "bench", "message_id": "m",
                                "call_id": f"{run}-{i}"}}
            r = await c.post(path, json=body)
            if r.status_code != 200 or r.json().get("status") != "completed":
                raise RuntimeError(f"{r.status_code} {r.text[:200]}")

        for i in range(warm):
            await one(f"w{i}")
        return {**await sequential(one, seq), **await concurrent(one, tasks, per_task)}


async def section_native(opts: argparse.Namespace) -> str:
    rounds = opts.rounds or (1 if opts.quick else 3)
    seq, tasks, per_task, warm = (20, 16, 3, 5) if opts.quick else (1000, 16, 100, 50)
    apps = {"bare": "bare Starlette JSON echo", "sidecar": "sidecar POST /v1/snapshots/{id}/calls",
            "sidecar-nondurable": "sidecar, durable=False (no SQLite outcome log)"}
    results: dict[str, list[dict[str, Any]]] = {a: [] for a in apps}
    async with contextlib.AsyncExitStack() as stack:
        urls = {a: (await stack.enter_async_context(native_server(a)))[0] for a in apps}
        for _ in range(rounds):
            for a in apps:
                results[a].append(await native_round(urls[a], a, seq, tasks, per_task, warm))
    bare_s = max(r["seq_rate"] for r in results["bare"])
    bare_c = max(r["conc_rate"] for r in results["bare"])
    rows = []
    for a, label in apps.items():
        bs = max(results[a], key=lambda r: r["seq_rate"])
        bc = max(results[a], key=lambda r: r["conc_rate"])
        rows.append([label, f"{bs['seq_rate']:.0f}", fmt_ratio(bs["seq_rate"], bare_s),
                     f"{bs['seq_p50']:.2f}", f"{bs['seq_p99']:.2f}", f"{bc['conc_rate']:.0f}",
                     fmt_ratio(bc["conc_rate"], bare_c), f"{bc['conc_p50']:.1f}", f"{bc['conc_p99']:.1f}"])
    return "\n".join([
        f"### 2. Native API: echo calls ({rounds} interleaved rounds, best shown)\n",
        "Both servers: uvicorn, `loop=\"uvloop\"`, access log off, 127.0.0.1, in their own "
        f"process; one httpx.AsyncClient (keep-alive). Sequential {seq} calls; {tasks} concurrent "
        f"callers × {per_task}. Every sidecar call has a fresh `call_id` (calls are idempotent "
        "per call_id).\n",
        table(["server", "seq calls/s", "vs bare", "p50 ms", "p99 ms", "16-conc calls/s",
               "vs bare", "p50 ms", "p99 ms"], rows),
        "\nBaseline: the bare Starlette endpoint (same uvicorn settings). Target: >= 0.6x bare.",
    ])


# -- section 3: large outputs ----------------------------------------------------------------


async def fastmcp_large(nbytes: int, limit: int) -> dict[str, Any]:
    import psutil

    t = Targets(Path(tempfile.gettempdir()))
    target = t.fastmcp(limit)
    if target.unavailable:
        return {"error": target.unavailable}
    before = {p.pid for p in psutil.Process().children()}
    async with target.connect() as client:
        name = await find_tool(client, "big")
        pid = next(iter(new_children(before)), None)
        base = psutil.Process(pid).memory_info().rss / 2**20 if pid else 0
        start = time.perf_counter()
        result = await call(client, name, {"nbytes": nbytes})
        elapsed = time.perf_counter() - start
        peak = 0.0
        if pid:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        peak = int(line.split()[1]) / 1024
    got = sum(len(c.text.encode()) for c in result.content if getattr(c, "text", None))
    return {"seconds": elapsed, "peak_mb": peak, "base_mb": base, "received": got}


async def section_large(opts: argparse.Namespace) -> str:
    sizes = [100_000, 1 * MB] if opts.quick else [1 * MB, 10 * MB, 100 * MB, 1000 * MB]
    fastmcp_sizes = sizes[:2] if opts.quick else [1 * MB, 10 * MB]
    rows = []
    for n in sizes:
        label = f"{n / MB:g} MB"
        disk = child_json(["disk", "--bytes", str(n)], 600)["seconds"]
        rows.append([label, "disk write + fsync (baseline)", f"{disk:.3f}", "–", "–", "1.00x", ""])
        try:
            up = child_json(["large-upstream", "--bytes", str(n)], 1200)
            rows.append([label, "sidecar: upstream MCP `big` → pool → seam → managed store",
                         f"{up['seconds']:.3f}", f"{up['peak_mb']:.0f}", f"{up['base_mb']:.0f}",
                         fmt_ratio(up["seconds"], disk), f"peak/payload {up['peak_mb'] * 2**20 / n:.2f}, "
                         f"(peak-base)/payload {(up['peak_mb'] - up['base_mb']) * 2**20 / n:.2f}"])
        except RuntimeError as exc:
            rows.append([label, "sidecar: upstream MCP", f"failed: {exc}", "", "", "", ""])
        cmd_bytes = max(n, 8 * 2**20)  # smaller outputs stay in memory and are not spooled
        try:
            cmd = child_json(["large-command", "--bytes", str(cmd_bytes)], 1200)
            note = f"producer → file: {cmd['plain_s']:.3f} s"
            if cmd_bytes != n:
                note += f"; {cmd_bytes / 2**20:.0f} MiB (spooling threshold)"
            rows.append([label, "sidecar: `command` tool → spool → managed store",
                         f"{cmd['seconds']:.3f}", f"{cmd['peak_mb']:.0f}", f"{cmd['base_mb']:.0f}",
                         fmt_ratio(cmd["seconds"], disk if cmd_bytes == n else None), note])
        except (RuntimeError, AssertionError) as exc:
            rows.append([label, "sidecar: `command` tool", f"failed: {exc}", "", "", "", ""])
        if n in fastmcp_sizes and not opts.no_external:
            for limit in (0, 500_000):
                name = "FastMCP proxy stdio" + (" + ResponseLimiting 500 kB" if limit else "")
                try:
                    async with asyncio.timeout(600):
                        fm = await fastmcp_large(n, limit)
                    if "error" in fm:
                        rows.append([label, name, fm["error"], "", "", "", ""])
                        continue
                    rows.append([label, name + " (client: mcp.Client)", f"{fm['seconds']:.3f}",
                                 f"{fm['peak_mb']:.0f}", f"{fm['base_mb']:.0f}",
                                 fmt_ratio(fm["seconds"], disk),
                                 f"received {fm['received'] / MB:.2f} MB"])
                except BaseException as exc:
                    if isinstance(exc, KeyboardInterrupt):
                        raise
                    rows.append([label, name, f"failed: {_short(exc)}", "", "", "", ""])
        elif n >= 100 * MB and not opts.no_external:
            rows.append([label, "FastMCP proxy stdio", "skipped (anchor: 182 s, peak 677 MB)", "", "", "", ""])
    return "\n".join([
        "### 3. Large text outputs: end-to-end time and peak RSS of the relaying process\n",
        "Sidecar rows: a fresh daemon process (`Location.open` + manifests), VmHWM reset with "
        "/proc/self/clear_refs right before the call; `base` is VmRSS then. FastMCP: VmHWM of "
        "the proxy process (never reset; base = RSS after connecting); the time includes the "
        "mcp.Client's own stdio reader. Disk: the same bytes written by Python with fsync.\n",
        table(["size", "path", "seconds", "peak RSS MB", "base MB", "vs disk", "notes"], rows),
        "\nBaseline (anchor-bench): 100 MB over any SDK stdio reader 87–182 s, proxy peak "
        "0.68–0.78 GB. Targets: 1 GB command output peak RSS <= 200 MB and time <= 2x disk; "
        "100 MB upstream result < 10 s and peak RSS < 3x payload.",
    ])


# -- section 4: startup ----------------------------------------------------------------------


def section_startup(opts: argparse.Namespace) -> str:
    counts = [1, 3] if opts.quick else [1, 20]
    rounds = opts.rounds or (1 if opts.quick else 3)
    kinds = [("SDK upstream (bench/upstream.py)", "sdk"),
             ("light upstream (bench/light_upstream.py)", "light"),
             ("bash upstream (bench/sh_upstream.sh)", "sh")]
    rows = []
    for label, upstream in kinds:
        extra = ["--upstream", upstream]
        res: dict[str, dict[int, list[float]]] = {
            kind: {n: [] for n in counts} for kind in ("startup", "launch", "spawn")}
        for _ in range(rounds):
            for n in counts:
                for kind in ("startup", "launch", "spawn"):
                    r = child_json([kind, "--servers", str(n), *extra], 600)
                    res[kind][n].append(r["ready_s"])
        one, bare_one, launch_one = (min(res[kind][counts[0]])
                                     for kind in ("startup", "spawn", "launch"))
        for n in counts:
            ready, bare, launched = res["startup"][n], res["spawn"][n], res["launch"][n]
            rows.append([label, n, f"{min(ready):.3f}", f"{max(ready):.3f}",
                         fmt_ratio(min(ready), one), f"{min(launched):.3f}",
                         fmt_ratio(min(launched), launch_one), f"{min(bare):.3f}",
                         fmt_ratio(min(bare), bare_one),
                         f"{(min(ready) - min(bare)) * 1000:.0f}"])
    return "\n".join([
        f"### 4. Startup: until every upstream stdio server is ready, from `Location.open` and from "
        f"launch ({rounds} rounds)\n",
        table(["upstream", "servers", "best s", "worst s", "vs 1 server",
               "from launch: best s", "from launch vs 1",
               "no sidecar: spawn + initialize s", "no sidecar vs 1", "sidecar adds ms"], rows),
        f"\nMachine: {os.cpu_count()} CPUs. The SDK upstream is a Python process importing the "
        "mcp SDK (~0.8 s of CPU), so N of them need N × that CPU on the box whatever starts "
        "them; the light upstream (plain JSON-RPC in Python, ~30 ms) and the bash upstream "
        "(~3 ms) show how the sidecar's own start scales. `no sidecar`: the same N upstreams "
        "spawned at once by a bare asyncio script that waits for each `initialize` answer: what "
        "the machine itself needs to start them. The sidecar's rows freeze the import-time heap "
        "first, as `sidecar serve` and `sidecar stdio` do. `from launch`: what a user waits "
        "for, from starting the `sidecar stdio` process (a fresh interpreter: its imports, ~0.6 s "
        "of which the `mcp` SDK's) until its `tools/list` answer, over its stdin/stdout, holds "
        "every upstream's tools.",
        "Baseline: the 1-server time of the same upstream. Target: 20 servers <= 1.5x it.",
    ])


# -- section 5: catalog ----------------------------------------------------------------------


def section_catalog(opts: argparse.Namespace) -> str:
    rows = []
    if opts.quick:
        plan = [("manifests", 3, 10, 0), ("in-process", 0, 0, 100), ("in-process", 0, 0, 500)]
    else:
        plan = [("manifests", 50, 100, 0), ("in-process", 0, 0, 500),
                ("in-process", 0, 0, 1000), ("in-process", 0, 0, 5000)]
    for how, servers, tools, inproc in plan:
        try:
            r = child_json(["catalog", "--servers", str(servers), "--tools", str(tools),
                            "--inproc", str(inproc)], 900)
        except RuntimeError as exc:
            rows.append([how, f"{servers}x{tools}" if servers else inproc, f"failed: {exc}",
                         "", "", "", "", "", "", "", "", "", ""])
            continue
        grown = r["rss_loaded_mb"] - (r["rss_open_mb"] if inproc else r["rss_start_mb"])
        setup = r["open_s"] + r["register_s"]
        rows.append([how, f"{servers} servers × {tools + 2}" if servers else f"{inproc} registered",
                     r["tools"], f"{setup:.2f}", f"{r['snapshot_ms']:.2f}", f"{r['list_ms']:.1f}",
                     f"{r['list_served_ms']:.1f}", f"{r['post_snapshot_ms']:.1f}", f"{r['mcp_list_ms']:.1f}",
                     f"{r['stdio_list_ms']:.1f}", f"{r['stdio_wire_ms']:.1f}",
                     f"{r['rss_loaded_mb']:.0f}",
                     f"{grown:.1f} ({grown * 1024 / max(r['tools'], 1):.1f} KiB/tool)"])
    return "\n".join([
        "### 5. Catalog scale\n",
        "Each row is a fresh daemon process. `snapshot ms`: median `location.snapshot()`; "
        "`GET /v1/tools` and `POST /v1/snapshots`: median over 10 requests on 127.0.0.1 "
        "(uvicorn, default loop), the client's parsing of the body included; `GET /v1/tools, "
        "daemon side`: the same app answering in-process (ASGI, no socket), the body read and "
        "not parsed; RSS after loading (gc'd); growth: in-process rows over the opened "
        "Location before registering, manifests rows over the process before `Location.open` "
        "(includes the pool's connections and the Location itself).\n",
        table(["source", "catalog", "tools", "load s", "snapshot ms", "GET /v1/tools ms",
               "GET /v1/tools, daemon side ms", "POST /v1/snapshots ms", "MCP tools/list /mcp ms", "MCP tools/list stdio ms",
               "stdio tools/list, daemon side ms", "RSS MB", "RSS growth MB"], rows),
        "\n`MCP tools/list /mcp ms`: median of 10 `tools/list` requests by an `mcp.Client` on "
        "`/mcp` of the same daemon (streamable HTTP, one page). `... stdio ms`: the same through "
        "the facade as `sidecar stdio` runs it (with its fast path), over in-memory streams "
        "instead of pipes. Both include the client's own parsing of the result. `stdio "
        "tools/list, daemon side ms`: what the daemon spends on one such request on pipes, from "
        "the parsed line to the answer's bytes (the listing is cached per registry state, its "
        "JSON too).",
        "Target: snapshot build and tools/list for 5,000 tools each < 50 ms; RSS linear in "
        "tool count.",
    ])


# -- main ------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke version: seconds, tiny sizes")
    parser.add_argument("--only", default="", help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--rounds", type=int, default=0, help="rounds per target (default 3; 1 quick)")
    parser.add_argument("--no-external", action="store_true",
                        help="skip FastMCP and mcp-proxy (their venvs)")
    parser.add_argument("--results", default=str(RESULTS),
                        help="Markdown file whose compare.py block gets this run's tables "
                             "(default bench/RESULTS.md; never written with --quick)")
    parser.add_argument("--no-write", action="store_true", help="only print the tables")
    opts = parser.parse_args()
    only = [s.strip() for s in opts.only.split(",") if s.strip()] or list(SECTIONS)
    unknown = set(only) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    import logging

    logging.basicConfig(level=logging.ERROR)
    command = " ".join(shlex.quote(a) for a in [os.path.relpath(sys.executable, ROOT), "bench/compare.py", *sys.argv[1:]])
    out: list[str] = []

    def emit(text: str) -> None:
        out.append(text)
        print(text, flush=True)

    emit("## mcp-sidecar side-by-side benchmarks\n")
    emit(f"- machine: {machine()}")
    emit(f"- versions: {versions()}")
    emit(f"- command: `{command}`")
    emit(f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n")
    for section in SECTIONS:
        if section not in only:
            continue
        started = time.perf_counter()
        try:
            if section == "bridge":
                text = asyncio.run(section_bridge(opts))
            elif section == "native":
                text = asyncio.run(section_native(opts))
            elif section == "large":
                text = asyncio.run(section_large(opts))
            elif section == "startup":
                text = section_startup(opts)
            else:
                text = section_catalog(opts)
        except Exception as exc:
            text = f"### {section}: FAILED: {_short(exc)}"
            main.failed = True  # type: ignore[attr-defined]
        emit(text)
        emit(f"\n_(section {section}: {time.perf_counter() - started:.1f} s)_\n")
    if not opts.quick and not opts.no_write:
        partial = only if set(only) != set(SECTIONS) else None
        write_results(Path(opts.results), "\n".join(out), partial)
    return 1 if getattr(main, "failed", False) else 0


BEGIN, END = "<!-- compare.py:begin -->", "<!-- compare.py:end -->"


def write_results(path: Path, text: str, sections: list[str] | None = None) -> None:
    """Put this run's tables between the compare.py markers of `path` (appended when the file
    has none); everything else in the file is kept. With `sections` (a partial run), only
    those sections of the block are replaced, and the run is noted under the block's header."""
    old = path.read_text() if path.exists() else ""
    has_block = BEGIN in old and END in old
    if sections and has_block:
        text = _merge(old.split(BEGIN, 1)[1].split(END, 1)[0], text, sections)
    block = f"{BEGIN}\n{text.strip()}\n{END}"
    if has_block:
        head, rest = old.split(BEGIN, 1)
        new = head + block + rest.split(END, 1)[1]
    else:
        new = old.rstrip() + ("\n\n" if old else "") + block + "\n"
    path.write_text(new)
    print(f"wrote {path}", file=sys.stderr)


def _split(block: str) -> tuple[str, dict[str, str]]:
    """(header, {section name: its text}) of a block; a section runs from its `### ` heading
    to its `_(section NAME: ...)_` line."""
    header: list[str] = []
    found: dict[str, str] = {}
    current: list[str] = []
    for line in block.strip().splitlines():
        if line.startswith("### ") and not current:
            current = [line]
        elif current:
            current.append(line)
            if line.startswith("_(section "):
                name = line[len("_(section "):].split(":", 1)[0]
                found[name] = "\n".join(current)
                current = []
        else:
            header.append(line)
    return "\n".join(header).strip(), found


def _merge(old: str, new: str, sections: list[str]) -> str:
    old_header, old_sections = _split(old)
    new_header, new_sections = _split(new)
    merged = {name: new_sections.get(name) if name in sections else old_sections.get(name)
              for name in SECTIONS}
    rerun = ", ".join(sections)
    command = next((ln for ln in new_header.splitlines() if ln.startswith("- command:")), "")
    date = next((ln for ln in new_header.splitlines() if ln.startswith("- date:")), "")
    machine = next((ln for ln in new_header.splitlines() if ln.startswith("- machine:")), "")
    # the machine too: the VM behind this one changes kind between runs (AMD EPYC, Intel Xeon)
    note = f"- re-run of {rerun}: {command[2:]}, {date[2:]}, {machine[2:]}"
    parts = [old_header + "\n" + note]
    parts += [text for text in merged.values() if text]
    return "\n\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
