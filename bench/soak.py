"""Soak: does a daemon stay flat over a long run? Memory, descriptors, threads and disk.

    .venv/bin/python bench/soak.py [--seconds 600] [--callers 16] [--retention 60]
                                   [--transports stdio,mcp] [--quick] [--write]
    scripts/bench soak ...                                   (the same, after the installs)

One daemon per transport, each on its own state directory, in front of `bench/upstream.py`: `sidecar
stdio` (the background daemon it relays to is the one sampled) and `sidecar serve` (`/mcp`).
`--callers` callers per transport call for `--seconds`: `echo`, and every `--large-every`-th call
`big`, whose `--large-bytes` the managed store retains; `SIDECAR_RETENTION` = `--retention`. Every
`--sample` seconds: RSS, descriptors, threads, state directory size. Targets, after warm-up (the
first fifth, at most 60 s): RSS growth under 10 %, descriptors and threads flat (the second half's
highest count at most 2 above the first half's), state directory less managed objects under
150 MB, 0 errors. `--quick` is the CI smoke run; `--write` puts the summary into bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import shlex
import signal
import sqlite3
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "RESULTS.md"
UPSTREAM = HERE / "upstream.py"
SIDECAR = Path(sys.executable).parent / "sidecar"
TOKEN = "soak-bench-token-0123456789abcdef0123456789abcdef"
MB = 1_000_000
BEGIN, END = "<!-- soak.py:begin -->", "<!-- soak.py:end -->"
STATE_TARGET = 150 * MB


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # seconds since the callers started
    calls: int
    rss: int
    fds: int
    threads: int
    state: int
    outcomes: int
    wal: int
    managed: int


@dataclass
class Daemon:
    name: str
    state_dir: Path
    pid: int = 0
    calls: int = 0
    large: int = 0
    errors: int = 0
    first_errors: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    health: dict[str, Any] = field(default_factory=dict)

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.first_errors) < 5:
            self.first_errors.append(what[:300])


# -- measuring --------------------------------------------------------------------------------


def tree_bytes(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def file_bytes(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def sample(daemon: Daemon, started: float) -> Sample:
    proc = psutil.Process(daemon.pid)
    with proc.oneshot():
        rss, fds, threads = proc.memory_info().rss, proc.num_fds(), proc.num_threads()
    state = daemon.state_dir
    return Sample(
        at=time.monotonic() - started, calls=daemon.calls, rss=rss, fds=fds, threads=threads,
        state=tree_bytes(state), outcomes=file_bytes(state / "outcomes.sqlite"),
        wal=file_bytes(state / "outcomes.sqlite-wal"), managed=tree_bytes(state / "managed" / "objects"),
    )


def outcome_counts(state: Path) -> dict[str, int]:
    """Rows in the outcome log and its tombstones, read once at the end (read-only)."""
    path = state / "outcomes.sqlite"
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as db:
            stored = db.execute("SELECT count(*) FROM outcomes").fetchone()[0]
            expired = db.execute("SELECT count(*) FROM expired").fetchone()[0]
    except sqlite3.Error:
        return {}
    return {"outcomes_stored": int(stored), "outcomes_expired": int(expired)}


# -- daemons and callers ----------------------------------------------------------------------


def write_manifest(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    entry = {"command": sys.executable, "args": [str(UPSTREAM)], "protocol": "legacy",
             "timeouts": {"startup": 120, "call": 300}}
    (directory / "soak.json").write_text(json.dumps({"mcpServers": {"up": entry}}))
    return directory


@contextlib.asynccontextmanager
async def mcp_session(target: Any, headers: dict[str, str] | None = None) -> AsyncIterator[Any]:
    from mcp import Client

    if isinstance(target, str):
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        http = httpx2.AsyncClient(headers=headers or {}, timeout=httpx2.Timeout(300.0))
        async with http:
            transport = streamable_http_client(target, http_client=http, max_sse_event_size=2**31)
            async with Client(transport, mode="legacy", cache=None, read_timeout_seconds=300) as client:
                yield client
    else:
        async with Client(target, mode="legacy", cache=None, read_timeout_seconds=300) as client:
            yield client


def stdio_child(state: Path) -> int:
    """The `sidecar stdio` child of this process that serves `state`."""
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmd = child.cmdline()
            if "stdio" in cmd and str(state) in cmd:
                return child.pid
    raise RuntimeError(f"no sidecar stdio child for {state}")


async def daemon_pid(state: Path) -> int:
    """The process that owns `state`: the daemon `sidecar stdio` relays to (its pid is in
    `<state>/daemon.json`), else the `sidecar stdio` child itself (an embedded daemon)."""
    relay = stdio_child(state)
    for _ in range(100):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            pid = int(json.loads((state / "daemon.json").read_text())["pid"])
            if pid != relay and psutil.pid_exists(pid):
                return pid
        await asyncio.sleep(0.1)
    return relay


async def stop_pid(pid: int) -> None:
    """Stop a process we started (a daemon `sidecar stdio` left running), by PID."""
    try:
        proc = psutil.Process(pid)
        proc.terminate()
        await asyncio.to_thread(proc.wait, 30)
    except psutil.TimeoutExpired:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
    except psutil.Error:
        pass


async def daemon_health(state: Path) -> dict[str, Any]:
    """The `state` section of the daemon's health, through its Unix socket when it has one."""
    import httpx2

    try:
        info = json.loads((state / "daemon.json").read_text())
        token = (state / "token").read_text().strip()
        transport = httpx2.AsyncHTTPTransport(uds=info["http_socket"])
        async with httpx2.AsyncClient(transport=transport, timeout=60,
                                      headers={"authorization": f"Bearer {token}"}) as http:
            report = (await http.get("http://localhost/v1/health")).json()
    except Exception:
        return {}
    state_report: dict[str, Any] = report.get("state", {})
    return state_report


