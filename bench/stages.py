"""Where a sequential `sidecar stdio` call spends the daemon's time, stage by stage, in place
(`STAGES`): a daemon started here (`--daemon`: the CLI's `sidecar daemon`, with the methods that
begin each stage wrapped to record `time.perf_counter_ns()`), a real upstream over pipes, and
`sidecar stdio` attached to the daemon as to any.

    .venv/bin/python bench/stages.py [--calls N] [--rounds R] [--era legacy|auto]

Per round: each stage's median over the calls (a wrapper costs ~0.5 µs), the daemon's CPU per
call (every thread, /proc, read after its writers committed the round's rows), and what no
stage holds: the two pipe writes, the reads and the client line's parse, the wake-ups, the
task's end and the writer threads. Printed, not written to RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.util
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

MARKS = ("parsed", "task", "tool", "pipe", "answer", "record", "recorded", "reply")
"""Where each stage begins, in the order a call passes them."""
STAGES = (
    # the client's line parsed, to the call's task starting: the fast route's decision, the hop
    ("route", "parsed", "task", True),
    # call context, admission, the claim with its journal line, the input check
    ("facade and seam", "task", "tool", True),
    # the bridge's caller (its permission ask, the connection), to the request line handed
    # to the upstream's pipe (until 2026-12-07 this began at the seam's `_invoke`, a few
    # µs earlier, before the tool's own `execute` wrapper)
    ("bridge out", "tool", "pipe", True),
    # the pipe write, the upstream's own work, the answer read and parsed
    ("upstream (wall)", "pipe", "answer", False),
    # the coroutines resumed, the result read, the seam after the tool (output, bounding)
    ("answer back", "answer", "record", True),
    # the outcome's record itself (its journal line)
    ("outcome record", "record", "recorded", True),
    # the way back to the facade, the wire result encoded (the history row and the metrics
    # come after the answer: `sidecar.execution.behind`, b3ee76e)
    ("way back and wire", "recorded", "reply", True),
)
"""(name, from mark, to mark, whether it is the daemon's own CPU); then "client (wall)": the
client's write, its own work and its next line."""


# --- the daemon side ------------------------------------------------------------------------


def _install(marks: dict[str, list[int]]) -> None:
    """Wrap the methods that begin (or end) each stage so they record their mark."""
    from bridges.mcp.calls import Caller
    from bridges.mcp.direct_requests import DirectRequests
    from sidecar.backends.sqlite.outcome_log import SqliteOutcomeLog
    from sidecar.serve.mcp_facade.stdio_fastpath import FastCalls

    now = time.perf_counter_ns

    def on_entry(cls: Any, name: str, mark: str) -> None:
        original = getattr(cls, name)
        slot = marks[mark]
        if asyncio.iscoroutinefunction(original):
            @functools.wraps(original)
            async def entered(*args: Any, **kwargs: Any) -> Any:
                slot.append(now())
                return await original(*args, **kwargs)
            setattr(cls, name, entered)
        else:
            @functools.wraps(original)
            def called(*args: Any, **kwargs: Any) -> Any:
                slot.append(now())
                return original(*args, **kwargs)
            setattr(cls, name, called)

    on_entry(FastCalls, "take_raw", "parsed")
    on_entry(FastCalls, "_run", "task")
    on_entry(Caller, "__call__", "tool")  # the bridged tool, as the seam awaits it
    on_entry(DirectRequests, "_write", "pipe")
    on_entry(DirectRequests, "deliver", "answer")
    on_entry(SqliteOutcomeLog, "record", "record")
    on_entry(FastCalls, "_send", "reply")
    recorded = marks["recorded"]
    record = SqliteOutcomeLog.record

    @functools.wraps(record)
    async def timed_record(*args: Any, **kwargs: Any) -> Any:
        try:
            return await record(*args, **kwargs)
        finally:
            recorded.append(now())

    setattr(SqliteOutcomeLog, "record", timed_record)  # noqa: B010


def daemon(argv: list[str], out: str) -> int:
    """`sidecar daemon ARGV` with the marks installed; SIGUSR1 forgets them, SIGUSR2 writes
    them to `out` (JSON, one list per mark) and forgets them."""
    marks: dict[str, list[int]] = {mark: [] for mark in MARKS}
    _install(marks)

    def forget(*_: Any) -> None:
        for got in marks.values():
            got.clear()

    def dump(*_: Any) -> None:
        Path(out).write_text(json.dumps(marks))
        forget()

    signal.signal(signal.SIGUSR1, forget)
    signal.signal(signal.SIGUSR2, dump)
    from sidecar.cli.commands import main

    return main(["daemon", *argv])


# --- the measuring side ---------------------------------------------------------------------


def _compare() -> Any:
    spec = importlib.util.spec_from_file_location("compare", HERE / "compare.py")
    assert spec is not None and spec.loader is not None
    compare: Any = importlib.util.module_from_spec(spec)
    sys.modules["compare"] = compare
    spec.loader.exec_module(compare)
    return compare


async def _forget(pid: int) -> None:
    """The daemon drops the marks it has (SIGUSR1)."""
    os.kill(pid, signal.SIGUSR1)
    await asyncio.sleep(0.05)


async def _marks(pid: int, out: Path) -> dict[str, list[int]]:
    """The marks since the last `_forget` (SIGUSR2: written to `out`, then dropped)."""
    out.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR2)
    for _ in range(200):
        if out.exists():
            try:
                got: dict[str, list[int]] = json.loads(out.read_text())
                return got
            except ValueError:  # still being written
                pass
        await asyncio.sleep(0.02)
    raise SystemExit("the daemon wrote no marks")


