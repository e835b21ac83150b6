"""What each part of a sequential `sidecar stdio` call costs the daemon in place: one daemon
started here (`--daemon`: the CLI's `sidecar daemon` with parts of the call path that a switch
file can turn into stubs), `sidecar stdio` attached to it, a real upstream over pipes. Blocks of
sequential echo calls take turns between switch sets in a shuffled order each round; reported:
the daemon's CPU per call (every thread, /proc) and the median same-round difference from the
whole call. Then the same daemon, and the lean proxy (`bench/lean_proxy.py`), with every process
of the call pinned to one vCPU against the scheduler's own placement.

    .venv/bin/python bench/ablation.py [--rounds R] [--seconds S]

Switches (a stub does nothing or the least the next part needs; measurement only):
- `canned`: the facade answers the call itself (the floor of reading, routing and answering);
- `bridge`: the facade sends the call straight to the upstream's pipe (`Connection._direct_call`:
  the floor of a relay, no seam);
- `outcomes`: the seam has no outcome log (no fingerprint, claim, journal lines or row);
- `audit`: no history row and no metrics (the seam's `_audit`);
- `publish`: no observers and no event (the seam's `_publish`);
- `caller`: the bridged tool calls the pipe without the bridge's caller (no permission ask,
  progress, latency record or tracing step);
- `fused`: the call's work in one hand-written sequence from the facade to the pipe and back
  (context, admission, input check, fingerprint, claim, the pipe, output and content, bounding
  plan, events, record, history row and metrics, the wire result), none of the layers between
  (the seam's in-flight map and tracing, the caller's permission ask and progress, the
  connection's rounds, the facade's login check): what a rebuilt call path could save.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONFIGS: tuple[str, ...] = ("", "canned", "bridge", "outcomes", "audit", "publish", "caller",
                            "outcomes audit publish caller", "fused")
_ALL = CONFIGS


# --- the daemon side ------------------------------------------------------------------------


def _install(off: set[str]) -> None:
    """Turn the parts named in `off` into stubs (each check costs the whole call ~0.1 µs)."""
    from bridges.mcp import calls, connection, results
    from sidecar.execution import seam
    from sidecar.execution.bounding import plan_bounding
    from sidecar.model.tool import CallContext
    from sidecar.serve.mcp_facade import fast_answers, tools

    seams: list[Any] = []
    kept: dict[int, Any] = {}
    conns: list[Any] = []
    direct: Any = connection.Connection._direct_call  # (the echo answers plain text)

    async def direct_call(self: Any, *args: Any) -> Any:
        if not conns:
            conns.append(self)
        return await direct(self, *args)

    async def relayed(arguments: dict[str, Any]) -> dict[str, Any]:
        got = await direct(conns[0], {"name": "echo", "arguments": arguments}, 30.0, None)
        return {"content": [{"type": "text", "text": t} for t in got.texts],
                "isError": got.is_error}

    async def fused(self: Any, state: Any, request_id: Any, name: str,
                    arguments: dict[str, Any], meta: dict[str, Any]) -> Any:
        snapshot = state.snapshot
        entry, runs = snapshot.entry(name), snapshot.seam
        if id(runs) in kept:  # the switch set before stubbed the outcome log
            runs.outcomes = kept.pop(id(runs))
        client = state.session.client_params
        context = tools.call_context(
            session_id=state.id, request_id=request_id, meta=meta, owner=state.owner,
            client_name=client.client_info.name if client is not None else None)
        for check in runs.admission:
            if (refused := check(entry)) is not None:
                return tools.error_wire(refused.message)
        tool = entry.tool
        value = seam._decode(tool.input, arguments, name)
        fingerprint = seam._fingerprint(name, arguments, context, snapshot)
        stored = await runs.outcomes.claim(runs.location, context.call_id, fingerprint, name)
        if stored is None:
            started = time.perf_counter()
            got = await direct(conns[0], {"name": "echo", "arguments": value}, 30.0, None)
            response = results.plain_response(got, has_output=tool.output is not None)
            outcome = runs._completed(tool, response, CallContext(context, name,
                                                                  runs._publish_progress))
            if plan_bounding(outcome.content, runs.bounds) is not None:
                raise RuntimeError("the echo is never bounded")
            runs._publish(outcome, started)
            stored = await runs.outcomes.record(runs.location, outcome, context, fingerprint)
            runs._audit(snapshot, name, arguments, context, stored, started)
        return await self._result_wire(stored, snapshot, modern=False)

    call = fast_answers.FastAnswers.call

    async def facade_call(self: Any, state: Any, request_id: Any, name: str,
                          arguments: dict[str, Any], *args: Any) -> Any:
        if "canned" in off:
            return {"content": [{"type": "text", "text": arguments.get("text", "")}],
                    "isError": False}
        if "bridge" in off and conns:
            return await relayed(arguments)
        if "fused" in off and conns:
            return await fused(self, state, request_id, name, arguments, *args[:1])
        return await call(self, state, request_id, name, arguments, *args)

    execute = seam.Seam.execute

    async def seam_execute(self: Any, *args: Any) -> Any:
        if self not in seams:
            seams.append(self)
        if "outcomes" in off and self.outcomes is not None:
            kept[id(self)] = self.outcomes
            self.outcomes = None
        elif "outcomes" not in off and id(self) in kept:
            self.outcomes = kept.pop(id(self))
        return await execute(self, *args)

    audit, publish = seam.Seam._audit, seam.Seam._publish

    def seam_audit(self: Any, *args: Any) -> None:
        if "audit" not in off:
            audit(self, *args)

    def seam_publish(self: Any, *args: Any) -> None:
        if "publish" not in off:
            publish(self, *args)

    caller = calls.Caller.__call__

    async def caller_call(self: Any, tool: Any, arguments: Any, ctx: Any) -> Any:
        if "caller" in off:
            got = await direct(self._current()[1], {"name": tool.name, "arguments": arguments},
                               30.0, None)
            return results.plain_response(got, has_output=tool.has_output)
        return await caller(self, tool, arguments, ctx)

    patches: list[tuple[Any, str, Any]] = [
        (connection.Connection, "_direct_call", direct_call),
        (fast_answers.FastAnswers, "call", facade_call),
        (seam.Seam, "execute", seam_execute), (seam.Seam, "_audit", seam_audit),
        (seam.Seam, "_publish", seam_publish), (calls.Caller, "__call__", caller_call),
    ]
    for owner, attribute, value in patches:
        setattr(owner, attribute, value)


def daemon(argv: list[str], switches: str) -> int:
    """`sidecar daemon ARGV` with the stubs installed; SIGUSR1 reads the switch file."""
    off: set[str] = set()
    _install(off)

    def read(*_: Any) -> None:
        off.clear()
        off.update(Path(switches).read_text().split())

    signal.signal(signal.SIGUSR1, read)
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


def _pin(pids: list[int], cpus: set[int]) -> None:
    for pid in pids:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                os.sched_setaffinity(int(task), cpus)
            except OSError:
                pass


def _family(pid: int) -> list[int]:
    import psutil

    return [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]


async def _block(compare: Any, client: Any, name: str, pid: int, seconds: float) -> float:
    """The daemon's CPU µs per call over `seconds` of sequential calls (after 100 more)."""
    for _ in range(100):
        await compare.call(client, name, {"text": "warm"})
    await asyncio.sleep(compare.WRITE_BEHIND_SECONDS)
    used, calls, began = compare.cpu_seconds(pid), 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        result = await compare.call(client, name, {"text": "hello"})
        calls += 1
    if "hello" not in str(result.content):
        raise SystemExit(f"the daemon answered {result!r}")
    await asyncio.sleep(compare.WRITE_BEHIND_SECONDS)
    return float((compare.cpu_seconds(pid) - used) / calls * 1e6)