@contextlib.asynccontextmanager
async def stdio_daemon(tmp: Path, manifests: Path, env: dict[str, str]) -> AsyncIterator[tuple[Daemon, Any]]:
    from mcp import StdioServerParameters

    daemon = Daemon("sidecar stdio", tmp / "state-stdio")
    params = StdioServerParameters(
        command=str(SIDECAR), args=["stdio", "--manifests", str(manifests), "--state-dir", str(daemon.state_dir)],
        env={**os.environ, **env}, cwd=str(ROOT))
    try:
        async with mcp_session(params) as client:
            daemon.pid = await daemon_pid(daemon.state_dir)
            yield daemon, client
            daemon.health = await daemon_health(daemon.state_dir)
    finally:
        if daemon.pid and psutil.pid_exists(daemon.pid):
            await stop_pid(daemon.pid)


@contextlib.asynccontextmanager
async def http_daemon(tmp: Path, manifests: Path, env: dict[str, str]) -> AsyncIterator[tuple[Daemon, Any]]:
    daemon = Daemon("sidecar /mcp", tmp / "state-http")
    proc = await asyncio.create_subprocess_exec(
        str(SIDECAR), "serve", "--port", "0", "--manifests", str(manifests), "--state-dir", str(daemon.state_dir),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **env, "SIDECAR_TOKEN": TOKEN}, start_new_session=True, cwd=str(ROOT))
    assert proc.stderr is not None
    drain: asyncio.Task[None] | None = None
    try:
        url = ""
        async with asyncio.timeout(120):
            while not url:
                line = (await proc.stderr.readline()).decode(errors="replace")
                if not line:
                    raise RuntimeError(f"sidecar serve exited ({await proc.wait()})")
                if "listening on" in line:
                    url = line.split("listening on", 1)[1].strip()
        drain = asyncio.create_task(_drain(proc.stderr))
        daemon.pid = proc.pid
        headers = {"authorization": f"Bearer {TOKEN}"}
        async with mcp_session(url + "/mcp", headers) as client:
            yield daemon, client
        import httpx2

        async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
            with contextlib.suppress(Exception):
                daemon.health = (await http.get(url + "/v1/health")).json().get("state", {})
    finally:
        if drain is not None:
            drain.cancel()
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                async with asyncio.timeout(30):
                    await proc.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass


async def call_tool(client: Any, name: str, arguments: dict[str, Any]) -> Any:
    from mcp import types

    request = types.CallToolRequest(params=types.CallToolRequestParams(name=name, arguments=arguments))
    return await client.session.send_request(request, types.CallToolResult)


async def tool_names(client: Any) -> tuple[str, str]:
    """The upstream's echo and big (listed again until they appear: the daemon starts its
    servers in the background)."""
    from compare import find_tool

    return await find_tool(client, "echo"), await find_tool(client, "big")


async def caller(daemon: Daemon, client: Any, names: tuple[str, str], k: int, deadline: float,
                 opts: argparse.Namespace) -> None:
    echo, big = names
    i = 0
    while time.monotonic() < deadline:
        large = opts.large_every > 0 and i % opts.large_every == opts.large_every - 1
        began = time.perf_counter()
        try:
            if large:
                result = await call_tool(client, big, {"nbytes": opts.large_bytes})
            else:
                result = await call_tool(client, echo, {"text": f"caller {k} call {i}"})
            if result.is_error:
                daemon.error(f"{'big' if large else 'echo'}: {result.content}")
            elif large and "managed" not in json.dumps(result.model_dump(mode="json")):
                daemon.error("big: the text was not retained in the managed store")
        except Exception as exc:
            daemon.error(f"{type(exc).__name__}: {exc}")
        if not large:
            daemon.latencies.append(time.perf_counter() - began)
        daemon.calls += 1
        daemon.large += large
        i += 1


