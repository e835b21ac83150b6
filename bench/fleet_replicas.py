"""Section 2 of `bench/fleet.py`: two `sidecar serve` replicas against one behind HAProxy.

Replicas A and B are `sidecar serve` processes on one PostgreSQL database
(`SIDECAR_DATABASE_URL`: outcome log, snapshots and the other fleet stores), each with its own
state directory and the `echo` plugin (`bench/fleet_plugin.py`). HAProxy has three frontends:
`one` (A alone), `two` (A and B) and `any` (A and B, no affinity). A third replica on SQLite
and A without the proxy are reference rows. 16 callers, each on its own keep-alive
connection, make a snapshot and call `/v1/snapshots/{id}/calls` with fresh call ids; the
targets take turns in blocks (order rotating).

On `one` and `two` each caller sends an `X-Bench-Caller` header and HAProxy keeps a caller on
the replica that served its first request (the stick table one uses for `Mcp-Session-Id`):
callers are spread round-robin, 8 on each replica, as sessions would be. On `any` every
request goes round-robin to either replica, which then finds the snapshot another replica
made in the database.

The load generator is this process, kept light on purpose (HTTP/1.1 written by hand on
asyncio streams, about a tenth of an HTTP client library's CPU per request), because on 2
cores every process of the fleet shares the same CPUs. The CPU of each process and of the
whole machine is sampled around every block: it says whether two replicas can be faster.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from fleet_common import process_cpu, table
from fleet_servers import HAProxy, PostgresServer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TOKEN = "fleet-bench-token-0123456789abcdef0123456789abcdef"
CALLERS = 16
AFFINITY = "X-Bench-Caller"
MACHINE = ("machine: in processes", "machine: interrupts", "machine: stolen")
MANIFEST = 'plugins = ["fleet_plugin:activate"]\n'


@dataclass
class Replica:
    name: str
    process: asyncio.subprocess.Process
    address: str  # host:port
    drain: asyncio.Task[None]


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass


async def start_replica(tmp: Path, name: str, database_url: str | None) -> Replica:
    home = tmp / name
    (home / "manifests").mkdir(parents=True)
    (home / "manifests" / "bench.toml").write_text(MANIFEST)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    env.update(SIDECAR_STATE_DIR=str(home / "state"), SIDECAR_MANIFESTS=str(home / "manifests"),
               SIDECAR_TOKEN=TOKEN, PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT)]))
    if database_url:
        env["SIDECAR_DATABASE_URL"] = database_url
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sidecar.cli", "serve", "--port", "0", env=env, cwd=str(ROOT),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        start_new_session=True)
    assert process.stderr is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(120):
            while True:
                line = (await process.stderr.readline()).decode(errors="replace")
                if not line:
                    raise RuntimeError(f"replica {name} exited: {''.join(seen)[-2000:]}")
                seen.append(line)
                if "listening on " in line:
                    url = line.split("listening on ", 1)[1].strip()
                    break
    except BaseException:
        await stop_replica_process(process)
        raise
    drain = asyncio.create_task(_drain(process.stderr))
    return Replica(name, process, url.removeprefix("http://").rstrip("/"), drain)


async def stop_replica_process(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            async with asyncio.timeout(30):
                await process.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()


async def stop_replica(replica: Replica) -> None:
    await stop_replica_process(replica.process)
    replica.drain.cancel()


class Connection:
    """One keep-alive HTTP/1.1 connection, JSON POSTs only (Content-Length or chunked
    answers). A connection the server closed between requests is opened again once."""

    def __init__(self, address: str, headers: dict[str, str]) -> None:
        self.host, port = address.rsplit(":", 1)
        self.port = int(port)
        self.head = "".join(f"{k}: {v}\r\n" for k, v in {
            "Host": address, "Content-Type": "application/json", **headers}.items())
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        data = json.dumps(body).encode()
        request = (f"POST {path} HTTP/1.1\r\n{self.head}Content-Length: {len(data)}\r\n\r\n"
                   ).encode() + data
        for attempt in (1, 2):
            if self.writer is None:
                self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            assert self.reader is not None
            try:
                self.writer.write(request)
                return await self._answer(self.reader)
            except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError):
                await self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    @staticmethod
    async def _answer(reader: asyncio.StreamReader) -> tuple[int, Any]:
        lines = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
        status = int(lines[0].split()[1])
        length, chunked = 0, False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if not chunked:
            return status, json.loads(await reader.readexactly(length))
        body = bytearray()
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            body += (await reader.readexactly(size + 2))[:-2]
        await reader.readuntil(b"\r\n")
        return status, json.loads(body)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()
        self.reader = self.writer = None


@dataclass
class Target:
    label: str
    address: str
    pids: list[int]  # the replicas behind it
    conns: list[tuple[Connection, str]] = field(default_factory=list)  # (connection, path)
    rates: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    cpu: defaultdict[str, float] = field(  # process group -> CPU seconds
        default_factory=lambda: defaultdict(float))
    wall: float = 0.0
    calls: int = 0
    answered_by: Counter[int] = field(default_factory=Counter)

    async def connect(self) -> None:
        """One connection per caller, each making its snapshot first (one after the other:
        round-robin spreads the callers evenly)."""
        for k in range(CALLERS):
            conn = Connection(self.address, {"Authorization": f"Bearer {TOKEN}",
                                             AFFINITY: f"caller-{k}"})
            status, body = await conn.post("/v1/snapshots", {"session_id": f"bench-{k}"})
            if status not in (200, 201):
                raise RuntimeError(f"{self.label}: snapshot {status} {body}")
            self.conns.append((conn, f"/v1/snapshots/{body['id']}/calls"))


def machine_busy() -> tuple[float, float, float]:
    """CPU seconds of the whole machine, all cores: busy in processes, in interrupts
    (loopback TCP is partly handled there, for no process) and stolen by the hypervisor."""
    t = psutil.cpu_times()
    irq = getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
    return t.user + t.nice + t.system, irq, getattr(t, "steal", 0.0)


async def block(target: Target, groups: dict[str, list[int]], per_caller: int,
                run: str) -> None:
    async def caller(k: int, conn: Connection, path: str) -> None:
        for i in range(per_caller):
            start = time.perf_counter()
            status, body = await conn.post(path, {
                "name": "echo", "input": {"text": f"hello {i}"},
                "context": {"session_id": f"bench-{k}", "agent": "bench", "message_id": "m",
                            "call_id": f"{run}-{k}-{i}"}})
            target.latencies.append(time.perf_counter() - start)
            if status != 200 or body.get("status") != "completed" or body.get("replayed"):
                raise RuntimeError(f"{target.label}: {status} {str(body)[:300]}")
            target.answered_by[body["output"]["pid"]] += 1

    def cpu(name: str) -> float:  # this process spawned the others: count only its own
        return sum(process_cpu(p, tree=p != os.getpid()) for p in groups[name])

    before = {name: cpu(name) for name in groups}
    machine0 = machine_busy()
    start = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for k, (conn, path) in enumerate(target.conns):
            group.create_task(caller(k, conn, path))
    took = time.perf_counter() - start
    machine1 = machine_busy()
    for name in groups:
        target.cpu[name] += cpu(name) - before[name]
    for n, name in enumerate(MACHINE):
        target.cpu[name] += machine1[n] - machine0[n]
    target.wall += took
    target.calls += CALLERS * per_caller
    target.rates.append(CALLERS * per_caller / took)


def same_block_ratios(mine: Target, base: Target) -> list[float]:
    return [a / b for a, b in zip(mine.rates, base.rates, strict=True)]


def fmt(ratios: list[float]) -> str:
    if len(ratios) < 4:
        return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}–{max(ratios):.2f})"
    q = statistics.quantiles(ratios, n=4)
    return f"{statistics.median(ratios):.2f}x ({q[0]:.2f}–{q[2]:.2f})"


async def section_replicas(opts: Any, pg: PostgresServer) -> str:
    database = await pg.new_database()
    with tempfile.TemporaryDirectory(prefix="sidecar-fleet-") as tmp_name:
        tmp = Path(tmp_name)
        replicas: list[Replica] = []
        proxy: HAProxy | None = None
        try:
            started = await asyncio.gather(*(
                start_replica(tmp, name, url)
                for name, url in (("a", database), ("b", database), ("sqlite", None))),
                return_exceptions=True)
            replicas = [r for r in started if isinstance(r, Replica)]
            for failed in started:
                if isinstance(failed, BaseException):
                    raise failed
            a, b, lite = replicas
            proxy = await asyncio.to_thread(HAProxy.start, {
                "one": [a.address], "two": [a.address, b.address],
                "any": [a.address, b.address]}, AFFINITY, ("one", "two"))
            targets = [
                Target("one replica (PostgreSQL) behind HAProxy", proxy.url("one")
                       .removeprefix("http://"), [a.process.pid]),
                Target("two replicas (PostgreSQL) behind HAProxy", proxy.url("two")
                       .removeprefix("http://"), [a.process.pid, b.process.pid]),
                Target("two replicas, each request to either (snapshots shared)",
                       proxy.url("any").removeprefix("http://"),
                       [a.process.pid, b.process.pid]),
                Target("one replica (PostgreSQL), no proxy", a.address, [a.process.pid]),
                Target("one replica (SQLite), no proxy", lite.address, [lite.process.pid]),
            ]
            groups = {"replica A": [a.process.pid], "replica B": [b.process.pid],
                      "SQLite replica": [lite.process.pid], "HAProxy": [proxy.process.pid],
                      "PostgreSQL": [pg.postmaster_pid()], "load generator": [os.getpid()]}
            for target in targets:
                await target.connect()
                await block(target, groups, max(1, opts.warm // CALLERS), "warm-" + uuid.uuid4().hex)
                target.rates.clear()
                target.latencies.clear()
                target.cpu.clear()
                target.answered_by.clear()
                target.wall, target.calls = 0.0, 0
            run = uuid.uuid4().hex[:8]
            for n in range(opts.blocks):
                for target in targets[n % len(targets):] + targets[:n % len(targets)]:
                    await block(target, groups, opts.per_caller * 2,
                                f"{run}-{targets.index(target)}-{n}")
            for target in targets:
                for conn, _ in target.conns:
                    await conn.close()
        finally:
            if proxy is not None:
                await asyncio.to_thread(proxy.stop)
            for replica in replicas:
                await stop_replica(replica)
    return report(opts, targets, groups)


def report(opts: Any, targets: list[Target], groups: dict[str, list[int]]) -> str:
    one, two = targets[0], targets[1]
    cores = os.cpu_count() or 1
    rows = []
    for target in targets:
        lat = sorted(target.latencies)
        spread = "/".join(str(n) for _, n in sorted(target.answered_by.items()))
        rows.append([target.label, f"{statistics.median(target.rates):,.0f}",
                     fmt(same_block_ratios(target, one)),
                     f"{lat[len(lat) // 2] * 1e3:.1f}", f"{lat[int(len(lat) * 0.99)] * 1e3:.1f}",
                     spread])
    names = [*groups, *MACHINE]
    cpu_rows = []
    for target in targets:
        ours = sum(target.cpu[name] for name in groups)
        others = target.cpu[MACHINE[0]] - ours
        cpu_rows.append([target.label, *(f"{target.cpu[n] / target.wall:.2f}" for n in names),
                         f"{max(0.0, others) / target.wall:.2f}",
                         f"{ours / target.calls * 1e6:,.0f}"])
    ratio = statistics.median(same_block_ratios(two, one))
    # What two replicas could reach at most on these cores: the CPU left to the fleet (cores
    # minus what other users took) over the CPU a call costs every process of the fleet.
    per_call_two = sum(two.cpu[name] for name in groups) / two.calls
    others_two = max(0.0, two.cpu[MACHINE[0]] - sum(two.cpu[name] for name in groups)) / two.wall
    ceiling = (cores - others_two) / per_call_two
    one_rate = statistics.median(one.rates)
    a_busy = one.cpu["replica A"] / one.wall
    machine_one = (one.cpu[MACHINE[0]] + one.cpu[MACHINE[1]]) / one.wall
    # On the same cores with nobody else: one replica is one event loop (at most one core
    # for its own share of a call) and the fleet's processes share the cores.
    per_call_one = sum(one.cpu[name] for name in groups) / one.calls
    one_alone = min(1 / (one.cpu["replica A"] / one.calls), cores / per_call_one)
    two_alone = cores / per_call_two
    return "\n".join([
        f"### 2. Two replicas vs one behind HAProxy, {CALLERS} callers on `/v1` "
        f"({opts.blocks} interleaved blocks)",
        "",
        f"`sidecar serve` replicas on one PostgreSQL database; per block {CALLERS} callers x "
        f"{opts.per_caller * 2} calls (`POST /v1/snapshots/{{id}}/calls`, fresh call ids, the "
        "`echo` plugin in the daemon's process). Each caller keeps its connection; behind "
        f"the `one` and `two` frontends also its replica (header `{AFFINITY}`, an HAProxy "
        "stick table), behind `any` each request goes round-robin and the replica finds "
        "the snapshot in the database. `vs one`: the median of same-block ratios to the "
        "one-replica frontend (middle half); `answered by`: calls per replica process.",
        "",
        table(["target", "calls/s", "vs one", "p50 ms", "p99 ms", "answered by"], rows),
        "",
        "CPU during the blocks, in cores (CPU seconds per wall second; this machine has "
        f"{cores}), and the fleet's CPU per call (replicas + HAProxy + PostgreSQL + load "
        "generator):",
        "",
        table(["target", *names, "other users' processes", "fleet cpu µs/call"], cpu_rows),
        "",
        "Baseline: one replica behind the same HAProxy, same blocks. Target: two >= 1.6x.",
        "",
        f"- two replicas: {ratio:.2f}x one: {'met' if ratio >= 1.6 else 'MISS'} (target >= 1.6x). "
        f"With one replica, A used {a_busy:.2f} of a core and the machine {machine_one:.2f} of "
        f"{cores}. With two, a call cost the fleet {per_call_two * 1e6:,.0f} µs of CPU and "
        f"other users took {others_two:.2f} cores, so these cores allow at most "
        f"{ceiling:,.0f} calls/s: {ceiling / one_rate:.2f}x the one-replica rate "
        f"({one_rate:,.0f}/s). 1.6x needs 1.6 x {one_rate:,.0f} calls/s x "
        f"{per_call_two * 1e6:,.0f} µs = {1.6 * one_rate * per_call_two:.2f} cores for the fleet.",
        f"- the same cores with no other users, from these CPU costs: one replica at most "
        f"{one_alone:,.0f} calls/s (its event loop at one core, or all {cores} cores), two at "
        f"most {two_alone:,.0f}: {two_alone / one_alone:.2f}x; 1.6x would need "
        f"{1.6 * one_alone * per_call_two:.1f} cores. A call costs the replica "
        f"{one.cpu['replica A'] / one.calls * 1e6:,.0f} µs and the rest of the fleet "
        f"{(per_call_one - one.cpu['replica A'] / one.calls) * 1e6:,.0f} µs (PostgreSQL "
        f"{one.cpu['PostgreSQL'] / one.calls * 1e6:,.0f}, HAProxy "
        f"{one.cpu['HAProxy'] / one.calls * 1e6:,.0f}, load generator "
        f"{one.cpu['load generator'] / one.calls * 1e6:,.0f}).",
    ])