async def _placement(compare: Any, client: Any, name: str, pid: int, rounds: int,
                     seconds: float) -> tuple[list[float], list[float]]:
    """(free, one vCPU) CPU per call of `pid`, the client and `pid`'s children pinned alike."""
    every = set(range(os.cpu_count() or 1))
    free: list[float] = []
    pinned: list[float] = []
    for index in range(rounds):
        for one in ((False, True) if index % 2 == 0 else (True, False)):
            _pin([os.getpid(), *_family(pid)], {0} if one else every)
            (pinned if one else free).append(await _block(compare, client, name, pid, seconds))
    _pin([os.getpid(), *_family(pid)], every)
    return free, pinned


async def measure(rounds: int, seconds: float) -> None:
    import psutil

    compare = _compare()
    found: dict[str, list[float]] = {config: [] for config in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        manifests = compare.write_manifest(Path(tmp) / "m", protocol="legacy")
        state, switches = Path(tmp) / "state", Path(tmp) / "switches"
        switches.write_text("")
        env = {**os.environ, "SIDECAR_STATE_DIR": str(state)}
        started = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--daemon", str(switches), "--",
             "--manifests", str(manifests), "--state-dir", str(state)],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        try:
            for _ in range(600):
                if compare.state_daemon(state) == started.pid:
                    break
                if started.poll() is not None:
                    raise SystemExit(f"the daemon exited ({started.returncode})")
                await asyncio.sleep(0.05)
            else:
                raise SystemExit("the daemon did not start")
            params = compare.stdio_params(
                sys.executable, ["-m", "sidecar.cli", "stdio", "--manifests", str(manifests),
                                 "--state-dir", str(state)], env={"SIDECAR_STATE_DIR": str(state)})
            async with compare.mcp_client(params) as client:
                name = await compare.find_tool(client, "echo")
                for _ in range(300):
                    await compare.call(client, name, {"text": "warm"})
                for index in range(rounds):
                    for config in random.Random(index).sample(CONFIGS, len(CONFIGS)):
                        switches.write_text(config)
                        os.kill(started.pid, signal.SIGUSR1)
                        found[config].append(
                            await _block(compare, client, name, started.pid, seconds))
                switches.write_text("")
                os.kill(started.pid, signal.SIGUSR1)
                daemon_free, daemon_one = await _placement(
                    compare, client, name, started.pid, rounds, seconds)
        finally:
            compare.stop(started)
            started.wait(timeout=30)
        targets = compare.Targets(Path(tmp))
        before = {p.pid for p in psutil.Process().children()}
        lean = targets.lean_proxy()
        async with lean.connect() as client:
            name = await compare.find_tool(client, "echo")
            for _ in range(300):
                await compare.call(client, name, {"text": "warm"})
            (proxy,) = compare.new_children(before)
            lean_free, lean_one = await _placement(compare, client, name, proxy, rounds, seconds)
        await targets.stack.aclose()
    _report(found, rounds, seconds, (daemon_free, daemon_one), (lean_free, lean_one))