async def sampler(daemons: list[Daemon], started: float, every: float, stop: asyncio.Event) -> None:
    while True:
        for daemon in daemons:
            try:
                s = await asyncio.to_thread(sample, daemon, started)
            except psutil.Error as exc:
                daemon.error(f"sampling: {exc}")
                continue
            daemon.samples.append(s)
            print(f"  {s.at:6.0f} s  {daemon.name:14} calls {s.calls:8}  RSS {s.rss / MB:6.1f} MB  "
                  f"fds {s.fds:3}  threads {s.threads:3}  state {s.state / MB:7.1f} MB  "
                  f"(outcomes {s.outcomes / MB:.1f}, WAL {s.wal / MB:.1f}, managed {s.managed / MB:.1f})",
                  flush=True)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(every):
                await stop.wait()
        if stop.is_set():
            return


# -- report -----------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def summary(daemon: Daemon, warmup: float, seconds: float) -> tuple[list[str], bool]:
    """Table rows for one daemon, and whether every target held."""
    after = [s for s in daemon.samples if s.at >= warmup] or daemon.samples[-1:]
    base, last = after[0], daemon.samples[-1]
    rss_growth = (last.rss - base.rss) / base.rss * 100
    # Descriptors come and go with connections and object files: "flat" means no upward
    # trend, i.e. the highest count in the second half after warm-up is no higher (+2) than
    # the highest in the first half.
    half = max(1, len(after) // 2)
    first, second = after[:half], after[half:] or after[-1:]
    fd_growth = max(s.fds for s in second) - max(s.fds for s in first)
    thread_growth = max(s.threads for s in second) - max(s.threads for s in first)
    non_retained = max(s.state - s.managed for s in daemon.samples)
    checks = [rss_growth < 10, fd_growth <= 2, thread_growth <= 2, non_retained < STATE_TARGET,
              daemon.errors == 0]
    rate = daemon.calls / seconds if seconds else 0.0
    lat = sorted(daemon.latencies) or [0.0]
    rows = [
        f"| {daemon.name} | calls | {daemon.calls:,} ({rate:,.0f}/s; {daemon.large:,} large) | | |",
        f"| {daemon.name} | echo latency ms p50 / p99 / max | {pct(lat, 0.5) * 1e3:.1f} / "
        f"{pct(lat, 0.99) * 1e3:.1f} / {lat[-1] * 1e3:.0f} | | |",
        f"| {daemon.name} | RSS MB (after warm-up → end, max) | {base.rss / MB:.1f} → {last.rss / MB:.1f}, "
        f"max {max(s.rss for s in after) / MB:.1f} | {rss_growth:+.1f} % (< 10 %) | {verdict(checks[0])} |",
        f"| {daemon.name} | open fds (after warm-up: range; max 1st half → 2nd half) | "
        f"{min(s.fds for s in after)}–{max(s.fds for s in after)}; {max(s.fds for s in first)} → "
        f"{max(s.fds for s in second)} | {fd_growth:+d} (flat: <= +2) | {verdict(checks[1])} |",
        f"| {daemon.name} | threads (after warm-up: range; max 1st half → 2nd half) | "
        f"{min(s.threads for s in after)}–{max(s.threads for s in after)}; {max(s.threads for s in first)} → "
        f"{max(s.threads for s in second)} | {thread_growth:+d} (flat: <= +2) | {verdict(checks[2])} |",
        f"| {daemon.name} | state dir MB (end; max) | {last.state / MB:.1f}; max {max(s.state for s in daemon.samples) / MB:.1f} "
        f"| max without managed objects {non_retained / MB:.1f} (< 150) | {verdict(checks[3])} |",
        f"| {daemon.name} | outcome log / WAL MB (max) | {max(s.outcomes for s in daemon.samples) / MB:.1f} / "
        f"{max(s.wal for s in daemon.samples) / MB:.1f} | | |",
        f"| {daemon.name} | managed objects MB (end; max) | {last.managed / MB:.1f}; max "
        f"{max(s.managed for s in daemon.samples) / MB:.1f} | | |",
        f"| {daemon.name} | errors | {daemon.errors} | 0 | {verdict(checks[4])} |",
    ]
    counts = {**outcome_counts(daemon.state_dir), **daemon.health.get("upkeep", {})}
    if counts:
        shown = ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items()))
        rows.append(f"| {daemon.name} | at the end | {shown} | | |")
    return rows, all(checks)


def commit() -> str:
    import subprocess

    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=30, cwd=ROOT)
    except OSError:
        return "?"
    return done.stdout.strip() or "?"