def _medians(marks: dict[str, list[int]]) -> tuple[int, dict[str, float]]:
    calls = min(len(got) for got in marks.values())
    if calls == 0:
        raise SystemExit(f"no call passed every mark: {({k: len(v) for k, v in marks.items()})}")
    found = {name: statistics.median((marks[end][i] - marks[start][i]) / 1000
                                     for i in range(calls))
             for name, start, end, _ in STAGES}
    found["client (wall)"] = statistics.median(
        (marks["parsed"][i + 1] - marks["reply"][i]) / 1000 for i in range(calls - 1)
    ) if calls > 1 else 0.0
    return calls, found


async def measure(calls: int, rounds: int, era: str) -> None:
    compare = _compare()
    with tempfile.TemporaryDirectory() as tmp:
        # legacy: the 2025 handshake era, as the bench's `sidecar stdio` row; auto: the
        # default manifest, where the sidecar picks 2026-07-28
        manifests = compare.write_manifest(Path(tmp) / "m",
                                           protocol="legacy" if era == "legacy" else None)
        state = Path(tmp) / "state"
        out = Path(tmp) / "marks.json"
        started = compare.start_daemon(
            [sys.executable, str(Path(__file__).resolve()), "--daemon", str(out), "--",
             "--manifests", str(manifests), "--state-dir", str(state)], state)
        try:
            await compare.wait_state_daemon(started, state)
            async with compare.mcp_client(compare.attached_stdio(manifests, state)) as client:
                name = await compare.find_tool(client, "echo")
                for _ in range(200):
                    await compare.call(client, name, {"text": "warm"})
                rows = []
                for _ in range(rounds):
                    await _forget(started.pid)
                    used = compare.cpu_seconds(started.pid)
                    for _ in range(calls):
                        result = await compare.call(client, name, {"text": "hello"})
                    if "hello" not in str(result.content):
                        raise SystemExit(f"the daemon answered {result!r}")
                    await asyncio.sleep(compare.WRITE_BEHIND_SECONDS)
                    cpu = (compare.cpu_seconds(started.pid) - used) / calls * 1e6
                    counted, found = _medians(await _marks(started.pid, out))
                    rows.append((cpu, counted, found))
        finally:
            compare.stop(started)  # the daemon and its upstream (its process group)
            started.wait(timeout=30)  # gone before its state directory is removed
    _report(rows, calls, era)


def _report(rows: list[tuple[float, int, dict[str, float]]], calls: int, era: str) -> None:
    print(f"- machine: {os.uname().machine}, {os.cpu_count()} CPUs, Python "
          f"{sys.version.split()[0]}, load average {os.getloadavg()[0]:.2f} after the run")
    print(f"- command: `.venv/bin/python bench/stages.py --calls {calls} --rounds {len(rows)} "
          f"--era {era}`\n")
    print("| stage | " + " | ".join(f"round {i + 1}" for i in range(len(rows))) + " |")
    print("|---|" + "---|" * len(rows))
    names = [name for name, *_ in STAGES] + ["client (wall)"]
    for name in names:
        print(f"| {name} µs | " + " | ".join(f"{found[name]:.0f}" for _, _, found in rows)
              + " |")
    own = [sum(found[name] for name, _, _, mine in STAGES if mine) for _, _, found in rows]
    print("| the stages' sum (the daemon's own) µs | " + " | ".join(f"{s:.0f}" for s in own)
          + " |")
    print("| daemon cpu µs/call | " + " | ".join(f"{cpu:.0f}" for cpu, _, _ in rows) + " |")
    print("| not in a stage (pipe writes, reads, wake-ups, task end, writers) µs | "
          + " | ".join(f"{cpu - s:.0f}" for (cpu, _, _), s in zip(rows, own, strict=True))
          + " |")
    print("| calls that passed every mark | " + " | ".join(str(n) for _, n, _ in rows) + " |")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--daemon":
        out, rest = sys.argv[2], sys.argv[sys.argv.index("--") + 1:]
        raise SystemExit(daemon(rest, out))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--era", choices=("legacy", "auto"), default="legacy",
                        help="the upstream's protocol era (auto: the default manifest's)")
    args = parser.parse_args()
    asyncio.run(measure(args.calls, args.rounds, args.era))


if __name__ == "__main__":
    main()