def _report(found: dict[str, list[float]], rounds: int, seconds: float,
            daemon: tuple[list[float], list[float]], lean: tuple[list[float], list[float]]) -> None:
    print(f"- machine: {os.uname().machine}, {os.cpu_count()} CPUs, Python "
          f"{sys.version.split()[0]}, load average {os.getloadavg()[0]:.2f} after the run")
    only = "" if len(found) == len(CONFIGS) and CONFIGS == _ALL else " --only " + ",".join(
        (c or "whole").replace(" ", "+") for c in CONFIGS)
    print(f"- command: `.venv/bin/python bench/ablation.py --rounds {rounds} --seconds "
          f"{seconds:g}{only}`\n")
    whole = found[""]
    print("| stubbed | daemon cpu µs/call | vs the whole call (median, range) | share |")
    print("|---|---|---|---|")
    for config in CONFIGS:
        differences = [a - b for a, b in zip(found[config], whole, strict=True)]
        share = statistics.median(a / b for a, b in zip(found[config], whole, strict=True))
        print(f"| {config or 'nothing (the whole call)'} | {statistics.median(found[config]):.0f}"
              f" | {statistics.median(differences):+.0f} ({min(differences):+.0f} to "
              f"{max(differences):+.0f}) | {share:.2f} |")
    print("\n| process | free µs/call | one vCPU µs/call | difference |")
    print("|---|---|---|---|")
    for label, (free, one) in (("the daemon", daemon), ("the lean proxy", lean)):
        print(f"| {label} | {statistics.median(free):.0f} | {statistics.median(one):.0f} | "
              f"{statistics.median(o - f for f, o in zip(free, one, strict=True)):+.0f} |")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--daemon":
        switches, rest = sys.argv[2], sys.argv[sys.argv.index("--") + 1:]
        raise SystemExit(daemon(rest, switches))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--only", default="", help="switch sets, comma separated (whole: none; + joins two)")
    args = parser.parse_args()
    if args.only:
        global CONFIGS
        CONFIGS = tuple("" if c == "whole" else c.replace("+", " ") for c in args.only.split(","))
    asyncio.run(measure(args.rounds, args.seconds))


if __name__ == "__main__":
    main()