def machine() -> str:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"load average at the end {load}")


def write_results(path: Path, text: str) -> None:
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    block = f"{BEGIN}\n{text.strip()}\n{END}"
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        new = head + block + rest.split(END, 1)[1]
    elif "\n## History" in old:  # current results come before the dated history
        head, rest = old.split("\n## History", 1)
        new = head.rstrip("\n") + "\n\n" + block + "\n\n## History" + rest
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(new)


# -- main -------------------------------------------------------------------------------------


async def soak(opts: argparse.Namespace) -> str:
    load_before = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="sidecar-soak-") as tmp_name:
        tmp = Path(tmp_name)
        manifests = write_manifest(tmp / "manifests")
        env = {"SIDECAR_RETENTION": f"{opts.retention}s", "SIDECAR_LOG_LEVEL": "WARNING"}
        async with contextlib.AsyncExitStack() as stack:
            connected: list[tuple[Daemon, Any, tuple[str, str]]] = []
            for transport in opts.transports.split(","):
                opener = {"stdio": stdio_daemon, "mcp": http_daemon}[transport]
                daemon, client = await stack.enter_async_context(opener(tmp, manifests, env))
                connected.append((daemon, client, await tool_names(client)))
            daemons = [d for d, _, _ in connected]
            print(f"soak: {opts.seconds:.0f} s, {opts.callers} callers per transport, "
                  f"1 in {opts.large_every} calls returns {opts.large_bytes:,} bytes, retention "
                  f"{opts.retention:g} s; load average before {load_before}", flush=True)
            started = time.monotonic()
            deadline = started + opts.seconds
            stop = asyncio.Event()
            watch = asyncio.create_task(sampler(daemons, started, opts.sample, stop))
            async with asyncio.TaskGroup() as group:
                for daemon, client, names in connected:
                    for k in range(opts.callers):
                        group.create_task(caller(daemon, client, names, k, deadline, opts))
            stop.set()
            await watch
            for daemon in daemons:  # one last sample after the callers stopped
                daemon.samples.append(await asyncio.to_thread(sample, daemon, started))
            elapsed = time.monotonic() - started
        warmup = min(60.0, opts.seconds / 5)
        rows: list[str] = []
        all_ok = True
        for daemon in daemons:
            more, ok = summary(daemon, warmup, elapsed)
            rows += more
            all_ok &= ok
            for line in daemon.first_errors:
                print(f"  first errors ({daemon.name}): {line}")
    command = "bench/soak.py " + shlex.join(sys.argv[1:])
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join([
        "## Soak (`bench/soak.py`)",
        "",
        f"- date: {when}; commit {commit()}; command: `{command}`",
        f"- machine: {machine()}; load average before {load_before}",
        f"- {opts.callers} callers per transport for {opts.seconds:.0f} s; 1 call in {opts.large_every} "
        f"returns {opts.large_bytes:,} bytes (retained); `SIDECAR_RETENTION={opts.retention:g}s`; "
        f"samples every {opts.sample:g} s; warm-up {warmup:.0f} s",
        f"- targets (issue 32, for 10 minutes): {'all held' if all_ok else 'NOT all held'}; the "
        "WAL cap is 64 MiB (67.1 MB); MB here are 10^6 bytes",
        "- baseline (issue 32, before the WAL cap and pruning): `sidecar stdio`, 16 callers, 180 s, "
        "tiny calls only: `outcomes.sqlite-wal` 494 MB within 60 s, kept until the daemon closed; "
        "outcome table 87 MB, never pruned",
        "",
        "| daemon | measure | value | target | |",
        "|---|---|---|---|---|",
        *rows,
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--callers", type=int, default=16, help="concurrent callers per transport")
    parser.add_argument("--transports", default="stdio,mcp", help="stdio, mcp or both")
    parser.add_argument("--large-every", type=int, default=50, help="every Nth call returns --large-bytes")
    parser.add_argument("--large-bytes", type=int, default=200_000)
    parser.add_argument("--retention", type=float, default=60, help="SIDECAR_RETENTION, seconds")
    parser.add_argument("--sample", type=float, default=5, help="seconds between samples")
    parser.add_argument("--quick", action="store_true", help="CI smoke: seconds, tiny sizes")
    parser.add_argument("--write", action="store_true", help="write the summary into bench/RESULTS.md")
    opts = parser.parse_args()
    if opts.quick:
        opts.seconds, opts.callers, opts.sample = min(opts.seconds, 6), min(opts.callers, 4), 1
        opts.retention, opts.large_every, opts.large_bytes = 2, 10, 80_000
    report = asyncio.run(soak(opts))
    print()
    print(report)
    if opts.write:
        write_results(RESULTS, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
